from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kitlib.cli import main
from kitlib.config import TrainConfig
from kitlib.errors import SetupError
from kitlib.machine.hardware import ARCH_LIST_WITH_SM60, HardwareInfo, fake_profile
from kitlib.machine.precision import PrecisionError, UnsupportedGPUError
from kitlib.notebook.estimate import estimate_epoch_seconds
from kitlib.notebook.presets import (
    PRESETS,
    RUN_FILE,
    Choice,
    MissingRunError,
    Preset,
    ResolvedRun,
    get_preset,
    load_choice,
    resolve,
)

# auto precision per profile (the precision module's rules, seen through presets)
EXPECTED_DTYPE = {
    "T4": "fp16",
    "2xT4": "fp16",
    "P100": "fp32",
    "V100": "fp16",
    "A100": "bf16",
    "L4": "bf16",
    "H100": "bf16",
    "MPS": "fp32",
    "CPU-AMX": "fp32",  # a CPU trains fp32 unless bf16 is asked (its gain is the model's: 1.8x MiniLM, 0.92x BiLSTM)
    "CPU": "fp32",
}
LENGTHS = [12] * 50 + [30] * 40 + [90] * 9 + [700]


def profile(name: str) -> HardwareInfo:
    # Kaggle's torch has no sm_60 kernels; model a torch that still runs a P100 so it resolves at all.
    return fake_profile(name, torch_cuda_arch_list=ARCH_LIST_WITH_SM60 if name == "P100" else None)


@pytest.mark.parametrize("name", list(EXPECTED_DTYPE))
@pytest.mark.parametrize("preset", list(PRESETS))
def test_every_preset_resolves_on_every_profile(name: str, preset: str) -> None:
    hw = profile(name)
    for lengths in (None, LENGTHS):
        run = resolve(preset, hw, lengths=lengths)
        assert isinstance(run.config, TrainConfig)
        TrainConfig.from_dict(run.config.to_dict())  # valid: __post_init__ accepts it again
        target = PRESETS[preset].target_effective_batch
        short = lengths is not None and len(lengths) * PRESETS[preset].epochs < target * PRESETS[preset].min_steps
        assert run.effective_batch_size == target or (short and run.effective_batch_size < target)
        assert run.config.precision == EXPECTED_DTYPE[name]
        assert run.precision_reason
        assert {r.split()[0] for r in run.reasons} >= {"precision", "batch", "max_length"}
        assert run.config.max_length is not None and run.config.max_length <= PRESETS[preset].max_length_cap


def test_unusable_gpu_raises_with_the_fix() -> None:
    with pytest.raises(UnsupportedGPUError, match="T4 x2"):
        resolve("balanced", fake_profile("P100"))


def test_world_size_and_regime() -> None:
    hw = fake_profile("2xT4")
    assert resolve("balanced", hw).world_size == 2
    assert resolve("fast", hw).world_size == 1  # a head gains nothing from DDP
    assert resolve("fast", hw).regime.name == "head"
    assert resolve("best", hw).regime.name == "finetune"
    run = resolve("balanced", hw, world_size=1)
    assert run.world_size == 1 and run.effective_batch_size == 32
    assert resolve("best", fake_profile("CPU")).world_size == 1


def test_max_length_from_coverage_and_cap() -> None:
    from kitlib.data.lengths import suggest_max_length

    hw = fake_profile("CPU")
    run = resolve("balanced", hw, lengths=LENGTHS)
    assert run.config.max_length == suggest_max_length(LENGTHS, coverage=0.95, multiple_of=8)
    assert run.mean_tokens is not None and run.mean_tokens < run.config.max_length
    best = resolve("best", hw, lengths=LENGTHS)  # 99% coverage reaches the 700-token outlier's neighbours, capped
    assert best.config.max_length == min(suggest_max_length(LENGTHS, coverage=0.99), 512)
    assert resolve("best", hw, lengths=[600] * 10).config.max_length == 512
    assert resolve("balanced", hw).config.max_length == 256  # no lengths: the cap
    assert resolve("balanced", hw, overrides={"max_length": 40}).config.max_length == 40


