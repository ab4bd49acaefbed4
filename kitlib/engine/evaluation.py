"""Evaluation: a cheap loss-only pass, and an expensive user metric whose CPU-bound part may run in the
background while the next epoch trains.

The expensive part of a "full" evaluation is usually not the accelerator's: executing generated SQL, scoring
generated text. A ``full_eval(model)`` that returns a *callable* instead of a dict hands that part to a worker pool
while the next epoch trains; fit() joins its result to the epoch's record at that next epoch's end (waiting only if
it is not ready by then), so best/ and early stopping judge the epochs in order, one epoch behind.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from kitlib.engine.objective import Batch, CountFn, LossFn
from kitlib.errors import KitError
from kitlib.machine.distributed import DistEnv, all_reduce_sum

Metrics = dict[str, float]
FullEval = Callable[[nn.Module], "Metrics | Callable[[], Metrics]"]


def evaluate_loss(
    model: nn.Module,
    batches: Iterable[Batch],
    *,
    loss_fn: LossFn,
    count_fn: CountFn,
    autocast: Callable[[], Any],
    to_device: Callable[[Batch], Batch],
    env: DistEnv,
    max_batches: int | None = None,
) -> float:
    """Item-weighted mean loss over (at most ``max_batches`` of) the batches: no autograd, eval mode."""
    was_training = model.training
    model.eval()
    total_loss = torch.zeros((), dtype=torch.float64)
    total_items = torch.zeros((), dtype=torch.float64)
    try:
        with torch.no_grad():
            for batch in itertools.islice(batches, max_batches):
                batch = to_device(batch)
                with autocast():
                    loss = loss_fn(model, batch)
                items = count_fn(batch)
                # Accumulate on the loss's device and read it once at the end: one host sync per eval, not per batch.
                total_loss = total_loss.to(loss.device) + loss.detach().double() * items
                total_items = total_items.to(loss.device) + items
    finally:
        model.train(was_training)
    total_loss, total_items = all_reduce_sum(total_loss, env), all_reduce_sum(total_items, env)
    return float(total_loss / total_items) if float(total_items) > 0 else float("nan")


def run_full_eval(
    model: nn.Module, full_eval: FullEval, autocast: Callable[[], Any]
) -> Metrics | Callable[[], Metrics]:
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), autocast():
            return full_eval(model)
    finally:
        model.train(was_training)


@dataclass
class Pending:
    epoch: int
    future: cf.Future[Metrics]
    payload: Any = None  # e.g. a weights snapshot, kept until the metric says whether it is the best


@dataclass
class DeferredEvals:
    """The CPU-bound halves of full evaluations, running in a thread or process pool.

    Threads suit work that releases the GIL (sqlite, regex-heavy C code, tokenizers); processes suit pure-Python
    scoring, at the price of pickling the callable (define it at module level, e.g. functools.partial).
    """

    kind: str = "thread"  # "thread" | "process"
    workers: int = 1
    pending: list[Pending] = field(default_factory=list)
    _pool: cf.Executor | None = None

    def submit(self, epoch: int, job: Callable[[], Metrics], payload: Any = None) -> None:
        if self._pool is None:
            make = cf.ProcessPoolExecutor if self.kind == "process" else cf.ThreadPoolExecutor
            self._pool = make(max_workers=self.workers)
        self.pending.append(Pending(epoch, self._pool.submit(job), payload))

    def add_done(self, epoch: int, metrics: Metrics, payload: Any = None) -> None:
        """A result already known (scored in the foreground), queued behind the pending ones: it is collected in
        its epoch's turn like them."""
        future: cf.Future[Metrics] = cf.Future()
        future.set_result(metrics)
        self.pending.append(Pending(epoch, future, payload))

    def collect(self, *, wait: bool = False, through: int | None = None) -> list[tuple[int, Metrics, Any]]:
        """Finished results in submission order; a failed job re-raises here with its epoch named. ``wait``: also
        the unfinished ones (blocking until they are done); ``through``: only the epochs up to this one."""
        done: list[tuple[int, Metrics, Any]] = []
        while (
            self.pending
            and (through is None or self.pending[0].epoch <= through)
            and (wait or self.pending[0].future.done())
        ):
            item = self.pending.pop(0)
            try:
                metrics = item.future.result()
            except KitError:  # already names the problem and the fix (a user's metric, a failing reference)
                raise
            except Exception as err:
                raise RuntimeError(f"the background full evaluation of epoch {item.epoch} failed: {err!r}") from err
            done.append((item.epoch, {k: float(v) for k, v in metrics.items()}, item.payload))
        return done

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
