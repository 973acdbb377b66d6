#!/usr/bin/env bash
# The main job: get the corpus, train the default model, sample from it.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
scripts/get_corpus.sh
# The main job's run has a folder of its own, runs/main, apart from the
# README's first-hour runs.
bin/train --config tiny_gdn.ini --set train.run_dir=runs/main --overwrite "$@"   # a fresh run each time
bin/generate --checkpoint runs/main/checkpoint.h5 --prompt "And God said" --max-tokens 300 --check
