#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the default test suite: `bash scripts/test.sh [pytest args]`.
# Long checks: `bash scripts/test.sh -m slow`; GPU checks: `bash scripts/test.sh -m gpu`.
# The tests run in parallel (pytest-xdist), one worker per core up to 4: most of them wait on a subprocess or on
# Python rather than on torch's threads. Work stealing: a worker that is done takes the tests queued behind
# another's long one. `-n 0` (a later -n wins) runs them in one process, for -s, --pdb or -x.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -n auto --maxprocesses=4 --dist worksteal "$@"
