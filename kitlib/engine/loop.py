"""fit(): hardware-aware, gradient-accumulated mixed-precision training for any nn.Module.

The optimizer step reads top to bottom in ``_train_window``: autocast -> weighted backward (no DDP sync until the
window's last micro-batch) -> unscale -> clip -> step (skipped on inf/nan) -> schedule -> zero_grad. Everything else
(evaluation, checkpoints, budget, logging) happens between windows in ``fit``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn
from torch.utils.data import DataLoader, RandomSampler

from kitlib._version import __version__
from kitlib.config import TrainConfig
from kitlib.engine import checkpoint
from kitlib.engine.batches import shard_batches, skip_batches
from kitlib.engine.evaluation import DeferredEvals, FullEval, Metrics, evaluate_loss, run_full_eval
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
from kitlib.engine.optim import build_optimizer, build_scheduler, freeze
from kitlib.engine.timing import PhaseTimer
from kitlib.machine import distributed
from kitlib.models.facts import model_facts
from kitlib.progress import progress_bar

if TYPE_CHECKING:
    import pandas as pd

    from kitlib.machine.hardware import HardwareInfo
    from kitlib.machine.precision import Precision, PrecisionPlan


class NonFiniteLossError(RuntimeError):
    """Raised when too many optimizer steps in a row had inf/nan gradients."""


class Callback(Protocol):
    """Optional hooks; fit() calls the ones a callback defines, in list order, on every rank."""

    def on_log(self, metrics: Mapping[str, float]) -> None: ...
    def on_epoch_end(self, record: Mapping[str, Any]) -> None: ...


@dataclass
class FitResult:
    model: nn.Module  # the trained module, unwrapped from DDP/torch.compile
    history: pd.DataFrame  # one row per epoch
    stop_reason: str  # "completed" | "early_stopping" | "time_budget"
    best_metric: float | None
    best_epoch: int | None
    steps: int  # optimizer steps applied
    skipped_steps: int  # optimizer steps skipped because of inf/nan gradients
    precision: PrecisionPlan
    timing: dict[str, Any]
    run_dir: Path | None


@dataclass
class _RunState:
    """Everything about the loop's position that a resumed run needs besides weights and optimizer."""

    epoch: int = 0
    batch_in_epoch: int = 0  # micro-batches of `epoch` already consumed (per rank)
    step: int = 0  # optimizer steps applied
    skipped: int = 0
    nonfinite_streak: int = 0
    best: float | None = None
    best_epoch: int | None = None
    evals_since_best: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    epoch_loss_sum: float = 0.0  # item-weighted loss of the current epoch so far
    epoch_items: float = 0.0


def _to_device(device: torch.device) -> Callable[[Batch], Batch]:
    # Pinned host memory + non_blocking lets the copy overlap the previous step's kernels on CUDA; on CPU it is a no-op.
    non_blocking = device.type == "cuda"

    def move(batch: Batch) -> Batch:
        if isinstance(batch, torch.Tensor):
            return batch.to(device, non_blocking=non_blocking)
        if isinstance(batch, Mapping):  # dicts and Hugging Face BatchEncoding alike
            return {k: move(v) for k, v in batch.items()}
        if isinstance(batch, list | tuple):
            return type(batch)(move(v) for v in batch)
        return batch

    return move


def _train_window(
    window: list[Batch],
    *,
    model: nn.Module,
    loss_fn: LossFn,
    count_fn: CountFn,
    precision: Precision,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    params: list[nn.Parameter],
    cfg: TrainConfig,
    env: distributed.DistEnv,
    timer: PhaseTimer,
    to_device: Callable[[Batch], Batch],
) -> tuple[bool, torch.Tensor, torch.Tensor]:
    """One optimizer step over a window of micro-batches. Returns (applied, summed item-weighted loss, items)."""
    with timer.phase("h2d"):
        window = [to_device(batch) for batch in window]
        counts = [torch.as_tensor(count_fn(batch), dtype=torch.float32, device=params[0].device) for batch in window]
        # Each micro-batch's mean loss is weighted by its share of the window's items across all ranks, so the
        # update equals one big batch: also for a short last window and token-weighted losses. DDP averages the
        # gradients over ranks, hence the world_size factor.
        total = distributed.all_reduce_sum(torch.stack(counts).sum(), env)
    loss_sum = torch.zeros((), device=params[0].device)
    for i, (batch, count) in enumerate(zip(window, counts, strict=True)):
        with distributed.sync_context(model, sync=i == len(window) - 1):
            with timer.phase("forward"), precision.autocast():
                loss = loss_fn(model, batch)
            with timer.phase("backward"):
                precision.backward(loss * (count * env.world_size / total))
        loss_sum += loss.detach().float() * count
    with timer.phase("optimizer"):
        precision.unscale_(optimizer)
        norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip or math.inf, foreach=True)
        # One host sync per optimizer step (the GradScaler needs the same one for found_inf anyway).
        applied = precision.step(optimizer, grads_finite=bool(torch.isfinite(norm)))
        if applied:
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    return applied, loss_sum, total


