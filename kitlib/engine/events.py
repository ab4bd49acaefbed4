"""fit's named events, and the one protocol for kitlib's own policies and the user's callbacks alike.

Only the loop fires events, in this order::

    on_fit_start(loop)                      once, before the first step (a policy keeps ``loop`` to act on it)
      on_epoch_start(loop)                  each epoch (also the resumed one)
        on_step_end(step)                   after every optimizer window (``step.applied`` False: inf/nan, skipped)
        on_log(metrics)                     after that step's on_step_end, to every callback: every
                                            ``log_every_steps`` applied steps the training log (step, loss, lr,
                                            speed), and ``{"step", "eval_loss"}`` when a step eval ran
      on_metrics(epoch, metrics, weights)   an epoch's metrics are known: at its end, or later from a background eval
                                            (``epoch`` 1-based, as in the history; ``loop.state.epoch`` counts the
                                            epochs completed). Always in epoch order: a background eval's metrics
                                            come at the end of the next epoch, before that epoch's own (or earlier
                                            when a last/ save mid-epoch waits for them, or at fit's end). The loop
                                            has judged the monitored metric by then (``state.best``...)
      on_epoch_end(record)                  the epoch's history row is complete
      on_next_epoch(loop)                   the loop moved past the epoch: a clean resume point
    on_fit_end(loop)                        always, also when training raised: close what you opened

Within one event, callbacks run in their declared ``order`` (lower first; fastai's ``Callback.order``): kitlib's
policies from -90 to -10, a callback 0 unless it says otherwise; list position decides only between equal orders.
A callback stops training with ``loop.stop("reason")``; the loop finishes the current step (mid-epoch) or epoch and
reports the reason in ``FitResult.stop_reason``. Callbacks run on every rank; a decision that must agree across
ranks goes through ``kitlib.machine.distributed.broadcast_object``.
"""

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

EVENTS = (
    "on_fit_start",
    "on_epoch_start",
    "on_step_end",
    "on_log",
    "on_metrics",
    "on_epoch_end",
    "on_next_epoch",
    "on_fit_end",
)


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
    """Override the events you need; the rest are no-ops. See the module docstring for the order; ``order`` places
    this callback among the others (lower first)."""

    order: int = 0

    def on_fit_start(self, loop: LoopView) -> None: ...
    def on_epoch_start(self, loop: LoopView) -> None: ...
    def on_step_end(self, step: StepEnd) -> None: ...
    def on_log(self, metrics: Mapping[str, float]) -> None: ...
    def on_metrics(self, epoch: int, metrics: Mapping[str, float], weights: Snapshot | None) -> None: ...
    def on_epoch_end(self, record: Mapping[str, Any]) -> None: ...
    def on_next_epoch(self, loop: LoopView) -> None: ...
    def on_fit_end(self, loop: LoopView) -> None: ...


class Events:
    """Calls one event on every callback that defines it, sorted by ``order`` (stable: list order between equals).
    Objects that do not subclass Callback work too (the hooks they define are called, order 0 unless they have
    one): a callback need not import kitlib. Callback's own no-ops are not called: an event no callback listens to
    costs one empty loop (per step that matters: ~1 us a hook at a 3 ms step)."""

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
