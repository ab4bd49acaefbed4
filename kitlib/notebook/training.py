"""02 and 03 as functions: train the features' run (each fold), predict the test set, export-merged. Split from
kitlib.notebook.stages so that 00, 01 and the CLI import without torch."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from safetensors.torch import save_model
from transformers import AutoTokenizer

from kitlib._files import read_json_object, record_file, write_atomic
from kitlib.config import RETIRED, TrainConfig
from kitlib.engine import checkpoint
from kitlib.engine.loop import FitResult, fit
from kitlib.errors import CheckpointError, MissingRunError, SetupError
from kitlib.machine.amp import Precision
from kitlib.machine.distributed import WorkerDied, broadcast_object, dist_env, join_process_group, launch
from kitlib.machine.hardware import detect
from kitlib.machine.precision import PrecisionPlan, carried
from kitlib.machine.threads import cpu_threads
from kitlib.models.loading import frozen_dtype
from kitlib.models.lora import add_adapter, describe_size, merge_adapter
from kitlib.notebook import handoff, trees
from kitlib.notebook.estimate import BUDGET_MARGIN_S, KAGGLE_SESSION_S, duration, estimate_run
from kitlib.notebook.params import Params, kaggle_input, keep_aside, load_params
from kitlib.notebook.reporting import Report
from kitlib.notebook.stages import (
    BASELINE_FILE,
    StandIn,
    _cpu,
    _machine_for_plan,
    _model_choice,
    _splits,
    load_features,
    verdict_of,
)
from kitlib.notebook.submission import write_submission
from kitlib.notebook.tasks import get_task
from kitlib.notebook.tasks.base import Context, Prepared
from kitlib.progress import advise
from kitlib.tasks.baseline import Baseline, BestRows, compare
from kitlib.tasks.metrics import get_metric

if TYPE_CHECKING:
    from kitlib.machine.hardware import HardwareInfo
    from kitlib.notebook.handoff import Features
    from kitlib.tasks.metrics import Metric

VALID_FILE = "valid.json"  # in each fold's run dir: its validation rows' truth and predictions (the out-of-fold parts)
OOF_FILE = "oof.csv"  # in run/ with folds: every training row's out-of-fold prediction (row, fold, target, prediction)
INPUTS_FILE = "inputs.json"  # in run.new/: the config and features an attempt trained on (may it be continued?)
UNFINISHED = ("sigterm", "time_budget")  # stops that leave run.new/last for the next 02 to continue


def time_budget_s(p: Params, feats: Features, hw: HardwareInfo | None) -> float | None:
    """02's training seconds: ``time_budget`` hours; None: on Kaggle the session limit less this kernel's time so far,
    03's predicted time and a margin, elsewhere no limit."""
    if p.time_budget is not None:
        return p.time_budget * 3600
    if "KAGGLE_KERNEL_RUN_TYPE" not in os.environ:
        return None
    infer_s = estimate_run(feats.run, feats.n_train, feats.n_test, hw or detect(), folds=p.folds).infer_s
    return max(60.0, KAGGLE_SESSION_S - _process_seconds() - infer_s - BUDGET_MARGIN_S)


def _process_seconds() -> float:
    """Seconds since this process (the kernel, started with the session) started: Linux's /proc; 0 elsewhere."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        return float(Path("/proc/uptime").read_text().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _kept(run_dir: Path) -> Path | None:
    """``run_dir``'s complete best checkpoint, else its last; None when it has neither."""
    return checkpoint.latest(run_dir, "best") or checkpoint.latest(run_dir, "last")


def unfinished(p: Params) -> str:
    """Why 03 cannot predict yet when 02 stopped at its time budget (or SIGTERM) with a resumable last/: the line
    to print instead; "" when no fold waits to be continued."""
    folds = [dataclasses.replace(p, fold=f) for f in range(p.folds)]
    waiting = [_staging(f) for f in folds if checkpoint.latest(_staging(f), "last") and not _kept(f.run_dir)]
    if not waiting:
        return ""
    return (f"02 stopped before the end of training ({waiting[0]}/last is saved): no submission in this session. "
            "Continue it: on Kaggle build the next session with python -m kitlib kaggle build --continue-from "
            "OWNER/THIS-KERNEL and run it; elsewhere run notebooks/02_train.ipynb again")  # fmt: skip