def _enable_activation_checkpointing(model: nn.Module) -> None:
    """Recompute activations in backward: ~30% more compute for far less activation memory (Hugging Face models)."""
    # transformers 5.x renamed gradient_checkpointing_enable (deprecated, removed in v6); 4.x has only the old name.
    # Non-reentrant checkpointing works with DDP, frozen inputs and torch.compile; the reentrant default does not.
    kwargs = {"use_reentrant": False}
    if callable(enable := getattr(model, "activation_checkpointing_enable", None)):
        enable(activation_checkpointing_kwargs=kwargs)
    elif callable(enable := getattr(model, "gradient_checkpointing_enable", None)):
        enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise ValueError(
            f"gradient_checkpointing=True needs a Hugging Face model (activation_checkpointing_enable()); for "
            f"{type(model).__name__} wrap its blocks in torch.utils.checkpoint.checkpoint(..., use_reentrant=False)"
        )


def _improved(value: float, best: float | None, cfg: TrainConfig) -> bool:
    if math.isnan(value):
        return False
    if best is None:
        return True
    return value < best - cfg.min_delta if cfg.mode == "min" else value > best + cfg.min_delta


def _seed_epoch_order(loader: DataLoader[Any], seed: int, epoch: int) -> None:
    """Make each epoch's batch order a pure function of (seed, epoch), so a resumed run replays it exactly."""
    for sampler in (loader.batch_sampler, loader.sampler):
        if callable(getattr(sampler, "set_epoch", None)):
            sampler.set_epoch(epoch)  # type: ignore[union-attr]
            return
    if isinstance(loader.sampler, RandomSampler):
        # The user's plain DataLoader(shuffle=True): give its sampler a seeded generator (torch would otherwise
        # draw a fresh seed from the global RNG at every iterator, which a resumed run cannot replay).
        loader.sampler.generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)


def _run_facts(
    cfg: TrainConfig,
    plan: PrecisionPlan,
    hw: HardwareInfo,
    env: distributed.DistEnv,
    device: torch.device,
    loader: DataLoader[Any],
    *,
    epochs_done: int,
    steps: int,
) -> dict[str, Any]:
    """What the speed doctor needs to know about this run besides the phase times."""
    if device.type == "cuda":
        peak, total = torch.cuda.max_memory_allocated(device), torch.cuda.get_device_properties(device).total_memory
    else:
        import resource

        peak, total = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, hw.ram_bytes  # Linux: KiB
    return {
        "steps": steps,
        "epochs_planned": cfg.epochs,
        "epochs_done": epochs_done,
        "world_size": env.world_size,
        "micro_batch_size": getattr(loader, "batch_size", None) or cfg.micro_batch_size,
        "grad_accum_steps": cfg.grad_accum_steps,
        "num_workers": loader.num_workers,
        "persistent_workers": loader.persistent_workers,
        "pin_memory": loader.pin_memory,
        "precision": plan.dtype,
        "tf32": plan.tf32,
        "device_type": device.type,
        "device_name": _device_name(hw),
        "peak_memory_bytes": peak,
        "memory_total_bytes": total,
        "time_budget_s": cfg.time_budget_s,
        "full_eval_every": cfg.full_eval_every,
        "save_best": cfg.save_best,
        "save_last": cfg.save_last,
        "save_every_steps": cfg.save_every_steps,
        "batching": cfg.batching,
    }


