"""fit(): hardware-aware, gradient-accumulated mixed-precision training for any nn.Module.

``fit`` is the loop: set up, then epochs of optimizer windows (``kitlib.engine.step.train_window``), an epoch-end
record with its evaluations, and named events (``kitlib.engine.events``) on which kitlib's policies (best checkpoint,
early stopping, time budget, non-finite guard, periodic saves, progress, the doctor's record:
``kitlib.engine.policies``) and the user's callbacks act through one protocol.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn
from torch.utils.data import DataLoader

from kitlib._files import write_atomic
from kitlib._version import __version__
from kitlib.config import TrainConfig, full_eval_due
from kitlib.engine import checkpoint
from kitlib.engine.backoff import MicroBatchBackoff, next_strategy
from kitlib.engine.batches import shard_batches, skip_batches
from kitlib.engine.evaluation import DeferredEvals, FullEval, Metrics, evaluate_loss, run_full_eval
from kitlib.engine.events import Callback, Events, StepEnd
from kitlib.engine.objective import (
    Batch,
    CountFn,
    LossFn,
    computed_tokens,
    default_count_fn,
    hf_loss,
    real_tokens,
    rows,
)
from kitlib.engine.optim import build_optimizer, build_scheduler, cast_for_optimizer, freeze
from kitlib.engine.policies import default_policies
from kitlib.engine.record import RunRecorder
from kitlib.engine.step import (
    StepLedger,
    enable_activation_checkpointing,
    seed_epoch_order,
    to_device,
    train_window,
)
from kitlib.engine.timing import PhaseTimer
from kitlib.errors import CheckpointError, NonFiniteLossError
from kitlib.machine import distributed

if TYPE_CHECKING:
    import pandas as pd

    from kitlib.machine.hardware import HardwareInfo
    from kitlib.machine.precision import PrecisionPlan

__all__ = ["Callback", "FitResult", "Loop", "NonFiniteLossError", "RunState", "fit"]


@dataclass
class FitResult:
    """What fit() returns. Epoch numbers count from 1 (epoch 1 is the first), as in the history and history.csv."""

    model: nn.Module  # the trained module, unwrapped from DDP/torch.compile
    history: pd.DataFrame  # one row per epoch; "epoch" is 1-based
    stop_reason: str  # "completed" | "early_stopping" | "time_budget" | "sigterm" | a user callback's reason
    best_metric: float | None  # the best value of ``monitor``
    best_epoch: int | None  # 1-based
    steps: int  # optimizer steps applied
    skipped_steps: int  # optimizer steps skipped because of inf/nan gradients
    precision: PrecisionPlan
    timing: dict[str, Any]
    run_dir: Path | None
    monitor: str  # the metric best_metric and best_epoch are judged by
    config: TrainConfig  # the config that ran
    step_evals: list[dict[str, Any]] = field(default_factory=list)  # eval_every_steps: {"epoch", "step", "eval_loss"}
    notes: tuple[str, ...] = ()  # lines the caller adds under the summary (the notebooks: the trivial baseline)

    def summary(self) -> str:
        """One line for a notebook: why training stopped, the best metric (named, 4 decimals) and its epoch, the
        precision. E.g. ``stopped: early stop (patience 2) after 4 of 10 epochs; best accuracy 0.6822 at epoch 2;
        precision fp32``. Then the caller's ``notes``, a line each."""
        if self.best_metric is None:
            best = f"no best {self.monitor} (never reported)"
        else:
            best = f"best {self.monitor} {_rounded(self.best_metric)} at epoch {self.best_epoch}"
        return "\n".join([f"stopped: {self._stop_text()}; {best}; precision {self.precision.dtype}", *self.notes])

    def _stop_text(self) -> str:
        cfg = self.config
        planned = f"{len(self.history)} of {cfg.epochs} epochs"
        if self.stop_reason == "completed":
            return f"completed {planned}"
        if self.stop_reason == "early_stopping":  # a callback may stop with kitlib's reasons: no patience then
            return f"early stop{f' (patience {cfg.patience})' if cfg.patience else ''} after {planned}"
        if self.stop_reason == "time_budget":
            return f"time budget{f' ({cfg.time_budget_s:g} s)' if cfg.time_budget_s else ''} after {planned}"
        if self.stop_reason == "sigterm":
            return f"SIGTERM after {planned} (last/ saved: run again to continue)"
        return f"{self.stop_reason} after {planned}"