def _judge_baseline(
    p: Params, feats: Features, result: FitResult, staging: Path, watched: BestRows | None = None, oof: bool = False
) -> FitResult:
    """The model's validation score beside the baseline's, with the model-minus-baseline interval (``watched``: the
    best validation predictions; ``oof``: every fold's): ``baseline.json`` (03 warns from it) and 02's summary."""

    if feats.run.choice.baseline is None:  # a run.json from an older kitlib
        return result
    baseline = Baseline.from_dict(feats.run.choice.baseline)
    score = _model_score(result.history, baseline.metric, result.best_epoch)
    blended = (staging / trees.TREES_FILE).is_file() and watched is not None and watched.score is not None
    score = watched.score if (blended or oof) and watched is not None else score  # the blend: what 03 will write
    gap = None
    if watched is not None and watched.rows is not None and baseline.value is not None:
        y_true, y_pred = watched.rows
        gap = compare(watched.metric, y_true, y_pred, baseline.constant(len(y_true)), seed=p.seed)
    limits = getattr(result.model, "kitlib_limits", None)  # a generating task's: how many training targets are cut
    done = [feats.run.name, *([feats.spec.loss] if feats.spec.kind == "regression" else [])]  # the advice skips them
    record = baseline.to_dict() | {"model_score": score, "kind": feats.spec.kind, "done": done}
    record |= {"gap": None if gap is None else dataclasses.asdict(gap), "cut_targets": getattr(limits, "cut", 0)}
    record |= {"folds": p.folds} if oof else {}
    record["beaten"] = baseline.verdict(score, feats.spec.kind, gap) is None
    if dist_env().is_main:  # under DDP only rank 0 writes: the others' staging folder is rank 0's, moved when done
        write_atomic(staging / BASELINE_FILE, json.dumps(record, indent=1) + "\n")
    return dataclasses.replace(result, notes=(*result.notes, baseline.line(), _verdict_line(record)))


def _verdict_line(record: Mapping[str, Any]) -> str:
    """02's verdict line from a baseline.json record: "verdict: ..." when the model beats the baseline, else
    "warning: ..."."""
    return ("verdict: " if record["beaten"] else "warning: ") + verdict_of(record)


def _blend_trees(p: Params, feats: Features, watched: BestRows, staging: Path) -> str | None:
    """02: trees beside the network where the run wants them (kitlib.notebook.trees): fitted on the training split,
    blended with the network's best validation predictions by the weight the metric scores best there. The weight
    goes to run/trees.json for 03, the blend into ``watched`` (the verdict judges what 03 will write); 02's line."""

    if not trees.wanted(feats) or watched.rows is None:
        return None
    kind = feats.spec.kind
    train_idx, valid_idx = _splits(p, feats)[p.fold]
    y_true, net = watched.rows
    if len(y_true) != len(valid_idx) or not np.array_equal(feats.spec.decode(feats.labels[valid_idx]), y_true):
        return "trees: skipped (the full eval's rows are not the validation split in order)"
    fitted = trees.Trees.fit(feats, train_idx, p.seed)
    if fitted is None:
        return None
    metric, by_trees = watched.metric, fitted.predict(feats, valid_idx)
    weight, score = trees.blend(metric, y_true, net, by_trees, kind)
    said = {"weight": weight, "network": watched.score, "trees": metric(y_true, by_trees), "blend": score}
    if dist_env().is_main:
        write_atomic(staging / trees.TREES_FILE, json.dumps(said, indent=1) + "\n")
    watched.score, watched.rows = score, (y_true, trees.mix(net, by_trees, weight, kind))
    return (
        f"trees (scikit-learn HistGradientBoosting on the columns + text embeddings): validation {metric.name} "
        f"{said['trees']:.4g}, network {said['network']:.4g}; 03 writes {weight:g} x trees + {1 - weight:g} x network "
        f"({score:.4g})"
    )


def _with_trees(p: Params, feats: Features, values: np.ndarray) -> np.ndarray:
    """03: the submission's values blended with the trees by 02's weight (run/trees.json), the trees refitted on the
    same training rows with the same seed (seconds; nothing pickled). With folds, each fold's trees by its weight,
    the blends averaged (classes: fold 1's)."""
    blends = []
    for fold, (train_idx, _) in enumerate(_splits(p, feats)):
        try:
            run_dir = dataclasses.replace(p, fold=fold).run_dir
            weight = float(json.loads((run_dir / trees.TREES_FILE).read_text())["weight"])
        except (OSError, ValueError, KeyError):
            continue  # no trees in this run
        fitted = trees.Trees.fit(feats, train_idx, p.seed) if weight > 0 else None
        if fitted is not None:
            print(f"trees: {weight:g} x trees + {1 - weight:g} x network (02's blend: {run_dir.name}/trees.json)")
            blends.append(trees.mix(values, fitted.predict(feats, None), weight, feats.spec.kind))
            if feats.spec.kind != "regression":
                break  # classes take the first fold's blend: the other folds' trees need not be fitted
    if not blends:
        return values
    return np.mean(blends, axis=0) if feats.spec.kind == "regression" else blends[0]


