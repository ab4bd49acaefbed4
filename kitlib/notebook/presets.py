"""Speed/accuracy presets (``PRESETS``) and ``resolve``: a ``Choice`` (a preset and overrides) turned into a
``ResolvedRun`` for one machine, the TrainConfig with the reason for every setting."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np

from kitlib._files import write_atomic
from kitlib._version import __version__
from kitlib.config import Freeze, Requested, TrainConfig
from kitlib.data.lengths import suggest_max_length
from kitlib.errors import MissingRunError, SetupError, damaged_file
from kitlib.machine.hardware import check_compile
from kitlib.machine.precision import decide_precision
from kitlib.models.adapters import LORA_LR, check_adapter

# lazy: torch (+1.0 s): presets resolve without it, so the picker imports without torch (python -X importtime).

if TYPE_CHECKING:
    from kitlib.machine.hardware import HardwareInfo
    from kitlib.machine.precision import PrecisionPlan

Checkpoints = Literal["best", "best_and_last", "none"]
RegimeName = Literal["head", "finetune"]

RUN_FILE = "run.json"  # what 00_setup writes into the working dir
_CHOICE_FORMAT = 2  # run.json's layout (Choice); bump when it changes
_RUN_FORMAT = 3  # features.json's run (ResolvedRun); 3: it holds its Choice

_GIB = 2**30
_REFERENCE_LENGTH = 128  # tokens; the micro-batch table below is for rows this long
_PAD_MULTIPLE = 8  # tensor cores want sequence lengths in multiples of 8
_MIN_EFFECTIVE_BATCH = 8  # below this, per-step overhead and gradient noise cost more than extra steps gain


@dataclass(frozen=True)
class Regime:
    """What resolving, the picker and the estimate know of a regime (what it builds is Task's): head (cached
    embeddings and a small head) or finetune (the whole model)."""

    name: RegimeName
    matmuls_per_param: int  # FLOPs per token per weight: 6 to train (2 forward + 4 backward), 2 to embed once
    estimate_label: str  # what the picker's time estimate measures
    gains_from_ddp: bool  # worth one process per GPU (a per-step all-reduce of every trainable weight)
    features_need_accelerator: bool = False  # 01 runs the encoder over every row (not only the tokenizer)
    reason: str | None = None  # a line for the preset's reasons, when the regime changes what training means
    whole_step: str = ""  # why one pass takes a whole step (rows per forward = per process); "": sized by memory
    frozen_text: str = ""  # what of the encoder does not train (the picker's freeze row); "": the config's freeze


REGIMES: Mapping[str, Regime] = MappingProxyType({
    "head": Regime(
        "head", 2, "embedding pass", gains_from_ddp=False, features_need_accelerator=True,
        reason="regime head: the encoder runs once (no grad) to cache embeddings; a head trains on them and tf-idf "
        "n-grams", whole_step="the head's inputs are cached vectors: a whole step fits in one pass",
        frozen_text="the whole encoder (it runs once, in 01, to cache embeddings; only the head trains)",
    ),  # 2: the one-time embedding pass; the head's own epochs take well under a second. No DDP: too small to gain
    "finetune": Regime("finetune", 6, "per epoch", gains_from_ddp=True),
})  # fmt: skip


@dataclass(frozen=True)
class Preset:
    """A named set of overrides of these defaults; epochs, lr and full_eval_every are the declared training
    parameters' (``Params``: None means the preset's), the rest are the preset's own intents."""

    name: str
    description: str
    regime: RegimeName = "finetune"  # "head" (cached embeddings + a head) or "finetune" (all weights)
    epochs: int = 2
    target_effective_batch: int = 32  # rows per optimizer step summed over all devices; micro x accum x world keeps it
    lr: float = 1e-4  # MiniLM-sized encoders take ~1e-4; 5e-5 left the demo at 0.826 after 2 epochs (0.830 here)
    length_coverage: float = 0.99  # fraction of rows that fit untruncated (0.95 cut 5% of the demo's reviews)
    max_length_cap: int = 256  # tokens, whatever coverage says (attention costs ~length^2); used without lengths
    full_eval_every: int = 1  # epochs between full evals (metrics on all of eval); 0: only at the end
    eval_max_batches: int | None = None  # cap for the cheap loss-only eval between full evals
    checkpoints: Checkpoints = "best"
    patience: int | None = None  # evals without improvement before stopping; None: never
    freeze: Freeze = "none"
    freeze_layers: int = 0  # also the first N transformer blocks (TrainConfig.freeze_layers)
    min_steps: int = 0  # short runs: halve the effective batch (down to 8) until the run takes this many steps
    precision: Requested = "auto"
    row_limit: int | None = None  # use at most this many training rows (smoke runs); None: all
    adjusted_for: str = ""  # the task whose Task.preset made this preset (stages.task_preset applies it only once)

    def __post_init__(self) -> None:
        # epochs and freeze_layers too: an override of them reaches no TrainConfig before 00 saves run.json (review)
        checks = (
            (self.regime in REGIMES, f"regime={self.regime!r} is not one of {tuple(REGIMES)}"),
            (self.checkpoints in get_args(Checkpoints), f"checkpoints={self.checkpoints!r} is unknown"),
            (self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}"),
            (self.target_effective_batch >= 1, "target_effective_batch must be >= 1"),
            (0.0 < self.length_coverage <= 1.0, f"length_coverage must be in (0, 1], got {self.length_coverage}"),
            (self.max_length_cap >= _PAD_MULTIPLE, f"max_length_cap must be >= {_PAD_MULTIPLE}"),
            (self.row_limit is None or self.row_limit >= 1, f"row_limit must be >= 1 or None, got {self.row_limit}"),
            (self.freeze_layers >= 0 and self.min_steps >= 0, "freeze_layers and min_steps must be >= 0"),
        )
        problems = [message for ok, message in checks if not ok]
        if problems:
            raise ValueError(f"Preset {self.name!r}: " + "; ".join(problems))

    def rows_used(self, n_rows: int) -> int:
        """How many of the data's ``n_rows`` training rows this preset trains on (its ``row_limit``)."""
        return n_rows if self.row_limit is None else min(n_rows, self.row_limit)


