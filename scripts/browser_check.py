"""Real-browser check of the four notebooks: JupyterLab + headless Chromium, driven like a person would.

CI runs it (.ci/run: ``--preset smoke,fast --rows 2000``; scripts/test_hosted_pins.sh: smoke with ipywidgets
7.7.1); not part of scripts/test.sh. Run it through
scripts/browser_check.sh, which makes a venv with JupyterLab and Playwright (no browser download: Debian's chromium
is used) and, with IPYWIDGETS=7.7.1, the old ipywidgets that Colab ships:

    bash scripts/browser_check.sh                          # ipywidgets as installed (8.x)
    IPYWIDGETS=7.7.1 bash scripts/browser_check.sh         # a second venv with ipywidgets 7.7.1
    bash scripts/browser_check.sh --preset fast --docs     # the early-stopping path; copy the two doc screenshots

What it does: builds the offline demo competition, copies notebooks/00-03 into a temp folder with the parameters
cell set to it (data_dir, work_dir, preset, model; the repo's notebooks are never edited), starts JupyterLab on a
free port with a token and a kernel that imports this checkout's kitlib, then in Chromium: opens 00_setup, runs all,
clicks every preset button the picker offers (then back to the chosen preset), checks each preset's rows without
training it (the summary follows the click, the batch and memory rows agree, figures rounded, run.json holds the
click), changes the advanced epochs value, runs the setup cell and checks what it saved; then opens 01, 02, 03 and
runs all. Several presets (``--preset smoke,fast``) share one JupyterLab server and one browser.
After each notebook it takes a screenshot and fails on:

- a Python error (an error output) or any red stderr box (warnings included: a user sees a red box either way);
- a missing or broken widget (the picker in 00, the progress bar in 02; "Error displaying widget", a text repr);
- a stale summary: text in the picker's cell, the widget's table or the setup cell's output naming another preset
  or epochs value than the one clicked;
- a progress bar left red (bar style 'danger') after training stopped normally (completed, early stopping);
- an unrounded number (7+ decimals) in printed text;
- what the run shows: the picker's time row not an estimate of the whole run (01 features, 02 training, 03 predict;
  02's share must not fall when epochs go up); a throughput on screen under another name than samples/s or tokens/s
  (sps=, samples_per_s, tqdm's it/s), or missing from the bar, 02's history table or the doctor, or a doctor whose
  samples/s are not the history table's; 02's history table
  with a figure past 4 significant digits, or not indexed by the 1-based epoch alone; 02's loss plot not drawn, without
  train and eval loss in one legend, without "kept: epoch N (best metric x)" matching the summary line, or with
  fractional epoch ticks (the kernel sends SVG beside PNG, so the figure's text can be read); 03 without a summary of
  its predictions (class counts or quantiles), or warning that every row gets one answer exactly when it does not.
  kitlib's verdicts on a weak model (that warning, "does not beat the trivial baseline") are expected red boxes.

One line per finding (with the screenshot's name), exit status 1 when there is any, 0 when clean, 2 when the check
itself could not run. ``--docs`` copies close-ups of 00's picker (with the whole-run estimate) and of 02's history
table and loss plot, the picker and 03's summary to docs/browser_{estimate,history,picker,infer}.png.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = ("00_setup", "01_features", "02_train", "03_infer")
# Variables that make kitlib (rightly) treat the kernel as headless; a person at JupyterLab has none of them.
HEADLESS_VARS = ("CI", "GITHUB_ACTIONS", "KIT_HEADLESS", "KAGGLE_KERNEL_RUN_TYPE", "KAGGLE_IS_COMPETITION_RERUN")
KIT_VARS = ("KIT_DATA_DIR", "KIT_WORK_DIR", "KIT_PRESET", "KIT_MODEL", "KIT_TASK")  # would override the parameters
NORMAL_STOPS = ("completed", "early_stopping", "budget", "time_budget")


class CheckError(RuntimeError):
    """The check itself could not run (not a finding about the notebooks)."""


class Findings:
    def __init__(self, label: str) -> None:
        self.label, self.items = label, []  # type: tuple[str, list[str]]

    def add(self, notebook: str, what: str, shot: str) -> None:
        line = f"FAIL [{self.label}] {notebook}: {what} (screenshot {shot})"
        if line in self.items:
            return
        self.items.append(line)
        print(line, flush=True)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------------------------ set-up


def set_parameters(nb_path: Path, values: dict[str, Any]) -> None:
    """Set ``name = value`` lines in the copy's tagged parameters cell (keeps the comments)."""
    nb = json.loads(nb_path.read_text())
    cell = next((c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])), None)
    if cell is None:
        raise CheckError(f"{nb_path.name}: no cell tagged 'parameters'")
    source = "".join(cell["source"])
    for name, value in values.items():
        pattern = re.compile(rf"^{re.escape(name)} = [^#\n]*?(\s*#.*)?$", re.M)
        if not pattern.search(source):
            raise CheckError(f"{nb_path.name}: no '{name} = ...' line in the parameters cell")
        source = pattern.sub(lambda m, k=name, v=value: f"{k} = {v!r}{m.group(1) or ''}", source, count=1)
    cell["source"] = source.splitlines(keepends=True)
    nb_path.write_text(json.dumps(nb, indent=1))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_settings(root: Path) -> Path:
    """JupyterLab user settings: every cell in the DOM (no windowing), no news/update toasts over the screenshots."""
    settings = root / "lab-settings"
    files = {
        # recordTiming: each cell's start and end in its metadata, for the log of where a notebook's time went
        "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none", "recordTiming": True},
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
            "fetchNews": "false",
            "checkForUpdates": False,
        },
    }
    for rel, value in files.items():
        (settings / rel).parent.mkdir(parents=True, exist_ok=True)
        (settings / rel).write_text(json.dumps(value))
    return settings