def _model_score(history: pd.DataFrame, metric: str, best_epoch: int | None) -> float | None:
    """The kept checkpoint's metric: its epoch's, else the last one computed (a metric scored at the end only)."""
    if metric not in history or history[metric].isna().all():
        return None
    scored = history.dropna(subset=[metric])
    kept = scored[scored["epoch"] == best_epoch] if best_epoch is not None else scored.iloc[0:0]
    return float((kept if len(kept) else scored.tail(1))[metric].iloc[0])


def prepare(p: Params, feats: Features, hw: HardwareInfo) -> Prepared:
    """Loaders and the model to train for the features' run (the same split every time: seeded): the regime's text
    model inside what the task builds around it (kitlib.notebook.tasks), with the run's adapter when it has one."""

    prepared = get_task(p.task).prepare(Context(feats, hw, _splits(p, feats)[p.fold], p.seed, _model_choice(p)))
    cfg = feats.run.config
    half = frozen_dtype(cfg.precision, cfg.adapter, hw.device_type)  # a frozen base needs no fp32 master copy
    generating = feats.spec.kind == "sequence"
    model = add_adapter(prepared.model, cfg.adapter, generating=generating, base_dtype=half, seed=p.seed)
    return dataclasses.replace(prepared, model=model)


def train(
    p: Params,
    feats: Features | None = None,
    *,
    hw: HardwareInfo | None = None,
    callbacks: tuple[object, ...] = (),
) -> FitResult:
    """fit() the features' run into ``p.run_dir``: per fold with ``folds`` > 1 (keeping those an interrupted 02
    finished), then the out-of-fold verdict; several planned GPUs: forked DDP workers (this process must not have
    touched CUDA). The result is fold 1's with every fold's lines."""
    feats = feats or load_features(p)
    kept = _finished_folds(p, feats)
    said = f"folds {', '.join(str(fold + 1) for fold in kept)} of {p.folds} kept: an earlier 02 finished them"
    if kept:
        print(f"{said} with these inputs (best/ and out-of-fold predictions saved); the others train, an interrupted "
              "one continuing from its last/")  # fmt: skip
    results: dict[int, FitResult] = {}
    budget_s = time_budget_s(p, feats, hw)
    deadline = None if budget_s is None else time.monotonic() + budget_s
    if budget_s is not None:
        kaggle = "Kaggle's 12 h session less this kernel's time so far, 03's predicted time and 20 min"
        source = f"time_budget = {p.time_budget:g} h" if p.time_budget is not None else kaggle
        print(f"time budget: {duration(budget_s)} of training in this session ({source}); a run that needs "
              "more stops with a resumable last/ that the next session continues")  # fmt: skip
    for fold in (fold for fold in range(p.folds) if fold not in kept):
        if p.folds > 1:
            print(f"fold {fold + 1} of {p.folds}: {dataclasses.replace(p, fold=fold).run_dir}")
        budget = None if deadline is None else max(1.0, deadline - time.monotonic())  # what the earlier folds left
        results[fold] = _train_fold(dataclasses.replace(p, fold=fold), feats, hw, callbacks, budget)
        if results[fold].stop_reason in UNFINISHED:  # 02 again continues this fold (its run.new/ is kept)
            return results[fold]
    if p.folds == 1:
        return results[0]
    if not dist_env().is_main and results:  # launched: rank 0 judges the folds
        return next(iter(results.values()))
    cpu = feats.run.world_size > 1  # DDP: this process must not touch CUDA (02 again launches), as _train_fold
    first = results[0] if 0 in results else _finished_result(p, feats, _cpu(hw) if cpu else hw or detect())
    judged = _out_of_fold(p, feats, first)
    return dataclasses.replace(judged, notes=(*judged.notes, said)) if kept else judged


