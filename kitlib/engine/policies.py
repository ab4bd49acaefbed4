"""kitlib's training policies: callbacks on fit's events with a declared ``order``; ``default_policies(cfg)``
is what fit runs unless given ``policies=``. They share facts only through the loop's ``RunState``."""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kitlib._version import __version__
from kitlib.engine import checkpoint
from kitlib.engine.events import Callback, LoopView, StepEnd
from kitlib.errors import NonFiniteLossError
from kitlib.machine import distributed
from kitlib.progress import close_as_done, progress_bar, shown

if TYPE_CHECKING:
    from kitlib.config import TrainConfig


class Policy(Callback):
    """A callback that acts on the loop it is given at the start of fit."""

    loop: LoopView

    def on_fit_start(self, loop: LoopView) -> None:
        self.loop = loop


class NonFiniteGuard(Policy):
    """Too many optimizer steps in a row skipped for inf/nan gradients (counted by the loop: ``state.skipped``,
    ``state.nonfinite_streak``) stop the run with the fixes named. First: no other callback sees that step."""

    order = -90

    def on_step_end(self, step: StepEnd) -> None:
        loop, state, cfg = self.loop, self.loop.state, self.loop.cfg
        if state.nonfinite_streak + loop.unsettled < cfg.max_nonfinite_steps:
            return  # the run of skipped steps cannot have reached the limit since the device's counts were read
        loop.settle()  # the skipped steps are counted on the device (StepLedger); this reads them
        if state.nonfinite_streak >= cfg.max_nonfinite_steps:
            best = f"; the best checkpoint in {self.loop.out / 'best'} is intact" if self.loop.out else ""
            raise NonFiniteLossError(
                f"{state.nonfinite_streak} optimizer steps in a row had inf/nan gradients (step {state.step}, "
                f"epoch {state.epoch + 1}){best}. Lower lr (now {cfg.lr:g}), keep grad_clip on, use precision='bf16' "
                "or 'fp32' instead of fp16, and check the data for inf/nan."
            )


class ProgressLog(Policy):
    """The progress bar, with the loss, lr and speed of every training log; each epoch ends on its history row's
    speed (samples and real tokens per second of the epoch's training wall time, named as there)."""

    order = -80
    every_s = 0.1  # the bar moves at most 10 times a second: tqdm's update is ~3 us, a 3 ms step's 0.1%

    def on_fit_start(self, loop: LoopView) -> None:
        super().on_fit_start(loop)
        self.pending, self.due = 0, 0.0  # steps not shown yet; when the bar moves next (perf_counter)
        state, per_epoch = loop.state, loop.data.windows_per_epoch
        done = state.epoch * per_epoch + math.ceil(state.batch_in_epoch / loop.cfg.grad_accum_steps)
        self.bar = progress_bar(
            per_epoch * loop.cfg.epochs, desc="train", interactive=loop.hw.interactive, disable=not loop.env.is_main,
            initial=done,
        )  # fmt: skip

    def on_step_end(self, step: StepEnd) -> None:
        self.pending += 1
        if step.started >= self.due:  # the step's own clock reading: no extra perf_counter call
            self.flush()
            self.due = step.started + self.every_s

    def flush(self) -> None:
        if self.pending:
            self.bar.update(self.pending)
            self.pending = 0

    def on_log(self, metrics: Mapping[str, float]) -> None:
        self.flush()
        if "loss" not in metrics:  # a step eval's
            return
        postfix = {"loss": f"{metrics['loss']:.4f}", "lr": f"{metrics['lr']:.2e}"} | shown(metrics)
        self.bar.set_postfix(postfix, refresh=False)
        self.postfix = postfix

    def on_epoch_end(self, record: Mapping[str, Any]) -> None:
        # The history row is the epoch's throughput; the last log step came before the epoch's tail (up to
        # log_every_steps - 1 steps and the last fetch), so the bar ends the epoch on the row's figure, not its own.
        self.flush()
        self.postfix = postfix = {**getattr(self, "postfix", {}), **shown(record)}
        self.bar.set_postfix(postfix)

    def on_fit_end(self, loop: LoopView) -> None:
        if not hasattr(self, "bar"):
            return
        self.flush()
        if loop.ended_cleanly:  # an early, time-budget or callback stop is a normal end: a full (green) bar
            close_as_done(self.bar)
        else:  # an exception: the bar stays short of its total (red in a notebook)
            self.bar.close()


class BestCheckpoint(Policy):
    """Saves the weights of the best value of the monitored metric so far to ``best/`` when ``cfg.save_best``: the
    loop judges each value as it arrives (``state.best``, ``state.best_epoch``; a background eval's late verdict
    comes with the epoch's kept weights), this policy only saves."""

    order = -70

    def on_metrics(self, epoch: int, metrics: Mapping[str, float], weights: checkpoint.Snapshot | None) -> None:
        loop, cfg = self.loop, self.loop.cfg
        if cfg.save_best and loop.monitor in metrics and loop.state.is_best(epoch):
            meta = {"epoch": epoch, "metrics": dict(metrics), "config": cfg.to_dict(), "kitlib": __version__}
            loop.save("best", lambda: weights or checkpoint.snapshot(loop.raw_model, meta=meta))


