#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the default test suite: `bash scripts/test.sh [pytest args]`.
# Long checks: `bash scripts/test.sh -m slow`; GPU checks: `bash scripts/test.sh -m gpu`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
