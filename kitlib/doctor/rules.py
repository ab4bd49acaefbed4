"""Bottlenecks: one rule per way a run loses time, turning a ``RunRecord`` into a Finding with its estimated
saving and the model behind it (``Finding.basis``); ``kitlib.doctor.report`` ranks them."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from kitlib.config import full_eval_due
from kitlib.engine.record import RunFacts
from kitlib.engine.timing import STEP_PHASES
from kitlib.machine.peaks import peak_flops
from kitlib.machine.precision import PrecisionError, decide_precision

if TYPE_CHECKING:
    from kitlib.config import TrainConfig
    from kitlib.machine.hardware import HardwareInfo

TARGET_SHARE = 0.10  # what a well-tuned run spends on full evals or checkpoints, as a share of the wall
BUCKET_EFFICIENCY = 0.95  # real/computed tokens with length bucketing (benchmarks/bench_padding.py goal at batch 32)
PRECISION_SPEEDUP_CAP = 3.0  # end-to-end ceiling for a mixed-precision switch; see _precision
WORKER_START_S = 0.03  # a forked DataLoader worker's start, each epoch unless persistent (docs/measurements.md)
LOOP_OVERHEAD_S = 5e-4  # untimed bookkeeping per step in fit() (progress bar, counters): measured 0.1-0.5 ms on CPU
# torch.compile compiles in the first step, and once more when dynamo turns a changed shape dynamic: a run that
# compiled in more steps than this recompiled for new input shapes.
COMPILE_STEPS_EXPECTED = 2
SMALL_MICRO_BATCH = 4  # rows per forward pass at or below which a forward/backward is mostly fixed per-call cost ...
MAX_LENGTH_SLACK = 0.95  # a fixed max length this much longer than the data's longest row is worth cutting
CACHED_READ_SHARE = 0.1  # reading cached features back: ~10% of computing them (tokenised ids from a pickle or npy)
PER_CALL_OVERHEAD_S = 0.05  # ... when it also takes less than this (Python, op dispatch, launches: ~10-50 us per op)


@dataclass(frozen=True)
class Finding:
    rule: str  # machine name: data_bound, padding, full_eval, eval, checkpoint, precision, ...
    title: str
    evidence: str  # numbers from the run
    estimated_saving_s: float
    saving_share: float  # of the run's wall time
    fix: str  # the exact change: the notebooks' control (picker or preset override) and the TrainConfig field
    basis: str  # how the saving was estimated
    changes: dict[str, Any] = dataclasses.field(default_factory=dict)  # the TrainConfig fields of the fix, if any

    def apply(self, cfg: TrainConfig) -> TrainConfig:
        """``cfg`` with this finding's TrainConfig changes (unchanged when the fix is a call, not a field)."""
        return dataclasses.replace(cfg, **self.changes)


@dataclass(frozen=True)
class RunRecord:
    """One run's timing.json and TrainConfig dict, read defensively: records from older kitlib lack some facts."""

    timing: Mapping[str, Any]
    cfg: Mapping[str, Any]  # the TrainConfig dict from config.json ({} when unknown)
    probes: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # measurements passed to diagnose()

    @cached_property
    def facts(self) -> RunFacts:
        return RunFacts.from_dict(self.timing.get("run"))

    @property
    def wall(self) -> float:
        return float(self.timing.get("wall_seconds") or 0.0)

    @property
    def steps(self) -> int:
        """Optimizer windows timed (applied and skipped)."""
        return int(self.phase("optimizer").get("count") or self.facts.steps or 0)

    def seconds(self, name: str) -> float:
        # Step phases: per-step means of the sampled steps (true on CUDA, where unsampled phase totals charge async
        # kernels to whichever phase syncs next) times the step count. Other phases: their recorded totals.
        per_step = self.timing.get("per_step_seconds") or {}
        if name in STEP_PHASES and name in per_step and self.steps:
            return float(per_step[name]) * self.steps
        return float(self.phase(name).get("seconds") or 0.0)

    def setting(self, name: str, default: Any = None) -> Any:
        """A run setting: the recorded fact, else the config field, else ``default``."""
        value = getattr(self.facts, name, None)
        return value if value is not None else self.cfg.get(name, default)

    def of_wall(self, seconds: float, what: str = "") -> str:
        """``seconds`` said with their share of the wall time, e.g. "1.50 s = 12% of the wall"."""
        return f"{seconds:.2f} s{what} = {seconds / self.wall:.0%} of the wall"

    def phase(self, name: str) -> Mapping[str, Any]:
        """A phase's recorded totals (seconds, count): {} when it never ran."""
        return (self.timing.get("phases") or {}).get(name, {})

    @property
    def compute(self) -> float:
        """Forward + backward seconds."""
        return self.seconds("forward") + self.seconds("backward")

    @property
    def step_total(self) -> float:
        """The step phases' seconds."""
        return sum(self.seconds(p) for p in STEP_PHASES)

    @property
    def split(self) -> tuple[int, int]:
        """(micro_batch_size, grad_accum_steps)."""
        return int(self.setting("micro_batch_size", 1)), int(self.setting("grad_accum_steps", 1))