# Each preset: what it changes from Preset's defaults. Numbers are for a MiniLM/base-sized encoder on short-to-medium
# texts (the demo's reviews are ~30 tokens); `fast` trades accuracy for one forward pass, `best` tunes everything.
PRESETS: Mapping[str, Preset] = MappingProxyType({p.name: p for p in (
    Preset("smoke", "CI plumbing check in seconds: 1 epoch on 256 rows, short texts; accuracy is meaningless",
           epochs=1, target_effective_batch=8, lr=5e-4, length_coverage=0.9, max_length_cap=64, full_eval_every=0,
           eval_max_batches=2, row_limit=256),
    # a head epoch over cached vectors takes ~1 s on a CPU; a fresh head tolerates a far larger lr than pretrained
    # weights; the embedding pass dominates and costs ~linearly in length; eval is as cheap as training here
    Preset("fast", "one forward pass caches frozen embeddings (top 3 layers) and tf-idf n-grams; a head trains in "
           "seconds", regime="head", epochs=20, target_effective_batch=64, lr=1e-3, length_coverage=0.95,
           max_length_cap=128, patience=3),
    # min_steps: 3k rows x 1 epoch: batch 16 (168 steps) scored 0.773 vs 0.755 for 32 (84 steps)
    Preset("balanced", "fine-tune with frozen input embeddings (half of MiniLM's weights, no optimizer state for "
           "them)", min_steps=150, freeze="embeddings"),
    Preset("best", "full fine-tune, more epochs, longer texts, resumable checkpoints", epochs=4, lr=3e-5,
           max_length_cap=512, checkpoints="best_and_last", patience=2),
)})  # fmt: skip
DEFAULT_PRESET = "balanced"  # what a notebook, the picker and the CLI start from


def get_preset(name: str) -> Preset:
    """A preset by (case-insensitive) name; the error lists the choices."""
    preset = PRESETS.get(name.strip().lower())
    if preset is None:
        raise SetupError(f"unknown preset {name!r}: choose one of {', '.join(PRESETS)} in the parameters cell")
    return preset


# --------------------------------------------------------------------------------------------------------- resolve


@dataclass(frozen=True)
class Choice:
    """What 00 saves (run.json) and 01 resolves once: the preset as the task trains it, the training settings over
    it, the processes per step (None: the plan's) and what 00 read in the data."""

    preset: Preset
    overrides: Mapping[str, Any] = field(default_factory=dict)
    world_size: int | None = None
    task: str = "auto"  # the workload (kitlib.notebook.tasks), as 00's parameters name it
    metric: str = "auto"  # what best/ follows, resolved for the target by 00 (kitlib.tasks.metrics)
    baseline: Mapping[str, Any] | None = None  # the trivial baseline's validation score (kitlib.tasks.baseline), 00's

    @property
    def name(self) -> str:
        return self.preset.name

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Choice:
        return cls(**_known(cls, data) | {"preset": Preset(**data["preset"])})

    def save(self, path: str | Path) -> Path:
        """Write ``run.json`` into the directory ``path``, atomically; returns the file."""
        values = self.to_dict() | {"format": _CHOICE_FORMAT}
        return write_atomic(Path(path) / RUN_FILE, json.dumps(values, indent=2, sort_keys=True) + "\n")


