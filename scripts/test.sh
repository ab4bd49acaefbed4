#!/usr/bin/env bash
# The test command: install, lint, type-check, run the test suite (CPU only). It passes on any machine, busy or quiet:
# no test asserts a time. The slow tests (@pytest.mark.slow: whole notebook routes, each over ~20 s on 2 cores) are
# left to CI (`.ci/run` runs them after this); `bash scripts/test.sh -m ""` runs everything here.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
ruff check kitlib tests benchmarks
ruff format --check kitlib tests benchmarks
mypy
python -m pytest -q -m "not slow" "$@"
