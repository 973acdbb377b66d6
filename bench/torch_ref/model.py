"""The independent PyTorch reference of the model lives in python/attnlab_model.py
(where the checkpoint loader, python/attnlab_torch.py, uses it too); this module
keeps the benchmark scripts' `from model import ...` working."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from attnlab_model import *  # noqa: E402,F401,F403
