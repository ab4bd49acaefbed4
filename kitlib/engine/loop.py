"""fit(): the loop: set-up, epochs of optimizer windows (``Loop.train_window``), an epoch-end record and its evals,
and the named events (``events``) on which kitlib's policies and the user's callbacks act."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import operator
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pandas as pd
import torch
from torch import nn
from torch.utils.data import DataLoader

from kitlib._files import write_atomic
from kitlib._version import __version__
from kitlib.config import TrainConfig, full_eval_due
from kitlib.engine import checkpoint, sharded
from kitlib.engine.backoff import MicroBatchBackoff, next_strategy
from kitlib.engine.batches import DataViews
from kitlib.engine.evaluation import BackgroundEval, FullEval, SplitEval, evaluate_loss
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
from kitlib.engine.state import RunState
from kitlib.engine.step import (
    MODEL_LOSSES,
    StepLedger,
    enable_activation_checkpointing,
    mask_optional,
    to_device,
)
from kitlib.engine.timing import PhaseTimer
from kitlib.errors import CheckpointError, DistributedError, NonFiniteLossError
from kitlib.machine import distributed
from kitlib.machine.amp import Precision, check_master_weights
from kitlib.machine.backends import flags_for, speed_flags
from kitlib.machine.hardware import check_compile, detect
from kitlib.machine.precision import carried
from kitlib.machine.threads import cpu_threads
from kitlib.models.adapters import adapter_keys
from kitlib.progress import figure, throughput

if TYPE_CHECKING:
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
            best = f"best {self.monitor} {figure(self.best_metric)} at epoch {self.best_epoch}"
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


class Loop:
    """One fit run: its objects (``model``/``raw_model``, ``optimizer``, ``precision``, the OOM ``backoff``, ``data``,
    ``output``, background ``evals``), its position (``state``) and ``stop``; callbacks see it as a ``LoopView``."""

    def __init__(self, model: nn.Module, train_loader: DataLoader[Any], cfg: TrainConfig, *, hw: HardwareInfo,
                 eval_loader: DataLoader[Any] | None, loss_fn: LossFn | None, count_fn: CountFn | None,
                 full_eval: FullEval | SplitEval | None, run_dir: str | Path | None) -> None:  # fmt: skip
        self.cfg, self.hw = cfg, hw
        plan = carried(cfg, hw)  # raises, naming the fix, for impossible asks
        compile_note = check_compile(hw) if cfg.compile else ""  # raises on GPUs Triton cannot compile for
        self.env = distributed.join_process_group(plan.device_type)
        self.device = distributed.device_for(plan.device_type, self.env)
        _same_on_every_rank("run_dir", run_dir is not None, self.env, self.device)
        self.output = checkpoint.RunOutput(run_dir, is_main=self.env.is_main)
        # fit's notices (what was frozen, cast, compiled): a line of output on rank 0, not a warning (a notebook
        # shows warnings as a red box, and this is the run going as configured)
        self.say: Callable[[str], None] = lambda line: print(f"fit: {line}") if self.env.is_main else None
        torch.manual_seed(cfg.seed)
        frozen = freeze(model, cfg.freeze, cfg.freeze_layers)
        if cfg.freeze != "none" or cfg.freeze_layers:
            self.say(str(frozen))
        if cast := cast_for_optimizer(model, cfg, plan.dtype):
            self.say(cast)
        # after freezing: a frozen half weight is never updated
        check_master_weights(model.named_parameters(), keeps_bf16_updates=cfg.optimizer == "adamw-kahan")
        if cfg.gradient_checkpointing:
            enable_activation_checkpointing(model, cfg.checkpoint_modules)
        self.raw_model = model.to(self.device)
        out = self.out if self.output.writes else None
        self.last_room = checkpoint.room_for_last(out, model, cfg.optimizer) if out is not None else None
        self.sharded = cfg.strategy == "fsdp" and self.env.enabled  # FSDP2: before the optimizer sees the weights
        if self.sharded:
            sharded.shard(model, plan.dtype, cfg.checkpoint_modules)
            self.last_room = distributed.broadcast_object(self.last_room, self.env)  # every rank skips last/ alike
        self.save_group = sharded.saves_group() if self.sharded else None
        self.eval_whole = eval_loader  # the eval set unsharded (FSDP's loss eval)
        self.data = DataViews(train_loader, eval_loader, self.env, grad_accum_steps=cfg.grad_accum_steps,
                              eval_every_steps=cfg.eval_every_steps)  # fmt: skip
        self.timer = PhaseTimer(sync=torch.cuda.synchronize if self.device.type == "cuda" else None)
        self.timer.extra.update(world_size=self.env.world_size, nodes=self.env.world_size // self.env.local_world_size,
                                strategy=cfg.strategy if self.env.enabled else "single process")  # fmt: skip
        self.plan, self.precision = plan, Precision(plan)
        self.loss_fn, self.count_fn = loss_fn or hf_loss, count_fn or default_count_fn(model)
        self.to_device = to_device(self.device, omit_full_masks=self.loss_fn in MODEL_LOSSES and mask_optional(model))
        self.params = [p for p in model.parameters() if p.requires_grad]
        if self.env.enabled:  # timing.json's run: the doctor's communication rule reads it
            self.timer.extra["comm_seconds_per_step"] = distributed.comm_seconds(
                self.params, self.env, self.device, sharded=self.sharded, accum=cfg.grad_accum_steps
            )
        self.optimizer = build_optimizer(model, cfg)
        total_steps = self.data.windows_per_epoch * cfg.epochs
        self.scheduler = build_scheduler(self.optimizer, cfg, total_steps)
        self.backoff = MicroBatchBackoff(
            cfg, optimizer=self.optimizer, precision=self.precision, device=self.device, distributed=self.env.enabled,
            next_strategy=next_strategy(cfg), say=self.say,
        )  # fmt: skip
        # step outcomes and the epoch's loss sums: on the device (no host sync a step)
        self.ledger = StepLedger(self.scheduler, total_steps, self.device, self.env)
        # unsettled: windows run since the ledger was read (state.step counts them as applied until ``settle``);
        # window_applied: the outcome of the window read last; checked_gradients: DDP's first-step check ran
        self.unsettled, self.window_applied, self.checked_gradients = 0, True, False
        if self.last_room and (cfg.save_last or cfg.save_every_steps):
            raise CheckpointError(
                f"{self.last_room}. Fix: no last/ (TrainConfig(save_last=False, save_every_steps=None); in the "
                "notebooks checkpoints = 'best'), or a run directory on a bigger disk"
            )
        if self.last_room:  # last/ is saved only when a time budget or SIGTERM stops the run: best/ is kept instead
            self.say(f"a stop by the time budget or SIGTERM will not save last/ (not resumable): {self.last_room}")
        self.model = (
            model
            if self.sharded
            else distributed.wrap(model, self.env, self.device, find_unused_parameters=cfg.find_unused_parameters)
        )
        if cfg.compile:
            if compile_note:
                self.say(compile_note)
            self.model = torch.compile(self.model)  # type: ignore[assignment]
        self.state, self.stop_reason = RunState(), "completed"
        # FSDP: every rank runs the full eval's forward (a collective), scored at once (no weights kept aside)
        self.evals = BackgroundEval(full_eval, "off" if self.sharded else cfg.background_eval, env=self.env,
                                    timer=self.timer, every_rank=self.sharded)  # fmt: skip
        self.events = Events(())
        self.ended_cleanly = False  # True once the loop ran to its end without an exception (read by on_fit_end)

    @property
    def out(self) -> Path | None:
        """The run directory (None: the run writes no files)."""
        return self.output.path

    @property
    def monitor(self) -> str:
        """The metric best/ and early stopping judge: nothing but the training loss without an eval set."""
        return "train_loss" if self.data.eval is None and self.cfg.monitor == "eval_loss" else self.cfg.monitor

    def settle(self) -> None:
        """Make ``state.step``, ``state.skipped``, ``state.nonfinite_streak`` and the scheduler exact: one host sync
        (``StepLedger.read``), paid only where a decision needs them (``reached``, the non-finite limit, saves, epoch
        ends); a no-op when nothing ran since the last one."""
        if not self.unsettled:
            return
        state = self.state
        applied, skipped, streak, self.window_applied = self.ledger.read()
        if applied != state.step - self.unsettled:  # the host's schedule catches up with the applied steps: a
            self.scheduler.last_epoch = applied - 1  # LambdaLR's lr is base x rule(last_epoch), so one step, not
            self.scheduler.step()  # one per step (~30 us each on a CPU)
        state.step, state.skipped, state.nonfinite_streak, self.unsettled = applied, skipped, streak, 0

    def reached(self, every: int | None) -> bool:
        """Whether the window just run was applied and made ``state.step`` a multiple of ``every`` (a log, eval or
        save step), exactly as if every step were read; it settles only when a multiple is within reach of the
        windows not yet read, i.e. about once per ``every`` steps (plus once per skipped step near one)."""
        step = self.state.step
        if not every or (self.unsettled and step // every == (step - self.unsettled) // every):
            return False
        self.settle()
        return self.window_applied and self.state.step % every == 0

    def applied_lr(self) -> float:
        """The lr the last step ran with: the schedule's at ``state.step - 1`` (no host sync). ``get_last_lr`` is the
        next step's: 0.0 after a linear schedule's end."""
        return float(self.scheduler.base_lrs[0] * self.scheduler.lr_lambdas[0](max(self.state.step - 1, 0)))

    def agree(self, reason: str) -> str:
        """Rank 0's stop ``reason`` ("": none) on every rank, for a stop every rank takes at the same window. Under DDP
        the ranks exchange it every ``log_every_steps`` windows only (a broadcast is a host sync): acted on later."""
        if not self.env.enabled:
            return reason
        if (self.state.step + self.state.skipped) % self.cfg.log_every_steps:
            return ""
        return str(distributed.broadcast_object(reason, self.env))

    def stop(self, reason: str) -> None:
        """Ask the loop to stop after the current step; the first reason given is the one reported."""
        if self.stop_reason == "completed":
            self.stop_reason = reason

    def resume(self) -> None:
        """Continue from ``run_dir/last`` exactly where it stopped: weights, optimizer, schedule, scaler, RNG, and
        the full evals still unscored when it was saved."""
        assert self.out is not None  # fit refuses resume without a run_dir
        last = checkpoint.latest(self.out, "last")
        if last is None:
            raise CheckpointError(
                f"resume=True but {self.out}/last holds no complete checkpoint (the run stopped before its first "
                'save). Fix: resume="auto" (continues when there is a checkpoint, else starts fresh) or resume=False'
            )
        snap = sharded.load_into(last, self.raw_model, self.optimizer) if self.sharded else checkpoint.load(last)
        assert snap.state is not None
        run = dict(snap.state["run"])  # another world size: the same rows a step, and the epoch's place in them
        saved, run["batch_in_epoch"] = distributed.regrouped(snap.meta, self.cfg.micro_batch_size,
                                                             self.cfg.grad_accum_steps, self.env.world_size,
                                                             run["batch_in_epoch"])  # fmt: skip
        changed = self.cfg.resume_differences(saved)
        if changed:
            raise CheckpointError(
                f"{last} was saved by a run with another config ({'; '.join(changed)}): continuing it with this one "
                "would be neither run. Fix: pass the config it was saved with, or a new run_dir (or resume=False "
                "to start over there)"
            )
        if not self.sharded:
            checkpoint.restore_model(self.raw_model, snap)
        self.ledger.load_state_dict(run)
        self.state = RunState(**{k: v for k, v in run.items() if k not in ("epoch_loss_sum", "epoch_items")})
        self.optimizer.load_state_dict(snap.state["optimizer"])
        self.scheduler.load_state_dict(snap.state["scheduler"])
        self.precision.load_state_dict(snap.state["precision"])
        self.backoff.load_state_dict(snap.state.get("backoff", {}))
        # Each rank continues its own streams; a checkpoint from another world size (or an older kitlib) has only
        # rank 0's, and every rank takes those.
        ranks = snap.state.get("rank_rngs") or []
        self.data.resume_rng = ranks[self.env.rank] if len(ranks) == self.env.world_size else snap.state["rng"]
        self.evals.load_state_dict(
            snap.state.get("background_eval") or {"unscored": snap.state.get("unscored_full_evals", [])}
        )
        at_end = self.state.epoch if self.state.batch_in_epoch == 0 else None  # last/ holds that epoch's weights
        self.evals.rescore(self.raw_model, self.precision.autocast, at_epoch_end=at_end, weights=self._kept_weights,
                           where=f"{self.out}/last")  # fmt: skip

    def _kept_weights(self, epoch: int) -> checkpoint.Snapshot | None:
        """Epoch ``epoch``'s weights, kept beside its queued full eval when best/ may need them once its verdict
        arrives (the model trains on meanwhile); None when best/ is not saved or the epoch was judged already."""
        record = next(r for r in self.state.history if r["epoch"] == epoch)
        if self.sharded or not (self.cfg.save_best and self.out is not None and self.monitor not in record):
            return None
        with self.timer.phase("checkpoint"):
            return checkpoint.snapshot(self.raw_model, meta={"epoch": epoch})

    def save(self, name: str, take: Callable[[], checkpoint.Snapshot]) -> None:
        if self.out is None or not (self.output.writes or self.sharded):
            return
        with self.timer.phase("checkpoint"):
            if self.sharded and adapter_keys(self.raw_model) is None:  # every rank its shards (best/: the weights)
                best = next((r for r in self.state.history if r["epoch"] == self.state.best_epoch), {})
                metrics = {k: v for k, v in best.items() if isinstance(v, float)}
                meta = {"epoch": self.state.best_epoch, "metrics": metrics, "config": self.cfg.to_dict()}
                sharded.save(
                    self.out / name,
                    self.raw_model,
                    None,
                    self.env,
                    self.output.writer,
                    group=self.save_group,
                    meta=meta,
                )
                return
            snap = take()  # on the critical path (an adapter under FSDP: gathered by every rank); the write is not
            if self.output.writes:
                self.output.save(name, snap)

    def save_last(self) -> None:
        """``last/``: the full resume state. A full eval still scoring is saved as unscored at an epoch end (the resume
        reruns it); elsewhere, and at the run's last save, the save waits for it, so a finished run's last/ is complete
        and running its cell again evaluates nothing."""
        self.settle()
        if self.out is None:
            return
        state = self.state
        final = self.stop_reason != "completed" or state.epoch >= self.cfg.epochs
        self.collect(through=state.epoch - 1 if state.batch_in_epoch == 0 and not final else None)
        # Every rank joins: rank 0 saves each rank's own streams (dropout masks etc. differ per rank).
        rngs = distributed.gather_object(checkpoint.rng_state(), self.env)
        run = {**dataclasses.asdict(state), **self.ledger.state_dict()}  # every rank: a collective
        if (not self.env.is_main and not self.sharded) or self.last_room:  # no room (room_for_last, said at start)
            return
        # "epoch": epochs completed, i.e. at an epoch end the 1-based number of the epoch just finished
        meta = {"epoch": state.epoch, "step": state.step, "config": self.cfg.to_dict(), "kitlib": __version__,
                "world_size": self.env.world_size}  # fmt: skip
        # the optimizer side (optimizer, schedule, precision's loss scale, the OOM back-off), RNGs and position
        resume = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                  "precision": self.precision.state_dict(), "backoff": self.backoff.state_dict(),
                  "rng": rngs[0] if rngs else None, "rank_rngs": rngs, "run": run,
                  "background_eval": self.evals.state_dict()}  # fmt: skip
        if self.sharded:  # every rank its shards of the weights and optimizer; rank 0 the rest
            del resume["optimizer"]
            with self.timer.phase("checkpoint"):
                sharded.save(self.out / "last", self.raw_model, self.optimizer, self.env, self.output.writer,
                             group=self.save_group, state=resume, meta=meta)  # fmt: skip
        else:
            self.save("last", lambda: checkpoint.snapshot(self.raw_model, state=resume, meta=meta))

    def begin_epoch(self) -> Any:
        """This epoch's batches (the remaining ones, when resuming mid-epoch) in its seeded order."""
        batches = self.data.epoch(self.cfg.seed, self.state.epoch, self.state.batch_in_epoch)
        self.ledger.mark()  # the first log's loss starts here
        return batches

    def step(self, window: list[Batch], started: float, fetch_s: float) -> StepEnd:
        """One optimizer window (``train_window``), replayed at half the micro-batch on out-of-memory, counted on the
        device: no host sync. ``state.step`` counts it as applied until ``settle`` reads the outcome."""
        # Under DDP, this process's first step checks that every trainable parameter got a gradient (named error).
        check = self.env.enabled and not self.cfg.find_unused_parameters and not self.checked_gradients
        self.checked_gradients = True

        with distributed.every_parameter_gets_a_gradient(self.raw_model) if check else contextlib.nullcontext():
            applied = self.backoff.run(window, self.train_window, step=self.state.step + self.state.skipped)
        self.state.batch_in_epoch += len(window)
        self.state.step += 1
        self.unsettled += 1
        shapes = frozenset(tuple(b["input_ids"].shape) for b in window if isinstance(b, Mapping) and "input_ids" in b)

        def total(count: Callable[[Batch], Any]) -> Any:  # no sum(): 0 + a device count is one more small op
            return functools.reduce(operator.add, map(count, window))

        return StepEnd(applied, len(window), total(rows), total(real_tokens), total(computed_tokens), shapes, started,
                       fetch_s, time.perf_counter() - started)  # fmt: skip

    def train_window(self, window: list[Batch]) -> Any:
        """The optimizer step over ``window``'s micro-batches, counted by the ledger (no host sync on a device):
        autocast -> weighted backward -> unscale -> clip -> step at the scheduled LR (skipped on inf/nan) -> zero_grad.
        Returns the applied flag."""
        timer, env, precision, optimizer = self.timer, self.env, self.precision, self.optimizer
        with timer.phase("h2d"):
            window = [self.to_device(batch) for batch in window]
            # Each micro-batch's mean loss is weighted by its share of the window's items across all ranks, so the
            # update equals one big batch: also for a short last window and token-weighted losses. DDP averages the
            # gradients over ranks, hence the world_size factor.
            counts, total = self.ledger.tally(window, self.count_fn)
        # One micro-batch on one process: its weight is exactly 1 (count / count), so no scaling ops (~4 a step).
        alone = len(window) == 1 and not env.enabled
        losses = []
        for i, (batch, count) in enumerate(zip(window, counts, strict=True)):
            with distributed.sync_context(self.model, sync=i == len(window) - 1):
                with timer.phase("forward"), precision.autocast():
                    loss = self.loss_fn(self.model, batch)
                with timer.phase("backward"):
                    precision.backward(loss if alone else loss * (count * env.world_size / total))
            losses.append(loss.detach())
        with timer.phase("optimizer"):
            precision.unscale_(optimizer)
            clip = self.cfg.grad_clip or math.inf
            norm = distributed.whole(torch.nn.utils.clip_grad_norm_(self.params, clip, foreach=True))
            applied = self.ledger.step(optimizer, precision, norm, losses, counts, total)
            optimizer.zero_grad(set_to_none=True)
        return applied

    def train_log(self, samples: int, tokens: int | torch.Tensor, epoch_start: float) -> dict[str, float]:
        """A log step's ``on_log`` metrics: the loss since the last log, the lr, and this epoch's speed so far
        (samples, and real tokens when the batches count them, per second of its training wall time). One sync."""
        with self.timer.phase("logging"):
            loss = self.ledger.since_mark()
            seconds = time.perf_counter() - epoch_start
            logs = {"step": self.state.step, "loss": loss, "lr": self.applied_lr()}
            return logs | throughput(samples, float(tokens), seconds, self.env.world_size)

    def epoch_record(self, epoch: int, seconds: float, samples: int, tokens: Any) -> dict[str, Any]:
        """Epoch ``epoch``'s (1-based) history row: training stats, the cheap eval, and the full eval when due (its
        score maybe queued in the background: its metrics then arrive through ``collect``), its throughput by
        ``kitlib.progress.throughput``."""
        self.settle()
        cfg, env = self.cfg, self.env
        record: dict[str, Any] = {
            "epoch": epoch,
            "step": self.state.step,
            "train_loss": self.ledger.mean(),
            "lr": self.applied_lr(),
            "skipped_steps": self.state.skipped,
            "epoch_s": seconds,
        } | throughput(samples, float(tokens), seconds, env.world_size)
        self.state.history.append(record)
        due = full_eval_due(epoch, cfg.full_eval_every, cfg.full_eval_at_end, cfg.epochs)
        measured = None
        if due and self.stop_reason != "time_budget":
            measured = self.evals.measure(self.raw_model, self.precision.autocast)
        # A full eval that reports eval_loss itself already made the pass over the eval set: no second pass
        # (single process only: under DDP the cheap eval is a collective every rank must join).
        known = measured.metrics or {} if measured is not None else {}
        if self.data.eval is not None and not ("eval_loss" in known and not env.enabled):
            record["eval_loss"] = self.eval_loss()
        if measured is not None:
            record.update(self.evals.score(epoch, measured, lambda: self._kept_weights(epoch)))
        return record

    def eval_loss(self) -> float:
        """The cheap loss-only eval on the eval set (at most ``eval_max_batches`` batches), timed as "eval"."""
        assert self.data.eval is not None
        with self.timer.phase("eval"):
            # The unwrapped model: DDP's forward broadcasts buffers (a collective) on every call, and eval shards keep
            # every batch, so ranks may run different counts; one collective per eval, at its end, is the only one.
            # FSDP: every forward is a collective, so every rank runs the whole eval set (the same count) alone
            return evaluate_loss(
                self.raw_model,
                self.eval_whole if self.sharded and self.eval_whole is not None else self.data.eval,
                loss_fn=self.loss_fn,
                count_fn=self.count_fn,
                autocast=self.precision.autocast,
                to_device=self.to_device,
                env=distributed.DistEnv() if self.sharded else self.env,
                device=self.device,
                max_batches=self.cfg.eval_max_batches,
            )

    def report(self, epoch: int, metrics: Mapping[str, float], weights: checkpoint.Snapshot | None) -> None:
        """Epoch ``epoch``'s metrics arrived: ``state`` judges the monitored one, then ``on_metrics`` fires."""
        self.state.verdict = 0
        if (value := metrics.get(self.monitor)) is not None:
            self.state.judge(epoch, value, self.cfg)
        self.events.fire("on_metrics", epoch, metrics, weights)

    def collect(self, through: int | None = None) -> None:
        """The background evals of the epochs up to ``through`` (all when None), waited for, into their epoch's row,
        then reported in epoch order: fit collects epoch k's at epoch k+1's end, before that epoch's own metrics, so
        best/ and early stopping judge every epoch in order, whenever its result lands."""
        for epoch, metrics, weights in self.evals.collect(through):
            next(r for r in self.state.history if r["epoch"] == epoch).update(metrics)
            self.report(epoch, metrics, weights)

    def next_epoch(self) -> None:
        self.state.epoch, self.state.batch_in_epoch = self.state.epoch + 1, 0
        self.ledger.reset()

    def close(self) -> None:
        self.evals.close(together=self.ended_cleanly)
        try:
            with self.timer.phase("checkpoint"):
                self.output.writer.close()  # the run's files are complete when fit() returns
        except CheckpointError as err:
            if self.ended_cleanly:
                raise
            # the run's own error says more: a dead rank fails a pending sharded save's collectives too
            warnings.warn(f"checkpoint writer error while the run stopped on another: {err}", stacklevel=2)
        finally:
            sharded.release(self.save_group)
            self.save_group = None
        self.timer.add("checkpoint_write_background", self.output.writer.busy_seconds)