@dataclass(frozen=True)
class ResolvedRun:
    """A ``Choice`` resolved for one machine and the data's lengths: the TrainConfig and a reason for each setting."""

    choice: Choice  # what was resolved: the task, metric, baseline and the user's overrides
    preset: Preset  # the choice's preset under its preset-level overrides
    config: TrainConfig
    world_size: int  # processes (GPUs) sharing each optimizer step
    precision_reason: str
    hardware: str  # one line: what it was resolved for
    reasons: tuple[str, ...]  # one per choice, printed by 01
    mean_tokens: float | None = None  # mean row length after truncation, when lengths were given
    rows_cut: float | None = None  # share of rows longer than max_length (their ends cut), when lengths were given
    longest_tokens: int | None = None  # the longest row: max_length for no cut at all (the lossless choice)
    kitlib_version: str = ""

    @property
    def name(self) -> str:
        return self.preset.name

    @property
    def regime(self) -> Regime:
        return REGIMES[self.preset.regime]

    @property
    def effective_batch_size(self) -> int:
        """Rows per optimizer step over all processes."""
        return self.config.effective_batch_size * self.world_size

    def table_rows(self) -> list[tuple[str, str]]:
        """(setting, value) pairs for a table: what the picker and 01 show."""
        cfg, c = self.config, self.choice
        ckpt = {"best": "best weights", "best_and_last": "best weights + resumable last", "none": "none"}
        full_eval = f"every {cfg.full_eval_every} epoch(s)" if cfg.full_eval_every else "at the end only"
        task = [("task", f"{c.task}, metric {c.metric}")] if c.metric != "auto" else []  # set by 00's setup
        adapted = f"all pretrained weights ({cfg.adapter} adapters train)"
        layers = f" + first {cfg.freeze_layers} blocks" if cfg.freeze_layers else ""
        frozen = adapted if cfg.adapter != "none" else self.regime.frozen_text or cfg.freeze + layers
        return [
            ("preset", f"{self.name} ({self.regime.name})"),
            *task,
            ("hardware", self.hardware),
            ("precision", f"{cfg.precision} (tf32 {'on' if cfg.tf32 else 'off'})"),
            (
                "batch",
                f"{cfg.micro_batch_size} x {cfg.grad_accum_steps} accum x {self.world_size} process(es)"
                f" = {self.effective_batch_size} rows/step",
            ),
            ("epochs", str(cfg.epochs)),
            ("lr", f"{cfg.lr:g}"),
            ("max_length", "loader decides" if cfg.max_length is None else f"{cfg.max_length} tokens{self._cut()}"),
            ("freeze", frozen),
            ("eval", f"full {full_eval}; cheap loss eval otherwise"),
            ("checkpoints", ckpt[self.preset.checkpoints]),
        ]

    def _cut(self) -> str:
        """What max_length cuts, and the lossless choice (the picker's max_length field takes it)."""
        if self.rows_cut is None or self.longest_tokens is None:
            return ""
        if not self.rows_cut:
            return " (cuts no row)"
        return f" (cuts {self.rows_cut:.1%} of rows; lossless: {self.longest_tokens})"

    def summary(self) -> str:
        width = max(len(k) for k, _ in self.table_rows())
        lines = [f"{k:<{width}}  {v}" for k, v in self.table_rows()]
        return "\n".join([*lines, "why:", *(f"  - {r}" for r in self.reasons)])

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"format": _RUN_FORMAT}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ResolvedRun:
        if data.get("format") != _RUN_FORMAT:
            raise SetupError(f"the saved run has format {data.get('format')!r}, this kitlib reads {_RUN_FORMAT}: "
                             "re-run 01_features (it resolves 00's run.json again)")  # fmt: skip
        return cls(**_known(cls, data) | {
            "choice": Choice.from_dict(data["choice"]), "preset": Preset(**data["preset"]),
            "config": TrainConfig.from_dict(data["config"]), "reasons": tuple(data["reasons"]),
        })  # fmt: skip


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """The saved ``data`` that are ``cls``'s fields (a saved "format" is not)."""
    return {k: v for k, v in data.items() if k in {f.name for f in dataclasses.fields(cls)}}