def write_kernelspec(root: Path) -> Path:
    """A python3 kernelspec for *this* interpreter (the venv's ipywidgets), importing this checkout's kitlib."""
    data = root / "jupyter-data"
    spec = data / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                # SVG beside PNG: JupyterLab draws the SVG, and its text (legend, ticks) can be read back for checks
                "argv": [
                    sys.executable,
                    "-m",
                    "ipykernel_launcher",
                    "-f",
                    "{connection_file}",
                    "--InlineBackend.figure_formats=png",
                    "--InlineBackend.figure_formats=svg",
                ],
                "display_name": "Python 3 (browser check)",
                "language": "python",
                "env": {"PYTHONPATH": str(REPO)},
            }
        )
    )
    return data


def widgets_data_dir() -> str | None:
    """<prefix>/share/jupyter of the installed jupyterlab_widgets (where its labextension is), if any."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution("jupyterlab_widgets")
    except PackageNotFoundError:
        return None
    for f in dist.files or []:
        if "share/jupyter/labextensions" in str(f):
            path = Path(dist.locate_file(f)).resolve()
            parts = path.parts
            i = max(k for k in range(len(parts)) if parts[k : k + 2] == ("share", "jupyter"))
            return str(Path(*parts[: i + 2]))
    return None


@contextlib.contextmanager
def jupyterlab(root: Path, out: Path) -> Iterator[tuple[str, str]]:
    port, token = free_port(), secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if k not in HEADLESS_VARS + KIT_VARS}
    # our kernelspec first; then the data folder of the jupyterlab_widgets that this Python imports (the widget
    # frontend; in a --system-site-packages venv it may sit in the base interpreter's prefix, not the venv's)
    env["JUPYTER_PATH"] = os.pathsep.join(
        [str(write_kernelspec(root)), *filter(None, [widgets_data_dir(), env.get("JUPYTER_PATH")])]
    )
    env["JUPYTER_RUNTIME_DIR"] = str(root / "runtime")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    cmd = [
        sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root / 'nb'}",
        f"--LabApp.user_settings_dir={write_settings(root)}", f"--LabApp.workspaces_dir={root / 'workspaces'}",
        "--LabApp.expose_app_in_browser=True",
        *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
    ]  # fmt: skip
    logf = open(out / "jupyterlab.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(cmd, cwd=root / "nb", env=env, stdout=logf, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            if proc.poll() is not None:
                raise CheckError(f"JupyterLab exited with {proc.returncode}: see {out / 'jupyterlab.log'}")
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                raise CheckError(f"JupyterLab did not answer on {base} in 90 s: see {out / 'jupyterlab.log'}")
            time.sleep(0.5)
        yield base, token
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        logf.close()


# ------------------------------------------------------------------------------------------------- the browser

JS_STATE = """() => {
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  if (!w || !w.sessionContext || !w.content) return {ready: false};
  const k = w.sessionContext.session && w.sessionContext.session.kernel;
  const prompts = [...w.content.node.querySelectorAll('.jp-Cell.jp-CodeCell .jp-InputPrompt')].map(p => p.textContent);
  return {ready: !!k, status: k ? k.status : null, busy: prompts.some(t => t.includes('*')), prompts};
}"""

JS_OUTPUTS = """() => {
  const nb = window.jupyterapp.shell.currentWidget.content;
  const cells = [];
  for (let i = 0; i < nb.model.cells.length; i++) {
    const c = nb.model.cells.get(i);
    const timing = c.getMetadata ? c.getMetadata('execution') : c.metadata.get('execution');  // JupyterLab 4 : 3
    cells.push({type: c.type, source: c.sharedModel.getSource(),
                outputs: c.type === 'code' ? c.outputs.toJSON() : [], execution: timing || null});
  }
  return cells;
}"""


class Notebook:
    def __init__(self, page: Any, name: str, out: Path, timeout_s: float, folder: str) -> None:
        self.page, self.name, self.out, self.timeout_s, self.folder = page, name, out, timeout_s, folder

    def open(self, base: str, token: str) -> None:
        page = self.page
        page.goto(f"{base}/lab/tree/{self.folder}/{self.name}.ipynb?token={token}&reset")
        page.wait_for_function("() => !!window.jupyterapp", timeout=90_000)
        page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell", timeout=90_000)
        self.wait_idle(90, what="kernel start")
        with contextlib.suppress(Exception):  # more room for the notebook in the screenshots
            page.evaluate("() => { window.jupyterapp.shell.collapseLeft(); window.jupyterapp.shell.collapseRight(); }")
        # dismiss any toast or dialog that would sit over the cells
        for sel in (".jp-Dialog button.jp-mod-reject", ".jp-toast-button"):
            with contextlib.suppress(Exception):
                if page.locator(sel).count():
                    page.locator(sel).first.click(timeout=2000)

    def wait_idle(self, timeout_s: float, *, what: str) -> None:
        deadline, idle_since = time.time() + timeout_s, None
        while time.time() < deadline:
            state = self.page.evaluate(JS_STATE)
            if state.get("ready") and state["status"] == "idle" and not state["busy"]:
                idle_since = idle_since or time.time()
                if time.time() - idle_since > 1.5:  # stays idle (outputs and widget views settle)
                    return
            else:
                idle_since = None
            time.sleep(0.5)
        raise CheckError(f"{self.name}: {what} did not finish in {timeout_s:.0f} s")

    def run_all(self) -> float:
        page, t0 = self.page, time.perf_counter()
        page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Run$")).click()
        page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()
        time.sleep(1.0)
        self.wait_idle(self.timeout_s, what="run all")
        took = time.perf_counter() - t0
        log(f"{self.name}: run all {took:.0f} s; cells {self.cell_seconds()}")
        return took

    def cell_seconds(self) -> str:
        """Each code cell's seconds (JupyterLab's recordTiming), "cell: s" for those over 1 s."""
        from datetime import datetime

        def at(stamp: str) -> float:
            return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()

        took = {}
        for i, cell in enumerate(self.cells()):
            run = cell.get("execution") or {}
            if "iopub.execute_input" in run and "shell.execute_reply" in run:
                took[i] = at(run["shell.execute_reply"]) - at(run["iopub.execute_input"])
        return ", ".join(f"{i}: {t:.0f}" for i, t in took.items() if t >= 1) or "-"

    def run_cell(self, index: int) -> None:
        cell = self.cell(index)
        cell.locator(".jp-InputPrompt").first.click()
        self.page.keyboard.press("Control+Enter")  # run in place (Shift+Enter on the last cell adds one)
        time.sleep(1.0)
        self.wait_idle(self.timeout_s, what=f"cell {index}")

    def cell(self, index: int) -> Any:
        """The cell's DOM node, marked through JupyterLab's own widget list (robust to its layout containers)."""
        self.page.evaluate(
            "() => window.jupyterapp.shell.currentWidget.content.widgets"
            ".forEach((w, i) => w.node.setAttribute('data-bc-index', String(i)))"
        )
        return self.page.locator(f'.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell[data-bc-index="{index}"]')

    def cells(self) -> list[dict[str, Any]]:
        return list(self.page.evaluate(JS_OUTPUTS))

    def index_of(self, needle: str) -> int:
        for i, c in enumerate(self.cells()):
            if c["type"] == "code" and needle in c["source"]:
                return i
        raise CheckError(f"{self.name}: no code cell contains {needle!r}")

    def tall(self) -> dict[str, int]:
        """Make the viewport as tall as the notebook's content (so nothing scrolls); returns the old size."""
        page, size = self.page, self.page.viewport_size
        js = (
            "() => { const p = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');"
            " const v = p.querySelector('.jp-WindowedPanel-viewport') || p.querySelector('.jp-Notebook');"
            " const o = p.querySelector('.jp-WindowedPanel-outer') || p.querySelector('.jp-Notebook');"
            " return {content: v.scrollHeight, box: o.clientHeight}; }"
        )
        for _ in range(3):  # outputs may reflow at the new size
            m = page.evaluate(js)
            extra = m["content"] - m["box"]
            if extra <= 4:
                break
            height = min(page.viewport_size["height"] + extra + 40, 16000)
            page.set_viewport_size({"width": size["width"], "height": int(height)})
            time.sleep(0.8)
        page.evaluate(
            "() => { const p = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');"
            " for (const o of p.querySelectorAll('.jp-WindowedPanel-outer, .jp-Notebook')) o.scrollTop = 0; }"
        )
        time.sleep(0.3)
        return size

    def screenshot(self, tag: str = "") -> str:
        """The whole notebook: the viewport is made as tall as its content for the shot."""
        page = self.page
        name = f"{self.name}{'_' + tag if tag else ''}.png"
        size = self.tall()
        page.screenshot(path=str(self.out / name))
        page.set_viewport_size(size)
        return name

    def shot_cells(self, indices: list[int], name: str, part: str = "") -> str:
        """A clip around some cells, or around a part of each (``part``: a selector, e.g. ".jp-OutputArea")."""
        page = self.page
        size = self.tall()
        for _ in range(5):  # under load the layout may still be settling at the new size: measure again
            nodes = [self.cell(i).locator(part).first if part else self.cell(i) for i in indices]
            boxes = [b for b in (n.bounding_box() for n in nodes) if b]
            view = page.viewport_size
            x0, y0 = max(0.0, min(b["x"] for b in boxes)), max(0.0, min(b["y"] for b in boxes))
            x1 = min(float(view["width"]), max(b["x"] + b["width"] for b in boxes))
            y1 = min(float(view["height"]), max(b["y"] + b["height"] for b in boxes))
            if x1 - x0 >= 1 and y1 - y0 >= 1:
                break
            time.sleep(1.0)
            self.tall()
        page.screenshot(path=str(self.out / name), clip={"x": x0, "y": y0, "width": x1 - x0, "height": y1 - y0})
        page.set_viewport_size(size)
        return name

    def shutdown(self) -> None:
        with contextlib.suppress(Exception):
            self.page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")