def fit(
    model: nn.Module,
    train_loader: DataLoader[Any],
    *,
    config: TrainConfig | None = None,
    eval_loader: DataLoader[Any] | None = None,
    loss_fn: LossFn | None = None,
    count_fn: CountFn | None = None,
    full_eval: FullEval | SplitEval | None = None,
    run_dir: str | Path | None = None,
    resume: bool | Literal["auto"] = False,
    hw: HardwareInfo | None = None,
    callbacks: Sequence[Callback | object] = (),
    policies: Sequence[Callback | object] | None = None,
) -> FitResult:
    """Train ``model`` on ``train_loader`` with kitlib's defaults, measurements and safety nets (docs/guide.md).

    - ``loss_fn(model, batch) -> mean loss`` (default: a Hugging Face model's own ``.loss``), ``count_fn(batch) ->
      items`` that mean is over (default: scored label tokens, else rows).
    - ``full_eval(model) -> metrics``: the expensive eval, every ``config.full_eval_every`` epochs and/or at the end;
      ``SplitEval(measure, score)`` scores in the background (``config.background_eval``), judged an epoch later.
    - ``run_dir``: config.json, history.csv, timing.json, best/ and last/; ``resume=True`` continues from its last/
      exactly, ``resume="auto"`` when a complete last/ exists (else starts fresh: rerun the same cell).
    - ``policies``: kitlib's callbacks (``default_policies(config)`` when None: pass a list to remove or replace one);
      ``callbacks``: yours (:class:`kitlib.engine.events.Callback`). All run by ``order`` (kitlib's below 0).

    Example::

        result = fit(model, train_loader, eval_loader=val_loader, config=TrainConfig(epochs=3, micro_batch_size=16),
                     run_dir="runs/a")  # train_loader: batches of 16 rows (fit refuses another size)
    """
    loaded = getattr(train_loader.batch_sampler, "batch_size", None)  # a DataLoader's batch_size, kitlib's samplers'
    cfg = config or TrainConfig(**({"micro_batch_size": loaded} if loaded else {}))
    if loaded is not None and loaded != cfg.micro_batch_size:  # one number, one source: the run's (the config)
        raise ValueError(
            f"the train loader's batches hold {loaded} rows, config.micro_batch_size is {cfg.micro_batch_size}: build "
            f"the loader from the config (kitlib.make_train_loader(dataset, config, hw)), or set micro_batch_size="
            f"{loaded} in the config"
        )
    if resume and run_dir is None:
        raise ValueError(f"resume={resume!r} needs the run_dir of the run to continue")
    loop = Loop(model, train_loader, cfg, hw=hw or detect(), eval_loader=eval_loader, loss_fn=loss_fn,
                count_fn=count_fn, full_eval=full_eval, run_dir=run_dir)  # fmt: skip
    if resume == "auto":
        resume = run_dir is not None and checkpoint.latest(Path(run_dir), "last") is not None
    if resume:
        loop.resume()
    recorder = RunRecorder()
    chosen = default_policies(cfg) if policies is None else policies
    loop.events = events = Events([*chosen, recorder, *callbacks])
    _write_config(loop)
    flags = flags_for(loop.plan, shapes_vary=cfg.batching != "fixed")
    if cfg.cudnn_benchmark is not None:
        flags["cudnn_benchmark"] = cfg.cudnn_benchmark
    try:
        # restored on exit, also on error: the kernel lives on. Threads: this process's share of the usable CPUs
        with speed_flags(**flags) as effective_flags, cpu_threads() as threads:
            loop.timer.extra["cudnn_benchmark"] = bool(effective_flags.get("cudnn_benchmark"))
            loop.timer.extra["intra_op_threads"] = threads
            events.fire("on_fit_start", loop)
            loop.model.train()
            while loop.state.epoch < cfg.epochs and loop.stop_reason == "completed":
                epoch, batches = loop.state.epoch, loop.begin_epoch()
                events.fire("on_epoch_start", loop)
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
                    logs = [loop.train_log(samples, tokens, epoch_start)] if loop.reached(cfg.log_every_steps) else []
                    evals = len(loop.state.step_evals)
                    events.fire("on_step_end", step)
                    logs += [{"step": e["step"], "eval_loss": e["eval_loss"]} for e in loop.state.step_evals[evals:]]
                    for metrics in logs:  # this step's: the training log, then a step eval's (StepEval)
                        events.fire("on_log", metrics)
                number = epoch + 1  # shown and recorded 1-based (RunState's docstring)
                record = loop.epoch_record(number, time.perf_counter() - epoch_start, samples, tokens)
                loop.collect(through=number - 1)  # the earlier epochs' background results first: epoch order
                loop.report(number, {k: v for k, v in record.items() if isinstance(v, float)}, None)
                events.fire("on_epoch_end", record)
                if finished:  # every batch consumed: move on (a clean resume point), even if a callback stopped
                    loop.next_epoch()
                    events.fire("on_next_epoch", loop)
            loop.collect()
        loop.ended_cleanly = True
    finally:
        try:
            events.fire("on_fit_end", loop)
        finally:  # a callback's error still leaves the run's files complete and no writer thread behind
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
        **{k: loop.timer.extra[k] for k in ("world_size", "nodes", "strategy")},  # nodes: torchrun's --nnodes
        "kitlib": __version__,
        "hardware": loop.hw.summary(),
    }
    write_atomic(loop.out / "config.json", json.dumps(resolved, indent=2, default=str) + "\n")


def _finish(loop: Loop) -> FitResult:
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
