"""The four notebooks, executed headless as CI and `jupyter nbconvert --execute` run them (smoke preset, tiny model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import types
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from kitlib.notebook.runbook import NOTEBOOKS, notebooks_dir

pytestmark = pytest.mark.slow


def _stream_text(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def test_committed_notebooks_are_thin_runbooks_without_outputs() -> None:
    installs = set()
    for name in NOTEBOOKS:
        raw = json.loads((notebooks_dir() / name).read_text())
        assert all("id" in c for c in raw["cells"]), f"{name}: a cell without an id (nbformat 4.5 requires one)"
        nb = nbformat.read(notebooks_dir() / name, as_version=4)
        nbformat.validate(nb)
        code = [c for c in nb.cells if c.cell_type == "code"]
        installs |= {c.source for c in code if "install" in c.metadata.get("tags", [])}
        assert all(not c.outputs and c.execution_count is None for c in code), f"{name} has outputs: strip them"
        assert "parameters" in code[0].metadata.get("tags", []), f"{name}: first code cell must be tagged parameters"
        assert not any(line.lstrip().startswith(("def ", "class ")) for c in code for line in c.source.splitlines()), (
            f"{name} defines functions: logic belongs in kitlib"
        )
    assert len(installs) == 1, "every notebook installs kitlib with the same cell (each Kaggle kernel needs it)"


def _other_competition(data: Path) -> pd.DataFrame:
    """Not the demo: another CSV, other column names (review_id, body, verdict), three classes; 300 train rows."""
    words = {
        "good": ["great", "lovely", "superb", "fine"],
        "bad": ["awful", "dull", "boring", "poor"],
        "meh": ["okay", "average", "plain", "so-so"],
    }
    rows = []
    for i in range(360):
        label = list(words)[i % 3]
        rows.append({"review_id": f"r{i:04d}", "body": f"a {words[label][i % 4]} film number {i}", "verdict": label})
    data.mkdir(parents=True)
    frame = pd.DataFrame(rows)
    frame.iloc[:300].to_csv(data / "train.csv", index=False)
    frame.iloc[300:][["review_id", "body"]].to_csv(data / "test.csv", index=False)
    frame.iloc[300:][["review_id"]].assign(verdict="good").to_csv(data / "sample_submission.csv", index=False)
    frame.iloc[300:][["review_id", "verdict"]].to_csv(data / "solution.csv", index=False)
    return frame


def test_notebooks_run_unchanged_from_another_cwd_on_another_csv_with_other_column_names(tmp_path: Path) -> None:
    """What README's main job does, from a folder that is neither the repo nor the notebooks' folder: relative
    --data/--work mean relative to where the command ran, not to the kernels' working directory; on a CSV that is
    not the demo's, its columns named by flags. (Two tests before, each running the four notebooks: the demo from
    another cwd, and this CSV through run_notebooks. The reviews demo runs in CI's main job; run_notebooks with a
    parameters dict in test_causal_lm's SFT route.)"""
    from kitlib.tasks.scoring import score

    frame = _other_competition(tmp_path / "competition" / "data")
    work = tmp_path / "competition" / "work"
    command = [sys.executable, "-m", "kitlib", "notebooks", "run", "--data", "data", "--work", "work"]
    columns = ["--text=body", "--target=verdict", "--id=review_id"]
    proc = subprocess.run(
        [*command, "--preset", "smoke", "--model", "tiny", *columns],
        cwd=tmp_path / "competition",
        env={k: v for k, v in os.environ.items() if not k.startswith("KIT_")},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    executed = sorted((work / "executed").glob("*.ipynb"))
    assert [e.name for e in executed] == list(NOTEBOOKS)
    data = (tmp_path / "competition" / "data").resolve()
    assert json.loads((work / "params.json").read_text())["data_dir"] == str(data)
    run = json.loads((work / "run.json").read_text())
    assert run["preset"]["name"] == "smoke"
    assert (work / "run" / "best" / "model.safetensors").exists()
    history = pd.read_csv(work / "run" / "history.csv")
    assert {"train_loss", "eval_loss", "accuracy"} <= set(history.columns)
    submission = pd.read_csv(work / "submission.csv")
    assert list(submission.columns) == ["review_id", "verdict"]
    assert submission["review_id"].tolist() == frame.iloc[300:]["review_id"].tolist()  # original row order
    assert set(submission["verdict"]) <= set(frame["verdict"])
    accuracy = score(data / "solution.csv", work / "submission.csv", target="verdict", id="review_id")
    assert 0.0 <= accuracy <= 1.0
    # Headless progress is throttled: a handful of bar lines per notebook, not one per step.
    train_output = _stream_text(work / "executed" / "02_train.ipynb")
    assert train_output.count("train:") <= 4, train_output
    sizes = {e.name: e.stat().st_size for e in executed}
    assert all(size < 200_000 for size in sizes.values()), sizes


def test_plain_nbconvert_with_environment_variables(tmp_path: Path) -> None:
    """What a user types: jupyter nbconvert --execute, parameters through KIT_* variables."""
    from demos.reviews import make_demo

    make_demo(tmp_path / "demo")
    env = {
        **os.environ,
        "KIT_DATA_DIR": "demo",  # relative to where the user typed the command (the shell's PWD), as a shell user means
        "KIT_WORK_DIR": "work",
        "KIT_PRESET": "fast",
        "KIT_HEADLESS": "1",
        "PWD": str(tmp_path),  # what a shell exports; the kernel's own cwd is the notebook's folder
    }
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "jupyter",
            "nbconvert",
            "--to",
            "notebook",
            "--execute",
            "--output-dir",
            str(out),
            str(notebooks_dir() / "00_setup.ipynb"),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads((tmp_path / "work" / "run.json").read_text())
    assert run["preset"]["name"] == "fast"  # the variable beat the parameters cell's default


def test_a_failing_notebook_is_one_short_message_naming_the_notebook_the_cell_and_the_fix(tmp_path: Path) -> None:
    from demos.reviews import make_demo

    make_demo(tmp_path / "demo")
    done = subprocess.run(
        [sys.executable, "-m", "kitlib", "notebooks", "run", "--data", "demo", "--work", "work", "--preset", "smoke",
         "--model", "tiny", "--target", "sentiment"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    lines = lines[next(i for i, line in enumerate(lines) if line.startswith("notebooks:")) :]  # after kernel noise
    message = "\n".join(lines)
    assert len(lines) == 2 and not any(line.startswith("Traceback") for line in lines), message
    # 00 reads the data before it writes anything: its 7th cell from the top (markdown included), as a user
    # scrolling the executed notebook counts
    assert message.startswith("notebooks: 00_setup.ipynb stopped in cell 7: DataError:"), message
    assert "'sentiment'" in message and "work/executed/00_setup.ipynb" in message, message


def test_a_stop_silences_the_stopped_kernels_socket_noise_until_the_run_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a signal the runner's kitlib message is the one thing said: zmq's log of the stopped kernel's closed
    sockets (a traceback, once in CI under load) is off from the signal until the run ends, then as it was; with
    KITLIB_TRACEBACK=1 it stays on. The kernel is faked away (no client): the handler runs as a signal would."""
    import logging
    import signal

    from kitlib.notebook.runbook import _Stop

    noise = logging.getLogger("tornado.general")
    monkeypatch.setattr(threading, "Timer", lambda *a: types.SimpleNamespace(daemon=False, start=lambda: None))
    for traceback_env, off in (("", True), ("1", False)):
        monkeypatch.setenv("KITLIB_TRACEBACK", traceback_env)
        stop = _Stop(None, "again")
        stop.keep_handlers()
        assert not noise.disabled
        stop._stop(signal.SIGTERM, None)
        assert noise.disabled is off
        stop.restore_handlers()
        assert not noise.disabled