def load_choice(path: str | Path) -> Choice:
    """The choice 00_setup saved in the working dir ``path``; MissingRunError naming 00_setup when there is none."""
    target = Path(path) / RUN_FILE
    if not target.is_file():
        raise MissingRunError(
            f"no saved run at {target}: run notebooks/00_setup.ipynb first (it picks a preset and writes {RUN_FILE} "
            f"to the working dir), or pass the working dir it used"
        )
    with damaged_file(target, "00_setup"):
        data = json.loads(target.read_text())
        if data.get("format") != _CHOICE_FORMAT:
            raise SetupError(f"{target} has format {data.get('format')!r}, this kitlib reads {_CHOICE_FORMAT}: "
                             "re-run 00_setup")  # fmt: skip
        return Choice.from_dict(data)


def resolve(
    choice: str | Preset | Choice,
    hw: HardwareInfo,
    *,
    lengths: Sequence[int] | np.ndarray | None = None,
    overrides: Mapping[str, Any] | None = None,
    world_size: int | None = None,
) -> ResolvedRun:
    """``choice`` (or a preset with ``overrides`` and ``world_size``: None = every GPU when DDP gains) resolved for
    ``hw`` and ``lengths`` (tokens per training row) into a TrainConfig with a reason for every setting; raises
    ValueError/SetupError/PrecisionError naming the fix."""
    if not isinstance(choice, Choice):
        choice = Choice(get_preset(choice) if isinstance(choice, str) else choice, dict(overrides or {}), world_size)
    p, late, plan, adapter = _refusals(choice.preset, hw, choice.overrides)
    reasons = [f"preset {p.name}: {p.description}"]
    lr = p.lr
    if adapter is not None:  # the adapter freezes the pretrained weights itself
        p = dataclasses.replace(p, freeze="none", freeze_layers=0)
        reasons.append(adapter)
        if "lr" not in choice.overrides and p.lr < LORA_LR:  # an lr set by the user wins
            lr = LORA_LR
            reasons.append(
                f"lr {lr:g} for the adapters (the preset's {p.lr:g} is a full fine-tune's; set lr to change)"
            )
    reasons.append(f"precision {plan.dtype}: {plan.reason}")
    world = _world_size(hw, p, choice.world_size, reasons)
    if world > 1:  # None: the plan's, DDP (FSDP is asked for by name; `python -m kitlib plan` says which fits)
        said = "as requested" if "strategy" in late else "the plan's: every GPU holds the whole model"
        reasons.append(f"strategy {late.get('strategy', 'ddp')}: {said}")
    max_length, mean_tokens, cut = _max_length(p, lengths, late.pop("max_length", None), reasons)
    # lengths may be the whole train.csv's (the picker in 00); the preset trains on at most row_limit of them
    target = _target_batch(p, None if lengths is None else p.rows_used(len(lengths)), reasons)
    micro, accum = _batch(hw, p, target, world, max_length, late.pop("micro_batch_size", None), late, reasons)

    same = {f.name for f in dataclasses.fields(TrainConfig)} & {f.name for f in dataclasses.fields(Preset)}
    cfg = TrainConfig(**{name: getattr(p, name) for name in same} | dict(
        micro_batch_size=micro, grad_accum_steps=accum, lr=lr, precision=plan.dtype, tf32=plan.tf32,
        max_length=max_length, save_best=p.checkpoints != "none", save_last=p.checkpoints == "best_and_last",
    ))  # fmt: skip
    if p.freeze != "none":
        reasons.append(f"freeze {p.freeze}: fewer trainable weights, no gradients or AdamW state for them")
    if p.freeze_layers:
        reasons.append(
            f"freeze the embeddings and the first {p.freeze_layers} blocks: no backward pass or AdamW state for them"
        )
    if (regime_reason := REGIMES[p.regime].reason) is not None:
        reasons.append(regime_reason)
    cfg = dataclasses.replace(cfg, **late)  # remaining TrainConfig overrides; __post_init__ validates
    if cfg.compile:  # refused here, in 00, on a GPU Triton cannot compile for (not at 02's first step)
        reasons.append(f"compile: {check_compile(hw) or 'torch.compile (inductor + Triton)'}")
    if choice.overrides:
        reasons.append("overridden: " + ", ".join(f"{k}={v!r}" for k, v in sorted(choice.overrides.items())))
    rows_cut, longest = cut or (None, None)
    return ResolvedRun(choice, p, cfg, world, plan.reason, _describe(hw), tuple(reasons), mean_tokens, rows_cut,
                       longest, __version__)  # fmt: skip


