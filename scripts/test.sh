#!/usr/bin/env bash
# The project's tests: what README's quick start runs and what CI (.ci/run) runs.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet -e ".[dev,ray,parquet]"
ruff check .
python -m pytest -q -n auto "$@"  # one worker per core (pytest-xdist)
