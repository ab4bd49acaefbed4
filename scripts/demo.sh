#!/usr/bin/env bash
# The main job: install, build an offline demo competition, run the four notebooks headless in order, score.
#   bash scripts/demo.sh                       Rotten Tomatoes reviews -> fresh/rotten (accuracy)
#   bash scripts/demo.sh --task tabular-text   film box office from text + numeric + categorical columns (SMAPE)
#   bash scripts/demo.sh --task seq2seq        text-to-SQL over a SQLite shop (record F1: each query executed)
#   bash scripts/demo.sh --task causal-lm      questions about the reviews, answered by a decoder-only LM (exact match)
#   bash scripts/demo.sh --task custom         the reviews, with your own model (bilstm.py in the demo folder)
#   bash scripts/demo.sh --task custom-seq2seq film synopses summarised by your own encoder-decoder
#                                              (pointer_generator.py in the demo folder; ROUGE-L)
# KIT_PRESET=smoke|fast|balanced|best picks the preset (default balanced); KIT_MODEL=tiny forces the tiny model.
set -euo pipefail
cd "$(dirname "$0")/.."
task=auto
if [[ ${1:-} == --task ]]; then task=${2:?--task needs a name}; fi
data=work/demo run=work/run  # the reviews demo's folders; another task's: work/demo-<task>, work/run-<task>
[[ $task == auto ]] || { data=work/demo-$task; run=work/run-$task; }
bash scripts/install.sh
python -m kitlib demo "$data" --task "$task"
python -m kitlib notebooks run --data "$data" --work "$run" --params "$data/demo.json" \
  --preset "${KIT_PRESET:-balanced}" --model "${KIT_MODEL:-auto}"
python -m kitlib score "$data/solution.csv" "$run/submission.csv"
