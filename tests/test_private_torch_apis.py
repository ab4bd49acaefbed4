"""Issue #29 item 4: what kitlib's hot path relies on that torch does not document as public, one test each, so a
torch release that changes it fails here by name instead of in a training run.

Run on torch 2.13.0 (CPU build) and 2.6.0 (the cu124 wheel, on a CPU): all pass on both. The package declares
torch>=2.4, but on 2.4 (and 2.5) kitlib.engine does not import: ``fully_shard``, ``MixedPrecisionPolicy`` and
``FSDPModule`` are public in ``torch.distributed.fsdp`` from 2.6, so 2.6 is the lowest torch these pins can run on.
GradScaler's private per-optimizer state is gone from kitlib (Precision.forget_unscale rebuilds the scaler from its
public state_dict).
"""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest
import torch
from torch import nn

import kitlib
from kitlib.engine.chunked_loss import _head_input
from kitlib.engine.step import _recompute_in_backward
from kitlib.machine.amp import Precision
from kitlib.machine.precision import PrecisionPlan


def test_kitlib_reads_no_private_grad_scaler_state() -> None:
    """The replaced use stays replaced: no kitlib module names GradScaler's private per-optimizer record."""
    root = Path(kitlib.__file__).parent
    assert [p for p in root.rglob("*.py") if "_per_optimizer_states" in p.read_text()] == []


def test_forget_unscale_keeps_the_loss_scale_and_its_growth_count() -> None:
    """The public replacement (state_dict into a fresh scaler) keeps what the private reset kept."""
    precision = Precision(PrecisionPlan("fp16", "cpu", True, False, "a GradScaler, on the CPU for the test"))
    model = nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(3):  # three applied steps: the growth count is 3
        precision.backward(model(torch.randn(2, 4)).sum())
        precision.unscale_(optimizer)
        precision.step(optimizer, grads_finite=True)
    before = precision.state_dict()
    precision.backward(model(torch.randn(2, 4)).sum())
    precision.unscale_(optimizer)
    precision.forget_unscale()
    assert precision.state_dict() == before and before["scaler"]["_growth_tracker"] == 3


@pytest.mark.parametrize("found_inf", [0.0, 1.0])
def test_private_torch_api_fused_adamw_takes_found_inf(found_inf: float) -> None:
    """Precision.apply's sync-free skip: an optimizer with ``_step_supports_amp_scaling`` (fused AdamW, kitlib's
    default) reads ``optimizer.grad_scale`` / ``optimizer.found_inf`` set as attributes (GradScaler.step's protocol)
    and leaves weights and step count untouched where found_inf is 1. Checked on torch 2.13.0."""
    model = nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    assert getattr(optimizer, "_step_supports_amp_scaling", False), "torch dropped the flag Precision.apply reads"
    model(torch.randn(2, 4)).sum().backward()
    before = [p.detach().clone() for p in model.parameters()]
    precision = Precision(PrecisionPlan("fp32", "cpu", False, False, "no scaler"))
    precision.apply(optimizer, torch.tensor(found_inf))
    moved = [not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True)]
    steps = [float(s["step"]) for s in optimizer.state.values()]
    assert moved == [not found_inf] * 2 and steps == [1.0 - found_inf] * 2
    assert not hasattr(optimizer, "found_inf")  # the attributes are taken away again


def test_private_torch_api_module_class_swap_recomputes_in_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gradient checkpointing of a plain block: its ``__class__`` becomes a subclass whose forward goes through
    torch.utils.checkpoint while training (nn.Module lets ``__class__`` be assigned; its state_dict, copies and
    pickles keep working). Checked on torch 2.13.0."""
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 1))
    block = copy.deepcopy(plain)
    _recompute_in_backward(block)
    calls = []
    real = torch.utils.checkpoint.checkpoint
    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = torch.randn(3, 4)
    plain(x).sum().backward()
    block(x).sum().backward()
    assert calls == [1] and isinstance(block, nn.Sequential) and block.state_dict().keys() == plain.state_dict().keys()
    grads = zip(plain.parameters(), block.parameters(), strict=True)
    assert all(torch.allclose(a.grad, b.grad) for a, b in grads)  # type: ignore[arg-type]
    for again in (copy.deepcopy(block), pickle.loads(pickle.dumps(block))):
        assert getattr(again, "_kitlib_checkpointed", False) and torch.equal(again(x), block(x))


def test_private_torch_api_instance_forward_replaces_the_class_forward() -> None:
    """The chunked loss's head capture: ``module.forward`` set on the instance is what ``module(x)`` calls
    (nn.Module.__call__ looks ``forward`` up on the instance), and deleting it brings the class's back.
    Checked on torch 2.13.0."""

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.head = nn.Linear(4, 4), nn.Linear(4, 10)

        def get_output_embeddings(self) -> nn.Module:
            return self.head

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.body(x))

    model, x = Model(), torch.randn(2, 4)
    with _head_input(model) as captured:
        logits = model(x)
    assert logits.shape == (2, 10) and logits.count_nonzero() == 0  # the placeholder: no logits computed
    assert len(captured) == 1 and torch.equal(captured[0], model.body(x))
    assert "forward" not in vars(model.head) and torch.equal(model(x), model.head(model.body(x)))


def test_hardware_detection_reads_no_private_torch_binding(monkeypatch: pytest.MonkeyPatch) -> None:
    """#50: AMX comes from /proc/cpuinfo's flags alone, like every other CPU flag (torch._C._cpu went): no module of
    kitlib.machine names torch._C, and a machine without /proc reports no AMX (fp32 on the CPU, the safe default)."""
    from kitlib.machine import hardware

    root = Path(kitlib.__file__).parent / "machine"
    assert [p.name for p in root.rglob("*.py") if "torch._C" in p.read_text()] == []

    monkeypatch.setattr(hardware, "_cpu_flags", frozenset)  # no /proc/cpuinfo (macOS, Windows)
    assert hardware.detect({}).cpu_amx is False


def test_private_torch_api_dynamo_records_compile_times() -> None:
    """RunFacts' compile seconds (record._compile_times): ``torch._dynamo.utils.compilation_time_metrics`` gains one
    ``_compile.compile_inner`` entry per dynamo compile (the eager backend: no C compiler needed)."""
    from kitlib.engine.record import _compile_times

    before = len(_compile_times())
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: x * 2 + 1, backend="eager")
    assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 3.0))
    assert len(_compile_times()) == before + 1 and all(t >= 0 for t in _compile_times())
