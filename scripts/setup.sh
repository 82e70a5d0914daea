#!/usr/bin/env bash
# Set up sparse-runner in ./.venv on a fresh machine (idempotent; a few minutes the first time).
# torch is installed first and pinned: `pip install torch==2.13.0` takes the CPU build where one is
# on disk, and keeps pip from pulling a multi-GB CUDA build through an open version range.
# On a GPU cluster, install your CUDA build of torch into the venv first; it is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
python -c "import torch" 2>/dev/null || pip install -q torch==2.13.0
pip install -q -e ".[dev]" -c constraints.txt