# ---------------------------------------------------------------------------------------------------- checks


def output_text(output: dict[str, Any]) -> str:
    if output.get("output_type") == "stream":
        text = output.get("text", "")
    elif output.get("output_type") == "error":
        text = "\n".join(output.get("traceback", [])) or f"{output.get('ename')}: {output.get('evalue')}"
    else:
        text = output.get("data", {}).get("text/plain", "")
    text = "".join(text) if isinstance(text, list) else str(text)
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def first_line(text: str, limit: int = 160) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    line = next((ln for ln in lines if re.search(r"Error|Warning|warn", ln)), lines[0] if lines else "")
    return line[:limit]


def advisory_only(stderr: str) -> bool:
    """Every warning in this red box is one of kitlib's verdicts on a weak model (a smoke run's, rightly shown)."""
    warned = [ln for ln in stderr.splitlines() if re.search(r"\w+(Warning|Error): ", ln)]
    return bool(warned) and all(any(a in ln for a in ADVISORY) for ln in warned)


def check_common(nb: Notebook, findings: Findings, shot: str, *, stop_reason: str | None = None) -> None:
    """Errors, red boxes, broken widgets, red bars, unrounded numbers: from the model and from what is drawn."""
    page = nb.page
    for i, cell in enumerate(nb.cells()):
        for output in cell["outputs"]:
            kind = output.get("output_type")
            text = output_text(output)
            if kind == "error":
                findings.add(nb.name, f"Python error in cell {i}: {output.get('ename')}: {output.get('evalue')}", shot)
            elif kind == "stream" and output.get("name") == "stderr" and advisory_only(text):
                log(f"{nb.name}: kitlib's verdict on a weak model in cell {i} (expected): {first_line(text)}")
            elif kind == "stream" and output.get("name") == "stderr":
                findings.add(nb.name, f"red stderr/warning box in cell {i}: {first_line(text)}", shot)
            if kind == "stream" and output.get("name") == "stdout":
                for m in re.finditer(r"(?<![\w.])\d+\.\d{7,}(?![\d])", text):
                    line = next(ln for ln in text.splitlines() if m.group(0) in ln).strip()
                    findings.add(nb.name, f"unrounded number {m.group(0)} in cell {i}: {line[:120]!r}", shot)
    # what the browser drew: widgets that failed, red progress bars
    scope = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook"
    drawn = page.evaluate(
        """(scope) => {
          const nb = document.querySelector(scope);
          const txt = e => (e.textContent || '').trim().slice(0, 160);
          return {
            errorWidgets: [...nb.querySelectorAll('.jupyter-widgets-error-widget, .jupyter-widgets-loading')]
                            .map(txt),
            errorText: [...nb.querySelectorAll('.jp-OutputArea-output')].map(txt)
                            .filter(t => /Error displaying widget|Failed to load model class|model not found/.test(t)),
            reprText: [...nb.querySelectorAll('.jp-OutputArea-output[data-mime-type="text/plain"]')].map(txt)
                            .filter(t => /^(VBox|HBox|FloatProgress|IntProgress|ToggleButtons)\\(/.test(t)),
            redBars: [...nb.querySelectorAll('.progress-bar-danger, .jupyter-widget-progress-bar-danger')].length,
            redBoxes: nb.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
                            .length,
          };
        }""",
        scope,
    )
    for t in drawn["errorWidgets"] + drawn["errorText"]:
        findings.add(nb.name, f"widget failed to render: {t!r}", shot)
    for t in drawn["reprText"]:
        findings.add(nb.name, f"widget shown as text (no widget frontend): {t[:100]!r}", shot)
    if drawn["redBars"]:
        if stop_reason is None or stop_reason in NORMAL_STOPS:
            findings.add(nb.name, f"progress bar left red (danger) after a normal stop ({stop_reason})", shot)
        else:
            log(f"{nb.name}: red bar after stop reason {stop_reason} (not a normal stop: not a finding)")
    log(f"{nb.name}: {drawn['redBoxes']} red box(es) drawn, {drawn['redBars']} red bar(s)")


