from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from kitlib.machine.amp import Precision
from kitlib.machine.hardware import ARCH_LIST_WITH_SM60, HardwareInfo, MathProbe, fake_profile
from kitlib.machine.precision import (
    PrecisionError,
    PrecisionPlan,
    UnsupportedGPUError,
    decide_precision,
)
from kitlib.notebook import presets

# (profile, dtype, grad scaler, tf32, what the reason must name)
TABLE = [
    ("T4", "fp16", True, False, "Tesla T4"),
    ("2xT4", "fp16", True, False, "Tesla T4"),
    ("V100", "fp16", True, False, "V100"),
    ("A100", "bf16", False, True, "A100"),
    ("L4", "bf16", False, True, "L4"),
    ("H100", "bf16", False, True, "H100"),
    ("MPS", "fp32", False, False, "MPS"),
    ("CPU-AMX", "bf16", False, False, "AMX"),
    ("CPU", "fp32", False, False, "AMX"),
]


@pytest.mark.parametrize(("name", "dtype", "scaler", "tf32", "card"), TABLE)
def test_auto_decision_table(name: str, dtype: str, scaler: bool, tf32: bool, card: str) -> None:
    plan = decide_precision(fake_profile(name))
    assert (plan.dtype, plan.use_grad_scaler, plan.tf32) == (dtype, scaler, tf32)
    assert card in plan.reason
    assert plan.device_type == fake_profile(name).device_type


def test_reasons_say_why() -> None:
    assert "no native bf16" in decide_precision(fake_profile("T4")).reason
    assert "weakest of 2 GPUs" in decide_precision(fake_profile("2xT4")).reason
    assert "57x" in decide_precision(fake_profile("CPU")).reason


def test_p100_without_sm60_kernels_refuses() -> None:
    with pytest.raises(UnsupportedGPUError, match=r"sm_60.*(T4|L4)"):
        decide_precision(fake_profile("P100"))
    with pytest.raises(PrecisionError):  # also for explicit fp32: the GPU itself cannot run
        decide_precision(fake_profile("P100"), "fp32")


def test_p100_with_sm60_kernels_is_fp32() -> None:
    plan = decide_precision(fake_profile("P100", torch_cuda_arch_list=ARCH_LIST_WITH_SM60))
    assert (plan.dtype, plan.use_grad_scaler, plan.tf32) == ("fp32", False, False)
    assert "P100" in plan.reason


@pytest.mark.parametrize(
    ("name", "requested", "tf32", "fix"),
    [
        ("T4", "bf16", None, "precision='fp16' or 'auto'"),
        ("2xT4", "bf16", None, "precision='fp16' or 'auto'"),
        ("V100", "bf16", None, "precision='fp16'"),
        ("CPU", "fp16", None, "precision='fp32' or 'auto'"),
        ("CPU", "bf16", None, "precision='fp32' or 'auto'"),
        ("V100", "auto", True, "tf32"),
        ("T4", "fp32", True, "tf32"),
        ("CPU", "auto", True, "tf32=False"),
        ("CPU-AMX", "bf16", True, "tf32=False"),
        ("MPS", "auto", True, "tf32=False"),
    ],
)
def test_impossible_requests_name_the_fix(name: str, requested: str, tf32: bool | None, fix: str) -> None:
    with pytest.raises(PrecisionError, match="Fix:") as err:
        decide_precision(fake_profile(name), requested, tf32=tf32)  # type: ignore[arg-type]
    assert fix in str(err.value)


def test_bad_request_string() -> None:
    with pytest.raises(PrecisionError, match="not valid"):
        decide_precision(fake_profile("T4"), "int8")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["T4", "2xT4", "V100", "A100", "L4", "H100", "MPS", "CPU-AMX", "CPU"])
def test_explicit_fp32_always_allowed(name: str) -> None:
    plan = decide_precision(fake_profile(name), "fp32")
    assert plan.dtype == "fp32" and not plan.use_grad_scaler