@dataclass(frozen=True)
class Found:
    """What a judge saw: evidence, seconds saved and how estimated; the fix is ``fix``, else ``_fix(changes, note,
    notebook=)``, then ``more``; ``title`` fills the rule's title."""

    evidence: str
    saving: float
    basis: str
    changes: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    note: str = ""
    more: str = ""
    fix: str = ""
    notebook: Mapping[str, Any] | None = None
    title: tuple[str, ...] = ()


@dataclass(frozen=True)
class Rule:
    """A row of the doctor's table: a bottleneck's name, its title, and ``judge(run, hw)``: its Found, or None where
    it is absent. Called as ``rule(run, hw)``: the Finding, or None."""

    name: str
    title: str
    judge: Callable[[RunRecord, HardwareInfo], Found | None]

    def __call__(self, run: RunRecord, hw: HardwareInfo) -> Finding | None:
        found = self.judge(run, hw)
        if found is None:
            return None
        saving = max(0.0, found.saving)
        fix = (found.fix or _fix(found.changes, found.note, notebook=found.notebook)) + found.more
        share = saving / run.wall if run.wall else 0.0
        title = self.title.format(*found.title)
        return Finding(self.name, title, found.evidence, saving, share, fix, found.basis, dict(found.changes))


# TrainConfig fields that are 00's parameters too (kitlib.notebook.params: a test checks they agree; the doctor sits
# below the notebooks and cannot import the declaration)
NOTEBOOK_PARAMETERS = ("epochs", "micro_batch_size", "grad_accum_steps", "lr", "max_length", "full_eval_every",
                       "adapter", "optimizer", "gradient_checkpointing", "compile", "seed", "strategy")  # fmt: skip


def _fix(changes: Mapping[str, Any], note: str = "", *, notebook: Mapping[str, Any] | None = None) -> str:
    """The one-line fix: 00's parameter and ``notebooks run``'s flag where the field is one (else the resolver's
    override), then the TrainConfig field. ``notebook``: the notebooks' change when it differs."""
    ui = dict(changes if notebook is None else notebook)
    if all(k in NOTEBOOK_PARAMETERS for k in ui):
        cell = ", ".join(f"{k} = {v!r}" for k, v in ui.items())
        flags = " ".join(_flag(k, v) for k, v in ui.items())
        where = f"set {cell} in 00_setup's parameters cell (notebooks run {flags}), then re-run 01 and 02"
    else:
        overrides = "{" + ", ".join(f"{k!r}: {v!r}" for k, v in ui.items()) + "}"
        where = f"in 00_setup (no parameter): stages.setup(p, hw, overrides={overrides}), then re-run 01 and 02"
    args = ", ".join(f"{k}={v!r}" for k, v in changes.items())
    return f"{where}; in Python: TrainConfig({args})" + (f" ({note})" if note else "")


def _flag(name: str, value: Any) -> str:
    flag = name.replace("_", "-")
    return (f"--{flag}" if value else f"--no-{flag}") if isinstance(value, bool) else f"--{flag} {value}"