# ------------------------------------------------------------------------- what the run shows: one truth on screen

THROUGHPUT = ("samples/s", "tokens/s")  # kitlib.progress.THROUGHPUT's names: the bar's, the history's, the doctor's
# other names for a throughput figure (tqdm's own it/s rate included): none may be on screen beside those two
OTHER_THROUGHPUT = re.compile(r"\bsps=|samples_per_s|tokens_per_s|samples/sec|\d\s?it/s\b")
DURATION = r"(?:<1 s|\d+(?:\.\d+)? (?:s|min|h))"
WHOLE_RUN = re.compile(
    rf"^~(?P<total>{DURATION}) for the whole run: 01 [\w ]+? (?P<features>{DURATION}), "
    rf"02 training (?P<train>{DURATION})(?: \([^)]*\))?, 03 predict (?P<predict>{DURATION})"
)
SAME_ANSWER = "rows predicts"  # views.prediction_summary's warning: every row gets one answer
ADVISORY = (SAME_ANSWER, "does not beat the trivial baseline")  # kitlib's verdicts on a weak model: expected red boxes


def seconds(duration: str) -> float:
    """estimate.duration's text back in seconds ("<1 s" -> 0.5)."""
    if duration.startswith("<"):
        return 0.5
    value, unit = duration.split()
    return float(value) * {"s": 1, "min": 60, "h": 3600}[unit]


def check_estimate(
    nb: Notebook, findings: Findings, table: dict[str, str], clicked: str, shot: str
) -> dict[str, float]:
    """The picker's time row estimates the whole run (01 features, 02 training, 03 predict), not one epoch or one
    pass; returns its parts in seconds ({} when it does not)."""
    text = table.get("time", "")
    m = WHOLE_RUN.match(text)
    if not m:
        findings.add(
            nb.name, f"no whole-run estimate in the picker's time row after clicking {clicked!r}: {text!r}", shot
        )
        return {}
    return {k: seconds(v) for k, v in m.groupdict().items()}


def check_picker_rows(
    nb: Notebook, findings: Findings, table: dict[str, str], clicked: str, work: Path, shot: str
) -> None:
    """Each preset's picker rows, without training it: the batch row and the memory row name one micro-batch and
    accumulation, no figure past 4 significant digits, and run.json (what 01 reads) holds the clicked preset."""
    batch = re.match(r"(\d+) x (\d+) accum", table.get("batch", ""))
    memory = re.search(r"micro-batch (\d+) x accumulation (\d+)", table.get("memory", ""))
    if batch and memory and batch.groups() != memory.groups():
        findings.add(nb.name, f"{clicked}: the batch row says {batch.group(0)!r}, the memory row {memory.group(0)!r}",
                     shot)  # fmt: skip
    for row, text in table.items():
        for figure in re.findall(r"(?<![\w.])\d+\.\d{5,}(?![\d])", text):
            findings.add(nb.name, f"{clicked}: an unrounded figure {figure} in the picker's {row} row", shot)
    deadline = time.time() + 10  # the click's save runs in the kernel: give it a moment
    while (got := _saved_run(work))[0] != clicked and time.time() < deadline:
        time.sleep(0.3)
    if got[0] != clicked:
        findings.add(nb.name, f"clicked {clicked!r} after Run All; run.json (what 01 reads) holds {got[0]!r}", shot)
    log(f"{nb.name}: {clicked}: batch {table.get('batch', '?')!r}; memory {table.get('memory', '?')[:60]!r}")


def all_text(nb: Notebook) -> list[tuple[int, str]]:
    """(cell, text) of every output as kernel sent it (stream, plain, HTML) and as the browser drew it (widgets)."""
    found = []
    for i, cell in enumerate(nb.cells()):
        for output in cell["outputs"]:
            found.append((i, output_text(output)))
            found.append((i, str(output.get("data", {}).get("text/html", ""))))
    drawn = nb.page.evaluate(
        "() => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell')].map("
        "c => [Number(c.getAttribute('data-bc-index')), c.querySelector('.jp-OutputArea') ? "
        "c.querySelector('.jp-OutputArea').innerText : ''])"
    )
    return found + [(int(i), str(t)) for i, t in drawn]