def _finished_folds(p: Params, feats: Features) -> list[int]:
    """The folds an interrupted 02 finished (no run/oof.csv yet): best/ and this split's validation predictions,
    trained on these features and config (the machine's choices aside), no later attempt begun."""
    if p.folds == 1 or (p.run_dir / OOF_FILE).exists():
        return []

    def trained_on(inputs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:  # the machine's choices aside
        machine = ("batching", "precision", "tf32")
        return inputs.get("features"), {k: v for k, v in inputs.get("config", {}).items() if k not in machine}

    wanted, kept = trained_on(_inputs(p, _train_config(p, feats))), []
    for fold, (_, valid_idx) in enumerate(_splits(p, feats)):
        run_dir, staging = dataclasses.replace(p, fold=fold).run_dir, _staging(dataclasses.replace(p, fold=fold))
        alike = trained_on(_current(read_json_object(run_dir / INPUTS_FILE))) == wanted
        rows = read_json_object(run_dir / VALID_FILE).get("row")
        if alike and rows == valid_idx.tolist() and checkpoint.latest(run_dir, "best") and not staging.exists():
            kept.append(fold)
    return kept


def _finished_result(p: Params, feats: Features, hw: HardwareInfo) -> FitResult:
    """Fold 1's FitResult read back from run/ (an earlier 02 finished it): best/'s model, its history, timing and
    config."""
    ran, timing = read_json_object(p.run_dir / "config.json"), read_json_object(p.run_dir / "timing.json")
    model, best = prepare(p, feats, hw).model, checkpoint.load(_trained_checkpoint(p.run_dir, p))
    checkpoint.restore_model(model, best)
    history, monitor = pd.read_csv(p.run_dir / "history.csv"), ran["monitor"]
    return FitResult(model=model, history=history, stop_reason=timing["run"]["stop_reason"],
                     best_metric=best.meta["metrics"].get(monitor), best_epoch=best.meta["epoch"],
                     steps=timing["run"]["steps"], skipped_steps=int(history["skipped_steps"].iloc[-1]),
                     precision=PrecisionPlan(**ran["precision"]), timing=timing, run_dir=p.run_dir, monitor=monitor,
                     config=TrainConfig.from_dict(ran["config"]))  # fmt: skip


def _out_of_fold(p: Params, feats: Features, first: FitResult) -> FitResult:
    """Every fold's validation predictions as run/oof.csv and the verdict judged on them (run/baseline.json);
    returns ``first`` (fold 1's result) with each fold's verdict line."""
    parts, notes = [], []
    for fold, (_, valid_idx) in enumerate(_splits(p, feats)):
        run_dir = dataclasses.replace(p, fold=fold).run_dir
        rows = json.loads((run_dir / VALID_FILE).read_text())
        if len(rows["prediction"]) != len(valid_idx):
            raise CheckpointError(f"fold {fold + 1}: {len(rows['prediction'])} predictions for {len(valid_idx)} rows")
        parts.append(pd.DataFrame({"row": valid_idx, "fold": fold + 1} | rows))
        record = read_json_object(run_dir / BASELINE_FILE)
        notes.append(f"fold {fold + 1}: {_verdict_line(record) if record else ''}")
    oof = pd.concat(parts).sort_values("row")
    write_atomic(p.run_dir / OOF_FILE, oof.to_csv(index=False))
    watched = BestRows(_run_metric(p, feats))
    watched.rows = (oof["target"].to_numpy(), oof["prediction"].to_numpy())
    watched.score = watched.metric(*watched.rows)
    judged = _judge_baseline(p, feats, first, p.run_dir, watched, oof=True)
    notes.append(f"out-of-fold predictions: {p.run_dir / OOF_FILE}")
    return dataclasses.replace(judged, notes=(*judged.notes, *notes))


def _train_launched(
    p: Params, feats: Features, hw: HardwareInfo | None, callbacks: tuple[object, ...], budget_s: float | None
) -> FitResult:
    """One fold's training as one rank of a launcher's job (torchrun, srun): every rank reads the work dir (one all
    nodes see), rank 0 stages and writes the run dir; 01's batching."""
    hw = hw or detect()
    env = join_process_group(hw.device_type)
    cfg = _train_config(p, feats)
    if env.world_size != feats.run.world_size and env.is_main:
        rows = cfg.effective_batch_size
        print(f"this job has {env.world_size} processes, the plan {feats.run.world_size}: each step trains "
              f"{rows * env.world_size} rows, not {rows * feats.run.world_size}")  # fmt: skip
    resume = broadcast_object(_stage(p, cfg) if env.is_main else None, env)  # rank 0 alone prepares run.new/
    cfg = dataclasses.replace(cfg, time_budget_s=budget_s)  # a session's, not the run's: inputs.json leaves it out
    return _train(p, feats, cfg, hw=hw, callbacks=callbacks, resume=bool(resume))


def _train_fold(
    p: Params, feats: Features, hw: HardwareInfo | None, callbacks: tuple[object, ...], budget_s: float | None = None
) -> FitResult:
    """One fold's training (``p.fold``; the whole run without folds) into its run dir, stopping at ``budget_s``."""
    if dist_env().enabled:  # launched: this process is one rank of the job
        return _train_launched(p, feats, hw, callbacks, budget_s)
    stand_in = _machine_for_plan(p, feats, hw, processes=feats.run.world_size)
    hw = stand_in.hw if stand_in is not None else hw
    here = feats.run.world_size == 1 and (hw := hw or detect()).device_type == "cpu"  # a CPU that trains here
    report = Report(p.report_to, p.run_dir) if p.report_to != "none" else None
    callbacks = (*callbacks, report) if report is not None else callbacks
    with cpu_threads() if here else contextlib.nullcontext():  # DDP: each worker sets its own
        cfg = _train_config(p, feats, stand_in)
        prepared = None
        if feats.run.world_size == 1 or stand_in is not None:  # this process reaches the device that trains
            prepared = prepare(p, feats, hw or detect())
        resume = _stage(p, cfg)  # here, once, before any DDP worker exists
        cfg = dataclasses.replace(cfg, time_budget_s=budget_s)  # a session's, not the run's: inputs.json leaves it out
        if feats.run.world_size > 1:
            cpu = stand_in.hw if stand_in is not None else None
            try:
                result, weights = launch(_train_worker, p, cfg, cpu, callbacks, resume, nprocs=feats.run.world_size)
            except WorkerDied as err:
                kept = [str(c) for n in ("last", "best") if (c := checkpoint.latest(_staging(p), n)) is not None]
                saved = ", ".join(kept) or "no checkpoint of this attempt yet"
                raise WorkerDied(
                    f"{str(err).partition('. Fix:')[0]}. Saved: {saved}. Fix: run "
                    "notebooks/02_train.ipynb again (headless: the same `python -m kitlib notebooks run` command): it "
                    f"continues from {_staging(p).name}/last when one is saved, else it starts this run again"
                ) from None
            # Rebuilt on the CPU (a qlora base in 4 bits there too): this process must not touch CUDA, so 02 can
            # run again
            model = prepare(p, feats, _cpu(hw)).model
            checkpoint.restore_model(model, checkpoint.Snapshot(weights, None, {}))  # an adapter's tensors only
            return dataclasses.replace(result, model=model)
        result = _train(p, feats, cfg, hw=hw, callbacks=callbacks, resume=resume, prepared=prepared)
        if report is not None:
            report.verdict(result.notes)
        return result


def ruled_batching(cfg: TrainConfig, hw: HardwareInfo) -> TrainConfig:
    """Packed rows on a CUDA device, else 01's batching: the probe this rule replaced read packed 3.18x bucketed on an
    H200 and 0.97-1.10x on CPUs, within its 1.25x noise margin (docs/measurements.md, "cuts"); other GPUs: reasoned."""
    return dataclasses.replace(cfg, batching="packed") if hw.device_type == "cuda" else cfg


def _train_worker(
    p: Params, cfg: TrainConfig, hw: HardwareInfo | None, callbacks: tuple[object, ...], resume: bool
) -> tuple[FitResult, dict[str, Any]]:
    """Rank 0's result and trained weights on the CPU (an adapter's tensors only): the parent rebuilds the model,
    whose class may come from a file only the worker imported. ``hw``: a rehearsal's CPU, else None."""

    result = _train(p, load_features(p), cfg, hw=hw, callbacks=callbacks, resume=resume)
    weights = {name: t.cpu() for name, t in checkpoint.saved_state(result.model).items()}
    return dataclasses.replace(result, model=torch.nn.Module()), weights


def _monitor_task_metric(cfg: TrainConfig, metric: Metric) -> TrainConfig:
    """Monitor the competition's metric whenever a cadence computes it (loss and metric part ways as a classifier
    grows confident: docs/measurements.md)."""
    if cfg.full_eval_every < 1 or cfg.monitor != "eval_loss":  # the metric only at the end, or chosen by hand
        return cfg
    return dataclasses.replace(cfg, monitor=metric.name, mode=metric.mode)


def _run_metric(p: Params, feats: Features) -> Metric:

    return get_metric(feats.run.choice.metric, feats.spec.kind, data_dir=p.data_dir)


def _train_config(p: Params, feats: Features, stand_in: StandIn | None = None) -> TrainConfig:
    """The config 02 trains: run.json's, seeded, following the task's metric; a rehearsal's in the CPU's precision
    (what ran is then what run/config.json and timing.json record)."""
    cfg = dataclasses.replace(feats.run.config, seed=p.seed)
    if stand_in is not None:
        cfg = dataclasses.replace(cfg, precision=stand_in.precision.dtype, tf32=stand_in.precision.tf32)
    return _monitor_task_metric(cfg, _run_metric(p, feats))


def _staging(p: Params) -> Path:
    return p.run_dir.with_name(p.run_dir.name + ".new")  # this run's files until it finishes


def _inputs(p: Params, cfg: TrainConfig) -> dict[str, Any]:
    """What a run trains on, as its inputs.json keeps it (read back: tuples are lists): the config, the features."""
    inputs = {"config": cfg.to_dict(), "features": record_file(p.work_dir / handoff.FEATURES_FILE)["sha256"]}
    return dict(json.loads(json.dumps(inputs, default=str)))


def _current(inputs: Any) -> Any:
    """A saved inputs.json as this kitlib writes it: the TrainConfig fields an older one saved (RETIRED) dropped."""
    if isinstance(inputs, dict) and isinstance(inputs.get("config"), dict):
        return inputs | {"config": {k: v for k, v in inputs["config"].items() if k not in RETIRED}}
    return inputs


def _stage(p: Params, cfg: TrainConfig) -> bool:
    """Prepare ``run.new/``; True when it holds an interrupted attempt with the same config and features and a
    complete ``last/``, which 02 continues. Anything else there is superseded (a resumable one kept aside)."""

    staging, inputs = _staging(p), _inputs(p, cfg)
    try:
        saved = _current(json.loads((staging / INPUTS_FILE).read_text()))
    except (OSError, ValueError):
        saved = None
    resumable = checkpoint.latest(staging, "last") is not None
    if saved == inputs and resumable:
        print(f"continuing the interrupted run in {staging} from its last checkpoint (same config, same features)")
        return True
    if saved is not None and resumable:  # resumable, but not this run: kept
        changed = sorted(k for k in inputs["config"] if inputs["config"][k] != saved.get("config", {}).get(k))
        why = f"config: {', '.join(changed)}" if changed else "the features changed (01 ran again)"
        aside = keep_aside(staging)
        print(f"an interrupted run with other inputs ({why}) was not continued: kept as {aside}; this run starts fresh")
    shutil.rmtree(staging, ignore_errors=True)
    write_atomic(staging / INPUTS_FILE, json.dumps(inputs, indent=1) + "\n")
    return False


def _train(
    p: Params,
    feats: Features,
    cfg: TrainConfig,
    *,
    hw: HardwareInfo | None,
    callbacks: tuple[object, ...],
    resume: bool,
    prepared: Prepared | None = None,
) -> FitResult:

    hw = hw or detect()
    prepared = prepared or prepare(p, feats, hw)
    if prepared.choices:  # the causal LM's packed rows beside 01's batching: the rule picks (every rank alike)
        cfg = ruled_batching(cfg, hw)
        prepared = dataclasses.replace(prepared, train=prepared.choices.get(cfg.batching, prepared.train), choices={})
    device = torch.device("cuda" if hw.device_type == "cuda" else hw.device_type)
    staging = _staging(p)
    watched = BestRows(_run_metric(p, feats))  # the validation predictions the verdict's interval resamples
    result = fit(
        prepared.model,
        prepared.train,
        config=cfg,
        loss_fn=get_task(p.task).loss_fn(feats.spec),
        eval_loader=prepared.valid,
        full_eval=get_task(p.task).evaluate(feats.spec, watched.watching(), prepared.valid, device),
        run_dir=staging,
        resume=resume,
        hw=hw,
        callbacks=callbacks,
    )
    line = _blend_trees(p, feats, watched, staging)
    result = dataclasses.replace(result, notes=(*result.notes, *prepared.notes, *([line] if line else [])))
    result = _judge_baseline(p, feats, result, staging, watched)
    if p.folds > 1 and watched.rows is not None and dist_env().is_main:  # this fold's part of the out-of-fold rows
        rows = {"row": _splits(p, feats)[p.fold][1].tolist(), "target": watched.rows[0].tolist(),
                "prediction": watched.rows[1].tolist()}  # fmt: skip
        write_atomic(staging / VALID_FILE, json.dumps(rows) + "\n")
    best = staging / "best" / "model.safetensors"
    if cfg.adapter != "none" and best.is_file() and dist_env().is_main:
        print(f"best/ holds the {cfg.adapter} adapter only: {describe_size(best.stat().st_size, result.model)}")
    if result.stop_reason in UNFINISHED:  # not a finished run: run/ stays as it was; the next 02 continues this one
        by = "SIGTERM" if result.stop_reason == "sigterm" else f"the time budget ({duration(cfg.time_budget_s or 0)})"
        print(f"stopped by {by}: {staging}/last saved; run 02_train again to continue from there (on Kaggle: "
              "the next session, attached to this output: python -m kitlib kaggle build --continue-from)")  # fmt: skip
        return dataclasses.replace(result, run_dir=staging)
    if dist_env().is_main:
        _publish(staging, p.run_dir)
    return dataclasses.replace(result, run_dir=p.run_dir)


def _publish(staging: Path, final: Path) -> None:
    """A finished run replaces ``run/``; the one before stays as ``run.prev/``. A run that raised never gets here,
    so the last good run/ (best/ checkpoint included) is never destroyed by a failed one."""
    previous = final.with_name(final.name + ".prev")
    if final.exists():
        shutil.rmtree(previous, ignore_errors=True)
        os.rename(final, previous)
    os.rename(staging, final)


# ------------------------------------------------------------------------------------------------------ 03 infer
@cpu_threads()  # predicting on the CPU: this process's share of the CPUs, restored after
def infer(
    p: Params,
    feats: Features | None = None,
    *,
    run_dirs: list[Path] | None = None,
    hw: HardwareInfo | None = None,
    sample: Path | None = None,
) -> pd.DataFrame:
    """Predict the test set with each run dir's best checkpoint (predictions averaged) and write the checked
    ``work_dir/submission.csv``; ``sample``: a rerun's sample_submission.csv to check against too."""

    hw = hw or detect()
    feats = feats or load_features(p)
    stand_in = _machine_for_plan(p, feats, hw, processes=1)  # prediction runs in this process
    # a rehearsal's CPU and precision, else as 02 trained it, TF32 included
    hw, plan = (stand_in.hw, stand_in.precision) if stand_in else (hw, carried(feats.run.config, hw))
    precision = Precision(plan)
    device = torch.device(precision.plan.device_type)
    prepared = prepare(p, feats, hw)  # one architecture: each strict restore overwrites every weight
    predictions = []
    workload = get_task(p.task)
    runs = [kaggle_input(Path(d)) for d in run_dirs or []] or [p.run_dir]
    for run_dir in runs + [d for d in _fold_dirs(p) if d not in runs]:  # the k fold models, averaged
        checkpoint.restore_model(prepared.model, checkpoint.load(_trained_checkpoint(run_dir, p)))
        predictions.append(
            workload.predict(prepared.model, prepared.test, precision=precision, device=device, spec=feats.spec,
                             interactive=hw.interactive, desc=f"predict ({run_dir.name})")
        )  # fmt: skip
    _warn_unbeaten(p.run_dir)
    values = _with_trees(p, feats, workload.submission(workload.combine(predictions), feats.spec))
    submission = pd.DataFrame({p.id: feats.test_ids, p.target: values})
    return write_submission(submission, feats.submission_columns, feats.n_test, p.work_dir / "submission.csv", sample)


EXPORT_MARK = "kitlib-export.json"  # in a folder export-merged wrote: the only kind it moves aside to write again


def export_merged(
    work_dir: str | os.PathLike[str], out: str | os.PathLike[str], hw: HardwareInfo | None = None
) -> Path:
    """03's model with best/'s adapter merged in, and its tokenizer, as one folder at ``out`` that transformers'
    ``from_pretrained`` loads without peft (``python -m kitlib export-merged WORK_DIR OUT``)."""

    target = Path(out)
    made = (target / EXPORT_MARK).is_file()
    if target.is_file() or (target.is_dir() and any(target.iterdir()) and not made):
        held = sorted(f.name for f in target.iterdir())[:5] if target.is_dir() else "a file"
        raise SetupError(
            f"export-merged's folder {target} already holds {held}, not written by export-merged: writing there would "
            "replace them. Fix: name a new or empty folder for the merged model"
        )
    p = load_params(work_dir)
    feats = load_features(p)
    adapter = feats.run.config.adapter
    if adapter == "none":
        raise SetupError(f"{p.run_dir} trained without an adapter: best/ is already the whole model. Fix: use it as is")
    hw = hw or detect()
    if adapter == "qlora" and hw.device_type != "cuda":
        raise SetupError(
            "this run trained qlora adapters on 4-bit weights: merging rebuilds that 4-bit model and dequantises it, "
            "with bitsandbytes on a CUDA GPU, and this machine has none. Fix: export on a CUDA machine, or keep base "
            "+ adapter (03 loads them)"
        )
    model = prepare(p, feats, hw).model
    checkpoint.restore_model(model, checkpoint.load(_trained_checkpoint(p.run_dir, p)))
    merged = merge_adapter(model)
    if made:  # an earlier export: kept, never written over
        print(f"the earlier export in {target} is kept as {keep_aside(target)}")
    target.mkdir(parents=True, exist_ok=True)
    (target / EXPORT_MARK).write_text(json.dumps({"work_dir": str(work_dir), "adapter": adapter}) + "\n")
    save = getattr(merged, "save_pretrained", None)
    if callable(save):
        save(target)
    else:  # a task's own module around the pretrained model: its state_dict, for the model 03 builds
        save_model(merged, str(target / "model.safetensors"))
    folder = Path(p.model)
    if folder.is_dir():  # saved by transformers, so every file it loads from comes along (chat_template.jinja, ...)
        AutoTokenizer.from_pretrained(folder).save_pretrained(target)
    size = sum(f.stat().st_size for f in target.iterdir() if f.is_file())
    weights = sum(t.numel() for t in merged.state_dict().values() if isinstance(t, torch.Tensor))
    print(f"merged: the {adapter} adapter of {p.run_dir.name}/ folded into {p.model}: {target} ({size / 1e6:.1f} MB, "
          f"{weights / 1e6:.1f} M weights; loads without peft)")  # fmt: skip
    return target


def _warn_unbeaten(run_dir: Path) -> None:
    """A UserWarning before the submission is written when 02 found the model no better than a constant."""
    try:
        record = json.loads((run_dir / BASELINE_FILE).read_text())
    except (OSError, ValueError):
        return  # a run from an older kitlib, or trained outside the notebooks
    if not record.get("beaten", True):
        verdict = verdict_of(record)
        # 4: past infer and the contextlib frame of its @cpu_threads, so the box names the 03 cell, not contextlib.py
        advise(f"{verdict}. The submission is written anyway.", stacklevel=4)


def _fold_dirs(p: Params) -> list[Path]:
    return [dataclasses.replace(p, fold=fold).run_dir for fold in range(1, p.folds)]


def _trained_checkpoint(run_dir: Path, p: Params) -> Path:
    """``run_dir``'s best (else last) checkpoint, trained on the features 01 saved; else an error naming the fix."""

    found = _kept(run_dir)
    if found is None:
        for name in ("best", "last"):
            if (run_dir / name).exists():
                try:
                    checkpoint.load(run_dir / name)  # fails, saying what is wrong with it
                except CheckpointError as err:
                    raise CheckpointError(
                        f"{err} In the notebooks: run 02_train again ({run_dir.name}.prev/ holds the run before)"
                    ) from None
        interrupted = _staging(p)
        if run_dir == p.run_dir and checkpoint.latest(interrupted, "last") is not None:
            raise MissingRunError(
                f"no finished training run in {run_dir}: the last one was interrupted ({interrupted}/last is saved). "
                "Fix: run notebooks/02_train.ipynb again; it continues from there"
            )
        raise MissingRunError(f"no checkpoint in {run_dir}: run notebooks/02_train.ipynb first")
    if run_dir not in (p.run_dir, *_fold_dirs(p)):  # an extra run (another seed or machine): the restore checks shapes
        return found
    try:
        trained_on = json.loads((run_dir / INPUTS_FILE).read_text())["features"]
    except (OSError, ValueError, KeyError):
        return found  # a run from an older kitlib, or trained outside the notebooks: nothing to compare
    if trained_on != record_file(p.work_dir / handoff.FEATURES_FILE)["sha256"]:
        raise CheckpointError(
            f"{run_dir} was trained on other features than the ones 01_features saved since (another preset, model, "
            "data or parameters). Fix: run notebooks/02_train.ipynb again, or re-run 01 with the settings that run "
            "was trained with"
        )
    return found