def _rounded(value: float) -> str:
    """A metric for reading: 4 decimals (0.6822), or 4 significant digits when that would hide it (1.235e-05)."""
    return f"{value:.4f}" if value == 0 or 1e-3 <= abs(value) < 1e6 else f"{value:.4g}"


@dataclass
class RunState:
    """Everything about the loop's position that a resumed run needs besides weights and optimizer.

    ``epoch`` counts the epochs completed (0 while the first runs): the in-progress epoch's 0-based index, for
    seeding and resuming. Every number shown or recorded (history, best_epoch, on_metrics, logs) is 1-based: epoch
    ``state.epoch + 1`` is the one running, and after it completes ``state.epoch`` equals its number.
    """

    epoch: int = 0
    batch_in_epoch: int = 0  # micro-batches of `epoch` already consumed (per rank)
    step: int = 0  # optimizer steps applied
    skipped: int = 0
    nonfinite_streak: int = 0
    best: float | None = None
    best_epoch: int | None = None  # 1-based
    evals_since_best: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    epoch_loss_sum: float = 0.0  # item-weighted loss of the current epoch so far
    epoch_items: float = 0.0
    step_evals: list[dict[str, Any]] = field(default_factory=list)  # eval_every_steps: epoch, step, eval_loss


class Loop:
    """What fit's callbacks see and may change: the run's objects, its position (``state``), and ``stop``."""

    def __init__(self, model: nn.Module, train_loader: DataLoader[Any], cfg: TrainConfig, *, hw: HardwareInfo,
                 eval_loader: DataLoader[Any] | None, loss_fn: LossFn | None, count_fn: CountFn | None,
                 full_eval: FullEval | None, run_dir: str | Path | None) -> None:  # fmt: skip
        from kitlib.machine.hardware import check_compile
        from kitlib.machine.precision import Precision, check_master_weights, decide_precision

        self.cfg, self.hw = cfg, hw
        self.plan = decide_precision(hw, cfg.precision, tf32=cfg.tf32)  # raises, naming the fix, for impossible asks
        compile_note = check_compile(hw) if cfg.compile else ""  # raises on GPUs Triton cannot compile for
        self.precision = Precision(self.plan)
        self.env = distributed.join_process_group(self.plan.device_type)
        self.device = distributed.device_for(self.plan.device_type, self.env)
        self.out = Path(run_dir) if run_dir is not None else None
        _same_on_every_rank("run_dir", run_dir is not None, self.env, self.device)
        self.loss_fn, self.count_fn, self.full_eval = loss_fn or hf_loss, count_fn or default_count_fn(model), full_eval
        # Nothing else to judge "best" by without an eval set.
        self.monitor = "train_loss" if eval_loader is None and cfg.monitor == "eval_loss" else cfg.monitor
        torch.manual_seed(cfg.seed)
        self.frozen = freeze(model, cfg.freeze, cfg.freeze_layers)
        if (cfg.freeze != "none" or cfg.freeze_layers) and self.env.is_main:
            # Say what was frozen (and what was kept because it is shared): a line of output, not a warning (a
            # notebook shows warnings as a red box, and this is the run going as configured).
            print(f"fit: {self.frozen}")
        if (cast := cast_for_optimizer(model, cfg, self.plan.dtype)) and self.env.is_main:
            print(f"fit: {cast}")
        # after freezing: a frozen half weight is never updated
        check_master_weights(model.named_parameters(), keeps_bf16_updates=cfg.optimizer == "adamw-kahan")
        if cfg.gradient_checkpointing:
            enable_activation_checkpointing(model, cfg.checkpoint_modules)
        self.raw_model = model.to(self.device)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(model, cfg)
        self.base_loader = train_loader  # its samplers decide each epoch's order; the views below share them
        self.train_loader = shard_batches(train_loader, self.env.rank, self.env.world_size)
        self.eval_batches = shard_batches(eval_loader, self.env.rank, self.env.world_size) if eval_loader else None
        if cfg.eval_every_steps and self.eval_batches is None:
            raise ValueError(f"eval_every_steps={cfg.eval_every_steps} needs an eval_loader: pass fit(eval_loader=...)")
        self.windows_per_epoch = math.ceil(len(self.train_loader) / cfg.grad_accum_steps)
        if self.windows_per_epoch == 0:
            raise ValueError("the training DataLoader is empty (with drop_last=True, fewer rows than one batch?)")
        self.scheduler = build_scheduler(self.optimizer, cfg, self.windows_per_epoch * cfg.epochs)
        self.backoff = MicroBatchBackoff(
            cfg, loader_batch=train_loader.batch_size, optimizer=self.optimizer, precision=self.precision,
            device=self.device, distributed=self.env.enabled, next_strategy=next_strategy(cfg),
            say=print if self.env.is_main else lambda line: None,
        )  # fmt: skip
        self.ledger = StepLedger(self.scheduler, self.windows_per_epoch * cfg.epochs, self.device)
        # Windows whose outcome (applied or skipped) the device has not reported yet; state.step counts them as
        # applied until settle() reads the device. window_applied: the outcome of the window settle() read last.
        self.unsettled, self.window_applied = 0, True
        self.model = distributed.wrap(model, self.env, self.device, find_unused_parameters=cfg.find_unused_parameters)
        if cfg.compile:
            if compile_note and self.env.is_main:
                print(f"fit: {compile_note}")
            self.model = torch.compile(self.model)  # type: ignore[assignment]
        self.state, self.stop_reason = RunState(), "completed"
        self.resume_rng: dict[str, Any] | None = None  # set by resume(), applied once after the loader's first iter
        self.timer = PhaseTimer(sync=torch.cuda.synchronize if self.device.type == "cuda" else None)
        self.writer = checkpoint.BackgroundWriter()
        self.deferred = DeferredEvals(kind=cfg.background_eval if cfg.background_eval != "off" else "thread")
        # Rank 0 alone runs the full evaluation: the other ranks wait for it here, not inside a NCCL collective.
        self.patient = distributed.patient_group(self.env)
        self.to_device = to_device(self.device)
        # Per-epoch sums stay on the device between log steps: reading them is a host sync.
        self.epoch_loss = torch.zeros((), dtype=torch.float64, device=self.device)
        self.epoch_items = torch.zeros((), dtype=torch.float64, device=self.device)
        self.events = Events(())
        self.checked_gradients = False  # every_parameter_gets_a_gradient ran (DDP, first step)
        self.ended_cleanly = False  # True once the loop ran to its end without an exception (read by on_fit_end)

    def settle(self) -> None:
        """Make ``state.step``, ``state.skipped``, ``state.nonfinite_streak`` and the scheduler exact: one host sync
        (``StepLedger.read``), paid only where a decision needs them (``reached``, the non-finite limit, saves, epoch
        ends); a no-op when nothing ran since the last one."""
        if not self.unsettled:
            return
        applied, skipped, streak, self.window_applied = self.ledger.read()
        for _ in range(applied - (self.state.step - self.unsettled)):
            self.scheduler.step()  # the host's copy of the schedule catches up with the device's applied steps
        self.state.step, self.state.skipped, self.state.nonfinite_streak, self.unsettled = applied, skipped, streak, 0

    def reached(self, every: int | None) -> bool:
        """Whether the window just run was applied and made ``state.step`` a multiple of ``every`` (a log, eval or
        save step), exactly as if every step were read; it settles only when a multiple is within reach of the
        windows not yet read, i.e. about once per ``every`` steps (plus once per skipped step near one)."""
        if not every:
            return False
        if self.unsettled and self.state.step // every == (self.state.step - self.unsettled) // every:
            return False
        self.settle()
        return self.window_applied and self.state.step % every == 0

    def agree(self, flag: bool) -> bool:
        """Rank 0's ``flag`` on every rank, for a stop every rank must take at the same window. Under DDP the ranks
        exchange it every ``log_every_steps`` windows only (a broadcast is a host sync): acted on that much later."""
        if not self.env.enabled:
            return flag
        if (self.state.step + self.state.skipped) % self.cfg.log_every_steps:
            return False
        return bool(distributed.broadcast_object(flag, self.env))

    def stop(self, reason: str) -> None:
        """Ask the loop to stop after the current step; the first reason given is the one reported."""
        if self.stop_reason == "completed":
            self.stop_reason = reason

    def resume(self) -> None:
        """Continue from ``run_dir/last`` exactly where it stopped: weights, optimizer, schedule, scaler, RNG."""
        if self.out is None:
            raise ValueError("resume=True needs the run_dir of the run to continue")
        last = checkpoint.latest(self.out, "last")
        if last is None:
            raise CheckpointError(
                f"resume=True but {self.out}/last holds no complete checkpoint (the run stopped before its first "
                'save). Fix: resume="auto" (continues when there is a checkpoint, else starts fresh) or resume=False'
            )
        snap = checkpoint.load(last)
        changed = self.cfg.resume_differences(snap.meta.get("config", {}))
        if changed:
            raise CheckpointError(
                f"{last} was saved by a run with another config ({'; '.join(changed)}): continuing it with this one "
                "would be neither run. Fix: pass the config it was saved with, or a new run_dir (or resume=False "
                "to start over there)"
            )
        checkpoint.restore_model(self.raw_model, snap)
        assert snap.state is not None
        self.optimizer.load_state_dict(snap.state["optimizer"])
        self.scheduler.load_state_dict(snap.state["scheduler"])
        self.precision.load_state_dict(snap.state["precision"])
        self.backoff.load_state_dict(snap.state.get("backoff", {}))
        # Each rank continues its own streams; a checkpoint from another world size (or an older kitlib) has only
        # rank 0's, and every rank takes those.
        ranks = snap.state.get("rank_rngs") or []
        rng = ranks[self.env.rank] if len(ranks) == self.env.world_size else snap.state["rng"]
        self.state, self.resume_rng = RunState(**snap.state["run"]), rng
        self.ledger.load(self.state.step, self.state.skipped, self.state.nonfinite_streak)
        self._rescore(snap.state.get("unscored_full_evals", []))

    def _rescore(self, unscored: list[dict[str, Any]]) -> None:
        """Full evals still running in the background when ``last/`` was saved at an epoch end (``save_last``):
        the weights it holds are that epoch's, so run the eval again on them, with the RNG as it was then (a
        sampling eval draws the same), and queue the result for its turn: the resumed run judges it when the
        uninterrupted one did. Cost: one more full eval (its accelerator half in the foreground) per resume."""
        for item in unscored:
            epoch = int(item["epoch"])
            if self.full_eval is None or epoch != self.state.epoch or self.state.batch_in_epoch:
                why = "no full_eval was passed" if self.full_eval is None else "last/ lacks that epoch's weights"
                warnings.warn(
                    f"the full evaluation of epoch {epoch} was still running when {self.out}/last was saved and "
                    f"cannot run again ({why}): its metrics stay missing from the history",
                    stacklevel=3,
                )
                continue
            if not self.env.is_main:
                continue
            checkpoint.set_rng_state(item["rng"])  # the training streams are set back in begin_epoch
            with self.timer.phase("full_eval"):
                result = run_full_eval(self.raw_model, self.full_eval, self.precision.autocast)
            self._defer(epoch, result, next(r for r in self.state.history if r["epoch"] == epoch), item["rng"])
        distributed.wait_together(self.patient, self.env)

    def save(self, name: str, take: Callable[[], checkpoint.Snapshot]) -> None:
        if self.out is not None and self.env.is_main:
            with self.timer.phase("checkpoint"):  # the snapshot copy is on the critical path; the disk write is not
                self.writer.submit(take(), self.out / name)

    def save_last(self) -> None:
        self.settle()
        if self.out is None:
            return
        # Background full evals still pending must not be lost by a resume from this checkpoint. At an epoch end
        # (save_last), the only one pending is the epoch just finished (the previous one was judged at this epoch's
        # end): the checkpoint holds that epoch's weights, so it records the eval as unscored and a resume runs it
        # again (Loop._rescore) instead of waiting for it here, which would put every full eval back on the
        # critical path. Anywhere else (a save every N steps, SIGTERM, the time budget) the pending eval's weights
        # are gone from the model, so the save waits for it: at most the rest of one eval, once an epoch (later
        # saves of the epoch find nothing pending). The run's last save (early stop, SIGTERM, the final epoch)
        # waits too: a finished run's last/ is complete, and running its cell again evaluates nothing.
        state = self.state
        final = self.stop_reason != "completed" or state.epoch >= self.cfg.epochs
        self.collect(through=state.epoch - 1 if state.batch_in_epoch == 0 and not final else None)
        # Every rank joins: rank 0 saves each rank's own streams (dropout masks etc. differ per rank).
        rngs = distributed.gather_object(checkpoint.rng_state(), self.env)
        if not self.env.is_main:
            return
        unscored = [{"epoch": p.epoch, "rng": p.payload[1]} for p in self.deferred.pending]

        def take() -> checkpoint.Snapshot:
            state.epoch_loss_sum, state.epoch_items = float(self.epoch_loss), float(self.epoch_items)
            resume_state = {
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "precision": self.precision.state_dict(),
                "backoff": self.backoff.state_dict(),
                "rng": rngs[0],
                "rank_rngs": rngs,
                "run": dataclasses.asdict(state),
                "unscored_full_evals": unscored,
            }
            # "epoch": epochs completed, i.e. at an epoch end the 1-based number of the epoch just finished
            meta = {"epoch": state.epoch, "step": state.step, "config": self.cfg.to_dict(), "kitlib": __version__}
            return checkpoint.snapshot(self.raw_model, state=resume_state, meta=meta)

        self.save("last", take)

    def begin_epoch(self) -> Any:
        """This epoch's batches (the remaining ones, when resuming mid-epoch) in its seeded order."""
        seed_epoch_order(self.base_loader, self.cfg.seed, self.state.epoch)
        # A resumed run continues the RNG streams (dropout, ...) exactly where the checkpoint took them. A DataLoader
        # without a generator draws its base seed from the global RNG at iter(): an epoch-end checkpoint was taken
        # before this epoch's draw (restore first, the draw then repeats), a mid-epoch one after it (restore after).
        if self.resume_rng is not None and self.state.batch_in_epoch == 0:
            checkpoint.set_rng_state(self.resume_rng)
            self.resume_rng = None
        batches = iter(skip_batches(self.train_loader, self.state.batch_in_epoch))
        if self.resume_rng is not None:
            checkpoint.set_rng_state(self.resume_rng)
            self.resume_rng = None
        self.epoch_loss.fill_(self.state.epoch_loss_sum)
        self.epoch_items.fill_(self.state.epoch_items)
        return batches

    def step(self, window: list[Batch], started: float, fetch_s: float) -> StepEnd:
        # Under DDP, this process's first step checks that every trainable parameter got a gradient (named error).
        check = self.env.enabled and not self.cfg.find_unused_parameters and not self.checked_gradients
        self.checked_gradients = True

        def train(micro_batches: list[Batch]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            return train_window(
                micro_batches, model=self.model, loss_fn=self.loss_fn, count_fn=self.count_fn,
                precision=self.precision, optimizer=self.optimizer, ledger=self.ledger, params=self.params,
                cfg=self.cfg, env=self.env, timer=self.timer, to_device=self.to_device,
            )  # fmt: skip

        with distributed.every_parameter_gets_a_gradient(self.raw_model) if check else contextlib.nullcontext():
            # Out of device memory: the window again from its start at half the micro-batch, twice the accumulation.
            applied, loss_sum, items = self.backoff.run(window, train, step=self.state.step + self.state.skipped)
        self.state.batch_in_epoch += len(window)
        self.state.step += 1  # as applied until settle() reads the outcome: no wait for the GPU here
        self.unsettled += 1
        self.epoch_loss += torch.where(applied, loss_sum, 0.0)  # where, not *: a skipped step's loss may be nan
        self.epoch_items += torch.where(applied, items, 0.0)
        shapes = frozenset(tuple(b["input_ids"].shape) for b in window if isinstance(b, Mapping) and "input_ids" in b)
        return StepEnd(applied, len(window), sum(rows(b) for b in window), sum(real_tokens(b) for b in window),
                       sum(computed_tokens(b) for b in window), shapes, started, fetch_s,
                       time.perf_counter() - started)  # fmt: skip

    def epoch_record(self, epoch: int, seconds: float, samples: int, tokens: Any) -> dict[str, Any]:
        """Epoch ``epoch``'s (1-based) history row: training stats, the cheap eval, and the full eval when due (maybe
        deferred to the background: its metrics then arrive through ``collect``). ``tokens_per_s`` only when the
        batches had token counts (attention masks): a head on cached vectors has none, and 0.0 would read as stalled."""
        self.settle()
        cfg, env, items, real = self.cfg, self.env, float(self.epoch_items), float(tokens)
        record: dict[str, Any] = {
            "epoch": epoch,
            "step": self.state.step,
            "train_loss": float(self.epoch_loss) / items if items else math.nan,
            "lr": self.scheduler.get_last_lr()[0],
            "skipped_steps": self.state.skipped,
            "epoch_s": seconds,
            "samples_per_s": samples * env.world_size / seconds,
        }
        if real:
            record["tokens_per_s"] = real * env.world_size / seconds
        due = full_eval_due(epoch, cfg.full_eval_every, cfg.full_eval_at_end, cfg.epochs)
        result: Metrics | Callable[[], Metrics] | None = None
        rng: dict[str, Any] = {}
        if self.full_eval is not None and due and self.stop_reason != "time_budget" and env.is_main:
            with self.timer.phase("full_eval"):
                rng = checkpoint.rng_state()  # what a resume re-runs it with (Loop._rescore)
                result = run_full_eval(self.raw_model, self.full_eval, self.precision.autocast)
        if self.full_eval is not None and due and self.stop_reason != "time_budget":
            distributed.wait_together(self.patient, self.env)  # before the cheap eval's collective
        # A full eval that reports eval_loss itself already made the pass over the eval set: no second pass
        # (single process only: under DDP the cheap eval is a collective every rank must join).
        if self.eval_batches is not None and not (
            isinstance(result, Mapping) and "eval_loss" in result and not env.enabled
        ):
            record["eval_loss"] = self.eval_loss()
        if callable(result) and cfg.background_eval != "off":
            self._defer(epoch, result, record, rng)
        elif callable(result):  # background_eval="off": score it here, on the critical path
            with self.timer.phase("full_eval"):
                record.update(result())
        elif result is not None:
            record.update(result)
        self.state.history.append(record)
        return record

    def eval_loss(self) -> float:
        """The cheap loss-only eval on the eval set (at most ``eval_max_batches`` batches), timed as "eval"."""
        assert self.eval_batches is not None
        with self.timer.phase("eval"):
            return evaluate_loss(
                self.model,
                self.eval_batches,
                loss_fn=self.loss_fn,
                count_fn=self.count_fn,
                autocast=self.precision.autocast,
                to_device=self.to_device,
                env=self.env,
                max_batches=self.cfg.eval_max_batches,
            )

    def _defer(self, epoch: int, result: Metrics | Callable[[], Metrics], record: Mapping[str, Any],
               rng: dict[str, Any]) -> None:  # fmt: skip
        """Queue epoch ``epoch``'s full-eval result for its turn in ``collect``: a callable scored in the background
        pool (or here, with background_eval="off"), or metrics already known (a resume's re-run)."""
        weights = None
        if self.cfg.save_best and self.out is not None and self.monitor not in record:
            with self.timer.phase("checkpoint"):  # kept until the verdict arrives: best/ gets this epoch's weights
                weights = checkpoint.snapshot(self.raw_model, meta={"epoch": epoch})
        if not callable(result):
            self.deferred.add_done(epoch, result, (weights, rng))
        elif self.cfg.background_eval != "off":
            self.deferred.submit(epoch, result, (weights, rng))
        else:
            with self.timer.phase("full_eval"):
                self.deferred.add_done(epoch, result(), (weights, rng))

    def collect(self, through: int | None = None) -> None:
        """The background evals of the epochs up to ``through`` (all when None), waiting for those still running:
        into their epoch's row, then to the callbacks, in epoch order. fit() collects epoch k's at the end of epoch
        k+1, before that epoch's own metrics, so best/ and early stopping judge every epoch in order, one epoch
        behind when its eval runs in the background, and the same whenever its result happens to land."""
        begin = time.perf_counter()
        done = self.deferred.collect(wait=True, through=through)
        distributed.wait_together(self.patient, self.env)  # every rank, so none waits in a collective meanwhile
        if done:
            self.timer.add("full_eval", time.perf_counter() - begin)  # waiting for it is the eval's cost
        for epoch, metrics, (weights, _rng) in done:
            next(r for r in self.state.history if r["epoch"] == epoch).update(metrics)
            self.events.on_metrics(epoch, metrics, weights)

    def next_epoch(self) -> None:
        self.state.epoch, self.state.batch_in_epoch = self.state.epoch + 1, 0
        self.state.epoch_loss_sum, self.state.epoch_items = 0.0, 0.0
        self.epoch_loss.zero_()
        self.epoch_items.zero_()

    def close(self) -> None:
        self.deferred.close()
        if self.patient is not None:
            torch.distributed.destroy_process_group(self.patient)
        with self.timer.phase("checkpoint"):
            self.writer.close()  # the run's files are complete when fit() returns
        self.timer.add("checkpoint_write_background", self.writer.busy_seconds)


def fit(
    model: nn.Module,
    train_loader: DataLoader[Any],
    *,
    config: TrainConfig | None = None,
    eval_loader: DataLoader[Any] | None = None,
    loss_fn: LossFn | None = None,
    count_fn: CountFn | None = None,
    full_eval: FullEval | None = None,
    run_dir: str | Path | None = None,
    resume: bool | Literal["auto"] = False,
    hw: HardwareInfo | None = None,
    callbacks: Sequence[Callback | object] = (),
) -> FitResult:
    """Train ``model`` on ``train_loader`` with kitlib's defaults, measurements and safety nets.

    - ``loss_fn(model, batch) -> mean loss`` (default: a Hugging Face model's own ``.loss``) and
      ``count_fn(batch) -> items`` that mean is over (default: scored label tokens, else rows).
    - ``full_eval(model) -> metrics`` is the expensive evaluation (generation, task metrics), run every
      ``config.full_eval_every`` epochs and/or at the end; return a zero-argument callable instead of a dict to run
      its CPU-bound part in the background while the next epoch trains (its metrics are judged, in epoch order, at
      that epoch's end: early stopping then acts one epoch later than with a dict).
    - ``run_dir`` receives config.json, history.csv, timing.json and the best/ and last/ checkpoints;
      ``resume=True`` continues from ``run_dir/last`` exactly where it stopped; ``resume="auto"`` does when a
      complete ``last/`` exists and starts fresh otherwise (a restarted session just runs the same cell again).
    - ``callbacks``: :class:`kitlib.engine.events.Callback` objects, called after kitlib's own policies.

    Example::

        result = fit(model, train_loader, eval_loader=val_loader, config=TrainConfig(epochs=3), run_dir="runs/a")
    """
    from kitlib.machine.backends import flags_for, speed_flags
    from kitlib.machine.hardware import cpu_threads, detect

    cfg = config or TrainConfig()
    if resume and run_dir is None:
        raise ValueError(f"resume={resume!r} needs the run_dir of the run to continue")
    loop = Loop(model, train_loader, cfg, hw=hw or detect(), eval_loader=eval_loader, loss_fn=loss_fn,
                count_fn=count_fn, full_eval=full_eval, run_dir=run_dir)  # fmt: skip
    if resume == "auto":
        resume = run_dir is not None and checkpoint.latest(Path(run_dir), "last") is not None
    if resume:
        loop.resume()
    recorder = RunRecorder()
    loop.events = events = Events([*default_policies(cfg), recorder, *callbacks])
    _write_config(loop)
    flags = flags_for(loop.plan, shapes_vary=cfg.batching != "fixed")
    if cfg.cudnn_benchmark is not None:
        flags["cudnn_benchmark"] = cfg.cudnn_benchmark
    try:
        # restored on exit, also on error: the kernel lives on. Threads: this process's share of the usable CPUs
        with speed_flags(**flags) as effective_flags, cpu_threads() as threads:
            loop.timer.extra["cudnn_benchmark"] = bool(effective_flags.get("cudnn_benchmark"))
            loop.timer.extra["intra_op_threads"] = threads
            events.on_fit_start(loop)
            loop.model.train()
            while loop.state.epoch < cfg.epochs and loop.stop_reason == "completed":
                epoch, batches = loop.state.epoch, loop.begin_epoch()
                events.on_epoch_start(loop)
                epoch_start, samples, finished = time.perf_counter(), 0, False
                tokens: int | torch.Tensor = 0  # real tokens; a tensor stays lazy on the device until the epoch ends
                while loop.stop_reason == "completed":  # a callback's stop ends the epoch after its step
                    started = time.perf_counter()
                    loop.timer.begin_step(loop.state.step + loop.state.skipped)
                    with loop.timer.phase("data_wait"):
                        window = [b for _, b in zip(range(cfg.grad_accum_steps), batches, strict=False)]
                    if finished := not window:
                        loop.timer.discard_step()
                        break
                    step = loop.step(window, started, time.perf_counter() - started)
                    samples, tokens = samples + step.rows, tokens + step.real_tokens
                    events.on_step_end(step)
                number = epoch + 1  # shown and recorded 1-based (RunState's docstring)
                record = loop.epoch_record(number, time.perf_counter() - epoch_start, samples, tokens)
                loop.collect(through=number - 1)  # the earlier epochs' background results first: epoch order
                events.on_metrics(number, {k: v for k, v in record.items() if isinstance(v, float)}, None)
                events.on_epoch_end(record)
                if finished:  # every batch consumed: move on (a clean resume point), even if a callback stopped
                    loop.next_epoch()
                    events.on_next_epoch(loop)
            loop.collect()
        loop.ended_cleanly = True
    finally:
        events.on_fit_end(loop)
        loop.close()
    loop.timer.extra.update(recorder.facts(loop).to_dict())
    return _finish(loop)


def _same_on_every_rank(what: str, given: bool, env: distributed.DistEnv, device: torch.device) -> None:
    """A DistributedError on every rank when only some were given ``what``: every rank joins the collectives of a
    save (``Loop.save_last``), so one without it would train on while the others wait for it (a hang). One
    all-reduce at setup."""
    if not env.enabled:
        return
    count = int(distributed.all_reduce_sum(torch.tensor(float(given), device=device), env))
    if 0 < count < env.world_size:
        from kitlib.errors import DistributedError

        raise DistributedError(
            f"{what} was given on {count} of {env.world_size} ranks: every rank takes part in saving (only rank 0 "
            f"writes). Fix: pass the same {what} to fit on every rank"
        )


def _write_config(loop: Loop) -> None:
    """The resolved config beside every run artifact (timm-style): what actually ran, and on what."""
    if loop.out is None or not loop.env.is_main:
        return
    resolved = {
        "config": loop.cfg.to_dict(),
        "precision": dataclasses.asdict(loop.plan),
        "monitor": loop.monitor,
        "world_size": loop.env.world_size,
        "kitlib": __version__,
        "hardware": loop.hw.summary(),
    }
    write_atomic(loop.out / "config.json", json.dumps(resolved, indent=2, default=str) + "\n")


def _finish(loop: Loop) -> FitResult:
    import pandas as pd

    loop.settle()
    history = pd.DataFrame(loop.state.history)
    if loop.out is not None and loop.env.is_main:
        write_atomic(loop.out / "history.csv", history.to_csv(index=False))
        if loop.state.step_evals:
            write_atomic(loop.out / "step_evals.csv", pd.DataFrame(loop.state.step_evals).to_csv(index=False))
        loop.timer.save(loop.out / "timing.json")
    if loop.monitor not in history.columns and len(history):
        warnings.warn(
            f"monitor {loop.monitor!r} never appeared in the history (columns: {list(history.columns)}): "
            "no best checkpoint was chosen",
            stacklevel=3,
        )
    distributed.barrier(loop.env)
    state = loop.state
    return FitResult(
        model=loop.raw_model,
        history=history,
        stop_reason=loop.stop_reason,
        best_metric=state.best,
        best_epoch=state.best_epoch,
        steps=state.step,
        skipped_steps=state.skipped,
        precision=loop.plan,
        timing=loop.timer.record(),
        run_dir=loop.out,
        monitor=loop.monitor,
        config=loop.cfg,
        step_evals=list(state.step_evals),
    )
