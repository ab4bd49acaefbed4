"""Rehearsing a plan made for another accelerator on this machine's CPU (``rehearse``, KIT_REHEARSE): a Kaggle chain
planned for hardware="2xT4" runs 02 in two gloo processes and 03 on the CPU, in the precision the CPU runs, before
any GPU quota is spent. Never active unless asked. The pushed chain itself: tests/test_kaggle_sim.py."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from kitlib.errors import SetupError
from kitlib.notebook import stages, training


def _competition(folder: Path, n_train: int = 80, n_test: int = 12) -> Path:
    folder.mkdir(parents=True)
    n = n_train + n_test
    rows = pd.DataFrame({"id": range(n), "text": [f"a {'good' if i % 2 else 'bad'} film" for i in range(n)]})
    rows.assign(label=[("neg", "pos")[i % 2] for i in range(n)]).iloc[:n_train].to_csv(
        folder / "train.csv", index=False
    )
    rows.iloc[n_train:].to_csv(folder / "test.csv", index=False)
    rows.iloc[n_train:][["id"]].assign(label="pos").to_csv(folder / "sample_submission.csv", index=False)
    return folder


def test_rehearse_is_a_parameter_like_every_kit_setting(tmp_path: Path) -> None:
    data, work = _competition(tmp_path / "data"), tmp_path / "work"
    given = {"data_dir": data, "work_dir": work, "preset": "smoke", "model": "tiny", "hardware": "2xT4"}
    assert stages.params(environ={}, **given).rehearse is False  # never active unless asked
    assert stages.params(environ={"KIT_REHEARSE": "0"}, **given, rehearse=True).rehearse is False  # the variable wins
    p = stages.params(environ={"KIT_REHEARSE": " Yes"}, **given)
    assert p.rehearse is True and "rehearsed on this machine's CPU" in repr(p)
    p.save()
    assert json.loads((work / "params.json").read_text())["rehearse"] is True  # 01-03 follow 00
    assert stages.load_params(work, environ={}).rehearse is True
    assert stages.load_params(work, environ={"KIT_REHEARSE": "1"}).rehearse is True  # restating is fine
    with pytest.raises(SetupError, match=r"rehearse: params.json \(00_setup\) says True, KIT_REHEARSE says False"):
        stages.load_params(work, environ={"KIT_REHEARSE": "off"})  # contradicting is not
    with pytest.raises(SetupError, match=r"KIT_REHEARSE='maybe' is neither on nor off: set it to 1"):
        stages.params(environ={"KIT_REHEARSE": "maybe"}, **given)
    with pytest.raises(SetupError, match=r"rehearse = 'yes' is not True or False"):
        stages.params(environ={}, **given, rehearse="yes")
    with pytest.raises(SetupError, match=r"hardware = '' plans for this one: nothing to rehearse. Fix: set hardware"):
        stages.params(environ={"KIT_REHEARSE": "1"}, **(given | {"hardware": ""}))


def test_a_2xt4_plan_rehearsed_on_cpu_trains_in_two_gloo_processes_and_predicts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 00 and 01 plan for the T4 x2 (fp16, 2 processes); 02 and 03 run here, on no GPU, as a rehearsal: the notebooks'
    # own launch path with gloo, in the CPU's precision, and the run record says so.
    from kitlib.machine.hardware import detect
    from kitlib.machine.precision import decide_stage_precision

    p = stages.params(environ={"KIT_REHEARSE": "1"}, data_dir=_competition(tmp_path / "data"),
                      work_dir=tmp_path / "work", preset="smoke", model="tiny", hardware="2xT4")  # fmt: skip
    cpu = stages.dataclasses.replace(detect(), accelerators=())
    run = stages.resolve_run(p, cpu, choice=stages.setup(p, cpu))
    stages.features(p, hw=cpu, quiet=True)
    assert (run.world_size, run.config.precision) == (2, "fp16")  # the plan is the T4 x2's
    capsys.readouterr()
    result = training.train(stages.load_params(p.work_dir, environ={}))  # this machine, as 02's notebook calls it
    ran = decide_stage_precision(cpu, run.preset.precision)
    line = f"rehearsal: 2 gloo processes on this machine's CPU stand in for 2xT4 ({run.hardware}), {ran.dtype} for fp16"
    assert line in capsys.readouterr().out
    config = json.loads((result.run_dir / "config.json").read_text())
    assert config["world_size"] == 2 and config["config"]["precision"] == ran.dtype
    assert config["precision"]["device_type"] == "cpu" and "device:    cpu (no GPU)" in config["hardware"]
    facts = json.loads((result.run_dir / "timing.json").read_text())["run"]
    assert (facts["world_size"], facts["precision"], facts["device_type"]) == (2, ran.dtype, "cpu")
    submission = training.infer(stages.load_params(p.work_dir, environ={}))
    assert "rehearsal: this machine's CPU stands in for 2xT4" in capsys.readouterr().out
    assert len(submission) == 12 and set(submission["label"]) <= {"neg", "pos"}


def test_notebooks_run_reads_kit_rehearse_as_00_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The kernels inherit KIT_REHEARSE; a params file saying the same (true = "1") is no clash, the opposite one is.
    from kitlib.cli import main

    data = _competition(tmp_path / "data")
    given = tmp_path / "params.json"
    given.write_text(json.dumps({"rehearse": True, "hardware": "2xT4", "preset": "turbo"}))
    args = ["notebooks", "run", "--data", str(data), "--work", str(tmp_path / "work"), "--params", str(given)]
    monkeypatch.setenv("KIT_REHEARSE", "1")
    assert main(args) != 0  # stopped by the next check, before any kernel: the preset
    assert "unknown preset 'turbo'" in (err := capsys.readouterr().err) and "KIT_REHEARSE" not in err
    monkeypatch.setenv("KIT_REHEARSE", "0")
    assert main(args) != 0
    assert "KIT_REHEARSE='0' vs rehearse='True': the kernel inherits the variable" in capsys.readouterr().err
