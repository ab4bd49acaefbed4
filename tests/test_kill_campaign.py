"""The fault campaign's notebooks route (benchmarks/kill_campaign.py --route notebooks), end to end: `notebooks run`
with a SIGTERM to its process group during 02, then the resume its own message names. The resume must continue 02
from the last/ the SIGTERM saved (a lost last/ or a fresh start fails), end with a submission that scores, and give
the best/ weights and the submission of an uninterrupted run bit for bit."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # two smoke runs of the four notebooks: ~2-4 min on 2 cores


def _campaign():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("kill_campaign", ROOT / "benchmarks" / "kill_campaign.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["kill_campaign"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_a_sigterm_to_the_run_during_02_resumes_from_last_to_the_uninterrupted_weights(tmp_path: Path) -> None:
    campaign = _campaign()
    data = campaign.small_demo(tmp_path)
    refs = {campaign._ref_key(False, 0): campaign.nb_reference(tmp_path, data, False, 0)}
    trial = campaign.nb_trial(0, "sigterm-group", tmp_path, data, refs, moment=0.3)
    assert trial.outcome == "exact", trial
    assert trial.continued, trial  # 02 went on from the SIGTERM's last/, not from step 0
    assert trial.submission, trial  # scored, every test id (its time against the budget depends on the load)
    said = (tmp_path / "nb-000.log").read_text()
    assert "stopped by SIGTERM during 02_train.ipynb" in said and "Resume: python -m kitlib notebooks run" in said