def _data_bound(run: RunRecord, hw: HardwareInfo) -> Found | None:
    wait = run.seconds("data_wait")
    if not run.steps or wait < 0.1 * run.wall:
        return None
    n, workers = run.steps, int(run.setting("num_workers", 0) or 0)
    d, c = wait / n, sum(run.seconds(p) for p in ("h2d", "forward", "backward", "optimizer")) / n
    # Loading one step's batches takes L seconds in one process; w workers deliver a window every L/w seconds.
    load = d if workers == 0 else workers * (d + c)
    new = min(4, max(2, hw.cpu_count - 1)) if workers == 0 else min(2 * workers, max(hw.cpu_count, workers + 1))
    epochs = int(run.facts.epochs_done or 1)
    persistent = bool(run.facts.persistent_workers) and workers > 0
    restart = (1 if persistent else epochs) * (load + new * WORKER_START_S)  # each (re)start: fork, one batch
    return Found(
        f"waiting for batches {run.of_wall(wait)} ({1e3 * d:.1f} ms per step vs "
        f"{1e3 * c:.1f} ms of compute) with num_workers={workers}",
        n * (d - max(0.0, load / new - c)) - restart,
        f"{new} workers load in parallel with compute: wait per step max(0, {1e3 * load:.1f} ms/{new} - compute); "
        f"minus, per epoch, {new} worker starts of {WORKER_START_S} s and one batch loaded before the first step "
        "(assumes loading does not compete with compute for cores: true on a GPU, and for I/O waits)",
        {"num_workers": new},
        "kitlib's make_train_loader reads it",
        f"; your own DataLoader: DataLoader(..., num_workers={new}, persistent_workers=True, prefetch_factor=4). "
        "If __getitem__ does the same work every epoch (decode, tokenize), compute it once with kitlib.cached(...)",
    )


def _tokens(run: RunRecord, used: float, evidence: str, basis: str, changes: dict[str, Any], note: str,
            more: str = "") -> Found:  # fmt: skip
    """Forward+backward time scales with computed tokens: ``used`` of them is all the data needs."""
    return Found(f"{evidence}; forward+backward {run.compute:.2f} s)", run.compute * (1 - used),
                 f"forward+backward time scales with computed tokens: {basis}", changes, note, more)  # fmt: skip


def _padding(run: RunRecord, hw: HardwareInfo) -> Found | None:
    real, computed = int(run.facts.real_tokens or 0), int(run.facts.computed_tokens or 0)
    if not real or not computed or real / computed > 0.8:
        return None
    eff, batching = real / computed, run.setting("batching", "fixed")
    return _tokens(
        run,
        eff / BUCKET_EFFICIENCY,
        f"{real:,} real of {computed:,} computed tokens: efficiency {eff:.2f} ({1 - eff:.0%} is padding, "
        f"batching={batching!r}",
        f"bucketing reaches ~{BUCKET_EFFICIENCY} efficiency (the eval pass gains too, not counted)",
        {"batching": "token_budget" if batching == "bucket" else "bucket"},
        "then make_train_loader(TokenDataset(tokens, labels), cfg, hw): needs lengths",
    )


def _max_length(run: RunRecord, hw: HardwareInfo) -> Found | None:
    cap, longest = int(run.facts.max_length or 0), int(run.facts.longest_row_tokens or 0)
    if run.setting("batching") != "fixed" or not cap or not longest or longest >= MAX_LENGTH_SLACK * cap:
        return None
    return _tokens(
        run,
        longest / cap,
        f"every row padded to max_length={cap} tokens; the longest training row has {longest} "
        f"({1 - longest / cap:.0%} of each padded row is never used",
        f"x {longest}/{cap} (attention's length^2 part gains more, not counted)",
        {"max_length": longest},
        "or None in the notebooks: 01 fits it to the data",
        f"; your own collator: pad to {longest} (the data's longest) or to each batch's longest",
    )


def _features(run: RunRecord, hw: HardwareInfo) -> Found | None:
    """Tokenising (and computing features) again in every session, where a cache would read them back."""
    seconds = float(run.facts.featurise_s or 0.0)
    if not seconds or run.facts.features_cached is not False:
        return None
    return Found(
        f"featurising took {run.of_wall(seconds)}, computed afresh in this session",
        seconds * (1 - CACHED_READ_SHARE),
        f"every later session reads them back at ~{CACHED_READ_SHARE:.0%} of the compute time (a pickle/npy read)",
        fix="cache them: kitlib.cached(key, compute) (or the notebooks' 01_features, whose cache 02 and 03 read: "
        "re-run 02 alone after a change of training settings)",
    )


def _full_evals(epochs_done: int, epochs_planned: int, every: int, at_end: bool) -> int:
    return sum(full_eval_due(e, every, at_end, epochs_planned) for e in range(1, epochs_done + 1))


