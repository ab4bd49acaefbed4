"""The one frozen, typed run configuration (``TrainConfig``): what ``fit`` takes, saved beside every artifact;
invalid values fail at construction with the fix named."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin, get_type_hints

# The vocabularies, each defined once: validation below, the picker, the CLI and precision read them from here.
Dtype = Literal["fp32", "fp16", "bf16"]
Requested = Literal["auto", Dtype]  # what a user may ask for; "auto" lets decide_precision pick with a reason
Schedule = Literal["cosine", "linear", "constant"]
Optimizer = Literal["adamw", "adamw8bit", "adamw-kahan"]
Freeze = Literal["none", "embeddings", "encoder"]
Adapter = Literal["none", "lora", "qlora"]  # kitlib.models.adapters: LoRA, or LoRA on 4-bit weights (CUDA)
Batching = Literal["bucket", "dynamic", "fixed", "token_budget", "packed"]  # packed: kitlib.data.packing (causal LM)
Mode = Literal["min", "max"]
BackgroundEval = Literal["off", "thread"]
Strategy = Literal["ddp", "fsdp"]
# What the target column is: "auto" decides from the values (names: classes; fractions: a number; few distinct
# integers: classes; integers that are neither clearly codes nor clearly quantities: asks for one of the others).
TargetRule = Literal["auto", "classify", "regress"]


# Fields a resumed run may change: none of them alters a weight update.
_RESUMABLE_CHANGES = frozenset(
    {
        "num_workers",
        "log_every_steps",
        "eval_every_steps",
        "save_best",
        "save_last",
        "save_every_steps",
        "time_budget_s",
        "max_nonfinite_steps",
        "background_eval",
        "eval_max_batches",
        "eval_batch_factor",
        "find_unused_parameters",  # how DDP finds the gradients, not which ones
        "full_eval_every",
        "full_eval_at_end",
        "patience",
        "min_delta",
        "compile",
    }
)


# The least value of each whole-number field (None allowed where it is the default); 0 = only at the end for
# full_eval_every.
_LEAST = {"epochs": 1, "micro_batch_size": 1, "grad_accum_steps": 1, "full_eval_every": 0, "eval_max_batches": 1,
          "patience": 1, "save_every_steps": 1, "eval_every_steps": 1, "max_length": 1, "num_workers": 0,
          "eval_batch_factor": 1, "freeze_layers": 0, "log_every_steps": 1, "max_nonfinite_steps": 1}  # fmt: skip


def full_eval_due(epoch: int, every: int, at_end: bool, epochs: int) -> bool:
    """Whether the full evaluation runs after 1-based ``epoch`` of ``epochs``: every ``every`` epochs (0: never by
    cadence) and/or after the last. fit() schedules by it; the doctor counts and re-plans with it."""
    return (every > 0 and epoch % every == 0) or (at_end and epoch == epochs)


def _jsonish(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value  # a config read back from JSON has lists


# Fields an older kitlib saved in config.json/inputs.json that this one no longer has: ignored where a run is read back
RETIRED = ("batching_measured",)  # 02's batching probe, replaced by a rule (#50, list B3)


@dataclass(frozen=True)
class TrainConfig:
    # --- optimisation ---
    epochs: int = 3
    micro_batch_size: int = 32  # rows per forward pass; memory-bound
    grad_accum_steps: int = 1  # effective batch = micro_batch_size * grad_accum_steps * world_size
    lr: float = 5e-5
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    schedule: Schedule = "cosine"
    warmup_ratio: float = 0.06  # fraction of optimizer steps spent warming up linearly from 0
    min_lr_ratio: float = 0.0  # cosine/linear decay floor, as a fraction of lr
    # adamw8bit: bitsandbytes' 8-bit AdamW (optional extra kitlib[lean]), 2 bytes of state a parameter instead of 8;
    # adamw-kahan: torch-optimi's AdamW with Kahan-summed updates: trains pure bf16 weights in a bf16 run (kitlib[lean])
    optimizer: Optimizer = "adamw"
    grad_clip: float | None = 1.0  # max global grad norm; None: no clipping (the norm is still checked for inf/nan)
    seed: int = 42

    # --- speed ---
    precision: Requested = "auto"  # auto: bf16 on sm80+/AMX CPUs, fp16 + GradScaler on sm70/75, else fp32
    tf32: bool | None = None  # None: on for sm80+ (free ~3-8x for fp32 matmuls left outside autocast)
    cudnn_benchmark: bool | None = None  # None: on only when input shapes are fixed
    compile: bool = False  # torch.compile: first epoch pays the compile (~30-90 s); worth it for long runs
    gradient_checkpointing: bool = False  # ~30% more compute for ~60% less activation memory
    # What to recompute in backward when gradient_checkpointing is on: submodule names ("blocks": a ModuleList's blocks
    # each, "encoder.layers.0") or class names ("TransformerBlock"). Empty: a Hugging Face model's own switch (also
    # for Hugging Face models inside a wrapper module); any other model must name its blocks.
    checkpoint_modules: tuple[str, ...] = ()
    freeze: Freeze = "none"
    # Train low-rank adapters beside the frozen pretrained weights (kitlib.models.adapters; the task builds them):
    # checkpoints then hold the adapters only. "qlora": on 4-bit weights, CUDA only.
    adapter: Adapter = "none"
    # Also freeze the first N transformer blocks (and the embeddings): no backward pass or AdamW state below block N
    freeze_layers: int = 0
    # DDP only: let parameters go without a gradient in a step (a branch the forward skips). It costs a walk of the
    # autograd graph every step; without it, fit names the parameters that got none after the first step.
    find_unused_parameters: bool = False
    # Several processes: ddp (each holds the whole model) or fsdp (FSDP2: weights, gradients and optimizer state
    # sharded per transformer block, kitlib.engine.sharded; checkpoints through torch.distributed.checkpoint)
    strategy: Strategy = "ddp"

    # --- data ---
    max_length: int | None = None  # tokens; None: the loader decides (e.g. suggest_max_length at 99% coverage)
    batching: Batching = "bucket"
    num_workers: int | None = None  # None: derived from the CPU count and platform
    eval_batch_factor: int = 4  # no autograd state at eval, so batches can be ~4x larger

    # --- evaluation ---
    full_eval_every: int = 0  # epochs between expensive evals (generation, metrics); 0: only at the end
    full_eval_at_end: bool = True
    eval_max_batches: int | None = None  # cap for the cheap loss-only eval
    # Optimizer steps between extra loss-only evals (step_evals.csv); None: epoch ends only. RNG streams put back.
    eval_every_steps: int | None = None
    background_eval: BackgroundEval = "thread"  # where the CPU-bound part of a full eval runs

    # --- stopping and checkpoints ---
    monitor: str = "eval_loss"
    mode: Mode = "min"
    patience: int | None = None  # evals without improvement before stopping; None: never stop early
    min_delta: float = 0.0
    save_best: bool = True  # weights only, when `monitor` improves
    save_last: bool = False  # full resume state at epoch end (and every `save_every_steps`)
    save_every_steps: int | None = None  # optimizer steps between "last" checkpoints (resume points; implies last)
    time_budget_s: float | None = None  # wall clock for fit(), e.g. a Kaggle session minus inference time
    max_nonfinite_steps: int = 25  # consecutive skipped (inf/nan) steps before the run stops

    # --- logging ---
    log_every_steps: int = 10  # optimizer steps between progress/loss syncs (.item() is a CPU-GPU sync)

    def __post_init__(self) -> None:
        fields = {f.name: f.default for f in dataclasses.fields(self)}
        problems = [
            f"{name} must be >= {least}{' or None' if fields[name] is None else ''}, got {value}"
            for name, least in _LEAST.items()
            if (value := getattr(self, name)) is not None or fields[name] is not None
            if value is None or value < least
        ]
        problems += [f"{name} must be > 0{' or None' if name != 'lr' else ''}, got {value}"
                     for name in ("lr", "grad_clip", "time_budget_s")
                     if ((value := getattr(self, name)) is not None or name == "lr")
                     and not (value or 0) > 0]  # fmt: skip
        problems += [f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}"] * (not 0 <= self.warmup_ratio < 1)
        problems += [f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}"] * (not 0 <= self.min_lr_ratio <= 1)
        modules = self.checkpoint_modules
        if not isinstance(modules, tuple) or not all(isinstance(n, str) for n in modules):
            problems.append(f"checkpoint_modules must be a tuple of module or class names, got {modules!r}")
        elif modules and not self.gradient_checkpointing:
            problems.append(f"checkpoint_modules={modules!r} needs gradient_checkpointing=True")
        problems += [f"{name}={getattr(self, name)!r} is not one of {allowed}"
                     for name, allowed in _vocabularies().items() if getattr(self, name) not in allowed]  # fmt: skip
        if problems:
            raise ValueError(f"TrainConfig: {'; '.join(problems)}")

    @property
    def effective_batch_size(self) -> int:
        """Rows per optimizer step on one process (multiply by the world size under DDP)."""
        return self.micro_batch_size * self.grad_accum_steps

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def resume_differences(self, saved: dict[str, Any]) -> list[str]:
        """Fields where a checkpoint's config (``saved``, a ``to_dict``) differs from this one in a way that changes
        the math, so continuing it would not be the run it was: ``["lr: 0.001 -> 0.0005", ...]``. Logging, saving,
        evaluation cadence, time budget and worker settings may change between sessions."""
        mine = self.to_dict()
        # A field the checkpoint's kitlib did not have yet ran at its default (optimizer: AdamW).
        then = {f.name: saved.get(f.name, f.default) for f in dataclasses.fields(self)}
        return [
            f"{name}: {then[name]!r} -> {mine[name]!r}"
            for name in mine
            if name not in _RESUMABLE_CHANGES and _jsonish(then[name]) != _jsonish(mine[name])
        ]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        data = {k: v for k, v in data.items() if k not in RETIRED}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"TrainConfig: unknown field(s) {unknown}; known fields: {sorted(known)}")
        tuples = ("betas", "checkpoint_modules")  # JSON gives lists
        values = dict(data) | {k: tuple(data[k]) for k in tuples if k in data}
        return cls(**values)


@functools.cache
def _vocabularies() -> dict[str, tuple[Any, ...]]:
    """TrainConfig's Literal-typed fields and their allowed values, read from the annotations once."""
    hints = get_type_hints(TrainConfig)
    return {name: get_args(hint) for name, hint in hints.items() if get_origin(hint) is Literal}
