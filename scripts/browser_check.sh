#!/usr/bin/env bash
# Real-browser check of notebooks 00-03 (JupyterLab + Debian's headless chromium, driven by Playwright). CI runs
# `--preset smoke,fast --rows 2000` (.ci/run, beside the next one) and, with IPYWIDGETS=7.7.1, `--preset smoke
# --rows 2000` (scripts/test_hosted_pins.sh). See scripts/browser_check.py for what it checks.
#
#   bash scripts/browser_check.sh                              # ipywidgets as the Python has it (8.x)
#   IPYWIDGETS=7.7.1 bash scripts/browser_check.sh             # ipywidgets 7.7.1 (Colab's) in its own venv
#   bash scripts/browser_check.sh --preset smoke,fast          # both presets, one JupyterLab and one browser
#   bash scripts/browser_check.sh --rows 2000                  # the demo cut to 2000 training rows (CI's)
#   bash scripts/browser_check.sh --out shots --docs           # keep screenshots in ./shots, refresh docs/browser_*.png
#   IPYWIDGETS=7.7.1 JUPYTERLAB=4 bash scripts/browser_check.sh  # 7.7.1 under JupyterLab 4: its widgets cannot draw
#
# Makes (once) a venv holding JupyterLab and Playwright's Python package that also sees the packages of the Python it
# is started with ($PYTHON, default python3: in an activated venv, that venv's; torch and kitlib's dependencies come
# from there: run scripts/install.sh first on a fresh machine). --system-site-packages alone would see only the base
# interpreter's, never a venv's, so a .pth file adds $PYTHON's site-packages (after the browser venv's own); no
# browser is downloaded: Debian's chromium is installed with apt when missing (as root). The venv lives in
# $BROWSER_VENV (default: ~/.cache/kitlib-browser/venv-lab<3|4>-ipywidgets-<version or "latest">). The kernel imports this
# checkout's kitlib (PYTHONPATH), never an installed one. Exit status: 0 clean, 1 findings (one "FAIL" line each),
# 2 the check could not run.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PYTHON=${PYTHON:-python3}
IPYWIDGETS=${IPYWIDGETS:-}

if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  else
    echo "browser_check: no chromium; install Debian's (apt-get install chromium) or pass --chromium PATH" >&2
    exit 2
  fi
fi

# ipywidgets 7 kernels need the 7.x widget frontend (jupyterlab_widgets 1.x), which only JupyterLab 3 takes: JupyterLab
# 4's frontend (jupyterlab_widgets 3) draws "Error displaying widget" for every ipywidgets 7 widget. JUPYTERLAB=4 with
# IPYWIDGETS=7.x shows exactly that.
case "$IPYWIDGETS" in
  7.*) JUPYTERLAB=${JUPYTERLAB:-3} ;;
  *) JUPYTERLAB=${JUPYTERLAB:-4} ;;
esac
if [ "$JUPYTERLAB" = 3 ]; then
  want=("jupyterlab>=3.6,<4" "jupyterlab_widgets>=1.1,<2" playwright)
else
  want=("jupyterlab>=4,<5" "jupyterlab_widgets>=3,<4" playwright)
fi
want+=("ipywidgets${IPYWIDGETS:+==$IPYWIDGETS}")
VENV=${BROWSER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kitlib-browser/venv-lab$JUPYTERLAB-ipywidgets-${IPYWIDGETS:-latest}}
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv --system-site-packages "$VENV"
fi
# $PYTHON's site-packages (a venv's, or the interpreter's own): rewritten every run, the caller may have changed
CALLER_SITE=$("$PYTHON" -c 'import site, sysconfig; print(repr(sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})))')
VENV_SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
echo "import site; list(map(site.addsitedir, $CALLER_SITE))" > "$VENV_SITE/kitlib-caller-site.pth"
# pip's no-op check costs ~20 s on a busy 2-core machine: skipped while the venv holds what this list asked for
stamp="$VENV/kitlib-browser-want.txt"
if [ "$(cat "$stamp" 2>/dev/null)" != "${want[*]}" ]; then
  "$VENV/bin/python" -m pip install -q "${want[@]}"
  echo "${want[*]}" >"$stamp"
fi
"$VENV/bin/python" -c "import ipywidgets, jupyterlab; print('browser_check venv:', '$VENV', 'ipywidgets', ipywidgets.__version__, 'jupyterlab', jupyterlab.__version__)"

PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" exec "$VENV/bin/python" scripts/browser_check.py "$@"
