"""Short measurements on the user's model that back the doctor's advice with numbers (never run on import); the
model's gradients, mode and RNG streams are put back afterwards."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from kitlib._files import known_fields, write_atomic
from kitlib.engine.objective import Batch, LossFn, hf_loss, rows
from kitlib.engine.step import to_device
from kitlib.errors import DataError

PROBES_FILE = "probes.json"  # beside a run's timing.json: measurements on its model that diagnose(run_dir) reads


@dataclass(frozen=True)
class MicroBatchProbe:
    """Forward+backward time for the same rows as ``factor`` micro-batches of ``micro_batch_size`` rows (small_s)
    and as one micro-batch of ``micro_batch_size * factor`` rows (big_s); the best of the repeats."""

    micro_batch_size: int
    factor: int
    small_s: float
    big_s: float

    @property
    def ratio(self) -> float:
        """How many times faster the bigger micro-batch gets through the same rows."""
        return self.small_s / self.big_s if self.big_s > 0 else float("inf")

    def __str__(self) -> str:
        m, k = self.micro_batch_size, self.factor
        small = f"{k} forward/backward passes of {m} row{'s' * (m > 1)} took {1e3 * self.small_s:.1f} ms"
        return f"{small}, 1 pass of {m * k} rows {1e3 * self.big_s:.1f} ms: {self.ratio:.2f}x"


def _rows(batch: Batch, start: int, stop: int) -> Batch:
    """Rows ``start:stop`` of a batch (a tensor, a mapping or a sequence of tensors: their first dimension)."""
    if isinstance(batch, torch.Tensor):
        return batch[start:stop]
    if isinstance(batch, Mapping):
        return {k: _rows(v, start, stop) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(_rows(v, start, stop) for v in batch)
    return batch


def probe_micro_batch(
    model: nn.Module,
    batch: Batch,
    *,
    micro_batch_size: int,
    factor: int,
    loss_fn: LossFn | None = None,
    repeats: int = 3,
) -> MicroBatchProbe:
    """Time forward+backward over ``micro_batch_size * factor`` rows of ``batch`` (on the model's device): as
    ``factor`` micro-batches and as one, after a warm-up pass of each shape, best of ``repeats``. A few seconds at
    most for a model that trains; gradients, mode and RNG streams are restored, weights never change."""
    need = micro_batch_size * factor
    have = rows(batch)
    if micro_batch_size < 1 or factor < 2 or have < need:
        raise ValueError(
            f"probe_micro_batch needs micro_batch_size >= 1, factor >= 2 and a batch of >= {need} rows "
            f"(micro_batch_size x factor); got {micro_batch_size}, {factor} and {have} rows"
        )
    small = [_rows(batch, i * micro_batch_size, (i + 1) * micro_batch_size) for i in range(factor)]
    best = best_passes(model, {"small": small, "big": [_rows(batch, 0, need)]}, loss_fn=loss_fn, repeats=repeats)
    return MicroBatchProbe(micro_batch_size, factor, best["small"], best["big"])


def best_passes(
    model: nn.Module,
    groups: Mapping[str, list[Batch]],
    *,
    loss_fn: LossFn | None = None,
    repeats: int = 3,
    budget_s: float = 0.0,
) -> dict[str, float]:
    """The best seconds of forward+backward through each group's batches: a warm-up each, then ``repeats`` interleaved
    passes (more, up to 20, within ``budget_s``). Gradients, mode and RNG streams are put back; weights never change."""
    loss_fn = loss_fn or hf_loss
    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device if params else torch.device("cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    move = to_device(device)

    def passes(batches: list[Batch]) -> float:
        for p in params:  # accumulated within a pass, as over a window's micro-batches; none held between passes
            p.grad = None
        sync()
        begin = time.perf_counter()
        for part in batches:
            loss_fn(model, move(part)).backward()
        sync()
        return time.perf_counter() - begin

    grads = [p.grad for p in params]  # kept aside, not accumulated into: backward() adds to an existing .grad in place
    was_training = model.training
    devices = [device] if device.type == "cuda" else []
    best = dict.fromkeys(groups, float("inf"))
    try:
        with torch.random.fork_rng(devices=devices):
            model.train()
            for batches in groups.values():
                passes(batches[:1])
            start, done = time.perf_counter(), 0
            while done < repeats or (done < 20 and time.perf_counter() - start < budget_s):
                for name, batches in groups.items():
                    best[name] = min(best[name], passes(batches))
                done += 1
    finally:
        model.train(was_training)
        for p, g in zip(params, grads, strict=True):
            p.grad = g
    return best


def save_probe(run_dir: str | Path, probe: MicroBatchProbe) -> Path:
    """Keep ``probe`` beside the run's record (``run_dir/probes.json``), so ``diagnose(run_dir)`` quotes it later."""
    return write_atomic(Path(run_dir) / PROBES_FILE, json.dumps({"micro_batch": dataclasses.asdict(probe)}))


def load_probes(run_dir: str | Path) -> dict[str, Any]:
    """The probes saved beside a run's record (``save_probe``), by name; {} when none were."""
    path = Path(run_dir) / PROBES_FILE
    if not path.is_file():
        return {}
    try:
        saved = json.loads(path.read_text())
        kept = saved.get("micro_batch")
        return {} if kept is None else {"micro_batch": MicroBatchProbe(**known_fields(MicroBatchProbe, kept))}
    except (ValueError, TypeError, AttributeError) as e:  # not JSON, or not the fields save_probe writes
        raise DataError(
            f"{path} is not what save_probe writes ({e}; kitlib.doctor.probe). Fix: delete it, or measure again and "
            "save_probe(run_dir, probe_micro_batch(model, batch, ...))"
        ) from e
