"""What a GPU run needs of fit beyond correctness, shown on a CPU: no host sync in a training step, bounded pinned
snapshot memory, fresh memory facts per fit, and generating evals that neither copy the model nor leave a DDP rank
in a collective. ``aten._local_scalar_dense`` is the op behind ``.item()``/``bool()``/``float()`` of a tensor: on
CUDA it is the host sync, so counting it (and ``tolist``) on CPU counts the syncs a GPU run would make."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader, TensorDataset

from kitlib import TrainConfig, fit
from kitlib.engine.events import Callback, StepEnd
from kitlib.engine.loop import Loop
from kitlib.engine.optim import lr_lambda


class _Syncs(TorchDispatchMode):
    """Counts the reads of a tensor's value by the host, i.e. the host syncs a CUDA run would make."""

    def __init__(self) -> None:
        super().__init__()
        self.count, self.paused = 0, False  # paused: the test's own reads

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default and not self.paused:
            self.count += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def _counting_syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Syncs]:
    mode = _Syncs()
    tolist = torch.Tensor.tolist

    def counted_tolist(self: torch.Tensor) -> Any:  # a whole tensor read at once: one sync, not one per element
        mode.count += not mode.paused
        return tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counted_tolist)
    with mode:
        yield mode


class _SyncsPerStep(Callback):
    """Syncs made during each window (from the end of the previous one), and whether that window logged."""

    def __init__(self, mode: _Syncs) -> None:
        self.mode, self.seen = mode, 0
        self.per_step: list[int] = []
        self.logged: list[bool] = []

    def on_step_end(self, step: StepEnd) -> None:
        self.per_step.append(self.mode.count - self.seen)
        self.logged.append(False)
        self.seen = self.mode.count

    def on_log(self, metrics: Any) -> None:  # the loop fires it after the step's on_step_end, its syncs made before
        self.logged[-1] = True


def _data(n: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True))


