"""Issue #50 item 2: a headless 00 -> 01 resolves the run once (01, at the tokenizer's lengths) and saves it once."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from test_workflow import _csvs

import kitlib
from kitlib.notebook import presets

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def _run_cells(name: str, values: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The notebook's code cells run in one namespace as a headless kernel runs them, the parameters cell followed
    by ``values`` (what papermill injects); a cell ending in an expression is shown (repr), as a kernel shows it."""
    cells = [c for c in json.loads((NOTEBOOKS / name).read_text())["cells"] if c["cell_type"] == "code"]
    namespace: dict[str, Any] = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for i, cell in enumerate(cells):
            source = "".join(cell["source"])
            exec(compile(source, f"{name}[{i}]", "exec"), namespace)
            if i == 0:
                namespace.update(values)
            last = source.rstrip().splitlines()[-1].split("#")[0].strip()
            if last.isidentifier() and last in namespace:
                shown = namespace[last]
                print(repr(shown) if not hasattr(shown, "_ipython_display_") else shown._ipython_display_())
    return namespace, out.getvalue()


def test_a_headless_00_then_01_resolves_the_run_once_and_01_saves_it(tmp_path: Path, cpu_hw, monkeypatch) -> None:
    """Every resolution (presets.resolve) of a headless 00 -> 01 on a CPU is counted: one, in 01, whose run is the
    one features.json holds and whose summary 01's log shows; 00 saves the choice (run.json), resolving nothing."""
    calls: list[presets.ResolvedRun] = []
    real = presets.resolve

    def counted(*args: Any, **kwargs: Any) -> presets.ResolvedRun:
        calls.append(run := real(*args, **kwargs))
        return run

    monkeypatch.setattr(presets, "resolve", counted)
    monkeypatch.setattr(kitlib, "detect", lambda: cpu_hw)
    pytest.importorskip("IPython")
    data, work = _csvs(tmp_path / "data"), tmp_path / "work"
    values = {"data_dir": str(data), "work_dir": str(work), "preset": "smoke", "model": "tiny", "lr": 0.002}
    _, log00 = _run_cells("00_setup.ipynb", values)
    assert calls == [], f"00 resolved the run {len(calls)} time(s): it saves the choice, 01 resolves"
    assert "preset smoke: 01 resolves" in log00 and "why:" not in log00
    ns01, log01 = _run_cells("01_features.ipynb", {"work_dir": str(work)})
    assert len(calls) == 1, f"{len(calls)} resolutions in a headless 00 -> 01"
    assert ns01["feats"].run.config == calls[0].config and ns01["feats"].run.config.lr == 0.002
    saved = json.loads((work / "features.json").read_text())["run"]
    assert presets.ResolvedRun.from_dict(saved).config == calls[0].config
    assert log01.count("why:") == 1 and calls[0].reasons[0] in log01  # the log shows the one resolution