def check_throughput(nb: Notebook, findings: Findings, shot: str) -> None:
    """One throughput name: no sps=, samples_per_s, tokens_per_s or tqdm's it/s anywhere on screen."""
    nb.cell(0)  # marks the cells' indices
    for i, text in all_text(nb):
        for m in OTHER_THROUGHPUT.finditer(text):
            line = next((ln for ln in text.splitlines() if m.group(0) in ln), m.group(0)).strip()
            findings.add(nb.name, f"a throughput not named {' or '.join(THROUGHPUT)} in cell {i}: {line[:120]!r}", shot)


def check_train_outputs(nb: Notebook, findings: Findings, shot: str) -> int | None:
    """02: samples/s named in the bar, the history table and the doctor; the history table rounded, indexed by the
    1-based epoch with no other index column; the plot drawn with the kept epoch marked and its metric named.
    Returns the kept epoch the summary line names."""
    i_train, i_plot, i_doctor = nb.index_of("training.train("), nb.index_of("plot_history("), nb.index_of("diagnose(")
    cells = nb.cells()
    summary = "\n".join(output_text(o) for o in cells[i_train]["outputs"])
    kept = re.search(r"best (\S+) \S+ at epoch (\d+)", summary)
    # the bar (drawn widget), the history table, the doctor: each names the throughput
    bar = nb.cell(i_train).locator(".widget-hprogress, .jupyter-widgets.widget-hbox").first
    bar_text = bar.inner_text(timeout=5000) if bar.count() else ""
    doctor = "\n".join(output_text(o) for o in cells[i_doctor]["outputs"])
    table = nb.cell(i_train).locator(".jp-OutputArea-output table.dataframe").first
    if not table.count():
        findings.add(nb.name, "02 shows no history table (a DataFrame) under the training cell", shot)
        return None
    head = [t.strip() for t in table.locator("thead tr").first.locator("th").all_inner_texts()]
    for where, text in (("progress bar", bar_text), ("history table", " ".join(head)), ("doctor", doctor)):
        if not any(name in text for name in THROUGHPUT):
            findings.add(nb.name, f"the {where} names no throughput as {' or '.join(THROUGHPUT)}: {text[:120]!r}", shot)
    # one figure per fact: the doctor says the history table's samples/s, epoch by epoch (2 + ... + 2 past 5 epochs)
    column = (
        [r.locator("td").nth(head.index("samples/s") - 1).inner_text().strip() for r in table.locator("tbody tr").all()]
        if "samples/s" in head
        else []
    )
    said = re.search(r"throughput by epoch: (.*?) samples/s", doctor)
    want = column if len(column) <= 5 else [*column[:2], "...", *column[-2:]]
    if not said or said.group(1).split(", ") != want:
        findings.add(nb.name, f"the doctor's samples/s ({said.group(1) if said else None!r}) are not the history "
                     f"table's ({want})", shot)  # fmt: skip
    # rounded, 1-based epochs, no extra index column
    index_names = [t.strip() for t in table.locator("thead tr").nth(1).locator("th").all_inner_texts()]
    rows = table.locator("tbody tr").all()
    epochs = [r.locator("th").all_inner_texts() for r in rows]
    if index_names[:1] != ["epoch"] or any(len(e) != 1 for e in epochs):
        findings.add(
            nb.name, f"the history table is not indexed by epoch alone (index {index_names}, rows {epochs[:2]})", shot
        )
    elif [e[0].strip() for e in epochs] != [str(n) for n in range(1, len(epochs) + 1)]:
        findings.add(nb.name, f"the history table's epochs are not 1, 2, ...: {[e[0] for e in epochs]}", shot)
    if "epoch" in head:
        findings.add(nb.name, "the history table has an epoch column beside its epoch index", shot)
    for row in rows:
        for value in row.locator("td").all_inner_texts():
            if value.strip() in ("NaN", "nan", "None", "<NA>"):
                findings.add(nb.name, f"a {value.strip()} in the history table (a figure not measured: blank)", shot)
            if not re.fullmatch(r"-?\d+\.\d+|-?\d+(\.\d+)?e[-+]\d+", value.strip()):
                continue  # integers (steps) are exact; NaN, text
            whole, _, fraction = value.strip().lstrip("-").split("e")[0].partition(".")
            if len((whole + fraction.rstrip("0")).lstrip("0")) > 4:  # pandas pads a column with zeros: not digits
                findings.add(
                    nb.name, f"a figure with more than 4 significant digits in the history table: {value!r}", shot
                )
    # the plot: drawn, losses on one axis, the kept epoch marked with its metric, whole-number epoch ticks
    outputs = cells[i_plot]["outputs"]
    svg = next((str(o["data"]["image/svg+xml"]) for o in outputs if "image/svg+xml" in o.get("data", {})), None)
    drawn = nb.cell(i_plot).locator(".jp-OutputArea-output img, .jp-OutputArea-output svg").count()
    if svg is None or not drawn:
        findings.add(nb.name, f"02's loss plot is not drawn (svg output {svg is not None}, drawn images {drawn})", shot)
        return int(kept.group(2)) if kept else None
    texts = re.findall(r"<!-- (.*?) -->", svg)
    marks = [re.fullmatch(r"kept: epoch (\d+) \(best (\S+)(?: (\S+))?\)", t) for t in texts]
    mark = next((m for m in marks if m), None)
    if mark is None:
        findings.add(
            nb.name,
            f"02's plot does not mark the kept epoch ('kept: epoch N (best metric x)'); its text: {texts}",
            shot,
        )
    elif kept and (mark.group(1), mark.group(2)) != (kept.group(2), kept.group(1)):
        findings.add(
            nb.name,
            f"02's plot marks epoch {mark.group(1)} by {mark.group(2)}, the summary kept epoch {kept.group(2)} by "
            f"{kept.group(1)}",
            shot,
        )
    for label in ("train loss", "eval loss"):
        if label not in texts:
            findings.add(nb.name, f"02's plot has no {label!r} line in its legend (losses on one axis)", shot)
    x_axis = svg.split('id="matplotlib.axis_1"', 1)[-1].split('id="matplotlib.axis_2"', 1)[0]
    ticks = re.findall(r'<g id="xtick_\d+">.*?<!-- (.*?) -->', x_axis, re.S)
    if any(not re.fullmatch(r"\d+", t) for t in ticks):
        findings.add(nb.name, f"02's plot has epoch ticks that are not whole numbers: {ticks}", shot)
    log(f"{nb.name}: plot legend {mark.group(0) if mark else '?'}; epoch ticks {ticks}; table head {head}")
    return int(kept.group(2)) if kept else None