def check(choice: Choice, hw: HardwareInfo) -> None:
    """Refuse in 00 what 01's resolution of ``choice`` on ``hw`` would refuse, without sizing anything."""
    late = _refusals(choice.preset, hw, choice.overrides)[1]
    TrainConfig(**late)  # its own checks (micro-batch >= 1, choices); _refusals took tf32 out
    if late.get("compile"):
        check_compile(hw)


def _refusals(
    base: Preset, hw: HardwareInfo, overrides: Mapping[str, Any]
) -> tuple[Preset, dict[str, Any], PrecisionPlan, str | None]:
    """``base`` under the preset-level overrides, the TrainConfig-level rest, the run's precision (decided here only)
    and the adapter's reason; refuses an unknown name, what ``hw`` cannot run and kahan outside bf16, naming the fix."""
    preset_fields = {f.name for f in dataclasses.fields(Preset)} - {"name"}
    known = preset_fields | {f.name for f in dataclasses.fields(TrainConfig)}
    if unknown := sorted(set(overrides) - known):
        raise ValueError(f"unknown override(s) {unknown}; allowed: {sorted(known)}")
    p = dataclasses.replace(base, **{k: v for k, v in overrides.items() if k in preset_fields})
    late = {k: v for k, v in overrides.items() if k not in preset_fields}
    adapter = check_adapter(late.get("adapter", "none"), hw, regime=p.regime)
    plan = decide_precision(hw, p.precision, tf32=late.pop("tf32", None))
    if late.get("optimizer") == "adamw-kahan" and plan.dtype != "bf16":  # refused: asked for, it would do nothing
        raise SetupError(
            f"optimizer = 'adamw-kahan' keeps the updates of pure bf16 weights, and this run trains in {plan.dtype} "
            f"on {_describe(hw)}: its weights stay fp32, where Kahan summation adds nothing but a slower optimizer. "
            "Fix: optimizer = 'adamw' (or 'adamw8bit' for 2 bytes of state a weight), or plan for a bf16 GPU "
            "(hardware = 'A100', 'L4', 'H100')"
        )
    return p, late, plan, adapter


def _describe(hw: HardwareInfo) -> str:
    device = hw.primary
    if device is None:
        return f"{hw.platform}: CPU only ({hw.cpu_count} CPUs)"
    count = sum(a.device_type == device.device_type for a in hw.accelerators)
    return f"{hw.platform}: {count}x {device.name} ({device.memory_bytes / _GIB:.0f} GiB each)"


def _world_size(hw: HardwareInfo, p: Preset, requested: int | None, reasons: list[str]) -> int:
    if requested is not None and requested < 1:
        raise ValueError(f"world_size must be >= 1, got {requested}")
    ddp = hw.num_gpus > 1 and REGIMES[p.regime].gains_from_ddp
    if requested is not None and requested != (hw.num_gpus if ddp else 1):  # the derived one keeps its reason (01)
        reasons.append(f"world size {requested}: as requested")
        return requested
    if ddp:
        reasons.append(
            f"world size {hw.num_gpus}: DDP over all {hw.num_gpus} GPUs (kitlib.machine.distributed.launch), each a "
            "micro-batch"
        )
        return hw.num_gpus
    if hw.num_gpus > 1:
        reasons.append("world size 1: a head on cached embeddings is too small to gain from DDP's per-step all-reduce")
    return 1


