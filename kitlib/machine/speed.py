"""This CPU's speed on a transformer block of the run's model: bf16 autocast against fp32 (decides a CPU's
precision, kept per machine) and the fp32 training and forward FLOP/s now (what the whole-run estimate plans by)."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from kitlib._files import known_fields, read_json_object, write_atomic
from kitlib.machine.hardware import MathProbe

__all__ = [
    "MathProbe",
    "block_key",
    "fastest_threads",
    "keep_probe",
    "kept_probe",
    "measure_cpu_step",
    "measure_model_step",
    "measure_python_s",
    "probe_cpu_bf16",
    "probe_model_bf16",
]

# Fewer threads must beat all of the process's share by this much (a tie keeps more; docs/measurements.md: 4.3x busy)
THREADS_MARGIN = 1.2
PROBE_FILE = "precision_probe.json"  # in the cache dir: bf16 against fp32, per CPU model, torch version and shape

Step = Callable[..., tuple[float, float]]  # (dtype, rows, train=True) -> (seconds, loss)
Loss = Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]  # fit's loss_fn: (model, batch) -> loss


def _block(width: int, ffn: int, heads: int, seq_len: int) -> Step:
    """One training step (forward, loss, backward; ``train=False``: the forward and loss alone, no autograd) of a
    transformer encoder block of this shape on up to 16 rows of ``seq_len`` tokens, in fp32 or under bf16 autocast;
    the same weights and inputs every call."""

    with torch.random.fork_rng(devices=[]):  # the user's random stream is not advanced by a probe
        torch.manual_seed(0)
        block = nn.TransformerEncoderLayer(width, heads, ffn, dropout=0.0, batch_first=True)
        head = nn.Linear(width, 8)
        x, y = torch.randn(16, seq_len, width), torch.randint(0, 8, (16, seq_len))

    def step(dtype: torch.dtype, rows: int, train: bool = True) -> tuple[float, float]:
        # no_grad, not inference_mode: bf16 autocast + inference_mode ran this train-mode layer 12x slower (AMX core)
        start = time.perf_counter()
        with (
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16),
            contextlib.nullcontext() if train else torch.no_grad(),
        ):
            logits = head(block(x[:rows]))
            loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), y[:rows].flatten())
        if train:
            loss.backward()
        return time.perf_counter() - start, float(loss.detach())

    return step


PROBE_ROWS = 8  # 8 x 128 tokens: about a training micro-batch's tokens (16 rows of ~56 at balanced on the demo)
# A bf16 step this many times slower than fp32 at one row cannot win at PROBE_ROWS (1 -> 8 rows gained bf16 1.45-1.6x
# on an AMX core): the probe stops there (bf16 emulated, or a CPU whose bf16 would lose), and costs one row's pair.
EMULATED = 2.0


def probe_cpu_bf16(
    width: int = 384,
    ffn: int = 1536,
    heads: int = 12,
    seq_len: int = 128,
    *,
    budget_s: float = 1.0,
    cache_dir: Path | None = None,
) -> MathProbe:
    """Time a training step of a block of this shape in fp32 and under bf16 autocast, interleaved on this CPU, and check
    their losses agree; kept in ``cache_dir``/precision_probe.json per CPU, torch and shape. Cost: a warm-up and 2-5
    pairs at PROBE_ROWS rows within ``budget_s`` (~1 s on an AMX core), ~0.2 s more for the forward gain."""
    # not keyed by the thread count: the stages probe inside the count the load leaves (kitlib.machine.threads), and
    # the precision is the machine's (a probe per count would re-run, and could decide otherwise, in 01)
    key = block_key(width, ffn, heads, seq_len)
    if (known := kept_probe(key, cache_dir)) is not None:
        return known
    step = _block(width, ffn, heads, seq_len)

    def best(rows: int, repeats: int) -> tuple[float, float, float, float]:
        runs = [(step(torch.float32, rows), step(torch.bfloat16, rows)) for _ in range(repeats)]  # interleaved
        (_, fp32_loss), (_, bf16_loss) = runs[0]
        return min(r[0][0] for r in runs), min(r[1][0] for r in runs), fp32_loss, bf16_loss

    best(1, 1)  # warm-up: oneDNN builds its kernels for each dtype and shape
    fp32_s, bf16_s, fp32_loss, bf16_loss = best(1, 1)
    rows, forward = 1, None
    if bf16_s < EMULATED * fp32_s:  # worth measuring at a batch: PROBE_ROWS rows, repeats as the budget allows
        # The rows stay whatever the machine's speed: sized by the budget, a busy machine's probe shrank to 1 row,
        # where bf16 gains nothing (12 vs 12 ms on an AMX core; 1.45-1.6x at 8 rows), and planned fp32 for the run.
        rows, pair_s = PROBE_ROWS, PROBE_ROWS * (fp32_s + bf16_s)
        best(rows, 1)  # warm-up at this shape
        fp32_s, bf16_s, fp32_loss, bf16_loss = best(rows, max(2, min(5, int(budget_s / pair_s))))
        forward = _forward_speedup(step) if bf16_s < fp32_s else None  # prices bf16's forward passes, where it won
    shape = f"width {width}, ffn {ffn}, {heads} heads, {rows} x {seq_len} tokens"
    probe = MathProbe(shape, fp32_s, bf16_s, _gap(fp32_loss, bf16_loss), forward_speedup=forward)
    return keep_probe(key, cache_dir, probe)


def _forward_speedup(step: Step, rows: int = 16, repeats: int = 3) -> float:
    """fp32 over bf16 seconds of the block's forward pass alone at ``rows`` rows, the best of interleaved repeats
    after a warm-up: ~0.2 s on 2 AMX cores, where the block's read 2.4x and MiniLM's own forward as 01 runs it
    (eval mode, inference_mode) 2.9-3.7x on 2 threads, 2.0x on one: the block errs slow (docs/measurements.md)."""
    runs = [(step(torch.float32, rows, False)[0], step(torch.bfloat16, rows, False)[0]) for _ in range(repeats + 1)]
    return min(r[0] for r in runs[1:]) / min(r[1] for r in runs[1:])


def block_key(width: int = 384, ffn: int = 1536, heads: int = 12, seq_len: int = 128) -> str:
    """What ``probe_cpu_bf16`` keeps a block's verdict under (beside the CPU and torch version)."""
    return f"{width}/{ffn}/{heads}/{seq_len}/{PROBE_ROWS}rows"  # a verdict of fewer rows (before 8) is probed again