def check_predictions(nb: Notebook, findings: Findings, shot: str) -> None:
    """03 prints a summary of its predictions (class counts or quantiles), and warns exactly when every row gets
    the same answer."""
    i_infer = nb.index_of("training.infer(")
    outputs = nb.cells()[i_infer]["outputs"]
    stdout = "\n".join(output_text(o) for o in outputs if o.get("name") == "stdout")
    stderr = "\n".join(output_text(o) for o in outputs if o.get("name") == "stderr")
    lines = re.findall(r"^\S+: .*\((\d+) rows(?:, (\d+) distinct)?\)$", stdout, re.M)
    if not lines:
        findings.add(
            nb.name, f"03 prints no summary of its predictions (class counts or quantiles): {stdout[-200:]!r}", shot
        )
        return
    constant = any(distinct == "1" for _, distinct in lines)
    if constant and SAME_ANSWER not in stderr:
        findings.add(nb.name, "every prediction is the same answer and 03 does not warn", shot)
    if not constant and SAME_ANSWER in stderr:
        findings.add(nb.name, "03 warns that every row gets one answer, its summary shows several", shot)
    log(
        f"{nb.name}: prediction summary {[ln for ln in stdout.splitlines() if 'rows' in ln]}; same-answer warning "
        f"{'shown' if SAME_ANSWER in stderr else 'not shown'}"
    )


def table_of(cell: Any) -> dict[str, str]:
    """The picker widget's summary table (th -> td) as drawn."""
    rows = cell.locator(".jp-OutputArea-output table tr").all()
    table = {}
    for row in rows:
        with contextlib.suppress(Exception):
            table[row.locator("th").inner_text(timeout=500).strip()] = row.locator("td").inner_text(timeout=500)
    return table


def stale_text(cell_outputs: list[dict[str, Any]], preset: str, epochs: int | None) -> list[str]:
    """Plain-text outputs in the picker's cell that name another preset or epochs than the widget shows."""
    problems = []
    for output in cell_outputs:
        if output.get("output_type") == "error":
            continue
        text = output_text(output)
        if not text or ("widget-view" in json.dumps(output.get("data", {})) and "PresetPicker" not in text):
            continue
        names = re.findall(r"PresetPicker\('([^']+)'\)", text) + re.findall(r"^preset\s+(\S+)", text, re.M)
        for name in names:
            if name != preset:
                problems.append(f"text under the picker says preset {name!r}, the picker shows {preset!r}")
        if epochs is not None:
            for value in re.findall(r"^epochs\s+(\d+)", text, re.M):
                if int(value) != epochs:
                    problems.append(f"text under the picker says epochs {value}, the picker shows {epochs}")
    return problems


def wait_table(cell: Any, key: str, want: str, timeout_s: float = 15) -> dict[str, str]:
    deadline, table = time.time() + timeout_s, {}
    while time.time() < deadline:
        table = table_of(cell)
        if table.get(key, "").split(" ")[0] == want:
            return table
        time.sleep(0.3)
    return table