def _max_length(
    p: Preset, lengths: Sequence[int] | np.ndarray | None, forced: int | None, reasons: list[str]
) -> tuple[int, float | None, tuple[float, int] | None]:
    """max_length, the mean row length under it, and (the share of rows it cuts, the longest row) given lengths."""
    arr = None if lengths is None else np.asarray(lengths, dtype=np.int64).reshape(-1)
    if forced is not None:
        length = int(forced)
        reasons.append(f"max_length {length}: set by hand")
    elif arr is None or arr.size == 0:
        length = p.max_length_cap
        reasons.append(f"max_length {length}: the preset's cap (no row lengths given; pass lengths= to fit the data)")
    else:
        covered = suggest_max_length(arr, coverage=p.length_coverage, multiple_of=_PAD_MULTIPLE)
        length = min(covered, p.max_length_cap)
        capped = f", capped at {p.max_length_cap}" if covered > p.max_length_cap else ""
        kept = float(np.mean(arr <= length))
        reasons.append(
            f"max_length {length}: covers {p.length_coverage:.0%} of {arr.size} rows{capped} "
            f"({kept:.1%} fit untruncated, {1 - kept:.1%} cut; lossless: max_length {int(arr.max())}, the longest)"
        )
    if arr is None or arr.size == 0:
        return length, None, None
    return length, float(np.minimum(arr, length).mean()), (float(np.mean(arr > length)), int(arr.max()))


def _base_micro_batch(hw: HardwareInfo) -> tuple[int, str]:
    """Rows per forward pass at 128 tokens for a MiniLM/BERT-base-sized encoder, by device memory class."""
    device = hw.primary
    if device is None:
        # CPU training is compute-bound: beyond ~16 rows throughput barely improves, while padding per batch grows.
        return 16, "CPU (compute-bound: bigger batches add padding, not speed)"
    if device.device_type == "mps":
        return 32, "Apple MPS (unified memory; conservative)"
    gib = device.memory_bytes / _GIB
    # Activation memory of a BERT-base layer stack at 128 tokens in fp16 is ~0.15 GiB per row with AdamW state for
    # 110M params on top (~1.3 GiB); these leave headroom for longer outliers and a cached eval batch.
    for limit, micro in ((12, 16), (20, 32), (32, 64), (64, 128)):
        if gib < limit:
            return micro, f"{gib:.0f} GiB GPU (< {limit} GiB class)"
    return 256, f"{gib:.0f} GiB GPU (>= 64 GiB class)"


def _target_batch(p: Preset, rows: int | None, reasons: list[str]) -> int:
    """The preset's effective batch, halved for short runs until they take ``p.min_steps`` optimizer steps (a
    pretrained encoder needs updates, not only rows: docs/measurements.md)."""
    target = p.target_effective_batch
    if rows is None or not p.min_steps:
        return target
    smaller = target
    while smaller > _MIN_EFFECTIVE_BATCH and rows * p.epochs < smaller * p.min_steps:
        smaller //= 2
    smaller = max(smaller, min(target, _MIN_EFFECTIVE_BATCH))
    if smaller == target:
        return target
    reasons.append(
        f"effective batch {smaller} instead of {target}: {rows} rows x {p.epochs} epoch(s) would be only "
        f"{rows * p.epochs // target} optimizer steps (the preset wants >= {p.min_steps})"
    )
    return smaller


def _batch(
    hw: HardwareInfo,
    p: Preset,
    target: int,
    world: int,
    max_length: int,
    forced_micro: int | None,
    late: dict[str, Any],
    reasons: list[str],
) -> tuple[int, int]:
    per_process = -(-target // world)
    forced_accum = late.pop("grad_accum_steps", None)
    if forced_micro is not None:
        micro, why = int(forced_micro), "set by hand"
    elif why := REGIMES[p.regime].whole_step:  # the regime decides: a whole step in one pass
        micro = per_process
    else:
        micro, why = _base_micro_batch(hw)
        # Activations grow ~linearly with length (attention ~quadratically): halve the rows per doubling past 128.
        # Only accelerator memory is that tight; CPU RAM (~30 GiB on Kaggle) holds these batches at any length.
        scale = max(1, -(-max_length // _REFERENCE_LENGTH)) if hw.primary is not None else 1
        micro = max(1, micro // (1 << (scale - 1).bit_length()))
        if scale > 1:
            why += f", scaled down for {max_length}-token rows"
        micro = min(micro, per_process)
    if micro < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro}")
    if forced_accum is not None:
        accum = int(forced_accum)
        effective = micro * accum * world
        note = "" if effective == target else f" (the preset's target is {target}; both micro and accum set by hand)"
        reasons.append(f"batch {micro} x {accum} accum x {world} = {effective} rows/step: set by hand{note}")
        return micro, accum
    accum = -(-target // (micro * world))
    if forced_micro is None:
        micro = -(-target // (accum * world))  # rebalance: 48 = 24 x 2, not 32 x 2 = 64
    reasons.append(
        f"batch {micro} x {accum} accum x {world} = {micro * accum * world} rows/step for the target {target}: "
        f"micro-batch from {why}"
    )
    return micro, accum