def _mse(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.mse_loss(model(batch[0]), batch[1])


def _cfg(**kw: Any) -> TrainConfig:
    base: dict[str, Any] = {"epochs": 1, "micro_batch_size": 8, "lr": 1e-2, "precision": "fp32", "grad_clip": 1.0}
    return TrainConfig(**{**base, **kw})


def _fp16_cpu(cpu_hw: Any) -> Any:
    """A CPU that runs fp16 autocast + GradScaler (AVX512-FP16), to drive the scaler path on this machine."""
    return dataclasses.replace(cpu_hw, cpu_avx512_fp16=True)


# ------------------------------------------------------------------------------------- finding 5: syncs per step


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_training_steps_make_no_host_sync_between_logs(
    precision: str, cpu_hw: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 windows, a log every 20 steps: the windows that do not log read nothing from the device (main: >= 1 each,
    bool(isfinite(norm)); fp16: get_scale() twice more)."""
    hw = _fp16_cpu(cpu_hw) if precision == "fp16" else cpu_hw
    cfg = _cfg(precision=precision, log_every_steps=20, grad_accum_steps=2)
    loader = DataLoader(_data(640), batch_size=8)
    with _counting_syncs(monkeypatch) as mode:
        probe = _SyncsPerStep(mode)
        result = fit(nn.Linear(4, 1), loader, config=cfg, loss_fn=_mse, hw=hw, callbacks=[probe])
    assert result.steps + result.skipped_steps == 40
    steady = [n for i, (n, logged) in enumerate(zip(probe.per_step, probe.logged, strict=True)) if i and not logged]
    assert len(steady) >= 30
    # a skipped step just before a log step costs one read (is the log due yet?): fp16's first steps skip
    assert sum(steady) <= result.skipped_steps, f"host syncs in steps that do not log: {probe.per_step}"
    far = [n for i, (n, logged) in enumerate(zip(probe.per_step, probe.logged, strict=True)) if 2 <= i % 20 <= 15]
    assert sum(far) - sum(probe.per_step[i] for i in range(40) if probe.logged[i] and 2 <= i % 20 <= 15) == 0
    # a log step reads the counts once, and the loss sums the log shows: a few syncs per log, not per step
    assert max(n for n, logged in zip(probe.per_step, probe.logged, strict=True) if logged) <= 4


class _PoisonAt(nn.Module):
    """A linear model whose gradients are inf in the given windows (one micro-batch each)."""

    def __init__(self, windows: set[int]) -> None:
        super().__init__()
        self.linear, self.windows, self.calls = nn.Linear(4, 1), windows, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)
        if self.training:
            self.calls += 1
            if self.calls - 1 in self.windows:
                out = out * float("inf")
        return out


class _Recorder(Callback):
    """Per optimizer.step call: the LR the step ran with, the weights before and after (its reads are not counted)."""

    def __init__(self, mode: _Syncs) -> None:
        self.mode = mode
        self.lrs: list[float] = []
        self.before: list[torch.Tensor] = []
        self.after: list[torch.Tensor] = []

    def on_fit_start(self, loop: Loop) -> None:
        def weights() -> torch.Tensor:
            return torch.cat([p.detach().flatten().clone() for p in loop.params])

        def before(optimizer: Any, args: Any, kwargs: Any) -> None:
            self.mode.paused = True
            self.lrs.append(float(optimizer.param_groups[0]["lr"]))
            self.before.append(weights())
            self.mode.paused = False

        loop.optimizer.register_step_pre_hook(before)
        loop.optimizer.register_step_post_hook(lambda optimizer, args, kwargs: self.after.append(weights()))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_an_injected_inf_is_skipped_on_the_device_without_advancing_the_schedule(
    precision: str, cpu_hw: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Windows 3 and 4 get inf gradients: those steps leave the weights alone, the next applied step runs at the LR
    the skipped one would have had, the counts are exact, and deciding all of it read nothing from the device
    (main: a sync per step)."""
    hw = _fp16_cpu(cpu_hw) if precision == "fp16" else cpu_hw
    cfg = _cfg(precision=precision, log_every_steps=100, warmup_ratio=0.5, schedule="linear")
    model = _PoisonAt({3, 4})
    with _counting_syncs(monkeypatch) as mode:
        probe, recorder = _SyncsPerStep(mode), _Recorder(mode)
        result = fit(model, DataLoader(_data(96), batch_size=8), config=cfg, loss_fn=_mse, hw=hw,
                     callbacks=[recorder, probe])  # fmt: skip
    windows = 12
    assert result.steps + result.skipped_steps == windows
    assert sum(probe.per_step[1:-1]) == 0, f"host syncs per step: {probe.per_step}"
    assert len(recorder.lrs) == windows  # fused AdamW is called every window and skips on the device
    for k in (3, 4):
        assert torch.equal(recorder.before[k], recorder.after[k]), f"the skipped step {k} changed the weights"
    assert not torch.equal(recorder.before[5], recorder.after[5])
    # The schedule advances per applied step only: windows 3, 4 and 5 all run at the LR of schedule position 3
    # (fp32; 2 under fp16 when its first step was skipped too), and the applied steps at consecutive positions.
    rule = lr_lambda(cfg, windows)
    applied = [not torch.equal(b, a) for b, a in zip(recorder.before, recorder.after, strict=True)]
    position = 0
    for k, (lr, was_applied) in enumerate(zip(recorder.lrs, applied, strict=True)):
        assert lr == pytest.approx(cfg.lr * rule(position), rel=1e-6), f"window {k}"
        position += was_applied
    assert position == result.steps and windows - position == result.skipped_steps >= 2
    assert recorder.lrs[3] == recorder.lrs[4] == recorder.lrs[5]


def test_fp16_training_reads_no_private_grad_scaler_state(cpu_hw: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """fit's sync-free fp16 step uses GradScaler's public API only: a torch release that renames its private
    per-optimizer state must not break every fp16 step (a T4's default). The inf window is still skipped, the scale
    halved."""
    outside: list[str] = []

    class Watched(torch.amp.GradScaler):
        def __getattribute__(self, name: str) -> Any:
            if name == "_per_optimizer_states" and not sys._getframe(1).f_code.co_filename.endswith("grad_scaler.py"):
                outside.append(sys._getframe(1).f_code.co_filename)
            return super().__getattribute__(name)

    monkeypatch.setattr(torch.amp, "GradScaler", Watched)
    scales: list[float] = []

    class Scale(Callback):
        def on_fit_start(self, loop: Loop) -> None:
            self.loop = loop

        def on_step_end(self, step: StepEnd) -> None:
            scales.append(self.loop.precision.scale)

    cfg = _cfg(precision="fp16", log_every_steps=100)
    result = fit(_PoisonAt({3}), DataLoader(_data(48), batch_size=8), config=cfg, loss_fn=_mse, hw=_fp16_cpu(cpu_hw),
                 callbacks=[Scale()])  # fmt: skip
    assert outside == [], f"private GradScaler state read from {sorted(set(outside))}"
    assert result.skipped_steps >= 1 and scales[3] == scales[2] / 2


# ------------------------------------------------------------------------------ finding 11: memory facts per fit


def test_each_fit_reports_its_own_peak_memory(cpu_hw: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake CUDA allocator whose peak only a reset lowers: the second fit's facts must show its own peak (main:
    the first fit's)."""
    from types import SimpleNamespace

    from kitlib.engine.record import RunRecorder

    allocator = {"now": 0, "peak": 0}

    def reset(device: Any = None) -> None:
        allocator["peak"] = allocator["now"]

    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: allocator["peak"])
    loop = SimpleNamespace(device=torch.device("cuda", 0), cfg=_cfg())
    peaks = []
    for used in (10 << 30, 1 << 30):  # a big first fit, then a small one in the same kernel
        recorder = RunRecorder()
        recorder.on_fit_start(loop)  # type: ignore[arg-type]
        allocator["now"], allocator["peak"] = 0, max(allocator["peak"], used)
        peaks.append(torch.cuda.max_memory_allocated(loop.device))
    assert peaks == [10 << 30, 1 << 30]

    # ... and a CPU run leaves CUDA alone (resetting its stats would initialise it)
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a CPU run touched the CUDA allocator")

    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", refuse)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", refuse)
    result = fit(nn.Linear(4, 1), DataLoader(_data(32), batch_size=8), config=_cfg(), loss_fn=_mse, hw=cpu_hw)
    assert result.steps == 4 and not torch.cuda.is_initialized()


# ------------------------------------------------- finding 6: generating evals on the device, DDP waits together


def test_generating_eval_runs_on_the_models_device_without_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The generating full eval generates with the model it is given (its device, its weights: no deep copy, which
    on a GPU doubled the weights' memory and generated on the CPU in a thread); only the metric is deferred."""
    import copy

    from kitlib.notebook.tasks import generation

    def no_copy(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the model was deep-copied for the eval")

    monkeypatch.setattr(copy, "deepcopy", no_copy)
    model, used, scored = nn.Linear(2, 2), [], []

    def generate(on: nn.Module) -> tuple[list[str], list[str]]:
        used.append(on)
        return ["a"], ["a"]

    def score(references: list[str], generated: list[str]) -> dict[str, float]:
        scored.append(references)
        return {"exact": float(references == generated)}

    split = generation.generated_eval(generate, score)
    measured = split.measure(model)
    assert used == [model] and not scored  # generated in the foreground, on the model itself; the metric waits
    assert split.score(measured) == {"exact": 1.0}


_DDP_EVAL = r"""
import os, sys, time, datetime
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from kitlib import TrainConfig, fit
from kitlib.engine.evaluation import SplitEval
from kitlib.machine.hardware import fake_profile

def slow_score(measured):
    # rank 0's background metric outlasts the collective timeout (3 s) the other rank would wait in
    time.sleep(6.0)
    return {"score": 1.0}

def worker(rank, port, out):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=3))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    cfg = TrainConfig(epochs=2, micro_batch_size=8, lr=1e-2, precision="fp32", full_eval_every=1,
                      monitor="score", mode="max")
    hw = fake_profile("CPU", platform="local", interactive=False)
    result = fit(nn.Linear(4, 1), DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8), config=cfg,
                 loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]),
                 full_eval=SplitEval(lambda m: None, slow_score), hw=hw)
    open(f"{out}.{rank}", "w").write(str(list(result.history.get("score", []))))
    dist.destroy_process_group()

if __name__ == "__main__":
    from kitlib.machine.distributed import free_port
    mp.spawn(worker, args=(free_port(), sys.argv[1]), nprocs=2)
"""


@pytest.mark.slow  # over 20 s on 2 cores: CI runs it (.ci/run), the test command does not
def test_ddp_ranks_wait_together_for_a_long_full_eval(tmp_path: Any) -> None:
    """Two gloo ranks, a 3 s collective timeout, rank 0's background metric takes 6 s: the other rank must wait for it
    at a barrier with no timeout risk, not in a collective (main: it waits in one and the job dies of the timeout)."""
    import subprocess
    import sys

    script = tmp_path / "ddp_eval.py"
    script.write_text(_DDP_EVAL)
    out = tmp_path / "scores"
    proc = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "scores.0").read_text() == "[1.0, 1.0]"


# ----------------------------------------------------------------- issue 49: no sync inside the models and losses


def _hf_batches(kind: str, n: int) -> list[dict[str, torch.Tensor]]:
    """Unpadded rows (masks of ones, as packed or equal-length batches): the prompt's labels -100 for a causal LM."""
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(n):
        ids = torch.randint(3, 97, (4, 12), generator=g)
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if kind == "bert":
            batch["labels"] = torch.randint(0, 2, (4,), generator=g)
        elif kind == "t5":
            batch["labels"] = torch.randint(3, 97, (4, 7), generator=g)
        else:
            batch["labels"] = torch.where(torch.arange(12) < 4, -100, ids)
        batches.append(batch)
    return batches


@pytest.mark.parametrize("kind, loss", [("bert", "hf"), ("llama", "hf"), ("llama", "chunked"), ("t5", "hf"),
                                        ("t5", "chunked")])  # fmt: skip
def test_hugging_face_models_and_losses_make_no_host_sync_between_logs(kind: str, loss: str, cpu_hw: Any) -> None:
    """The counter sees inside transformers (its mask code's ``padding_mask.all()``) and the losses: 0 syncs in every
    window that does not log, for a classifier, a causal LM (its own loss and the chunked one) and seq2seq. On main:
    one or two a window (the mask check in every forward; the chunked loss's boolean gather)."""
    from sync_counter import counting_syncs
    from test_chunked_loss import _model
    from transformers import BertConfig, BertForSequenceClassification

    from kitlib.engine.chunked_loss import chunked_lm_loss

    if kind == "bert":
        torch.manual_seed(0)
        config = BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=64, num_labels=2)  # fmt: skip
        model = BertForSequenceClassification(config)
    else:
        model = _model(kind)
    cfg = _cfg(micro_batch_size=4, log_every_steps=10, grad_accum_steps=2, lr=1e-3)
    loader = DataLoader(_hf_batches(kind, 40), batch_size=None)  # pre-built batches, yielded as they are
    with counting_syncs() as mode:
        probe = _SyncsPerStep(mode)  # type: ignore[arg-type]
        fit(model, loader, config=cfg, loss_fn=chunked_lm_loss if loss == "chunked" else None, hw=cpu_hw,
            callbacks=[probe])  # fmt: skip
    assert len(probe.per_step) == 20
    steady = [n for i, (n, logged) in enumerate(zip(probe.per_step, probe.logged, strict=True)) if i and not logged]
    assert len(steady) >= 16
    assert sum(steady) == 0, f"host syncs in windows that do not log: {probe.per_step}; where: {dict(mode.where)}"


# ------------------------------------------------ issue 49: a window with nothing to score


def test_a_window_with_no_scored_items_is_skipped(cpu_hw: Any) -> None:
    """A window whose micro-batches score nothing (a causal LM's prompts cut past their answers: every label -100)
    has a total of 0: 0/0 is nan on the device and the step is skipped (no ZeroDivisionError), the weights finite."""

    def count(batch: Any, calls: list[int] = [0]) -> int:  # noqa: B006 (its own counter per run)
        calls[0] += 1  # the 5th and 6th micro-batches (window 3 at accumulation 2) score nothing
        return 0 if calls[0] in (5, 6) else len(batch[0])

    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    result = fit(model, DataLoader(_data(96), batch_size=8), config=_cfg(grad_accum_steps=2), loss_fn=_mse,
                 count_fn=count, hw=cpu_hw)  # fmt: skip
    assert (result.steps, result.skipped_steps) == (5, 1)
    assert all(torch.isfinite(p).all() for p in model.parameters())