def test_micro_batch_by_memory_and_length() -> None:
    micro = {name: resolve("best", fake_profile(name), world_size=1, lengths=[100] * 10).config.micro_batch_size
             for name in ("CPU", "T4", "A100")}  # fmt: skip
    assert micro["CPU"] <= micro["T4"] <= micro["A100"]
    short = resolve("best", fake_profile("T4"), lengths=[100] * 10).config
    long = resolve("best", fake_profile("T4"), lengths=[500] * 10).config
    assert long.micro_batch_size < short.micro_batch_size
    assert long.effective_batch_size == short.effective_batch_size == 32


def test_overrides() -> None:
    hw = fake_profile("CPU")
    run = resolve("balanced", hw, overrides={"micro_batch_size": 4})
    assert (run.config.micro_batch_size, run.config.grad_accum_steps) == (4, 8)  # effective batch kept
    both = resolve("balanced", hw, overrides={"micro_batch_size": 4, "grad_accum_steps": 2})
    assert both.effective_batch_size == 8 and any("set by hand" in r for r in both.reasons)
    assert resolve("balanced", hw, overrides={"epochs": 7, "seed": 3}).config.epochs == 7
    assert resolve("balanced", hw, overrides={"seed": 3}).config.seed == 3  # TrainConfig-only field
    bigger = resolve("balanced", hw, overrides={"target_effective_batch": 128})
    assert bigger.effective_batch_size == 128
    assert bigger.choice.overrides == {"target_effective_batch": 128}
    with pytest.raises(ValueError, match="unknown override"):
        resolve("balanced", hw, overrides={"epoch": 3})
    with pytest.raises(ValueError, match="epochs"):
        resolve("balanced", hw, overrides={"epochs": 0})
    from kitlib.notebook.presets import Choice, check

    for bad in ({"epochs": 0}, {"freeze_layers": -1}):  # 00's check refuses them before run.json is written
        with pytest.raises(ValueError, match=next(iter(bad))):
            check(Choice(get_preset("smoke"), bad), hw)
    with pytest.raises(PrecisionError, match="fp16"):
        resolve("balanced", fake_profile("T4"), overrides={"precision": "bf16"})


