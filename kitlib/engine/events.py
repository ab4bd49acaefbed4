"""fit's named events (``EVENTS``, in firing order) and ``Callback``, the one protocol of kitlib's policies and the
user's callbacks: only the loop fires events; within one, callbacks run by ``order`` (lower first), then list order.
A callback stops training with ``loop.stop("reason")``; a decision every rank must share goes through broadcast."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    import torch
    from torch import nn

    from kitlib.config import TrainConfig
    from kitlib.engine.backoff import MicroBatchBackoff
    from kitlib.engine.batches import DataViews
    from kitlib.engine.checkpoint import Snapshot
    from kitlib.engine.state import RunState
    from kitlib.engine.timing import PhaseTimer
    from kitlib.machine.distributed import DistEnv
    from kitlib.machine.hardware import HardwareInfo
    from kitlib.machine.precision import PrecisionPlan


@dataclass(frozen=True)
class StepEnd:
    """One optimizer window, as the loop saw it: counted host-side from shapes, no device sync."""

    # False: the gradients had inf/nan and the step was skipped. A 0-d bool tensor on the device: `if step.applied`
    # reads it (a host sync, the CPU then waits for the GPU); kitlib's own policies read loop.state when settled.
    applied: bool | torch.Tensor
    micro_batches: int
    rows: int
    real_tokens: int | torch.Tensor  # non-pad tokens (a tensor stays lazy on the device)
    computed_tokens: int  # tokens the model computed, padding included
    shapes: frozenset[tuple[int, ...]]  # input_ids shapes in the window
    started: float  # perf_counter() when the loop asked for the window
    fetch_s: float  # seconds waiting for the DataLoader (worker start-up lands in an epoch's first window)
    seconds: float  # the whole window: fetch + forward/backward + optimizer


class LoopView(Protocol):
    """What a policy or callback reads and drives of the running loop (``kitlib.engine.loop.Loop``)."""

    cfg: TrainConfig
    hw: HardwareInfo
    env: DistEnv
    device: torch.device
    plan: PrecisionPlan
    raw_model: nn.Module  # unwrapped from DDP/torch.compile
    optimizer: torch.optim.Optimizer
    backoff: MicroBatchBackoff
    data: DataViews
    timer: PhaseTimer
    state: RunState
    unsettled: int  # windows run since ``settle`` (``state.step`` counts them as applied)
    stop_reason: str
    ended_cleanly: bool

    @property
    def out(self) -> Path | None: ...
    @property
    def monitor(self) -> str: ...
    def settle(self) -> None: ...
    def reached(self, every: int | None) -> bool: ...
    def agree(self, reason: str) -> str: ...
    def stop(self, reason: str) -> None: ...
    def eval_loss(self) -> float: ...
    def save(self, name: str, take: Callable[[], Snapshot]) -> None: ...
    def save_last(self) -> None: ...


class Callback:
    """Override the events you need (``EVENTS``, in firing order as here); the rest are no-ops. ``order``: lower runs
    first (kitlib's policies are below 0)."""

    order: int = 0

    def on_fit_start(self, loop: LoopView) -> None: ...  # once, before the first step: a policy keeps ``loop``
    def on_epoch_start(self, loop: LoopView) -> None: ...  # each epoch, the resumed one too
    def on_step_end(self, step: StepEnd) -> None: ...  # every optimizer window (``step.applied`` False: inf/nan skip)
    # after that step's on_step_end: the training log, or a step eval's {"step", "eval_loss"}
    def on_log(self, metrics: Mapping[str, float]) -> None: ...
    # an epoch's metrics, judged, in epoch order (a background eval's later)
    def on_metrics(self, epoch: int, metrics: Mapping[str, float], weights: Snapshot | None) -> None: ...
    def on_epoch_end(self, record: Mapping[str, Any]) -> None: ...  # the epoch's history row is complete
    def on_next_epoch(self, loop: LoopView) -> None: ...  # past the epoch: a clean resume point
    def on_fit_end(self, loop: LoopView) -> None: ...  # always, also when training raised: close what you opened


EVENTS = tuple(name for name in vars(Callback) if name.startswith("on_"))  # fit's events, in firing order


class Events:
    """Calls an event on every callback that defines it (any object: a callback need not import kitlib), sorted by
    ``order`` (stable); Callback's own no-ops are never called."""

    def __init__(self, callbacks: Sequence[object]) -> None:
        self.callbacks = tuple(sorted(callbacks, key=lambda cb: getattr(cb, "order", 0)))
        self._hooks = {e: [h for cb in self.callbacks if _listens(cb, e) and callable(h := getattr(cb, e))]
                       for e in EVENTS}  # fmt: skip

    def fire(self, event: str, *args: Any) -> None:
        """Call ``event`` (one of ``EVENTS``) on every callback that listens, in order."""
        for hook in self._hooks[event]:
            hook(*args)


def _listens(callback: object, event: str) -> bool:
    """Whether ``callback`` defines ``event`` itself (or on its instance), not only inherits Callback's no-op."""
    if event in getattr(callback, "__dict__", {}):
        return True
    hook = getattr(type(callback), event, None)
    return hook is not None and hook is not getattr(Callback, event)