def _full_eval(run: RunRecord, hw: HardwareInfo) -> Found | None:
    seconds = run.seconds("full_eval")
    if seconds < TARGET_SHARE * run.wall:
        return None
    done = int(run.facts.epochs_done or 1)
    planned = int(run.setting("epochs_planned", run.cfg.get("epochs", done)) or done)
    every, at_end = int(run.setting("full_eval_every", 0) or 0), bool(run.cfg.get("full_eval_at_end", True))
    count = int(run.facts.full_eval_count or 0) or _full_evals(done, planned, every, at_end) or 1
    per = seconds / count
    # The most frequent schedule whose full evals stay under TARGET_SHARE of the shortened wall; else only at the end.
    choice, fewer = 0, _full_evals(done, planned, 0, True)
    for n in range(max(every, 1) + 1, planned):
        evals = _full_evals(done, planned, n, True)
        if evals * per <= TARGET_SHARE * (run.wall - (count - evals) * per):
            choice, fewer = n, evals
            break
    when = f"every {choice} epochs and at the end" if choice else "only at the end"
    return Found(
        f"{count} full evals took {run.of_wall(seconds)} ({per:.2f} s each, "
        f"full_eval_every={every}" + (f"; {count} in {done} epochs: a step cadence" if count > done else "") + ")",
        (count - fewer) * per,
        f"{count} -> {fewer} full evals at {per:.2f} s each",
        {"full_eval_every": choice} | ({} if at_end else {"full_eval_at_end": True}),
        f"{when}; eval_loss still runs every epoch",
        ". If the cost is CPU-bound (scoring generations, SQL), pass full_eval=SplitEval(measure, score): the score "
        "then runs in the background",
    )


def _cheap_eval(run: RunRecord, hw: HardwareInfo) -> Found | None:
    seconds = run.seconds("eval")
    if seconds < 0.15 * run.wall:
        return None
    keep = min(1.0, 0.05 * (run.wall - seconds) / seconds)  # eval at ~5% of the training time
    current = run.cfg.get("eval_max_batches") or run.facts.eval_batches_per_eval  # the batches each eval made
    percent = max(1, round(100 * keep))
    return Found(
        f"eval {run.of_wall(seconds)} over {run.phase('eval').get('count', 0)} evals",
        seconds * (1 - keep),
        f"eval time scales with the batches evaluated: keep {percent}% of them",
        {"eval_max_batches": max(1, int(current * keep))} if current else {},
        "a fixed subset ranks epochs as well",
        fix=""
        if current
        else "in 00_setup (no parameter): stages.setup(p, hw, overrides={'eval_max_batches': n}) with "
        f"n = len(eval_loader) * {percent} // 100 (at least 1), then re-run "
        f"01 and 02; in Python: TrainConfig(eval_max_batches=max(1, len(eval_loader) * {percent} // 100))",
    )


