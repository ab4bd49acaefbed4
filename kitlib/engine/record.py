"""``RunRecorder`` (a callback counting host-side, no syncs) and ``RunFacts`` (timing.json's "run" section)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from kitlib._files import known_fields
from kitlib.engine.events import Callback, StepEnd
from kitlib.machine.distributed import gather_object
from kitlib.models.facts import model_facts
from kitlib.progress import THROUGHPUT

# lazy: resource (+0.1 ms): POSIX only; only a CPU run's peak RSS reads it

if TYPE_CHECKING:
    from kitlib.engine.events import LoopView


@dataclass
class RunFacts:
    steps: int | None = None
    epochs_planned: int | None = None
    epochs_done: int | None = None
    world_size: int | None = None
    micro_batch_size: int | None = None
    grad_accum_steps: int | None = None
    num_workers: int | None = None
    persistent_workers: bool | None = None
    pin_memory: bool | None = None
    precision: str | None = None
    tf32: bool | None = None
    device_type: str | None = None
    device_name: str | None = None
    peak_memory_bytes: int | None = None
    memory_total_bytes: int | None = None
    rank_peak_memory_bytes: list[int] = field(default_factory=list)  # every rank's, in rank order (rank 0's record)
    time_budget_s: float | None = None
    full_eval_every: int | None = None
    save_best: bool | None = None
    save_last: bool | None = None
    save_every_steps: int | None = None
    batching: str | None = None
    cudnn_benchmark: bool | None = None
    samples: int | None = None
    real_tokens: int | None = None
    computed_tokens: int | None = None
    distinct_input_shapes: int | None = None
    epoch_gaps_s: list[float] = field(default_factory=list)  # eval, checkpoint, loader restart between epochs
    epoch_train_s: list[float] = field(default_factory=list)
    epoch_throughput: list[dict[str, float]] = field(default_factory=list)  # each history row's, as the row has it
    first_batch_wait_s: list[float] = field(default_factory=list)  # worker start-up lands here
    eval_batches_per_eval: int | None = None
    stop_reason: str | None = None
    model_non_embedding_params: int | None = None
    model_layers: int | None = None
    model_width: int | None = None
    # torch.compile: compiles, their seconds, and the steps that compiled (first + recompiles) with their time
    compiles: int | None = None
    compile_s: float | None = None
    compile_steps: int | None = None
    compile_step_s: float | None = None
    # OOM back-offs: {"step", "micro_batch": [from, to], "grad_accum_steps": [from, to], "error"} each
    oom_backoffs: list[dict[str, Any]] = field(default_factory=list)
    # What trained, read off the live objects: optimizer package.class, adapter, trained/frozen dtypes
    optimizer: str | None = None
    adapter: str | None = None
    trained_dtype: str | None = None
    frozen_dtype: str | None = None
    # Written by runs outside fit() (benchmarks/seed_replays.py) for the doctor
    max_length: int | None = None
    longest_row_tokens: int | None = None
    featurise_s: float | None = None
    features_cached: bool | None = None
    full_eval_count: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> RunFacts:
        return cls(**{k: v for k, v in known_fields(cls, data or {}).items() if v is not None})


_CONFIG_FACTS = ("time_budget_s", "full_eval_every", "save_best", "save_last", "save_every_steps", "batching")


class RunRecorder(Callback):
    """Collects the run's facts for timing.json as fit runs: after kitlib's policies, before the user's callbacks."""

    order = -10

    def __init__(self) -> None:
        self.run = RunFacts()  # its lists filled as fit runs, the rest by ``facts`` at the end
        self.shapes: set[tuple[int, ...]] = set()
        self.samples, self.real_tokens, self.computed_tokens = 0, 0, 0
        self.epoch_tokens: int | torch.Tensor = 0  # stays lazy on the device until the epoch ends (one sync)
        self.gap_start: float | None = None  # epoch_start, first_step: set as each epoch starts

    def on_fit_start(self, loop: LoopView) -> None:
        if loop.device.type == "cuda":  # a CUDA run only: on a CPU run this would initialise CUDA for nothing
            # per process: a second fit in the kernel would report the first one's peak
            torch.cuda.reset_peak_memory_stats(loop.device)
        # compile=True: the compiles recorded in this process before fit
        self.compile_start = len(_compile_times()) if loop.cfg.compile else None
        self.compiled, self.compile_steps, self.compile_step_s = self.compile_start or 0, 0, 0.0

    def on_epoch_start(self, loop: LoopView) -> None:
        self.epoch_start, self.first_step = time.perf_counter(), True

    def on_step_end(self, step: StepEnd) -> None:
        if self.gap_start is not None:  # eval, checkpoint and loader restart between two epochs' steps
            self.run.epoch_gaps_s.append(round(step.started - self.gap_start, 4))
            self.gap_start = None
        if self.first_step:
            self.run.first_batch_wait_s.append(round(step.fetch_s, 4))
            self.first_step = False
        self.samples += step.rows
        self.epoch_tokens = self.epoch_tokens + step.real_tokens
        self.computed_tokens += step.computed_tokens
        self.shapes |= step.shapes
        if self.compile_start is not None and (done := len(_compile_times())) > self.compiled:  # a list's length
            self.compiled, self.compile_steps = done, self.compile_steps + 1
            self.compile_step_s += step.seconds

    def on_epoch_end(self, record: Mapping[str, Any]) -> None:
        self.gap_start = self.epoch_start + record["epoch_s"]  # training ended here; eval and saving came after
        self.run.epoch_train_s.append(record["epoch_s"])
        self.run.epoch_throughput.append({k: record[k] for k in THROUGHPUT if k in record})
        self.real_tokens, self.epoch_tokens = self.real_tokens + int(self.epoch_tokens), 0

    def facts(self, loop: LoopView) -> RunFacts:
        cfg, env, loader, device = loop.cfg, loop.env, loop.data.base, loop.device
        if device.type == "cuda":
            peak, total = torch.cuda.max_memory_allocated(device), torch.cuda.get_device_properties(device).total_memory
        else:
            import resource

            peak, total = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, loop.hw.ram_bytes  # Linux: KiB
        eval_batches = loop.data.eval
        shape: dict[str, Any] = model_facts(loop.raw_model)  # ints: mypy would try them against every ** field
        return dataclasses.replace(
            self.run,
            steps=loop.state.step,
            epochs_planned=cfg.epochs,
            epochs_done=len(loop.state.history),
            world_size=env.world_size,
            micro_batch_size=loop.backoff.micro_batch,  # the config's, or its pieces after OOM back-offs
            grad_accum_steps=cfg.grad_accum_steps * loop.backoff.parts,
            num_workers=loader.num_workers,
            persistent_workers=loader.persistent_workers,
            pin_memory=loader.pin_memory,
            precision=loop.plan.dtype,
            tf32=loop.plan.tf32,
            device_type=device.type,
            device_name=loop.hw.device_name,
            peak_memory_bytes=peak,
            memory_total_bytes=total,
            rank_peak_memory_bytes=gather_object(peak, env),  # a collective: fit reads facts on every rank
            **{k: getattr(cfg, k) for k in _CONFIG_FACTS},
            cudnn_benchmark=bool(loop.timer.extra.get("cudnn_benchmark")),
            samples=self.samples,
            real_tokens=self.real_tokens or None,  # None: no token inputs (a head on cached vectors), not 0 tokens/s
            computed_tokens=self.computed_tokens or None,
            distinct_input_shapes=len(self.shapes),
            eval_batches_per_eval=min(len(eval_batches), cfg.eval_max_batches or len(eval_batches))
            if eval_batches is not None
            else 0,
            stop_reason=loop.stop_reason,
            oom_backoffs=list(loop.backoff.changes),
            **_what_ran(loop.raw_model, loop.optimizer),
            features_cached=None,  # fit() featurises nothing (and **shape below holds ints only)
            **self._compile_facts(),
            **shape,
        )

    def _compile_facts(self) -> dict[str, Any]:
        if self.compile_start is None:
            return {}
        times = _compile_times()[self.compile_start :]
        return {
            "compiles": len(times),
            "compile_s": round(sum(times), 4),
            "compile_steps": self.compile_steps,
            "compile_step_s": round(self.compile_step_s, 4),
        }


def _compile_times() -> list[float]:
    """Seconds of each dynamo compile in this process so far (torch's own record; [] when torch has none)."""
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:  # pragma: no cover - torch without dynamo
        return []
    return compilation_time_metrics.get("_compile.compile_inner", [])


def _what_ran(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """RunFacts' optimizer, adapter and weight dtypes, from the model and optimizer that trained."""

    def dtypes(trained: bool) -> str | None:
        found = {"nf4" if type(p).__name__ == "Params4bit" else str(p.dtype).removeprefix("torch.")
                 for p in model.parameters() if p.requires_grad == trained}  # fmt: skip
        return ", ".join(sorted(found)) or None

    frozen = dtypes(False)
    adapter = "none" if not hasattr(model, "peft_config") else "qlora" if "nf4" in (frozen or "") else "lora"
    kind = f"{type(optimizer).__module__.split('.')[0]}.{type(optimizer).__name__}"
    return {"optimizer": kind, "adapter": adapter, "trained_dtype": dtypes(True), "frozen_dtype": frozen}