def _saved_run(work: Path) -> tuple[Any, Any]:
    """(preset name, epochs) of work/run.json, the choice 01 resolves (the picker's override, else the preset's);
    ("?", the reason) when it cannot be read."""
    try:
        saved = json.loads((work / "run.json").read_text())
        return saved["preset"]["name"], saved["overrides"].get("epochs", saved["preset"]["epochs"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        return "?", f"? ({type(err).__name__}: {err})"


def drive_setup(
    nb: Notebook, findings: Findings, preset: str, epochs: int, work: Path
) -> tuple[str, str, dict[str, float]]:
    page = nb.page
    nb.run_all()
    i_picker = nb.index_of("preset_picker(")
    i_setup = nb.index_of("picker.save()")
    cell = nb.cell(i_picker)
    cell.scroll_into_view_if_needed()
    shot = f"{nb.name}.png"
    buttons = cell.locator("button.widget-toggle-button")
    try:
        buttons.first.wait_for(timeout=20_000)
    except Exception:
        shot = nb.screenshot("no_widget")
        findings.add(nb.name, "the preset picker widget is missing (no preset buttons drawn)", shot)
        check_common(nb, findings, shot)
        return shot, shot, {}
    labels = [b.strip() for b in buttons.all_inner_texts()]
    log(f"{nb.name}: picker buttons {labels}")
    steps = [*(n for n in labels if n != preset), preset]  # every preset the picker offers, then the chosen one
    estimate: dict[str, float] = {}
    for name in steps:
        if name not in labels:
            findings.add(nb.name, f"no {name!r} button in the picker (buttons: {labels})", shot)
            continue
        cell.locator("button.widget-toggle-button", has_text=re.compile(rf"^\s*{re.escape(name)}\s*$")).click()
        table = wait_table(cell, "preset", name)
        shown = table.get("preset", "(no table)").split(" ")[0]
        if shown != name:
            findings.add(nb.name, f"stale summary: clicked {name!r}, the picker's table shows {shown!r}", shot)
        for problem in stale_text(nb.cells()[i_picker]["outputs"], name, None):
            findings.add(nb.name, f"stale summary after clicking {name!r}: {problem}", shot)
        check_picker_rows(nb, findings, table, name, work, shot)
        estimate = check_estimate(nb, findings, table, name, shot)
    # the advanced section: open it, change epochs
    header = cell.locator('[class*="Collapse-header"], .p-Accordion-child .p-Collapse-header', has_text="advanced")
    if header.count() == 0:
        findings.add(nb.name, "the picker has no 'advanced' section", shot)
    else:
        box = cell.locator(".widget-text", has=page.locator("label", has_text=re.compile(r"^\s*epochs\s*$")))
        field = box.locator("input").first
        if not field.is_visible():  # ipywidgets 8 starts with the section closed, 7 with it open
            header.first.click()
        try:
            field.wait_for(state="visible", timeout=10_000)
            field.fill(str(epochs))
            field.press("Enter")
            field.evaluate("e => e.blur()")  # IntText commits on Enter (8) or on blur (7)
        except Exception as err:
            findings.add(nb.name, f"could not set the advanced epochs value: {str(err).splitlines()[0]}", shot)
        table = wait_table(cell, "epochs", str(epochs))
        if table.get("epochs") != str(epochs):
            findings.add(
                nb.name,
                f"stale summary: epochs set to {epochs}, the picker's table shows {table.get('epochs')!r}",
                shot,
            )
        for problem in stale_text(nb.cells()[i_picker]["outputs"], preset, epochs):
            findings.add(nb.name, f"stale summary after setting epochs={epochs}: {problem}", shot)
        more = check_estimate(nb, findings, table, f"epochs {epochs}", shot)
        if estimate and more and more["train"] < estimate["train"]:  # one more epoch cannot train in less time
            findings.add(
                nb.name,
                f"stale estimate: epochs raised to {epochs}, 02 training's estimate fell from {estimate['train']:.0f} "
                f"to {more['train']:.0f} s",
                shot,
            )
        estimate = more or estimate
    time.sleep(0.5)
    picker_shot = nb.shot_cells([i_picker], f"{nb.name}_picker.png")
    got = _saved_run(work)  # Run All saved the run; each click after it saves again: run.json is what the picker shows
    if got != (preset, epochs):
        findings.add(nb.name, f"the picker shows {preset}/{epochs} but run.json (what 01 reads) holds {got[0]}, "
                     f"epochs {got[1]}, before the save cell is run again", shot)  # fmt: skip
    nb.run_cell(i_setup)
    got = _saved_run(work)  # what the setup cell saved for 01-03 (it prints only the preset's name)
    if got != (preset, epochs):
        findings.add(nb.name, f"stale run: the setup cell saved preset {got[0]}, epochs {got[1]}; the picker showed "
                     f"{preset}/{epochs}", shot)  # fmt: skip
    shot = nb.screenshot()
    check_common(nb, findings, shot)
    check_throughput(nb, findings, shot)
    return shot, picker_shot, estimate


def stop_reason_of(nb: Notebook) -> str | None:
    """FitResult.stop_reason from the summary line 02 prints ("stopped: early stop (patience 2) after ...")."""
    said = {
        "completed": "completed",
        "early stop": "early_stopping",
        "time budget": "time_budget",
        "SIGTERM": "sigterm",
    }
    for cell in nb.cells():
        for output in cell["outputs"]:
            m = re.search(r"stopped: (\S.*)", output_text(output))
            if m:
                return next((v for k, v in said.items() if m.group(1).startswith(k)), m.group(1).split()[0])
    return None


def small_png(src: Path, dst: Path, limit: int = 290_000) -> None:
    """Copy a screenshot, shrinking it (palette, then scale) until it is under ``limit`` bytes."""
    shutil.copyfile(src, dst)
    if dst.stat().st_size <= limit:
        return
    from PIL import Image

    img = Image.open(src).convert("RGB")
    scale = 1.0
    while True:
        w, h = int(img.width * scale), int(img.height * scale)
        im = img.resize((w, h), Image.LANCZOS) if scale < 1 else img
        im.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(dst, optimize=True)
        if dst.stat().st_size <= limit or scale < 0.4:
            return
        scale *= 0.85


# ------------------------------------------------------------------------------------------------------- main


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for pkg in ("ipywidgets", "jupyterlab", "jupyterlab_widgets", "widgetsnbextension", "tqdm", "playwright"):
        try:
            found[pkg] = version(pkg)
        except PackageNotFoundError:
            found[pkg] = "-"
    return found


def check_preset(
    page: Any, base: str, token: str, root: Path, out: Path, findings: Findings, args: Any, preset: str, data: Path
) -> dict[str, str]:
    """One preset's pass: 00 driven (every preset clicked, ending on ``preset``), then 01-03 run all; its notebooks
    in root/nb/<preset>, its work_dir root/work-<preset>. Returns the screenshots' names (in ``out``)."""
    from kitlib.notebook.presets import PRESETS

    epochs = args.epochs or PRESETS[preset].epochs + 1
    (root / "nb" / preset).mkdir(parents=True)
    work = root / f"work-{preset}"
    for name in NOTEBOOKS:
        dst = root / "nb" / preset / f"{name}.ipynb"
        shutil.copyfile(REPO / "notebooks" / f"{name}.ipynb", dst)
        if name == "00_setup":
            set_parameters(
                dst, {"data_dir": str(data.resolve()), "work_dir": str(work), "preset": preset, "model": args.model}
            )
        else:
            set_parameters(dst, {"work_dir": str(work)})
    shots: dict[str, str] = {}
    estimate: dict[str, float] = {}
    measured: dict[str, float] = {}
    for name in NOTEBOOKS:
        nb = Notebook(page, name, out, args.timeout, preset)
        t0 = time.perf_counter()
        log(f"{preset} {name}: open")
        nb.open(base, token)
        if name == "00_setup":
            shots[name], shots["picker"], estimate = drive_setup(nb, findings, preset, epochs, work)
            i_picker = nb.index_of("preset_picker(")
            shots["estimate"] = nb.shot_cells([i_picker], f"{name}_estimate.png", ".jp-OutputArea")
        else:
            measured[name] = nb.run_all()
            reason = stop_reason_of(nb) if name == "02_train" else None
            if name == "02_train":
                log(f"{name}: stopped: {reason}")
            shots[name] = nb.screenshot()
            check_common(nb, findings, shots[name], stop_reason=reason)
            check_throughput(nb, findings, shots[name])
            if name == "03_infer":
                check_predictions(nb, findings, shots[name])
                shots["infer"] = nb.shot_cells([nb.index_of("training.infer(")], f"{name}_summary.png")
            if name == "02_train":
                page.evaluate("() => 0")
                bars = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .progress-bar").count()
                if bars == 0:
                    findings.add(name, "no progress-bar widget drawn for training", shots[name])
                i_train = nb.index_of("training.train(")
                plot = [i_train + 1] if i_train + 1 < len(nb.cells()) else []
                shots["train"] = nb.shot_cells([i_train, *plot], f"{name}_train.png")
                check_train_outputs(nb, findings, shots[name])
                shots["history"] = nb.shot_cells(
                    [i_train, nb.index_of("plot_history(")], f"{name}_history.png", ".jp-OutputArea"
                )
        log(f"{preset} {name}: done in {time.perf_counter() - t0:.0f} s (screenshot {shots[name]})")
        nb.shutdown()
    if estimate:  # a log line, not a finding: the browser's own overhead and a shared CPU are in "measured"
        log(
            f"{preset}: whole-run estimate ~{estimate['total']:.0f} s (01 {estimate['features']:.0f}, "
            f"02 {estimate['train']:.0f}, 03 {estimate['predict']:.0f}); measured: run all of 01-03 "
            f"{sum(measured.values()):.0f} s "
            f"({', '.join(f'{k[:2]} {v:.0f}' for k, v in measured.items())}; kernel start and browser included)"
        )
    return shots


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="screenshots and logs (default: a new temp folder)")
    ap.add_argument("--data", type=Path, help="a competition folder (default: python -m kitlib demo into the temp)")
    ap.add_argument("--preset", default="smoke", help="the preset(s) to end on and train with, comma-separated: "
                    "one JupyterLab and one browser for all of them (default smoke)")  # fmt: skip
    ap.add_argument("--rows", type=int, help="keep the demo's first N training rows and N/4 test rows (CI: the screen "
                    "is the subject, not the scale; default: all)")  # fmt: skip
    ap.add_argument("--model", default="tiny", help="the model parameter (default tiny: no download)")
    ap.add_argument("--epochs", type=int, help="the advanced epochs value to set (default: the preset's + 1)")
    ap.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    ap.add_argument("--timeout", type=float, default=900, help="seconds per notebook run (default 900)")
    ap.add_argument("--docs", action="store_true", help="copy the last preset's close-ups into docs/")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder (notebooks, work_dir)")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(REPO))
    from kitlib.notebook.presets import PRESETS

    presets = args.preset.split(",")
    if unknown := [p for p in presets if p not in PRESETS]:
        ap.error(f"--preset {unknown}: each must be one of {list(PRESETS)}")
    if not args.chromium:
        print("no chromium found: apt-get install -y chromium, or pass --chromium PATH", file=sys.stderr)
        return 2
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("playwright is not installed: run scripts/browser_check.sh (it makes the venv)", file=sys.stderr)
        return 2

    vers = versions()
    label = f"ipywidgets {vers['ipywidgets']}, JupyterLab {vers['jupyterlab']}"
    root = Path(tempfile.mkdtemp(prefix="kitlib-browser-"))
    out = (args.out or root / "shots").resolve()
    out.mkdir(parents=True, exist_ok=True)
    log(f"versions: {vers}; chromium {args.chromium}; temp {root}; screenshots {out}")
    counts: dict[str, int] = {}
    t_start = time.perf_counter()
    try:
        data = args.data
        if data is None:
            data = root / "demo"
            subprocess.run(
                [sys.executable, "-m", "kitlib", "demo", str(data)], check=True, cwd=REPO, stdout=subprocess.DEVNULL
            )
            if args.rows:
                from demos import cut_demo  # the checkout's demos (REPO is on sys.path above)

                cut_demo(data, args.rows)
                log(f"demo cut to {args.rows} training and {args.rows // 4} test rows")
        (root / "nb").mkdir()
        with jupyterlab(root, out) as (base, token), sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=args.chromium, headless=True, args=["--no-sandbox", "--disable-dev-shm-usage"]
            )
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            console = open(out / "browser-console.log", "w")  # noqa: SIM115
            page.on("console", lambda m: console.write(f"{m.type}: {m.text}\n"))
            page.on("pageerror", lambda e: console.write(f"pageerror: {e}\n"))
            for preset in presets:
                t0, findings = time.perf_counter(), Findings(f"{label}, preset {preset}")
                (out / preset).mkdir(exist_ok=True)
                shots = check_preset(page, base, token, root, out / preset, findings, args, preset, data)
                counts[preset] = len(findings.items)
                log(f"preset {preset}: {counts[preset]} finding(s) in {time.perf_counter() - t0:.0f} s")
            console.close()
            browser.close()
        if args.docs:
            for shot in ("estimate", "history", "picker", "infer"):
                small_png(out / presets[-1] / shots[shot], REPO / "docs" / f"browser_{shot}.png")
            log(f"copied docs/browser_{{estimate,history,picker,infer}}.png (preset {presets[-1]})")
    except Exception as err:
        if not isinstance(err, CheckError):
            import traceback

            traceback.print_exc()
        print(f"ERROR [{label}] the check could not run: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    finally:
        if not args.keep:
            for folder in ("nb", "demo", *(f"work-{p}" for p in presets)):
                shutil.rmtree(root / folder, ignore_errors=True)
    took = time.perf_counter() - t_start
    said = ", ".join(f"preset {p}: {n} finding(s)" for p, n in counts.items())
    print(f"browser check [{label}]: {said} in {took:.0f} s; screenshots in {out}")
    return 1 if any(counts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