def test_effective_batch_rebalanced_for_odd_targets() -> None:
    hw = fake_profile("CPU")
    for target in (1, 3, 24, 40, 48, 100):
        custom = dataclasses.replace(get_preset("best"), name="custom", target_effective_batch=target)
        run = resolve(custom, hw)
        cfg = run.config
        assert target <= run.effective_batch_size < target + cfg.grad_accum_steps  # at most one row per micro-step
        assert cfg.grad_accum_steps == -(-target // cfg.micro_batch_size) or cfg.micro_batch_size < 16


def test_short_runs_take_smaller_steps_until_they_have_min_steps() -> None:
    hw = fake_profile("CPU")
    preset = dataclasses.replace(get_preset("best"), name="steps", epochs=1, target_effective_batch=32, min_steps=150)
    steps = {}
    for rows in (100, 1500, 3000, 4800, 20000):
        run = resolve(preset, hw, lengths=[30] * rows)
        steps[rows] = run.effective_batch_size
        # Never below 8; otherwise the largest halving of 32 that gives >= 150 steps, or 32 itself.
        assert (
            run.effective_batch_size == 32 or rows // run.effective_batch_size >= 150 or run.effective_batch_size == 8
        )
        assert run.effective_batch_size == 32 or any("optimizer steps" in r for r in run.reasons)
    assert steps == {100: 8, 1500: 8, 3000: 16, 4800: 32, 20000: 32}
    assert resolve(preset, hw).effective_batch_size == 32  # no lengths yet (00_setup): the preset's target
    two_epochs = resolve(dataclasses.replace(preset, epochs=2), hw, lengths=[30] * 3000)
    assert two_epochs.effective_batch_size == 32  # 6,000 rows seen: 187 steps of 32
    # 00's picker passes every train.csv row's length: a preset with a row_limit trains on only that many
    limited = resolve(dataclasses.replace(preset, row_limit=1500), hw, lengths=[30] * 20000)
    assert limited.effective_batch_size == steps[1500] and "1500 rows x 1 epoch" in " ".join(limited.reasons)
    with pytest.raises(ValueError, match="min_steps"):
        dataclasses.replace(preset, min_steps=-1)


def test_preset_validation_and_lookup() -> None:
    assert get_preset(" Fast ").name == "fast"
    with pytest.raises(ValueError, match="smoke, fast, balanced, best"):
        get_preset("accurate")
    with pytest.raises(ValueError, match="regime"):
        dataclasses.replace(get_preset("fast"), regime="frozen")  # type: ignore[arg-type]


def test_json_round_trip(tmp_path: Path) -> None:
    for name in ("2xT4", "CPU", "A100"):
        run = resolve("best", fake_profile(name), lengths=LENGTHS, overrides={"epochs": 2})
        again = ResolvedRun.from_dict(json.loads(json.dumps(run.to_dict())))  # features.json's run
        assert again == run and again.config.betas == run.config.betas
    choice = Choice(get_preset("best"), {"epochs": 2, "lr": 1e-4}, 2, task="regress", metric="rmse")
    assert choice.save(tmp_path) == tmp_path / RUN_FILE and load_choice(tmp_path) == choice  # 00's run.json


def test_missing_run_says_which_notebook(tmp_path: Path) -> None:
    with pytest.raises(MissingRunError, match="00_setup"):
        load_choice(tmp_path)
    with pytest.raises(FileNotFoundError):  # MissingRunError is a FileNotFoundError
        load_choice(tmp_path / "nowhere")


def test_estimate_epoch_seconds() -> None:
    cpu, t4, t4x2 = fake_profile("CPU"), fake_profile("T4"), fake_profile("2xT4")
    lengths = [30] * 100
    balanced_cpu = resolve("balanced", cpu, lengths=lengths)
    # ~8.5k demo rows x ~30 tokens on the 2-core box: minutes, not seconds or hours (measured ~230 s)
    seconds = estimate_epoch_seconds(balanced_cpu, 8530, dataclasses.replace(cpu, cpu_count=2))
    assert 60 < seconds < 900
    assert estimate_epoch_seconds(balanced_cpu, 2000, cpu) < estimate_epoch_seconds(balanced_cpu, 4000, cpu)
    fast_cpu = resolve("fast", cpu, lengths=lengths)
    assert estimate_epoch_seconds(fast_cpu, 8530, cpu) < estimate_epoch_seconds(balanced_cpu, 8530, cpu)
    one, two = resolve("balanced", t4, lengths=lengths), resolve("balanced", t4x2, lengths=lengths)
    assert estimate_epoch_seconds(two, 8530, t4x2) < estimate_epoch_seconds(one, 8530, t4)
    assert estimate_epoch_seconds(one, 8530, t4) < estimate_epoch_seconds(balanced_cpu, 8530, cpu)
    smoke = resolve("smoke", cpu)  # capped at its row_limit
    assert estimate_epoch_seconds(smoke, 10**6, cpu) == estimate_epoch_seconds(smoke, 256, cpu)


def test_presets_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["presets", "--profile", "T4", "--rows", "1000"]) == 0
    out = capsys.readouterr().out
    for name in PRESETS:
        assert f"=== {name}" in out
    assert "fp16" in out and "why:" in out and "estimate:" in out
    assert main(["presets", "--profile", "P100"]) == 2  # no preset is usable on Kaggle's P100
    assert "T4 x2" in capsys.readouterr().out


def test_cli_presets(capsys: pytest.CaptureFixture[str]) -> None:
    from kitlib.cli import main

    assert main(["presets", "--profile", "A100"]) == 0
    assert "bf16" in capsys.readouterr().out


