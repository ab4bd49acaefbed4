#!/usr/bin/env bash
# The main job: install, build the offline demo competition, run the four notebooks headless in order, score.
# KIT_PRESET=fast|balanced|best picks the preset (default balanced); KIT_MODEL=tiny forces the tiny fallback model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
python -m kitlib demo work/demo
python -m kitlib notebooks run --data work/demo --work work/run --preset "${KIT_PRESET:-balanced}" --model "${KIT_MODEL:-auto}"
python -m kitlib score work/demo/solution.csv work/run/submission.csv