def _device_name(hw: HardwareInfo) -> str:
    return hw.primary.name if hw.primary is not None else "CPU"


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
    resume: bool = False,
    hw: HardwareInfo | None = None,
    callbacks: Sequence[object] = (),
) -> FitResult:
    """Train ``model`` on ``train_loader`` with kitlib's defaults, measurements and safety nets.

    - ``loss_fn(model, batch) -> mean loss`` (default: a Hugging Face model's own ``.loss``) and
      ``count_fn(batch) -> items`` that mean is over (default: scored label tokens, else rows).
    - ``full_eval(model) -> metrics`` is the expensive evaluation (generation, task metrics), run every
      ``config.full_eval_every`` epochs and/or at the end; return a zero-argument callable instead of a dict to run
      its CPU-bound part in the background while training continues.
    - ``run_dir`` receives config.json, history.csv, timing.json and the best/ and last/ checkpoints;
      ``resume=True`` continues from ``run_dir/last`` exactly where it stopped.

    Example::

        result = fit(model, train_loader, eval_loader=val_loader, config=TrainConfig(epochs=3), run_dir="runs/a")
    """
    from kitlib.machine.backends import flags_for, speed_flags
    from kitlib.machine.hardware import detect
    from kitlib.machine.precision import Precision, decide_precision

    cfg = config or TrainConfig()
    hw = hw or detect()
    plan = decide_precision(hw, cfg.precision, tf32=cfg.tf32)  # raises, naming the fix, for impossible requests
    precision = Precision(plan)
    env = distributed.setup(plan.device_type)
    device = distributed.device_for(plan.device_type, env)
    out = Path(run_dir) if run_dir is not None else None
    if resume and out is None:
        raise ValueError("resume=True needs the run_dir of the run to continue")
    main = env.is_main
    loss_fn = loss_fn or hf_loss
    count_fn = count_fn or default_count_fn(model)
    monitor = cfg.monitor
    if eval_loader is None and monitor == "eval_loss":
        monitor = "train_loss"  # nothing else to judge "best" by

    torch.manual_seed(cfg.seed)
    freeze(model, cfg.freeze, cfg.freeze_layers)
    if cfg.gradient_checkpointing:
        _enable_activation_checkpointing(model)
    model.to(device)
    raw_model = model
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(model, cfg)
    base_loader = train_loader  # its samplers decide each epoch's order; the views below share them
    train_loader = shard_batches(train_loader, env.rank, env.world_size)
    eval_batches = shard_batches(eval_loader, env.rank, env.world_size) if eval_loader is not None else None
    windows_per_epoch = math.ceil(len(train_loader) / cfg.grad_accum_steps)
    if windows_per_epoch == 0:
        raise ValueError("the training DataLoader is empty (with drop_last=True, fewer rows than one batch?)")
    scheduler = build_scheduler(optimizer, cfg, windows_per_epoch * cfg.epochs)
    model = distributed.wrap(model, env, device)
    if cfg.compile:
        model = torch.compile(model)  # type: ignore[assignment]

    state = _RunState()
    if resume:
        assert out is not None
        last = checkpoint.latest(out, "last")
        if last is None:
            raise FileNotFoundError(f"resume=True but {out}/last holds no complete checkpoint; start with resume=False")
        snap = checkpoint.load(last)
        checkpoint.restore_model(raw_model, snap)
        assert snap.state is not None
        optimizer.load_state_dict(snap.state["optimizer"])
        scheduler.load_state_dict(snap.state["scheduler"])
        precision.load_state_dict(snap.state["precision"])
        state = _RunState(**snap.state["run"])
        resume_rng: dict[str, Any] | None = snap.state["rng"]
    else:
        resume_rng = None

    timer = PhaseTimer(sync=torch.cuda.synchronize if device.type == "cuda" else None)
    writer = checkpoint.BackgroundWriter()
    deferred = DeferredEvals(kind=cfg.background_eval if cfg.background_eval != "off" else "thread")
    to_device = _to_device(device)
    stop_reason = "completed"
    if out is not None and main:
        out.mkdir(parents=True, exist_ok=True)
        resolved = {
            "config": cfg.to_dict(),
            "precision": dataclasses.asdict(plan),
            "monitor": monitor,
            "world_size": env.world_size,
            "kitlib": __version__,
            "hardware": hw.summary(),
        }
        (out / "config.json").write_text(json.dumps(resolved, indent=2, default=str) + "\n")

    # Per-epoch sums stay on the device between log steps: reading them is a host sync.
    epoch_loss = torch.zeros((), dtype=torch.float64, device=device)
    epoch_items = torch.zeros((), dtype=torch.float64, device=device)

    def save(name: str, take: Callable[[], checkpoint.Snapshot]) -> None:
        if out is not None and main:
            with timer.phase("checkpoint"):  # the snapshot copy is on the critical path; the disk write is not
                writer.submit(take(), out / name)

    def save_last() -> None:
        def take() -> checkpoint.Snapshot:
            state.epoch_loss_sum, state.epoch_items = float(epoch_loss), float(epoch_items)
            resume_state = {
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "precision": precision.state_dict(),
                "rng": checkpoint.rng_state(),
                "run": dataclasses.asdict(state),
            }
            meta = {"epoch": state.epoch, "step": state.step, "config": cfg.to_dict(), "kitlib": __version__}
            return checkpoint.snapshot(raw_model, state=resume_state, meta=meta)

        save("last", take)

    def consider_best(epoch: int, metrics: Metrics, weights: checkpoint.Snapshot | None) -> None:
        value = metrics.get(monitor)
        if value is None:
            return
        if _improved(value, state.best, cfg):
            state.best, state.best_epoch, state.evals_since_best = value, epoch, 0
            if cfg.save_best:
                meta = {"epoch": epoch, "metrics": metrics, "config": cfg.to_dict(), "kitlib": __version__}
                save("best", lambda: weights or checkpoint.snapshot(raw_model, meta=meta))
        else:
            state.evals_since_best += 1

    def end_epoch(epoch: int, seconds: float, samples: int, tokens: Any) -> dict[str, Any]:
        """Cheap eval every epoch; the full eval when due (maybe in the background); best/early-stop bookkeeping."""
        items = float(epoch_items)
        record: dict[str, Any] = {
            "epoch": epoch,
            "step": state.step,
            "train_loss": float(epoch_loss) / items if items else math.nan,
            "lr": scheduler.get_last_lr()[0],
            "skipped_steps": state.skipped,
            "epoch_s": seconds,
            "samples_per_s": samples * env.world_size / seconds,
            "tokens_per_s": float(tokens) * env.world_size / seconds,
        }
        due = cfg.full_eval_every > 0 and (epoch + 1) % cfg.full_eval_every == 0
        at_end = cfg.full_eval_at_end and epoch == cfg.epochs - 1
        result: Metrics | Callable[[], Metrics] | None = None
        if full_eval is not None and (due or at_end) and stop_reason != "time_budget" and main:
            with timer.phase("full_eval"):
                result = run_full_eval(raw_model, full_eval, precision.autocast)
        # A full eval that reports eval_loss itself already made the pass over the eval set: no second pass
        # (single process only: under DDP the cheap eval is a collective every rank must join).
        if eval_batches is not None and not (isinstance(result, Mapping) and "eval_loss" in result and not env.enabled):
            with timer.phase("eval"):
                record["eval_loss"] = evaluate_loss(
                    model,
                    eval_batches,
                    loss_fn=loss_fn,
                    count_fn=count_fn,
                    autocast=precision.autocast,
                    to_device=to_device,
                    env=env,
                    max_batches=cfg.eval_max_batches,
                )
        if callable(result) and cfg.background_eval != "off":
            weights = None
            if cfg.save_best and out is not None and monitor not in record:
                with timer.phase("checkpoint"):  # kept until the verdict arrives
                    weights = checkpoint.snapshot(raw_model, meta={"epoch": epoch})
            deferred.submit(epoch, result, weights)
        elif callable(result):  # background_eval="off": score it here, on the critical path
            with timer.phase("full_eval"):
                record.update(result())
        elif result is not None:
            record.update(result)
        state.history.append(record)
        consider_best(epoch, {k: v for k, v in record.items() if isinstance(v, float)}, None)
        for cb in callbacks:
            getattr(cb, "on_epoch_end", lambda r: None)(record)
        return record

    def join_deferred(wait: bool) -> None:
        for epoch, metrics, weights in deferred.collect(wait=wait):
            next(r for r in state.history if r["epoch"] == epoch).update(metrics)  # the epoch's own record
            consider_best(epoch, metrics, weights)

    flags = flags_for(plan, shapes_vary=cfg.batching != "fixed")
    if cfg.cudnn_benchmark is not None:
        flags["cudnn_benchmark"] = cfg.cudnn_benchmark
    bar = progress_bar(
        windows_per_epoch * cfg.epochs,
        desc="train",
        interactive=hw.interactive,
        disable=not main,
        initial=state.epoch * windows_per_epoch + math.ceil(state.batch_in_epoch / cfg.grad_accum_steps),
    )
    step_seconds = 0.0  # moving average of one optimizer step, for the time budget
    # Run facts for timing.json (what `kitlib doctor` reads): counted host-side from shapes, no device syncs.
    gap_start: float | None = None
    epoch_gaps: list[float] = []
    epoch_train_s: list[float] = []
    first_waits: list[float] = []
    shapes: set[tuple[int, ...]] = set()
    total_samples, total_real_tokens, all_tokens = 0, 0, 0
    try:
        with speed_flags(**flags) as effective_flags:  # restored on exit, also on error: the kernel lives on
            timer.extra["cudnn_benchmark"] = bool(effective_flags.get("cudnn_benchmark"))
            model.train()
            while state.epoch < cfg.epochs and stop_reason == "completed":
                epoch = state.epoch
                _seed_epoch_order(base_loader, cfg.seed, epoch)
                batches = iter(skip_batches(train_loader, state.batch_in_epoch))
                if resume_rng is not None:  # after the loader drew its seeds: continue dropout etc. exactly
                    checkpoint.set_rng_state(resume_rng)
                    resume_rng = None
                epoch_loss.fill_(state.epoch_loss_sum)
                epoch_items.fill_(state.epoch_items)
                epoch_start, samples = time.perf_counter(), 0
                tokens: int | torch.Tensor = 0  # real (non-pad) tokens; a tensor stays lazy until the epoch ends
                log_start, log_loss, log_items, log_samples = (
                    time.perf_counter(),
                    epoch_loss.item(),
                    epoch_items.item(),
                    0,
                )
                log_tokens: int | torch.Tensor = 0
                while True:
                    t0 = time.perf_counter()
                    if gap_start is not None:  # eval, checkpoint and loader restart between two epochs' steps
                        epoch_gaps.append(t0 - gap_start)
                        gap_start = None
                    timer.begin_step(state.step + state.skipped)
                    with timer.phase("data_wait"):
                        window = [b for _, b in zip(range(cfg.grad_accum_steps), batches, strict=False)]
                    if samples == 0:
                        first_waits.append(time.perf_counter() - t0)
                    if not window:
                        timer.discard_step()
                        break
                    n_rows = sum(rows(b) for b in window)
                    samples, log_samples = samples + n_rows, log_samples + n_rows
                    window_tokens = sum(real_tokens(b) for b in window)
                    tokens, log_tokens = tokens + window_tokens, log_tokens + window_tokens
                    all_tokens += sum(computed_tokens(b) for b in window)
                    shapes.update(
                        tuple(b["input_ids"].shape) for b in window if isinstance(b, Mapping) and "input_ids" in b
                    )
                    applied, loss_sum, items = _train_window(
                        window,
                        model=model,
                        loss_fn=loss_fn,
                        count_fn=count_fn,
                        precision=precision,
                        optimizer=optimizer,
                        scheduler=scheduler,
                        params=params,
                        cfg=cfg,
                        env=env,
                        timer=timer,
                        to_device=to_device,
                    )
                    state.batch_in_epoch += len(window)
                    bar.update(1)
                    step_seconds = (
                        0.9 * step_seconds + 0.1 * (time.perf_counter() - t0)
                        if step_seconds
                        else time.perf_counter() - t0
                    )
                    if not applied:
                        state.skipped += 1
                        state.nonfinite_streak += 1
                        if state.nonfinite_streak >= cfg.max_nonfinite_steps:
                            best = f"; the best checkpoint in {out / 'best'} is intact" if out else ""
                            raise NonFiniteLossError(
                                f"{state.nonfinite_streak} optimizer steps in a row had inf/nan gradients (step "
                                f"{state.step}, epoch {epoch}){best}. Lower lr (now {cfg.lr:g}), keep grad_clip on, "
                                f"use precision='bf16' or 'fp32' instead of fp16, and check the data for inf/nan."
                            )
                        continue
                    state.step += 1
                    state.nonfinite_streak = 0
                    epoch_loss += loss_sum
                    epoch_items += items
                    if state.step % cfg.log_every_steps == 0:
                        with timer.phase("logging"):
                            loss_now, items_now = epoch_loss.item(), epoch_items.item()  # host sync: log steps only
                            dt = time.perf_counter() - log_start
                            logs = {
                                "step": state.step,
                                "loss": (loss_now - log_loss) / max(items_now - log_items, 1e-12),
                                "lr": scheduler.get_last_lr()[0],
                                "samples_per_s": log_samples * env.world_size / dt,
                                "tokens_per_s": float(log_tokens) * env.world_size / dt,  # real tokens, no padding
                            }
                            bar.set_postfix(
                                loss=f"{logs['loss']:.4f}",
                                lr=f"{logs['lr']:.2e}",
                                sps=f"{logs['samples_per_s']:.1f}",
                                tok_s=f"{logs['tokens_per_s']:.0f}",
                                refresh=False,
                            )
                            for cb in callbacks:
                                getattr(cb, "on_log", lambda m: None)(logs)
                            log_start, log_loss, log_items, log_samples = time.perf_counter(), loss_now, items_now, 0
                            log_tokens = 0
                    if cfg.save_every_steps and state.step % cfg.save_every_steps == 0:
                        save_last()
                    if cfg.time_budget_s is not None:
                        # Stop while one more step, the epoch-end eval and a checkpoint still fit in the budget.
                        evals = max(1, timer.counts.get("eval", 0))
                        reserve = 2 * step_seconds + timer.seconds.get("eval", 0.0) / evals + 5.0
                        if distributed.broadcast_object(timer.elapsed + reserve > cfg.time_budget_s, env):
                            stop_reason = "time_budget"
                            save_last()  # resumable from this exact position in the next session
                            break
                gap_start = time.perf_counter()
                epoch_train_s.append(gap_start - epoch_start)
                total_samples += samples
                total_real_tokens += int(tokens)
                end_epoch(epoch, gap_start - epoch_start, samples, tokens)
                join_deferred(wait=False)
                if stop_reason == "completed":
                    state.epoch, state.batch_in_epoch, state.epoch_loss_sum, state.epoch_items = epoch + 1, 0, 0.0, 0.0
                    epoch_loss.zero_()
                    epoch_items.zero_()
                    if cfg.patience is not None and distributed.broadcast_object(
                        state.evals_since_best >= cfg.patience, env
                    ):
                        stop_reason = "early_stopping"
                    if cfg.save_last:
                        save_last()
            join_deferred(wait=True)
    finally:
        bar.close()
        deferred.close()
        with timer.phase("checkpoint"):
            writer.close()  # the run's files are complete when fit() returns
        timer.add("checkpoint_write_background", writer.busy_seconds)
    import pandas as pd

    timer.extra.update(
        _run_facts(cfg, plan, hw, env, device, base_loader, epochs_done=len(state.history), steps=state.step)
        | {
            "samples": total_samples,
            "real_tokens": total_real_tokens,
            "computed_tokens": all_tokens,
            "distinct_input_shapes": len(shapes),
            "epoch_gaps_s": [round(g, 4) for g in epoch_gaps],
            "epoch_train_s": [round(t, 4) for t in epoch_train_s],
            "first_batch_wait_s": [round(t, 4) for t in first_waits],  # worker start-up lands here
            "eval_batches_per_eval": min(len(eval_batches), cfg.eval_max_batches or len(eval_batches))
            if eval_batches is not None
            else 0,
            "stop_reason": stop_reason,
        }
        | model_facts(raw_model)
    )
    history = pd.DataFrame(state.history)
    if out is not None and main:
        history.to_csv(out / "history.csv", index=False)
        timer.save(out / "timing.json")
    if monitor not in history.columns and len(history):
        warnings.warn(
            f"monitor {monitor!r} never appeared in the history (columns: {list(history.columns)}): "
            "no best checkpoint was chosen",
            stacklevel=2,
        )
    distributed.barrier(env)
    return FitResult(
        model=raw_model,
        history=history,
        stop_reason=stop_reason,
        best_metric=state.best,
        best_epoch=state.best_epoch,
        steps=state.step,
        skipped_steps=state.skipped,
        precision=plan,
        timing=timer.record(),
        run_dir=out,
    )