def test_import_is_cheap() -> None:
    heavy = "{'torch', 'ipywidgets', 'kaggle'}"
    modules = "kitlib.notebook.presets, kitlib.notebook.widgets, kitlib.cli"
    code = f"import {modules}, sys; kitlib.cli.kernel_tool(); print(sorted({heavy} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_custom_preset_object() -> None:
    custom = Preset("mine", "my own", regime="finetune", epochs=1, target_effective_batch=16, lr=1e-4,
                    length_coverage=0.9, max_length_cap=64, full_eval_every=0, eval_max_batches=None,
                    checkpoints="none")  # fmt: skip
    run = resolve(custom, fake_profile("CPU"))
    assert run.name == "mine" and not run.config.save_best and not run.config.save_last


def test_the_freeze_row_says_what_does_not_train() -> None:
    """`fast` never trains its encoder (it only embeds in 01): its table must not say `freeze none`."""
    cpu = fake_profile("CPU", interactive=False)
    rows = {name: dict(resolve(name, cpu).table_rows())["freeze"] for name in ("fast", "balanced", "best")}
    assert rows["fast"].startswith("the whole encoder") and "only the head trains" in rows["fast"]
    assert rows["balanced"] == "embeddings" and rows["best"] == "none"
    layers = resolve("best", cpu, overrides={"freeze": "embeddings", "freeze_layers": 2})
    assert dict(layers.table_rows())["freeze"] == "embeddings + first 2 blocks"


def test_the_plan_says_what_share_of_rows_max_length_cuts_and_offers_the_lossless_length() -> None:
    """Inputs are cut at the length that covers the preset's share of rows: the plan, the run.json it saves and the
    picker's table say what share that cuts and which max_length cuts nothing (the picker's max_length field)."""
    from kitlib.notebook.widgets import preset_picker

    cpu = fake_profile("CPU", interactive=False)
    lengths = [20] * 995 + [100] * 5  # 0.5% of rows are long: balanced covers 99%
    run = resolve("balanced", cpu, lengths=lengths)
    assert run.config.max_length == 24 and run.rows_cut == pytest.approx(0.005) and run.longest_tokens == 100
    assert dict(run.table_rows())["max_length"] == "24 tokens (cuts 0.5% of rows; lossless: 100)"
    assert any("0.5% cut; lossless: max_length 100, the longest" in r for r in run.reasons)
    assert ResolvedRun.from_dict(run.to_dict()) == run
    lossless = resolve("balanced", cpu, lengths=lengths, overrides={"max_length": 100})
    assert dict(lossless.table_rows())["max_length"] == "100 tokens (cuts no row)"
    picker = preset_picker(cpu, default="balanced", n_rows=1000, n_test=100, lengths=lengths, show=False)
    assert "24 tokens (cuts 0.5% of rows; lossless: 100)" in repr(picker)


def test_a_resolved_run_holds_its_choice_and_an_older_saved_run_names_the_notebook_to_rerun(tmp_path: Path) -> None:
    """features.json's run keeps the choice it resolved (task, metric, baseline, overrides written once); a run saved
    in the flat format-2 layout is refused naming 01, a run.json of another format naming 00 (never misread)."""
    choice = Choice(PRESETS["smoke"], {"lr": 0.002}, task="classify", metric="accuracy", baseline={"score": 0.5})
    run = resolve(choice, fake_profile("CPU"), lengths=[12, 40])
    assert run.choice == choice and ResolvedRun.from_dict(json.loads(json.dumps(run.to_dict()))) == run
    older = {k: v for k, v in run.to_dict().items() if k != "choice"} | {"format": 2, "task": "classify"}
    with pytest.raises(SetupError, match="re-run 01_features"):
        ResolvedRun.from_dict(older)
    choice.save(tmp_path)
    assert load_choice(tmp_path) == choice
    (tmp_path / "run.json").write_text(json.dumps(choice.to_dict() | {"format": 1}))
    with pytest.raises(SetupError, match="re-run 00_setup"):
        load_choice(tmp_path)