class EarlyStopping(Policy):
    """Stops after ``patience`` evaluations without improvement (``state.evals_since_best``, the loop's; all ranks
    agree), decided at an epoch boundary on the verdicts known by then, which arrive in epoch order (a background
    eval's at the end of the next epoch). Before PeriodicSave: the epoch-end save then knows the run ends."""

    order = -60

    def __init__(self, patience: int) -> None:
        self.patience = patience

    def on_next_epoch(self, loop: LoopView) -> None:
        if distributed.broadcast_object(loop.state.evals_since_best >= self.patience, loop.env):
            loop.stop("early_stopping")


class PeriodicSave(Policy):
    """``last/``: the full resume state every ``save_every_steps`` optimizer steps and/or at each epoch end."""

    order = -50

    def on_step_end(self, step: StepEnd) -> None:
        if self.loop.reached(self.loop.cfg.save_every_steps):
            self.loop.save_last()

    def on_next_epoch(self, loop: LoopView) -> None:
        if loop.cfg.save_last:
            loop.save_last()


class StepEval(Policy):
    """The loss-only eval every ``eval_every_steps`` applied steps, as ``{"epoch", "step", "eval_loss"}`` rows in
    ``state.step_evals`` (step_evals.csv; ``on_log`` gets step and eval_loss). The RNG streams are put back after it:
    training runs as it would without these evals."""

    order = -75

    def on_step_end(self, step: StepEnd) -> None:
        loop = self.loop
        if not loop.reached(loop.cfg.eval_every_steps):
            return
        rng = checkpoint.rng_state()
        value = loop.eval_loss()
        checkpoint.set_rng_state(rng)
        loop.state.step_evals.append({"epoch": loop.state.epoch + 1, "step": loop.state.step, "eval_loss": value})


class StopAndSave(Policy):
    """Stops at a step's end and saves ``last/`` there, so the next session resumes exactly: on SIGTERM (Kaggle/Colab
    before a session ends, or ``kill``; the previous handler is back when fit returns), or while one more step, the
    epoch-end eval and a checkpoint still fit in ``budget_s``. Ranks agree every ``log_every_steps`` (Loop.agree)."""

    order = -30
    clock = staticmethod(time.perf_counter)  # seconds; a test's fake clock makes the stop independent of the load

    def __init__(self, budget_s: float | None = None) -> None:
        self.budget_s, self.step_s = budget_s, 0.0  # step_s: moving average of one optimizer window

    def on_fit_start(self, loop: LoopView) -> None:
        super().on_fit_start(loop)
        self.requested, self.previous = False, None
        if threading.current_thread() is threading.main_thread():  # Python delivers signals to the main thread only
            self.previous = signal.signal(signal.SIGTERM, self._request)
        if self.budget_s is not None:
            self.last = self.clock()
            self.started = self.last - loop.timer.elapsed  # fit's time before the first step counts too

    def _request(self, signum: int, frame: Any) -> None:
        self.requested = True  # acted on between steps: never in the middle of an optimizer update

    def on_step_end(self, step: StepEnd) -> None:
        loop = self.loop
        reason = "sigterm" if self.requested else ""
        if self.budget_s is not None:
            now = self.clock()
            seconds, self.last = now - self.last, now
            self.step_s = 0.9 * self.step_s + 0.1 * seconds if self.step_s else seconds
            windows = 1 + (loop.cfg.log_every_steps if loop.env.enabled else 1)  # how often the ranks agree
            timer = loop.timer
            reserve = windows * self.step_s + timer.seconds.get("eval", 0.0) / max(1, timer.counts.get("eval", 0)) + 5
            reason = "time_budget" if now - self.started + reserve > self.budget_s else reason
        if reason := loop.agree(reason):
            loop.stop(reason)
            loop.save_last()

    def on_fit_end(self, loop: LoopView) -> None:
        if getattr(self, "previous", None) is not None:
            signal.signal(signal.SIGTERM, self.previous)


def default_policies(cfg: TrainConfig) -> list[Callback]:
    """kitlib's policies for ``cfg``, in their declared order (fit sorts every callback by ``order``): what fit runs
    unless it is given ``policies=``."""
    return [
        NonFiniteGuard(),
        ProgressLog(),
        *([StepEval()] if cfg.eval_every_steps else []),
        BestCheckpoint(),
        *([EarlyStopping(cfg.patience)] if cfg.patience is not None else []),
        PeriodicSave(),
        StopAndSave(cfg.time_budget_s),
    ]
