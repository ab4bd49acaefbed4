"""Out-of-memory back-off that keeps the effective batch: the window is replayed from its start (gradients zeroed, the
scaler's unscale forgotten, the RNG set back) with every loaded batch cut in two; item weighting makes it exact."""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from kitlib.engine.objective import Batch, rows
from kitlib.errors import DoesNotFitError

if TYPE_CHECKING:
    from kitlib.config import TrainConfig
    from kitlib.machine.amp import Precision

T = TypeVar("T")


class MicroBatchBackoff:
    """Runs each window through ``train`` and, on ``torch.OutOfMemoryError``, frees, halves and replays it. ``parts``
    (micro-batches per loaded batch) is resume state; ``changes`` records each back-off for timing.json."""

    def __init__(self, cfg: TrainConfig, *, optimizer: torch.optim.Optimizer, precision: Precision,
                 device: torch.device, distributed: bool, next_strategy: str,
                 say: Callable[[str], None]) -> None:  # fmt: skip
        self.accum, self.batch = cfg.grad_accum_steps, cfg.micro_batch_size  # the run's: fit checked the loader
        self.optimizer, self.precision, self.device = optimizer, precision, device
        self.distributed, self.next_strategy, self.say = distributed, next_strategy, say
        self.parts = 1
        self.changes: list[dict[str, Any]] = []

    @property
    def micro_batch(self) -> int:
        """Rows per forward pass now (the largest piece of a full loaded batch)."""
        return math.ceil(self.batch / self.parts)

    def run(self, window: list[Batch], train: Callable[[list[Batch]], T], *, step: int) -> T:
        """``train(micro_batches)`` for ``window`` at the current micro-batch, halving it until the step fits."""
        while True:
            rng = _rng_state(self.device)
            try:
                return train([piece for batch in window for piece in split_batch(batch, self.parts)])
            except torch.OutOfMemoryError as error:
                reason = str(error).strip().splitlines()[0] if str(error).strip() else "out of memory"
            # Out of the except block: the traceback, and the activations its frames held, are gone.
            self._back_off(window, reason, step)
            _set_rng_state(rng, self.device)

    def _back_off(self, window: list[Batch], reason: str, step: int) -> None:
        self.optimizer.zero_grad(set_to_none=True)  # the failed attempt's partial gradients: none may count
        self.precision.forget_unscale()
        gc.collect()  # reference cycles that still hold activations
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # the failed attempt's cached blocks go back to the allocator (fragmentation)
        biggest = max(rows(batch) for batch in window)
        before = math.ceil(biggest / self.parts)
        if before <= 1 or self.distributed:
            # DDP/FSDP: the other ranks wait in the step's collectives, so one rank cannot replay it on its own.
            why = "with several ranks one cannot replay a step alone" if self.distributed else "nothing left to halve"
            raise DoesNotFitError(
                f"out of device memory at step {step + 1} with micro-batch {before} x accumulation "
                f"{self.accum * self.parts}: {why} ({reason}). Fix: {self.next_strategy}"
            )
        old = (self.micro_batch, self.accum * self.parts)
        self.parts *= 2
        new = (self.micro_batch, self.accum * self.parts)
        self.changes.append(
            {"step": step + 1, "micro_batch": [old[0], new[0]], "grad_accum_steps": [old[1], new[1]], "error": reason}
        )
        self.say(
            f"out of memory at step {step + 1}: replaying it at micro-batch {new[0]} x accumulation {new[1]} "
            f"(was {old[0]} x {old[1]}; the same {old[0] * old[1]} rows per step)"
        )

    def state_dict(self) -> dict[str, Any]:
        return {"parts": self.parts, "changes": list(self.changes)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """A checkpoint without this state (an older kitlib) starts at the configured micro-batch."""
        self.parts = int(state.get("parts", 1))
        self.changes = list(state.get("changes", []))


def next_strategy(cfg: TrainConfig) -> str:
    """What to change when a step does not fit at micro-batch 1 (the back-off's error says it): the next strategy
    of the memory plan's table (``kitlib.doctor.memory_plan.strategies``, least compromise first) not used yet."""
    steps = (  # each named as a notebook user sets it (00's parameters), then as fit's TrainConfig
        (cfg.gradient_checkpointing, "gradient checkpointing (gradient_checkpointing = True in 00's parameters; "
                                     "TrainConfig(gradient_checkpointing=True))"),
        (cfg.freeze != "none", "frozen embeddings (TrainConfig(freeze='embeddings'); in the notebooks adapter = "
                               "'lora' freezes all the pretrained weights)"),
        (cfg.optimizer != "adamw", "8-bit AdamW (optimizer = 'adamw8bit' in 00's parameters; "
                                   "TrainConfig(optimizer='adamw8bit'): 2 bytes of state a parameter)"),
    )  # fmt: skip
    last = "LoRA, or QLoRA on a CUDA card (adapter= in 00's parameters)"
    chosen = next((text for used, text in steps if not used), last)
    return (
        f"the memory plan's next strategy: {chosen}, or fewer tokens per row (max_length); "
        "`python -m kitlib plan` shows what fits"
    )


def split_batch(batch: Batch, parts: int) -> list[Batch]:
    """``batch`` cut along its rows into ``min(parts, rows)`` consecutive pieces of near-equal size (the first ones
    one row longer, as ``torch.tensor_split``). Tensors and lists with one entry per row are cut; anything else (a
    scalar, a per-batch setting) goes to every piece."""
    n = rows(batch)
    pieces = min(parts, n)
    if pieces <= 1:
        return [batch]
    return [_slice(batch, n, int(part[0]), int(part[-1]) + 1) for part in torch.arange(n).tensor_split(pieces)]


def _slice(value: Any, n: int, start: int, stop: int) -> Any:
    if isinstance(value, torch.Tensor):
        return value[start:stop] if value.dim() > 0 and value.shape[0] == n else value
    if isinstance(value, Mapping):
        return type(value)({k: _slice(v, n, start, stop) for k, v in value.items()})  # type: ignore[call-arg]
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        if any(isinstance(v, torch.Tensor | Mapping) for v in value):  # a tuple of tensors: (inputs, targets)
            items = [_slice(v, n, start, stop) for v in value]
            return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)  # type: ignore[call-arg]
        return value[start:stop] if len(value) == n else value  # one entry per row: texts, ids
    return value


def _rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The generators a forward draws from (dropout): the CPU's, and this process's GPU's. A copy of ~5 KB and 16
    bytes, no device sync."""
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _set_rng_state(state: tuple[torch.Tensor, torch.Tensor | None], device: torch.device) -> None:
    cpu, gpu = state
    torch.set_rng_state(cpu)
    if gpu is not None:
        torch.cuda.set_rng_state(gpu, device)
