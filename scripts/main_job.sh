#!/usr/bin/env bash
# The main job: get the corpus, train the default model, sample from it.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
scripts/get_corpus.sh
bin/train --config tiny_gdn.ini --overwrite "$@"   # a fresh run each time
bin/generate --checkpoint runs/tiny_gdn/checkpoint.h5 --prompt "And God said" --max-tokens 300 --check
