"""One set of parameters: 00 writes params.json, 01-03 read it (carried forward from read-only inputs on Kaggle)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from kitlib.errors import MissingRunError, SetupError
from kitlib.notebook import params as params_module
from kitlib.notebook import stages, training
from kitlib.notebook.runbook import run_notebooks as _run_notebooks


def _competition(folder: Path) -> Path:
    folder.mkdir(parents=True)
    rows = pd.DataFrame({"id": range(60), "review": [f"a {'good' if i % 2 else 'bad'} film" for i in range(60)]})
    rows.assign(sentiment=[i % 2 for i in range(60)]).iloc[:50].to_csv(folder / "train.csv", index=False)
    rows.iloc[50:].to_csv(folder / "test.csv", index=False)
    rows.iloc[50:][["id"]].assign(sentiment=0).to_csv(folder / "sample_submission.csv", index=False)
    return folder


def test_params_json_drives_the_later_stages(tmp_path: Path, cpu_hw) -> None:
    data = _competition(tmp_path / "data")
    p = stages.params(
        environ={}, data_dir=data, work_dir=tmp_path / "work", preset="smoke", model="tiny", text="review",
        target="sentiment", task="classify", seed=7,
    )  # fmt: skip
    stages.setup(p, cpu_hw)
    saved = json.loads((p.work_dir / "params.json").read_text())
    assert saved["target"] == "sentiment" and "work_dir" not in saved and "inputs" not in saved
    later = stages.load_params(tmp_path / "work", environ={})
    assert later == p  # every value, from 00's cell, with no parameters cell of its own
    assert stages.load_params(tmp_path / "work", environ={"KIT_PRESET": "smoke"}) == p  # restating is fine


def test_a_variable_that_contradicts_the_saved_parameters_names_both_values(tmp_path: Path, cpu_hw) -> None:
    p = stages.params(environ={}, data_dir=_competition(tmp_path / "data"), work_dir=tmp_path / "work",
                      preset="smoke", model="tiny", text="review", target="sentiment")  # fmt: skip
    stages.setup(p, cpu_hw)
    with pytest.raises(SetupError, match=r"preset: params.json \(00_setup\) says 'smoke', KIT_PRESET says 'fast'.*"
                       r"re-run 00_setup with the new value, or unset KIT_PRESET"):  # fmt: skip
        stages.load_params(p.work_dir, environ={"KIT_PRESET": "fast"})
    moved = _competition(tmp_path / "moved")  # the data moved (a downloaded output, another mount): it may follow
    assert stages.load_params(p.work_dir, environ={"KIT_DATA_DIR": str(moved)}).data_dir == moved


def test_later_stages_without_00_name_it(tmp_path: Path) -> None:
    with pytest.raises(MissingRunError, match=r"no params.json in .*run notebooks/00_setup.ipynb first"):
        stages.load_params(tmp_path / "work", environ={})
    with pytest.raises(MissingRunError, match=r"input .*gone does not exist: attach the earlier kernel's output"):
        stages.load_params(tmp_path / "work", inputs=[tmp_path / "gone"], environ={})


def test_inputs_are_carried_forward_and_a_different_local_copy_is_kept(tmp_path: Path) -> None:
    upstream = tmp_path / "previous-kernel"
    (upstream / "features").mkdir(parents=True)
    (upstream / "params.json").write_text("{}")
    (upstream / "features" / "a.npy").write_bytes(b"new")
    (upstream / "kitlib-cache").mkdir()  # a cache is a seed, not carried
    work = tmp_path / "working"
    (work / "features").mkdir(parents=True)
    (work / "features" / "a.npy").write_bytes(b"mine")
    (work / "features.prev").mkdir()  # an older one the user kept: never overwritten
    (work / "params.json").write_text('{"mine": 1}')
    upstream.chmod(0o555)  # as mounted: read-only
    try:
        # folders first: a copy cut short never leaves a manifest naming files that are not there
        assert params_module.carry_forward([upstream], work) == ["features", "params.json"]
        assert params_module.carry_forward([upstream], work) == []  # identical copies are kept as they are
    finally:
        upstream.chmod(0o755)
    assert (work / "features" / "a.npy").read_bytes() == b"new"
    assert (work / "features.prev-2" / "a.npy").read_bytes() == b"mine" and (work / "features.prev").is_dir()
    assert (work / "params.json.prev").read_text() == '{"mine": 1}'
    assert not (work / "kitlib-cache").exists()


@pytest.mark.parametrize(
    ("given", "mounted"),
    [
        ("competitions/demo", "demo"),  # build writes the current layout; an older image mounts at /kaggle/input/<slug>
        ("datasets/me/kitlib-wheels", "kitlib-wheels"),
        ("notebooks/me/kit-00-setup", "kit-00-setup"),
        ("demo", "competitions/demo"),  # and the other way round
        ("kitlib-wheels", "datasets/me/kitlib-wheels"),
    ],
)
def test_kaggle_inputs_are_found_in_either_mount_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str, mounted: str
) -> None:
    root = tmp_path / "input"
    monkeypatch.setattr(params_module, "KAGGLE_INPUT", root)
    (root / mounted).mkdir(parents=True)
    assert params_module.kaggle_input(root / given) == root / mounted
    assert params_module.kaggle_input(root / "nowhere") == root / "nowhere"  # left for the caller's error
    assert params_module.kaggle_input(tmp_path / "local") == tmp_path / "local"


def test_a_chain_plans_for_the_accelerator_02_gets_and_02_checks_it_has_it(tmp_path: Path, cpu_hw) -> None:
    """A Kaggle chain runs 00/01 on CPU and gives 02/03 the T4 x2: run.json must be planned for the T4 x2."""
    p = stages.params(environ={}, data_dir=_competition(tmp_path / "data"), work_dir=tmp_path / "work",
                      preset="balanced", model="tiny", text="review", target="sentiment", hardware="2xT4")  # fmt: skip
    run = stages.resolve_run(p, cpu_hw, choice=stages.setup(p, cpu_hw))
    assert (run.world_size, run.config.precision) == (2, "fp16") and "T4" in run.hardware
    feats = stages.features(p, hw=cpu_hw, quiet=True)  # 01 re-fits to the data, still for the T4 x2
    assert (feats.run.world_size, feats.run.config.precision) == (2, "fp16")
    with pytest.raises(SetupError, match=r"planned for .*T4.*hardware = '2xT4'.*this machine has 0 GPU.*--gpu"):
        training.train(stages.load_params(p.work_dir, environ={}), hw=cpu_hw)
    with pytest.raises(SetupError, match=r"hardware = 'T5'.*unknown profile"):
        stages.params(environ={}, data_dir=p.data_dir, work_dir=p.work_dir, hardware="T5")


def test_03_refuses_features_of_another_test_set(tmp_path: Path, cpu_hw) -> None:
    """A code competition reruns the submitted kernel with the hidden test.csv: 03 must not predict the old rows."""
    p = stages.params(environ={}, data_dir=_competition(tmp_path / "data"), work_dir=tmp_path / "work",
                      preset="smoke", model="tiny", text="review", target="sentiment")  # fmt: skip
    stages.setup(p, cpu_hw)
    stages.features(p, hw=cpu_hw, quiet=True)
    stages.load_features(p)  # the same test.csv: fine
    hidden = pd.read_csv(p.data_dir / "test.csv").assign(id=lambda f: f["id"] + 1000)
    hidden.to_csv(p.data_dir / "test.csv", index=False)
    with pytest.raises(MissingRunError, match=r"test.csv changed after features.json was built.*kaggle build --single"):
        stages.load_features(p)


# ------------------------------------------------------------------------------ one precedence rule: flag > file > 00
_FILE = {"preset": "fast", "model": "tiny", "epochs": 3, "micro_batch_size": 1, "grad_accum_steps": 16, "lr": 0.002}
_FLAGS = {"preset": "smoke", "model": "auto", "epochs": 2, "micro_batch_size": 2, "grad_accum_steps": 4, "lr": 0.01}


def _run_00(monkeypatch: pytest.MonkeyPatch, data: Path, work: Path, *flags: str) -> tuple[dict, dict]:
    """``python -m kitlib notebooks run`` with only 00_setup executed (a real kernel): run.json and params.json."""
    from kitlib import cli
    from kitlib.notebook import runbook

    only_00 = {"names": runbook.NOTEBOOKS[:1]}
    monkeypatch.setattr(runbook, "run_notebooks", lambda out, **kw: _run_notebooks(out, **kw | only_00))
    for var in params_module.ENV.values():
        monkeypatch.delenv(var, raising=False)
    assert cli.main(["notebooks", "run", "--data", str(data), "--work", str(work), *flags]) == 0
    return json.loads((work / "run.json").read_text()), json.loads((work / "params.json").read_text())


def _ran(run: dict, saved: dict) -> dict:
    config = run["overrides"]  # 00's choice: what 01 resolves (every one of these is set)
    return {"preset": run["preset"]["name"], "model": saved["model"], "epochs": config["epochs"],
            "micro_batch_size": config["micro_batch_size"], "grad_accum_steps": config["grad_accum_steps"],
            "lr": config["lr"]}  # fmt: skip


@pytest.mark.slow
def test_a_params_file_is_what_runs_and_each_explicit_flag_overrides_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from kitlib.models.folders import pretrained_dir

    pretrained_dir()  # model "auto" below: the installed all-MiniLM-L6-v2 (00 checks it is there, loads nothing)
    data = _competition(tmp_path / "data")
    params_file = tmp_path / "params.json"
    params_file.write_text(json.dumps({**_FILE, "text": "review", "target": "sentiment"}))
    run, saved = _run_00(monkeypatch, data, tmp_path / "file", "--params", str(params_file))
    assert _ran(run, saved) == _FILE  # micro-batch 1 x accumulation 16, as written: nothing injected over it
    printed = capsys.readouterr().out
    assert printed.count("parameters: ") == 1 and "preset='fast' (file)" in printed
    flags = [text for name, value in _FLAGS.items() for text in ("--" + name.replace("_", "-"), str(value))]
    run, saved = _run_00(monkeypatch, data, tmp_path / "flags", "--params", str(params_file), *flags)
    assert _ran(run, saved) == _FLAGS  # every flag wins over the file (each value differs from the file's)
    printed = capsys.readouterr().out
    assert all(f"{name}={value!r} (flag)" in printed for name, value in _FLAGS.items()) and "(file)" in printed


def test_an_unknown_parameter_is_an_error_listing_the_valid_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kitlib import cli

    data = _competition(tmp_path / "data")
    params_file = tmp_path / "params.json"
    params_file.write_text(json.dumps({"preset": "smoke", "epoch": 3}))
    work = tmp_path / "work"
    assert cli.main(["notebooks", "run", "--data", str(data), "--work", str(work), "--params", str(params_file)]) == 2
    err = capsys.readouterr().err
    assert "unknown parameter(s) ['epoch']" in err and "'epochs'" in err and "'micro_batch_size'" in err
    assert not work.exists()  # refused before any kernel ran
    with pytest.raises(SetupError, match=r"unknown parameter\(s\) \['epoch'\].*'epochs'"):
        stages.params(environ={}, data_dir=data, work_dir=work, epoch=3)  # 00's cell: the same error


def test_a_variable_that_would_override_a_flag_in_00_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from kitlib import cli

    monkeypatch.setenv("KIT_PRESET", "smoke")
    work = tmp_path / "work"
    args = ["notebooks", "run", "--data", str(_competition(tmp_path / "data")), "--work", str(work), "--preset", "fast"]
    assert cli.main(args) == 2
    assert "KIT_PRESET='smoke' vs preset='fast'" in capsys.readouterr().err and not work.exists()


def test_training_parameters_reach_run_json_and_start_the_picker(tmp_path: Path, cpu_hw) -> None:
    from kitlib.notebook.widgets import PresetPicker

    p = stages.params(environ={}, data_dir=_competition(tmp_path / "data"), work_dir=tmp_path / "work",
                      preset="smoke", model="tiny", text="review", target="sentiment", epochs=3, micro_batch_size=1,
                      grad_accum_steps=16, lr=0.002, max_length=24, full_eval_every=1,
                      optimizer="adamw8bit")  # fmt: skip
    picker = PresetPicker(cpu_hw, default=p.preset, overrides=p.training())
    picker._on_preset({"new": "balanced"})  # another preset: the parameters' settings stay
    expected = {"epochs": 3, "micro_batch_size": 1, "grad_accum_steps": 16, "lr": 0.002, "max_length": 24,
                "full_eval_every": 1, "optimizer": "adamw8bit"}  # fmt: skip
    choice = stages.setup(p, cpu_hw)  # 00 without a picker: the choice 01 resolves
    for run in (picker.resolved, stages.resolve_run(p, cpu_hw, choice=choice)):
        assert {k: getattr(run.config, k) for k in expected} == expected
    assert stages.load_params(p.work_dir, environ={}).training() == expected  # 01-03 see them in params.json
    with pytest.raises(SetupError, match=r"micro_batch_size = 0 is not a whole number >= 1"):
        stages.params(environ={}, data_dir=p.data_dir, work_dir=p.work_dir, micro_batch_size=0)
    with pytest.raises(SetupError, match=r"optimizer = 'adam' is not one of \['adamw', 'adamw8bit', 'adamw-kahan'\]"):
        stages.params(environ={}, data_dir=p.data_dir, work_dir=p.work_dir, optimizer="adam")