def test_possible_overrides() -> None:
    a100 = fake_profile("A100")
    assert decide_precision(a100, "fp16").use_grad_scaler
    assert decide_precision(a100, "fp32").tf32  # auto TF32 still speeds up fp32 matmuls on sm80+
    assert not decide_precision(a100, tf32=False).tf32
    assert decide_precision(fake_profile("T4"), tf32=False).dtype == "fp16"
    assert decide_precision(fake_profile("CPU-AMX"), "fp16").use_grad_scaler  # AVX512-FP16 is native
    assert decide_precision(fake_profile("MPS"), "fp16").use_grad_scaler
    assert decide_precision(fake_profile("P100", torch_cuda_arch_list=ARCH_LIST_WITH_SM60), "fp16").use_grad_scaler


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dtype": "bf16", "device_type": "cuda", "use_grad_scaler": True}, "use_grad_scaler=False"),
        ({"dtype": "fp32", "device_type": "cuda", "use_grad_scaler": True}, "use_grad_scaler=False"),
        ({"dtype": "fp32", "device_type": "cpu", "tf32": True}, "tf32=False"),
        ({"dtype": "bf16", "device_type": "mps", "tf32": True}, "tf32=False"),
        ({"dtype": "fp8", "device_type": "cuda"}, "dtype"),
        ({"dtype": "fp32", "device_type": "tpu"}, "device_type"),
        ({"dtype": "fp32", "device_type": "cpu", "reason": ""}, "reason"),
    ],
)
def test_plan_validates_at_construction(kwargs: dict[str, object], match: str) -> None:
    full: dict[str, object] = {"use_grad_scaler": False, "tf32": False, "reason": "test", **kwargs}
    with pytest.raises(PrecisionError, match=match):
        PrecisionPlan(**full)  # type: ignore[arg-type]


def _plan(dtype: str, scaler: bool = False) -> PrecisionPlan:
    return PrecisionPlan(dtype, "cpu", scaler, False, "test")  # type: ignore[arg-type]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 1))