def _checkpoint(run: RunRecord, hw: HardwareInfo) -> Found | None:
    phase = run.phase("checkpoint")
    saves = max(0, int(phase.get("count") or 0) - 1)  # the last entry is the final flush at the end of fit()
    every = run.setting("save_every_steps")
    # fit() takes the snapshot (weights + optimizer state copied to CPU) before entering the timed phase, so with
    # frequent saves that cost shows up as untimed time: count it here, minus the loop's own bookkeeping.
    untimed = max(0.0, float(run.timing.get("other_seconds") or 0.0) - LOOP_OVERHEAD_S * run.steps) if every else 0.0
    cost = float(phase.get("seconds") or 0.0) + untimed
    if not saves or cost < TARGET_SHARE * run.wall:
        return None
    epochs = int(run.facts.epochs_done or 1)
    per = cost / saves
    save_last = bool(run.setting("save_last", False))
    if every:
        periodic = run.steps // every
        others = max(0, saves - periodic)  # best and epoch-end saves stay
        # The cadence that keeps checkpoints under TARGET_SHARE of the remaining wall; epoch ends at the least.
        budget = TARGET_SHARE * (run.wall - cost) - per * others
        new_every = math.ceil(per * run.steps / budget) if budget > 0 else run.steps
        if 2 * new_every > max(1, run.steps // epochs):  # at most one save mid-epoch: save at epoch ends
            changes: dict[str, Any] = {"save_every_steps": None, "save_last": True}
            new_saves, note = others + (0 if save_last else epochs), "resume points at epoch ends"
        else:
            changes = {"save_every_steps": new_every}
            new_saves, note = others + run.steps // new_every, "fewer resume points"
    elif save_last:  # full resume state (weights + optimizer, ~3x the weights) written every epoch
        changes, new_saves, note = {"save_last": False}, saves - epochs, "best-only weights; no mid-run resume point"
    else:
        return None  # best-only weights in a background thread: already the cheapest policy
    return Found(
        f"{saves} saves cost {run.of_wall(cost, ' on the critical path')} ({1e3 * per:.0f} "
        f"ms each: CPU snapshot + submit; background writer busy "
        f"{run.phase('checkpoint_write_background').get('seconds', 0.0):.2f} s); "
        f"save_every_steps={every}, save_last={save_last}",
        (saves - new_saves) * per,
        f"{saves} -> {new_saves} saves at {1e3 * per:.0f} ms each (untimed time counted as snapshots)",
        changes,
        note,
    )


def _precision(run: RunRecord, hw: HardwareInfo) -> Found | None:
    if (run.facts.precision or run.cfg.get("precision")) != "fp32":
        return None
    try:
        plan = decide_precision(hw, "auto")
    except PrecisionError:
        return None
    was = "tf32" if run.facts.tf32 else "fp32"
    target = plan.dtype if plan.dtype != "fp32" else ("tf32" if plan.tf32 else "fp32")
    if target == was:
        return None
    name = hw.device_name
    new, old = peak_flops(name, target), peak_flops(name, was)  # type: ignore[arg-type]
    ratio = new / old if new and old else 2.0
    # Peak ratios (A100 bf16/fp32 = 16x) only bound the matmuls; the memory-bound rest gains <= 2x: cap at 3x.
    speedup = min(ratio, PRECISION_SPEEDUP_CAP)
    compute = run.compute + run.seconds("eval")
    return Found(
        f"precision {was} on {name}, where auto picks {target} ({plan.reason}); forward+backward+eval {compute:.2f} s",
        compute * (1 - 1 / speedup),
        f"datasheet peak {target}/{was} = {ratio:.1f}x, capped at {PRECISION_SPEEDUP_CAP:g}x end to end, applied "
        "to forward+backward+eval (from the peak table, not measured)",
        {"precision": "auto", "tf32": None},
        notebook={"precision": "auto"},
        title=(was, target),
    )


def _memory(run: RunRecord, hw: HardwareInfo) -> Found | None:
    peak, total = run.facts.peak_memory_bytes, run.facts.memory_total_bytes
    if run.facts.device_type != "cuda" or not peak or not total or peak / total >= 0.4:
        return None
    factor = 4 if peak / total < 0.2 else 2
    micro, accum = run.split
    keep = accum > 1
    if keep:
        factor = min(factor, accum)
    return Found(
        f"peak {peak / 2**30:.1f} of {total / 2**30:.1f} GiB ({peak / total:.0%}); micro_batch_size={micro}, "
        f"grad_accum_steps={accum}",
        run.compute * min(0.4, 0.15 * math.log2(factor)),
        "rough: ~15% less compute time per doubling of a micro-batch that leaves the GPU under-filled",
        {"micro_batch_size": micro * factor} | ({"grad_accum_steps": accum // factor} if keep else {}),
        "same effective batch" if keep else "a larger effective batch: re-tune lr",
    )


def _tiny_batches(run: RunRecord, hw: HardwareInfo) -> Found | None:
    (micro, accum), optimizer, step_total = run.split, run.seconds("optimizer"), run.step_total
    if micro * accum >= 16 or not step_total or optimizer < 0.25 * step_total:
        return None
    factor = math.ceil(16 / (micro * accum))
    return Found(
        f"{micro * accum} rows per optimizer step (micro_batch_size={micro}, grad_accum_steps={accum}); the optimizer "
        f"step is {optimizer / step_total:.0%} of step time ({1e3 * optimizer / max(run.steps, 1):.2f} ms per step)",
        optimizer * (1 - 1 / factor),
        f"one optimizer step per {factor}x more rows: optimizer time / {factor}",
        {"grad_accum_steps": accum * factor},
        f"or micro_batch_size={micro * factor} if it fits",
        " (that also amortises per-forward overhead); fewer, larger updates: re-tune lr",
    )


def _recompiles(run: RunRecord, hw: HardwareInfo) -> Found | None:
    facts = run.facts
    compiling, compile_s = int(facts.compile_steps or 0), float(facts.compile_s or 0.0)
    if compiling <= COMPILE_STEPS_EXPECTED or not run.steps:
        return None
    step_s = float(facts.compile_step_s or 0.0)
    typical = max(0.0, run.step_total - step_s) / max(1, run.steps - compiling)  # a step that compiled nothing
    shapes = facts.distinct_input_shapes
    return Found(
        f"compile=True compiled {facts.compiles} times in {compiling} of {run.steps} optimizer steps"
        + (f" ({shapes} distinct input shapes)" if shapes else "")
        + f": {compile_s:.2f} s compiling; those steps took {step_s:.2f} s vs {1e3 * typical:.1f} ms for a step that "
        f"compiled nothing",
        max(compile_s, step_s - compiling * typical),  # backward graphs may compile outside dynamo's timer
        f"compile off: the {compiling} compiling steps cost what a typical step does ({compiling} x "
        f"{1e3 * typical:.1f} ms instead of {step_s:.2f} s; at least the {compile_s:.2f} s compiling); the compiled "
        "kernels' own speed-up is given up",
        {"compile": False},
        "no compiles",
        '. To keep compile, give it few shapes: batching="fixed" with a max_length (one padded length: one graph) '
        "or batches bucketed to a few lengths, or compile the model yourself with torch.compile(model, dynamic=True) "
        "and pass compile=False",
    )


def split_accumulation(accum: int) -> int:
    """k for micro-batch x k, accumulation / k: the largest divisor of ``accum`` up to 4, else ``accum`` (a prime)."""
    return next((k for k in (4, 3, 2) if accum % k == 0), accum)


def _micro_batch(run: RunRecord, hw: HardwareInfo) -> Found | None:
    (micro, accum), compute, step_total = run.split, run.compute, run.step_total
    if micro > SMALL_MICRO_BATCH or accum < 2 or not run.steps or compute < 0.5 * step_total:
        return None
    per_call = compute / (run.steps * accum)  # one micro-batch's forward + backward
    probe: Any = run.probes.get("micro_batch")  # a MicroBatchProbe measured on this run's model and micro-batch
    measured = probe is not None and probe.micro_batch_size == micro and accum % probe.factor == 0
    ratio = float(probe.ratio) if measured else 0.0
    if measured:
        k = int(probe.factor)
        if ratio < 1.05:  # the probe found no gain at the bigger micro-batch
            return None
        saving, basis = compute * (1 - 1 / ratio), f"measured on your model: {probe}"
    else:
        if per_call > PER_CALL_OVERHEAD_S:  # enough work per call that batching rows gains little
            return None
        k = split_accumulation(accum)
        share = min(0.4, 0.15 * math.log2(k))
        saving = compute * share
        basis = (
            f"rough: ~15% less forward+backward time per doubling of a micro-batch this small, {share:.0%} for {k}x; "
            f"measure it: kitlib.doctor.probe.probe_micro_batch(model, batch, micro_batch_size={micro}, factor={k}, "
            "loss_fn=...) and pass it as diagnose(run, probe=...)"
        )
    return Found(
        f"micro_batch_size={micro} x grad_accum_steps={accum}: {run.steps * accum} forward/backward passes of "
        f"{1e3 * per_call:.1f} ms each = {compute / step_total:.0%} of step time"
        + (f"; measured {ratio:.2f}x faster at {micro * k} x {accum // k}" if measured else ""),
        saving,
        basis,
        {"micro_batch_size": micro * k, "grad_accum_steps": accum // k},
        "same effective batch, so no lr change; needs the memory for the bigger micro-batch",
    )


def _respawn(run: RunRecord, hw: HardwareInfo) -> Found | None:
    workers, gaps = int(run.setting("num_workers", 0) or 0), list(run.facts.epoch_gaps_s or [])
    if not workers or run.facts.persistent_workers or not gaps:
        return None
    epochs = int(run.facts.epochs_done or len(gaps) + 1)
    explained = sum(run.seconds(p) for p in ("eval", "full_eval", "checkpoint")) / epochs
    restart = max(workers * WORKER_START_S, sum(gaps) / len(gaps) - explained)
    return Found(
        f"num_workers={workers}, persistent_workers=False: {len(gaps)} restarts; epoch gaps average "
        f"{sum(gaps) / len(gaps):.2f} s of which ~{restart:.2f} s are not eval or checkpoint",
        restart * len(gaps),
        f"per restart: {workers} worker starts of {WORKER_START_S} s, or the unexplained part of the epoch gap",
        fix=f"your own DataLoader: DataLoader(..., num_workers={workers}, persistent_workers=True) (kitlib's "
        "loaders, as in the notebooks, do this on CUDA)",
    )


def _time_budget(run: RunRecord, hw: HardwareInfo) -> Found | None:
    budget = run.setting("time_budget_s")
    train = list(run.facts.epoch_train_s or [])
    if not budget or not train:
        return None
    planned = int(run.setting("epochs_planned", len(train)) or len(train))
    stopped = run.facts.stop_reason == "time_budget"
    full = train[:-1] if stopped and len(train) > 1 else train
    gaps = list(run.facts.epoch_gaps_s or [])
    per_epoch = sum(full) / len(full) + (sum(gaps) / len(gaps) if gaps else 0.0)
    need = planned * per_epoch
    if need <= budget and not stopped:
        return None
    return Found(
        f"{planned} epochs x {per_epoch:.1f} s = {need:.0f} s planned vs time_budget_s={budget:g}"
        + (f"; the run stopped early after {len(train)} epochs" if stopped else ""),
        need - budget,
        "planned epochs x mean epoch time (training + gap) minus the budget",
        {"epochs": max(1, int(budget // per_epoch))},
        "so the LR schedule completes; or apply the fixes above",
    )


def _communication(run: RunRecord, hw: HardwareInfo) -> Found | None:
    """timing.json's ``comm_seconds_per_step`` (kitlib.machine.distributed.comm_seconds) over half the step."""
    facts = run.timing.get("run") or {}
    comm, strategy = float(facts.get("comm_seconds_per_step") or 0), facts.get("strategy")
    if not comm or not run.steps or comm * run.steps < 0.5 * run.step_total:
        return None
    (micro, accum), total = run.split, comm * run.steps
    evidence = f"~{1e3 * comm:.1f} ms of {1e3 * run.step_total / run.steps:.1f} ms a step communicating ({strategy})"
    basis = "one all-reduce timed at the start, scaled to the gradients' bytes; none of it hidden behind backward"
    changes: dict[str, Any]
    if strategy == "fsdp" and accum > 1:  # a gather each pass: fewer, bigger micro-batches gather less
        k = split_accumulation(accum)
        saved = total * (1 - (2 * accum / k + 1) / (2 * accum + 1))
        changes = {"micro_batch_size": micro * k, "grad_accum_steps": accum // k}
        note = "same rows a step, if the memory plan fits it"
    elif strategy == "fsdp":  # 1.5 all-reduces a step against DDP's 1
        saved, changes, note = total / 3, {"strategy": "ddp"}, "where the model fits one GPU whole"
    else:
        saved, changes = total / 2, {"grad_accum_steps": accum * 2}
        note = "one all-reduce per twice the rows: re-tune lr"
    more = "; or fewer ranks (one node: no network between them)"
    return Found(evidence, saved, basis, changes, note, more)


RULES: tuple[Rule, ...] = (  # name (Finding.rule), title, judge: in the report's order of ties
    Rule("data_bound", "Data loading stalls the training loop", _data_bound),
    Rule("padding", "Most computed tokens are padding", _padding),
    Rule("max_length", "The fixed max length is longer than any row", _max_length),
    Rule("features", "Features are recomputed every session", _features),
    Rule("full_eval", "The full evaluation dominates the run", _full_eval),
    Rule("eval", "The per-epoch eval loss pass is expensive", _cheap_eval),
    Rule("checkpoint", "Checkpointing stalls training", _checkpoint),
    Rule("precision", "Training in {} on hardware with fast {}", _precision),
    Rule("memory", "Most accelerator memory is unused", _memory),
    Rule("tiny_batches", "Tiny batches: the per-step overhead dominates", _tiny_batches),
    Rule("micro_batch", "Tiny micro-batches: per-call overhead dominates forward and backward", _micro_batch),
    Rule("recompiles", "torch.compile recompiles for new input shapes", _recompiles),
    Rule("respawn", "DataLoader workers restart every epoch", _respawn),
    Rule("time_budget", "The plan overruns the time budget", _time_budget),
    Rule("communication", "Communication between ranks takes most of the step", _communication),
)
