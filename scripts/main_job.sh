#!/usr/bin/env bash
# The main job: until `train` lands, run the gradient-check demo.
set -euo pipefail
cd "$(dirname "$0")/.."
./build/gradcheck_demo
