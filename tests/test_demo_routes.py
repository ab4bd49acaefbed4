"""Every task's demo competition through what ``scripts/demo.sh --task T`` runs: the demo, the four notebooks at
smoke (``--params demo.json``), the score. The reviews' demo is CI's main job, typed as the README has it (and again
at the hosted pins), and the Kaggle simulation drives the tabular-text demo whole; the other tasks' demos run here,
cut to a test's size, two at a time beside the rest of the slow tests (as .ci/run's demo.sh loop they took ~4.3 of
CI's minutes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from demos import cut_demo
from kitlib.notebook.tasks import TASKS

COVERED = ("auto", "tabular-text")  # driven elsewhere (above): .ci/run's main job, test_kaggle_sim's demo row
TASKS_WITH_A_DEMO = sorted(
    {e.demo: name for name, e in reversed(TASKS.items()) if e.demo not in {TASKS[t].demo for t in COVERED}}.values()
)  # one task per demo builder (classify and regress share the reviews'), named as the registry names it first
ROWS = 600  # training rows kept (a quarter as many test rows); a demo already smaller stays whole


def test_every_demo_builder_is_driven_somewhere() -> None:
    assert {TASKS[t].demo for t in (*COVERED, *TASKS_WITH_A_DEMO)} == {e.demo for e in TASKS.values()}


@pytest.mark.slow  # 30-120 s a task on 2 cores
@pytest.mark.parametrize("task", TASKS_WITH_A_DEMO)
def test_a_tasks_demo_runs_to_a_scored_submission(task: str, tmp_path: Path) -> None:
    data, work = tmp_path / "demo", tmp_path / "run"
    kitlib = [sys.executable, "-m", "kitlib"]
    subprocess.run([*kitlib, "demo", str(data), "--task", task], check=True, capture_output=True)
    cut_demo(data, ROWS)
    run = ["notebooks", "run", "--data", str(data), "--work", str(work), "--params", str(data / "demo.json")]
    proc = subprocess.run([*kitlib, *run, "--preset", "smoke"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sample, written = pd.read_csv(data / "sample_submission.csv"), pd.read_csv(work / "submission.csv")
    assert list(written.columns) == list(sample.columns) and written["id"].tolist() == sample["id"].tolist()
    scored = subprocess.run([*kitlib, "score", str(data / "solution.csv"), str(work / "submission.csv")],
                            capture_output=True, text=True)  # fmt: skip
    assert scored.returncode == 0 and scored.stdout.strip(), scored.stderr  # the score, with the demo's metric