def kept_probe(key: str, cache_dir: Path | None) -> MathProbe | None:
    """The probe kept for ``key`` on this CPU and torch version in ``cache_dir``/precision_probe.json, else None."""
    known = read_json_object(None if cache_dir is None else Path(cache_dir) / PROBE_FILE)
    found = known.get(f"{_cpu_model()} | torch {torch.__version__} | {key}")
    return None if found is None else MathProbe(**known_fields(MathProbe, found))


def keep_probe(key: str, cache_dir: Path | None, probe: MathProbe) -> MathProbe:
    """``probe``, kept for ``key`` on this CPU and torch version (nothing without a ``cache_dir``)."""
    if cache_dir is not None:
        file = Path(cache_dir) / PROBE_FILE
        known = {
            **read_json_object(file),
            f"{_cpu_model()} | torch {torch.__version__} | {key}": dataclasses.asdict(probe),
        }
        write_atomic(file, json.dumps(known, indent=1) + "\n")
    return probe


def _gap(fp32_loss: float, bf16_loss: float) -> float:
    return abs(bf16_loss - fp32_loss) / max(abs(fp32_loss), 1e-12)


def measure_cpu_step(
    width: int = 384,
    ffn: int = 1536,
    heads: int = 12,
    seq_len: int = 128,
    *,
    rows: int = 4,
    forward_rows: int = 16,
    budget_s: float = 1.0,
) -> tuple[float, float]:
    """Achieved FLOP/s of an fp32 training step of this block on this CPU now, and of its forward pass alone (6N and
    2N per token), alternated and averaged (a mean: a busy machine's speed is what the run gets). Never cached."""
    step = _block(width, ffn, heads, seq_len)
    train_s, forward_s = _mean_s(
        lambda: (step(torch.float32, rows)[0], step(torch.float32, forward_rows, False)[0]), budget_s
    )
    weights = 4 * width * width + 2 * width * ffn
    return 6.0 * weights * rows * seq_len / train_s, 2.0 * weights * forward_rows * seq_len / forward_s


def measure_model_step(
    model: nn.Module, batch: dict[str, torch.Tensor], flops: float, loss: Loss | None = None, *, budget_s: float = 1.0
) -> float:
    """Achieved FLOP/s of fp32 training steps of ``model`` on ``batch`` now (forward, ``loss``, backward, AdamW),
    counting ``flops`` per step. The model's weights change: build one for it."""
    step = _model_step(model, batch, loss)
    return flops / _mean_s(lambda: (step(False)[0],), budget_s)[0]


