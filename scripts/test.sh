#!/usr/bin/env bash
# The test command: install, lint, type-check, run the test suite (CPU only; ~10 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
ruff check kitlib tests benchmarks
ruff format --check kitlib tests benchmarks
mypy
python -m pytest -q "$@"
