#!/usr/bin/env bash
# Set up (scripts/setup.sh), train and evaluate the embedded default (LRA ListOps, CPU size,
# softmax transformer) offline, then write the report and print its overview; the last line names
# report.html, the page to open: `bash scripts/demo.sh [overrides]`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/sparse-run "$@"
.venv/bin/sparse-report outputs --print overview
