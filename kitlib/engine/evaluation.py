"""Evaluation: a loss-only pass, and the full one (``full_eval`` or ``SplitEval``, scored maybe in the background)."""

from __future__ import annotations

import concurrent.futures as cf
import functools
import itertools
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from kitlib.config import BackgroundEval as Mode
from kitlib.engine import checkpoint
from kitlib.engine.objective import Batch, CountFn, LossFn
from kitlib.engine.timing import PhaseTimer
from kitlib.errors import KitError, SetupError
from kitlib.machine import distributed
from kitlib.machine.distributed import DistEnv, all_reduce_sum

Metrics = dict[str, float]
FullEval = Callable[[nn.Module], Metrics]


@dataclass(frozen=True)
class SplitEval:
    """A full eval in halves: ``measure(model)`` in the foreground, ``score(measured)`` as ``background_eval`` says."""

    measure: Callable[[nn.Module], Any]
    score: Callable[[Any], Metrics]


def evaluate_loss(
    model: nn.Module,
    batches: Iterable[Batch],
    *,
    loss_fn: LossFn,
    count_fn: CountFn,
    autocast: Callable[[], Any],
    to_device: Callable[[Batch], Batch],
    env: DistEnv,
    device: torch.device,
    max_batches: int | None = None,
) -> float:
    """Item-weighted mean loss over (at most ``max_batches`` of) the batches: no autograd, eval mode."""
    was_training = model.training
    model.eval()
    # on the device: a rank without eval batches still all-reduces, and NCCL cannot reduce CPU tensors
    total_loss = torch.zeros((), dtype=torch.float64, device=device)
    total_items = torch.zeros((), dtype=torch.float64, device=device)
    try:
        with torch.no_grad():
            for batch in itertools.islice(batches, max_batches):
                batch = to_device(batch)
                with autocast():
                    loss = loss_fn(model, batch)
                items = count_fn(batch)
                # one host sync per eval, not per batch
                total_loss = total_loss + loss.detach().double() * items
                total_items = total_items + items
    finally:
        model.train(was_training)
    total_loss, total_items = all_reduce_sum(total_loss, env), all_reduce_sum(total_items, env)
    return float(total_loss / total_items) if float(total_items) > 0 else float("nan")


@dataclass(frozen=True)
class Measured:
    """An epoch's full eval after its foreground half: ``metrics`` if known, else ``score``'s input, and its RNG."""

    rng: dict[str, Any]
    metrics: Metrics | None
    measured: Any = None


@dataclass
class Pending:
    epoch: int
    future: cf.Future[Metrics]
    weights: checkpoint.Snapshot | None  # the epoch's weights, kept until its metric says whether they are the best
    rng: dict[str, Any]