def test_fp32_precision_is_bit_identical_to_plain_loop() -> None:
    x, y = torch.randn(32, 8, generator=torch.Generator().manual_seed(1)), torch.randn(32, 1)
    plain, wrapped = _model(), _model()
    opt_a = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    opt_b = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    precision = Precision(_plan("fp32"))
    for _ in range(3):
        loss = nn.functional.mse_loss(plain(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(plain.parameters(), 1.0)
        opt_a.step()
        opt_a.zero_grad()

        with precision.autocast():
            loss = nn.functional.mse_loss(wrapped(x), y)
        precision.backward(loss)
        precision.unscale_(opt_b)
        norm = torch.nn.utils.clip_grad_norm_(wrapped.parameters(), 1.0)
        assert precision.step(opt_b, grads_finite=bool(torch.isfinite(norm)))
        opt_b.zero_grad()
    for a, b in zip(plain.parameters(), wrapped.parameters(), strict=True):
        assert torch.equal(a, b)
    assert precision.scale == 1.0


def test_bf16_precision_autocasts_on_cpu() -> None:
    model, precision = _model(), Precision(_plan("bf16"))
    with precision.autocast():
        out = model(torch.randn(4, 8))
    assert out.dtype == torch.bfloat16
    assert model(torch.randn(4, 8)).dtype == torch.float32  # nothing leaks outside the context


def _poison(model: nn.Module) -> None:
    first = next(model.parameters())
    assert first.grad is not None
    first.grad[0, 0] = float("inf")


def test_step_without_scaler_skips_nonfinite() -> None:
    model, precision = _model(), Precision(_plan("fp32"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    precision.backward(model(torch.randn(4, 8)).sum())
    _poison(model)
    assert precision.step(opt, grads_finite=False) is False
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_step_with_scaler_skips_nonfinite_and_backs_off() -> None:
    model, precision = _model(), Precision(_plan("fp16", scaler=True))  # GradScaler("cpu") stands in for cuda
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    scale = precision.scale
    with precision.autocast():
        loss = model(torch.randn(4, 8)).float().sum()
    precision.backward(loss)
    _poison(model)
    precision.unscale_(opt)
    assert precision.step(opt, grads_finite=True) is False  # the scaler's own inf check decides
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert precision.scale == scale / 2
    opt.zero_grad()

    with precision.autocast():  # small loss: at scale 2**15 a larger one genuinely overflows fp16 (and is skipped)
        loss = model(torch.randn(4, 8)).float().mean() * 1e-3
    precision.backward(loss)
    assert precision.step(opt, grads_finite=True) is True
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_state_dict_round_trip() -> None:
    model, precision = _model(), Precision(_plan("fp16", scaler=True))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    precision.backward(model(torch.randn(4, 8)).sum())
    _poison(model)
    precision.step(opt, grads_finite=True)
    state = precision.state_dict()

    restored = Precision(_plan("fp16", scaler=True))
    restored.load_state_dict(state)
    assert restored.scale == precision.scale == 2.0**15
    assert restored.state_dict()["scaler"] == state["scaler"]

    # Changing precision between runs (T4 fp16 -> A100 bf16 and back) must not fail.
    plain = Precision(_plan("fp32"))
    plain.load_state_dict(state)
    assert plain.scale == 1.0
    fresh = Precision(_plan("fp16", scaler=True))
    fresh.load_state_dict(plain.state_dict())
    assert fresh.scale == 2.0**16


# ------------------------------------------------------------------------ a CPU's precision, measured by the probe
ZEN4 = dataclasses.replace(fake_profile("CPU"), cpu_avx512_bf16=True)  # AVX512-BF16, no AMX (AMD Zen 4/5)


def _probe(speedup: float, loss_gap: float = 0.001) -> MathProbe:
    return MathProbe("width 384, ffn 1536, 12 heads, 4 x 128 tokens", 0.5, 0.5 / speedup, loss_gap)


@pytest.mark.parametrize("cpu", [ZEN4, fake_profile("CPU-AMX")], ids=["avx512-bf16", "amx"])
def test_a_cpu_plans_bf16_where_the_probe_measured_it_faster_and_fp32_where_not(cpu: HardwareInfo) -> None:
    """The plan follows the measurement, not the ISA flag, and says which won and by how much: the same CPU plans
    bf16 with a 2.5x faster probe and fp32 with a slower one, a marginal one, or one whose losses disagree."""
    wins = presets.resolve("balanced", dataclasses.replace(cpu, cpu_bf16_probe=_probe(2.5)), lengths=[30] * 500)
    assert wins.config.precision == "bf16"
    assert "bf16 autocast measured 2.5x faster than fp32 (200 vs 500 ms" in wins.precision_reason
    assert any(r.startswith("precision bf16: ") and "2.5x faster" in r for r in wins.reasons)
    for probe, says in ((_probe(0.6), "1.7x slower"), (_probe(1.05), ">= 1.1x faster"), (_probe(3, 0.1), "disagree")):
        plan = decide_precision(dataclasses.replace(cpu, cpu_bf16_probe=probe))
        assert plan.dtype == "fp32" and says in plan.reason, plan.reason


def test_the_notebooks_probe_only_a_cpu_with_bf16_instructions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """00 (stages.measured) times bf16 against fp32 on the model's block where the CPU has bf16 instructions; an
    AVX2-only CPU keeps fp32 without a probe (bf16 is emulated there), and a GPU keeps its capability rule."""
    from kitlib.machine import speed
    from kitlib.notebook import stages

    calls: list[tuple[int, ...]] = []

    def fake(*block: int, cache_dir: Path | None = None) -> MathProbe:
        calls.append(block)
        return _probe(2.0)

    monkeypatch.setattr(speed, "probe_cpu_bf16", fake)
    monkeypatch.setattr(speed, "measure_cpu_step", lambda *block: 1e9)
    p = stages.params(environ={}, data_dir=tmp_path, work_dir=tmp_path / "work", model="tiny")
    avx2 = stages.measured(p, fake_profile("CPU"))
    assert avx2.cpu_bf16_probe is None and decide_precision(avx2).dtype == "fp32" and not calls
    assert stages.measured(p, fake_profile("A100")).cpu_bf16_probe is None and not calls
    chain = dataclasses.replace(p, hardware="2xT4")  # 00 on a Kaggle CPU kernel planning 02's GPUs: this CPU is moot
    assert stages.measured(chain, ZEN4) is ZEN4 and not calls  # and nothing lands in 00's output (the cache dir)
    zen4 = stages.measured(p, ZEN4)
    assert calls == [(384, 1536, 12)] and decide_precision(zen4).dtype == "bf16"
    assert stages.measured(p, zen4) is zen4 and len(calls) == 1  # measured once per run of 00


@pytest.mark.parametrize("model_speedup", [0.9, 1.5])
def test_a_model_the_task_builds_decides_its_precision_on_its_own_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_speedup: float
) -> None:
    """A block of the model's width is no stand-in for a model the task builds (on an AMX core the block ran bf16 1.4x
    faster, the demo's BiLSTM 0.92x): where 00 times that model (facts.step), its own fp32 and bf16 steps decide,
    either way, and 01 (measured without facts) reads the same verdict from the cache."""
    from kitlib.machine import speed
    from kitlib.notebook import stages

    monkeypatch.setattr(speed, "probe_cpu_bf16", lambda *block, cache_dir=None: _probe(1.5))  # the block: bf16 wins
    monkeypatch.setattr(speed, "measure_cpu_step", lambda *block: (1e9, 1e9))
    monkeypatch.setattr(speed, "measure_python_s", lambda: 0.033)
    timed: list[str] = []

    def own(model: torch.nn.Module, batch: dict[str, torch.Tensor], flops: float, loss: object = None) -> tuple:
        timed.append("both")
        return 2e9, MathProbe("the task's own model, 16 x 12 tokens", 0.5, 0.5 / model_speedup, 0.001)

    monkeypatch.setattr(speed, "probe_model_bf16", own)
    monkeypatch.setattr(speed, "measure_model_step", lambda *step: timed.append("fp32") or 3e9)
    step = lambda rows, cap: (torch.nn.Linear(4, 4), {"input_ids": torch.zeros(rows, 12)}, 1.0, None)  # noqa: E731
    p = stages.params(environ={}, data_dir=tmp_path, work_dir=tmp_path / "work", model="tiny", epochs=1)
    facts = stages.DataFacts(100, np.full(100, 12), step=step)
    hw = stages.measured(p, ZEN4, facts=facts)  # 00's picker cell
    wins = model_speedup >= 1.1
    assert (
        decide_precision(hw).dtype == ("bf16" if wins else "fp32") and "the task's own model" in hw.cpu_bf16_probe.shape
    )
    assert hw.model_flops_now == 2e9 and timed == ["both"]
    assert decide_precision(stages.measured(p, ZEN4)).dtype == ("bf16" if wins else "fp32")  # 01: the kept verdict
    again = stages.measured(p, ZEN4, facts=facts)  # 00 run again: fp32 timed, the verdict kept
    assert timed == ["both", "fp32"] and again.cpu_bf16_probe == hw.cpu_bf16_probe and again.model_flops_now == 3e9


@pytest.mark.parametrize("bf16_row_s", [0.4, 1.0])
def test_the_block_probe_keeps_its_batch_on_a_slow_or_busy_machine(
    monkeypatch: pytest.MonkeyPatch, bf16_row_s: float
) -> None:
    """bf16 gains with the batch (an AMX core: 1.0x at 1 row of 128 tokens, 1.45-1.6x at 8). The probe sized its rows
    by the budget, so on a busy machine (a slow 1-row step) it shrank to 1 row and planned fp32; it times 8 rows now,
    a warm-up and at least 2 pairs whatever the machine's speed, and the forward pass where bf16 won. A bf16 row
    2.5x slower (0.4 against 1.0 s) cannot win at 8 rows: the probe stops after one row. Faked steps (seconds
    returned, not measured): no test reads this machine's load."""
    from kitlib.machine import speed

    calls: list[tuple[str, int, bool]] = []

    def block(*shape: int) -> speed.Step:
        def step(dtype: torch.dtype, rows: int, train: bool = True) -> tuple[float, float]:
            calls.append((str(dtype)[6:], rows, train))
            fp32 = 0.4 * rows  # a busy machine: 0.4 s a row, so 1 row of each precision fills a third of the budget
            return (fp32 if dtype == torch.float32 else bf16_row_s + (fp32 - 0.4) / 1.5), 1.0

        return step

    monkeypatch.setattr(speed, "_block", block)
    probe = speed.probe_cpu_bf16(budget_s=1.0)
    one_row = [("float32", 1, True), ("bfloat16", 1, True)] * 2  # a warm-up pair, then the pair that decides
    if bf16_row_s == 1.0:
        assert "1 x 128 tokens" in probe.shape and probe.forward_speedup is None and calls == one_row
        return
    assert "8 x 128 tokens" in probe.shape, probe.shape
    assert probe.speedup == pytest.approx(3.2 / (0.4 + 2.8 / 1.5)) and probe.speedup >= 1.1  # bf16 wins at 8 rows
    assert calls[:10] == one_row + [("float32", 8, True), ("bfloat16", 8, True)] * 3  # warm-up + 2 pairs
    assert probe.forward_speedup is not None and {c[1] for c in calls[10:]} == {16}  # the forward pass alone


def test_00_probes_the_block_on_the_threads_the_run_takes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A neighbour holding 1 of 2 cores made torch's 2-thread pool time noise (bf16 read 0.8x on a forward pass that
    gains 2x): the block is probed inside the count the stages chose (HardwareInfo.cpu_threads_now), and torch's own
    count comes back afterwards."""
    from kitlib.machine import speed, threads
    from kitlib.notebook import stages

    seen: list[int] = []
    monkeypatch.setattr(
        speed, "probe_cpu_bf16", lambda *b, cache_dir=None: seen.append(torch.get_num_threads()) or _probe(1.5)
    )
    monkeypatch.setattr(threads, "share", lambda: 2)  # a 2-CPU share on any machine: only the chosen count gives 1
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        p = stages.params(environ={}, data_dir=tmp_path, work_dir=tmp_path / "work", model="tiny")
        hw = stages.measured(p, dataclasses.replace(ZEN4, cpu_threads_now=1))
        assert seen == [1] and torch.get_num_threads() == 2 and decide_precision(hw).dtype == "bf16"
    finally:
        torch.set_num_threads(before)


def test_the_probe_times_both_precisions_checks_the_loss_and_is_kept_per_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kitlib.machine.speed import probe_cpu_bf16

    rng = torch.get_rng_state()
    probe = probe_cpu_bf16(64, 128, 4, 16, budget_s=0.05, cache_dir=tmp_path)
    assert torch.equal(torch.get_rng_state(), rng)  # the user's random stream is untouched
    assert probe.fp32_s > 0 and probe.bf16_s > 0 and probe.loss_gap < 0.02  # the same step, in two precisions
    assert "width 64, ffn 128, 4 heads" in probe.shape and "x 16 tokens" in probe.shape
    monkeypatch.setattr(nn, "TransformerEncoderLayer", None)  # a second probe of this shape measures nothing
    assert probe_cpu_bf16(64, 128, 4, 16, cache_dir=tmp_path) == probe
    with pytest.raises(TypeError):  # another shape is measured again
        probe_cpu_bf16(64, 128, 2, 16, cache_dir=tmp_path)


def test_02_keeps_the_cpu_precision_verdict_beside_its_record_for_the_doctor(tmp_path: Path, cpu_hw) -> None:
    """02 on a CPU with bf16 instructions keeps 00's verdict (here: bf16 lost, fp32 planned) in run/probes.json, and
    the doctor reading the run then gives no precision advice; a CPU without bf16 instructions keeps nothing."""
    from test_tasks import _competition

    from kitlib.doctor.probe import load_probes
    from kitlib.doctor.report import diagnose
    from kitlib.notebook import stages, training

    lost = MathProbe("the task's own model, 16 x 107 tokens", 0.199, 0.218, 0.0)
    for name, hw in (("zen4", dataclasses.replace(ZEN4, cpu_bf16_probe=lost)), ("avx2", cpu_hw)):
        p = stages.params(data_dir=_competition(tmp_path / name), work_dir=tmp_path / f"work-{name}", preset="smoke",
                          model="tiny")  # fmt: skip
        stages.setup(p, hw)
        stages.features(p, hw=hw, quiet=True)
        training.train(p, hw=hw)
        kept = load_probes(p.run_dir)
        if name == "zen4":
            saved = json.loads((p.work_dir / "features.json").read_text())["run"]  # 01's resolution
            assert kept == {"precision": lost} and saved["config"]["precision"] == "fp32"
            assert not [f for f in diagnose(p.run_dir, ZEN4).findings if f.rule == "precision"]
        else:
            assert kept == {}


def test_the_model_probe_times_a_real_module_in_both_precisions_and_it_still_trains() -> None:
    """speed.probe_model_bf16 on a real (tiny) module: fp32 and bf16 steps both timed, the losses compared on the same
    weights, the shape read from input_ids (wherever it sits in the batch), and the module trains on afterwards."""
    from kitlib.machine.speed import probe_model_bf16

    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(50, 16), nn.Flatten(), nn.Linear(16 * 7, 3))
    batch = {"labels": torch.randint(0, 3, (4,)), "input_ids": torch.randint(0, 50, (4, 7))}

    def loss(m: nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
        return nn.functional.cross_entropy(m(b["input_ids"]).float(), b["labels"])

    before = model[2].weight.detach().clone()
    flops, probe = probe_model_bf16(model, batch, 1e6, loss, budget_s=0.05)
    assert flops > 0 and probe.fp32_s > 0 and probe.bf16_s > 0 and 0 <= probe.loss_gap < 0.05
    assert probe.shape == "the task's own model, 4 x 7 tokens" and model.training
    assert not torch.equal(before, model[2].weight)  # its steps updated the weights (documented: build one for it)
    loss(model, batch).backward()
    assert all(w.grad is not None for w in model.parameters())  # grads zeroed to None by the probe, then fresh ones


def test_a_module_that_fails_under_bf16_loses_the_probe_and_keeps_its_fp32_speed() -> None:
    """A user's module that raises under bf16 autocast (here: it asserts fp32 activations, as a hand-written kernel
    may) is a verdict, not a lost measurement: its fp32 step is still timed, bf16 loses, and the plan says why; the
    old code raised out of the probe, the fp32 timing was lost, and the block's verdict could plan bf16 for it."""
    from kitlib.machine.speed import probe_model_bf16

    class Fp32Only(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.out = nn.Embedding(50, 16), nn.Linear(16, 3)

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            hidden = self.out(self.embed(input_ids).mean(1))
            assert hidden.dtype == torch.float32, f"fp32 kernels only, got {hidden.dtype}"
            return hidden

    def loss(m: nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
        return nn.functional.cross_entropy(m(b["input_ids"]), b["labels"])

    batch = {"input_ids": torch.randint(0, 50, (4, 7)), "labels": torch.randint(0, 3, (4,))}
    flops, probe = probe_model_bf16(Fp32Only(), batch, 1e6, loss, budget_s=0.05)
    assert flops > 0 and probe.fp32_s > 0 and probe.speedup == 0.0
    assert "AssertionError: fp32 kernels only, got torch.bfloat16" in probe.error
    plan = decide_precision(dataclasses.replace(ZEN4, cpu_bf16_probe=probe))
    assert plan.dtype == "fp32" and "bf16 autocast failed on the task's own model, 4 x 7 tokens" in plan.reason
    assert "does not run under bf16 autocast" in plan.reason, plan.reason
    with pytest.raises(PrecisionError, match=r"raised under bf16 autocast.*Fix: use precision='fp32'"):
        decide_precision(dataclasses.replace(ZEN4, cpu_bf16_probe=probe), "bf16")  # asked for by hand: refused


def test_a_verdict_round_trips_through_both_files_and_a_newer_files_fields_are_ignored(tmp_path: Path) -> None:
    """A failed verdict and a forward gain survive the cache (precision_probe.json) and 02's probes.json; a field a
    newer kitlib added is ignored, not a TypeError (the cache is re-measured, probes.json named as damaged)."""
    from kitlib.doctor.probe import PROBES_FILE, load_probes, save_probe
    from kitlib.machine import speed

    failed = MathProbe("the task's own model, 4 x 7 tokens", 0.002, 0.0, 0.0, "AssertionError: fp32 only")
    block = dataclasses.replace(_probe(1.3), forward_speedup=2.4)
    for key, probe in (("model", failed), ("block", block)):
        assert speed.kept_probe(key, tmp_path) is None and speed.keep_probe(key, tmp_path, probe) == probe
        assert speed.kept_probe(key, tmp_path) == probe
        save_probe(tmp_path / "run", probe)
        assert load_probes(tmp_path / "run") == {"precision": probe}
    for file in (tmp_path / speed.PROBE_FILE, tmp_path / "run" / PROBES_FILE):
        saved = json.loads(file.read_text())
        for entry in saved.values():
            entry["a_later_field"] = 1
        file.write_text(json.dumps(saved))
    assert speed.kept_probe("block", tmp_path) == block and load_probes(tmp_path / "run") == {"precision": block}


def test_02_reads_the_kept_verdict_and_never_measures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What 02 keeps for the doctor is read from the cache (stages.kept_verdict): with nothing kept, nothing is
    measured after training (a block's probe there would stand in for a model the task builds)."""
    from kitlib.machine import speed
    from kitlib.notebook import stages

    def never(*args: object, **kwargs: object) -> MathProbe:
        raise AssertionError("02 measured a probe")

    monkeypatch.setattr(speed, "probe_cpu_bf16", never)
    p = stages.params(environ={}, data_dir=tmp_path, work_dir=tmp_path / "work", model="tiny")
    assert stages.kept_verdict(p, ZEN4) is None
    block = speed.keep_probe(speed.block_key(384, 1536, 12), p.cache_dir, _probe(1.5))
    assert stages.kept_verdict(p, ZEN4) == block
    own = speed.keep_probe(stages._model_key(p), p.cache_dir, _probe(0.9))
    assert stages.kept_verdict(p, ZEN4) == own  # the model's own verdict before the block's
    assert stages.kept_verdict(p, dataclasses.replace(ZEN4, cpu_bf16_probe=block)) == block  # the one hw carries