def probe_model_bf16(
    model: nn.Module, batch: dict[str, torch.Tensor], flops: float, loss: Loss | None = None, *, budget_s: float = 1.0
) -> tuple[float, MathProbe]:
    """``measure_model_step``'s fp32 FLOP/s and bf16 autocast against fp32 on the model's own steps, alternated, after
    comparing their losses; a model that raises under bf16 loses (the error in the verdict). Weights change: build one
    for it."""
    step = _model_step(model, batch, loss)
    ids = batch.get("input_ids", next(iter(batch.values())))
    shape = f"the task's own model, {' x '.join(str(n) for n in ids.shape[:2])} tokens"  # rows x tokens
    model.eval()  # no dropout: both precisions see the same function
    with torch.no_grad():
        fp32_loss = float(_loss(model, batch, loss, False))  # fp32 first: its failure is the caller's to report
    try:
        with torch.no_grad():
            bf16_loss = float(_loss(model, batch, loss, True))
        fp32_s, bf16_s = _mean_s(lambda: (step(False)[0], step(True)[0]), budget_s)
    except MemoryError:
        raise  # the machine's state, not the module's: no verdict to keep
    except Exception as err:  # whatever the user's module raises under bf16, at any of its steps, is the verdict
        fp32_s = _mean_s(lambda: (step(False)[0],), budget_s)[0]
        error = " ".join(f"{type(err).__name__}: {err}".split())[:200]  # one line: it is quoted in the plan's why
        return flops / fp32_s, MathProbe(shape, fp32_s, 0.0, 0.0, error)
    return flops / fp32_s, MathProbe(shape, fp32_s, bf16_s, _gap(fp32_loss, bf16_loss))


def _model_step(
    model: nn.Module, batch: dict[str, torch.Tensor], loss: Loss | None
) -> Callable[[bool], tuple[float, float]]:
    """One training step of ``model`` on ``batch`` as fit runs it (under bf16 autocast when asked; a fused AdamW
    update, as fit's: kitlib.engine.optim): its seconds and loss."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step(bf16: bool) -> tuple[float, float]:
        model.train()
        start = time.perf_counter()
        value = _loss(model, batch, loss, bf16)
        value.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start, float(value.detach())

    return step


def _loss(model: nn.Module, batch: dict[str, torch.Tensor], loss: Loss | None, bf16: bool) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        return model(**batch).loss if loss is None else loss(model, batch)


def fastest_threads(most: int, *, budget_s: float = 0.5) -> tuple[int, float]:
    """The intra-op thread count (``most``, ``most - 1``, half) whose fp32 MiniLM-block step ran fastest now, and its
    speed-up over ``most``; fewer win only by ``THREADS_MARGIN``. Costs ~1.5 x ``budget_s``; torch's count is
    restored."""
    candidates = sorted({most, most - 1, (most + 1) // 2} - {0}, reverse=True)
    if len(candidates) == 1:
        return most, 1.0
    step, before = _block(384, 1536, 12, 128), torch.get_num_threads()

    def each() -> tuple[float, ...]:
        seconds = []
        for n in candidates:
            torch.set_num_threads(n)
            seconds.append(step(torch.float32, 2)[0])
        return tuple(seconds)

    try:
        seconds = _mean_s(each, budget_s)
    finally:
        torch.set_num_threads(before)
    best = min(range(len(candidates)), key=seconds.__getitem__)
    speedup = seconds[0] / seconds[best]
    return (candidates[best], speedup) if speedup >= THREADS_MARGIN else (most, 1.0)


def measure_python_s(budget_s: float = 0.6) -> float:
    """Seconds of a fixed piece of plain Python on one thread now (how much of a core one thread gets), with the
    garbage collector off. Run it before torch's threads have worked in this process (their spinning competes)."""

    def work() -> tuple[float]:
        start = time.perf_counter()
        sorted({f"k{i}": [str(i)] * 3 for i in range(40_000)}, key=len)
        return (time.perf_counter() - start,)

    collecting = gc.isenabled()
    gc.disable()
    try:
        return _mean_s(work, budget_s)[0]
    finally:
        if collecting:
            gc.enable()


def _mean_s(step: Callable[[], tuple[float, ...]], budget_s: float) -> tuple[float, ...]:
    """The mean of each of the seconds ``step`` returns over the repeats that fit in ``budget_s`` (2 to 20), after
    half as long warming up, at least two steps: kernels, the allocator's first blocks, and a fresh process's first
    steps, which run ~20% slow."""
    first = sum(step())
    for _ in range(max(1, min(10, int(budget_s / 2 / first)))):
        step()
    repeats = max(2, min(20, int(budget_s / first)))
    return tuple(sum(column) / repeats for column in zip(*(step() for _ in range(repeats)), strict=True))


def _cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo; platform.processor() elsewhere): the probe's result is this CPU's."""

    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()