class BackgroundEval:
    """fit's full evaluation: ``measure``, ``score`` (now or queued), ``collect`` in order, ``rescore`` after resume."""

    def __init__(self, full_eval: FullEval | SplitEval | None, mode: Mode, *, env: DistEnv, timer: PhaseTimer,
                 every_rank: bool = False) -> None:  # fmt: skip
        self.full_eval, self.mode, self.env, self.timer = full_eval, mode, env, timer
        self.every_rank = every_rank  # FSDP: the forward is a collective, so every rank measures (rank 0's counts)
        self.patient = distributed.patient_group(env)
        self.pending: list[Pending] = []
        self.unscored: list[dict[str, Any]] = []  # from a checkpoint (load_state_dict), for rescore
        self._pool: cf.ThreadPoolExecutor | None = None

    def measure(self, model: nn.Module, autocast: Callable[[], Any]) -> Measured | None:
        """The foreground half of an epoch's full eval on rank 0 (None on the others), timed as "full_eval"."""
        if self.full_eval is None:
            return None
        measured = None
        if self.env.is_main or self.every_rank:
            with self.timer.phase("full_eval"):
                measured = self._measure(model, autocast)
        distributed.wait_together(self.patient, self.env)  # before the cheap eval's collective
        return measured

    def _measure(self, model: nn.Module, autocast: Callable[[], Any]) -> Measured:
        rng = checkpoint.rng_state()
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), autocast():
                if isinstance(self.full_eval, SplitEval):
                    return Measured(rng, None, self.full_eval.measure(model))
                assert self.full_eval is not None
                metrics = self.full_eval(model)
        finally:
            model.train(was_training)
        if not isinstance(metrics, Mapping):
            raise SetupError(
                f"full_eval returned a {type(metrics).__name__}, not metrics: a full eval whose scoring runs later is "
                "declared, not returned. Fix: fit(full_eval=kitlib.SplitEval(measure, score)), measure(model) -> what "
                "score needs, score(that) -> {name: value}; for a full_eval that returns its scoring callable, "
                "SplitEval(measure=full_eval, score=lambda job: job())"
            )
        return Measured(rng, dict(metrics))

    def score(self, epoch: int, measured: Measured, weights: Callable[[], checkpoint.Snapshot | None]) -> Metrics:
        """Epoch ``epoch``'s metrics now, or ``{}`` with the score queued (and its weights kept) for ``collect``."""
        if measured.metrics is not None:
            return measured.metrics
        assert isinstance(self.full_eval, SplitEval)
        if self.mode == "off":  # on the critical path, here
            with self.timer.phase("full_eval"):
                return self.full_eval.score(measured.measured)
        if self._pool is None:
            self._pool = cf.ThreadPoolExecutor(max_workers=1)
        future = self._pool.submit(self.full_eval.score, measured.measured)
        self.pending.append(Pending(epoch, future, weights(), measured.rng))
        return {}

    def collect(self, through: int | None = None) -> list[tuple[int, Metrics, checkpoint.Snapshot | None]]:
        """Queued results up to ``through`` (None: all) in epoch order on every rank; a failure names its epoch."""
        begin, done = time.perf_counter(), []
        while self.pending and (through is None or self.pending[0].epoch <= through):
            item = self.pending.pop(0)
            try:
                metrics = item.future.result()
            except KitError:  # already names the problem and the fix (a user's metric, a failing reference)
                raise
            except Exception as err:
                raise RuntimeError(f"the background full evaluation of epoch {item.epoch} failed: {err!r}") from err
            done.append((item.epoch, {k: float(v) for k, v in metrics.items()}, item.weights))
        distributed.wait_together(self.patient, self.env)  # every rank, so none waits in a collective meanwhile
        if done:
            self.timer.add("full_eval", time.perf_counter() - begin)  # waiting for it is the eval's cost
        return done

    def state_dict(self) -> dict[str, Any]:
        return {"unscored": [{"epoch": p.epoch, "rng": p.rng} for p in self.pending]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.unscored = list(state.get("unscored", []))

    def rescore(self, model: nn.Module, autocast: Callable[[], Any], *, at_epoch_end: int | None,
                weights: Callable[[int], checkpoint.Snapshot | None], where: object) -> None:  # fmt: skip
        """Rerun unscored evals on the resumed weights with their RNG, in turn (only the checkpoint's own epoch)."""
        for item in self.unscored:
            epoch = int(item["epoch"])
            if self.full_eval is None or epoch != at_epoch_end:
                why = "no full_eval was passed" if self.full_eval is None else "last/ lacks that epoch's weights"
                warnings.warn(
                    f"the full evaluation of epoch {epoch} was still running when {where} was saved and cannot run "
                    f"again ({why}): its metrics stay missing from the history",
                    stacklevel=4,
                )
                continue
            if not self.env.is_main:
                continue
            checkpoint.set_rng_state(item["rng"])  # the training streams are set back when the epoch begins
            with self.timer.phase("full_eval"):
                measured = self._measure(model, autocast)
            metrics = self.score(epoch, measured, functools.partial(weights, epoch))
            if measured.metrics is not None or self.mode == "off":  # known now: queued behind the pending ones
                done: cf.Future[Metrics] = cf.Future()
                done.set_result(metrics)
                self.pending.append(Pending(epoch, done, weights(epoch), measured.rng))
        self.unscored = []
        distributed.wait_together(self.patient, self.env)

    def close(self, together: bool = False) -> None:
        """``together`` (a run that ended cleanly, every rank here): a barrier on the default group first, so no rank
        tears the patient group down while another still finishes its last barrier on it (a rare SIGABRT at exit)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self.patient is not None:
            if together:
                distributed.barrier(self.env)
            torch.distributed.destroy_process_group(self.patient)
            self.patient = None
