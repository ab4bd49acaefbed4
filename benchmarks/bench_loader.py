"""Loader throughput next to model throughput on the demo: the DataLoader must never be what training waits for.

    python benchmarks/bench_loader.py /tmp/demo [--tiny] [--batches 20]

The demo is written to DEMO_DIR first if it is missing. The training texts are tokenised once (as a notebook does,
uncached here), wrapped in ``TokenDataset`` and served by ``make_train_loader`` (bucketed batches, dynamic padding).

(a) Loader only: N batches per iteration, each merely touched, for the worker count kitlib picks on this machine
    and for num_workers=0 and 1 explicitly. "first batch" is the latency of a fresh iteration (worker start-up
    included, paid once per epoch); batches/s and samples/s are the steady state after it (median of 5 iterations).
(b) Model: forward + backward + clip + AdamW step (kitlib's optimizer, precision and clip, as in fit()) on N batches
    taken from the same default loader, 2 warm-up steps untimed. Loading is excluded, so this is pure compute.

Goal: loader samples/s >= 10x the model's (data wait < ~10% of a step); the exit code is 1 when the default loader
misses it. all-MiniLM-L6-v2 is used when installed; ``--tiny`` or KITLIB_TINY_MODEL=1 forces the tiny fallback.
Note that on a CPU a worker process competes with the model's matmul threads for cores, a cost (a) cannot show:
that is why kitlib's default on a CPU is num_workers=0.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's demos/: not in the installed kitlib

import torch

from demos.reviews import make_demo
from kitlib.config import TrainConfig
from kitlib.data.featurize import tokenize_texts
from kitlib.data.loaders import TokenDataset, default_num_workers, make_train_loader
from kitlib.data.tables import read_table
from kitlib.engine.optim import build_optimizer
from kitlib.machine.amp import Precision
from kitlib.machine.hardware import detect
from kitlib.machine.precision import decide_precision
from kitlib.models.loading import load_text_classifier

GOAL = 10.0  # loader samples/s over model samples/s
WARMUP_STEPS = 2
REPEATS = 5


def touch(batch: dict[str, torch.Tensor]) -> int:
    """Rows of a batch, after reading one element of its data (not only the metadata)."""
    ids = batch["input_ids"]
    int(ids[-1, -1])
    return int(ids.shape[0])


def loader_throughput(loader: Any, n: int) -> dict[str, float]:
    """Iterate ``n`` batches, touching each and nothing more; median of REPEATS fresh iterations."""
    firsts, rates, samples = [], [], []
    for _ in range(REPEATS):
        start = time.perf_counter()
        it = iter(loader)  # worker processes start here
        touch(next(it))
        first_at = time.perf_counter()
        rows = sum(touch(batch) for batch in itertools.islice(it, n - 1))
        steady = time.perf_counter() - first_at
        del it  # shuts its workers down before the next iteration starts its own
        firsts.append(first_at - start)
        rates.append((n - 1) / steady)
        samples.append(rows / steady)
    return {
        "first_batch_ms": 1e3 * statistics.median(firsts),
        "batches_per_s": statistics.median(rates),
        "samples_per_s": statistics.median(samples),
    }


def model_throughput(model: Any, batches: list[dict[str, torch.Tensor]], cfg: TrainConfig, hw: Any) -> dict[str, Any]:
    """fit()'s step without its bookkeeping: autocast forward, backward, unscale, clip, AdamW step, zero_grad."""
    plan = decide_precision(hw, cfg.precision, tf32=cfg.tf32)
    precision = Precision(plan)
    device = torch.device(plan.device_type)
    model.to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(model, cfg)
    seconds, rows, tokens = 0.0, 0, 0
    for step, cpu_batch in enumerate(batches):
        start = time.perf_counter()
        batch = {k: v.to(device, non_blocking=True) for k, v in cpu_batch.items()}
        with precision.autocast():
            loss = model(**batch).loss
        precision.backward(loss)
        precision.unscale_(optimizer)
        norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip or math.inf, foreach=True)
        precision.step(optimizer, grads_finite=bool(torch.isfinite(norm)))  # the host sync fit() has too
        optimizer.zero_grad(set_to_none=True)
        if step >= WARMUP_STEPS:
            seconds += time.perf_counter() - start
            rows += int(cpu_batch["input_ids"].shape[0])
            tokens += int(cpu_batch["attention_mask"].sum())
    timed = len(batches) - WARMUP_STEPS
    return {
        "precision": plan.dtype,
        "steps": timed,
        "ms_per_step": 1e3 * seconds / timed,
        "batches_per_s": timed / seconds,
        "samples_per_s": rows / seconds,
        "tokens_per_s": tokens / seconds,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("demo_dir", type=Path)
    parser.add_argument("--tiny", action="store_true", help="the tiny 2-layer model instead of all-MiniLM-L6-v2")
    parser.add_argument("--batches", type=int, default=20, help="batches per measurement (default 20)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    args = parser.parse_args()
    if args.batches < WARMUP_STEPS + 2:
        parser.error(f"--batches must be >= {WARMUP_STEPS + 2}")

    wall = time.perf_counter()
    train_csv = args.demo_dir / "train.csv"
    if not train_csv.is_file():
        print(f"writing the demo to {args.demo_dir}")
        make_demo(args.demo_dir)
    df = read_table(train_csv, text="text", target="label", id="id")
    tokenizer, model, identity = load_text_classifier(2, train_texts=df["text"], tiny=True if args.tiny else None)
    start = time.perf_counter()
    tokens = tokenize_texts(df["text"], tokenizer, max_length=args.max_length, cache=False)
    tokenize_s = time.perf_counter() - start
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    dataset = TokenDataset(tokens, df["label"].to_numpy(), pad_id=pad_id)

    hw = detect()
    cfg = TrainConfig(micro_batch_size=args.batch_size, max_length=args.max_length)
    default_workers, reason = default_num_workers(cfg, hw)
    loader = make_train_loader(dataset, cfg, hw)
    n = min(args.batches, len(loader))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {hw.summary().splitlines()[0]}")
    print(
        f"model {identity}; {len(df)} rows, {tokens.n_tokens} tokens (mean {tokens.lengths.mean():.1f}), tokenised "
        f"in {tokenize_s:.2f} s; {type(loader.batch_sampler).__name__}, batch {args.batch_size}, {n} batches"
    )

    configs = {"default": loader}  # the JSON keys; the table says "loader, <key>"
    for workers in (0, 1):
        configs[f"num_workers={workers}"] = make_train_loader(
            dataset, dataclasses.replace(cfg, num_workers=workers), hw
        )
    loaders = {key: loader_throughput(dl, n) for key, dl in configs.items()}
    labels = {
        key: f"loader, {key}" + (f" (num_workers={default_workers})" if key == "default" else "") for key in configs
    }

    batches = list(itertools.islice(iter(loader), n))  # the same batches, pre-loaded: model compute only
    model_stats = model_throughput(model, batches, cfg, hw)

    model_label = f"model fwd+bwd+AdamW ({model_stats['precision']})"
    width = max(len(label) for label in [*labels.values(), model_label])
    header = f"{'first batch':>12} {'ms/batch':>9} {'batches/s':>10} {'samples/s':>10} {'x model':>8}"
    print(f"\n{'':<{width}} {header}")
    for key, stats in loaders.items():
        ratio = stats["samples_per_s"] / model_stats["samples_per_s"]
        print(
            f"{labels[key]:<{width}} {stats['first_batch_ms']:>9.1f} ms {1e3 / stats['batches_per_s']:>9.2f} "
            f"{stats['batches_per_s']:>10.1f} {stats['samples_per_s']:>10.0f} {ratio:>8.1f}"
        )
    print(
        f"{model_label:<{width}} {'-':>12} {model_stats['ms_per_step']:>9.1f} {model_stats['batches_per_s']:>10.2f} "
        f"{model_stats['samples_per_s']:>10.1f} {1.0:>8.1f}"
    )
    print(f"(default num_workers={default_workers}: {reason})")

    default = next(iter(loaders.values()))
    ratio = default["samples_per_s"] / model_stats["samples_per_s"]
    wait_ms = 1e3 / default["batches_per_s"]
    share = wait_ms / (wait_ms + model_stats["ms_per_step"])
    ok = ratio >= GOAL
    print(
        f"\nratio loader/model (default loader): {ratio:.1f}x (goal >= {GOAL:.0f}x: {'met' if ok else 'MISSED'}); "
        f"data wait ~{wait_ms:.2f} ms of a {wait_ms + model_stats['ms_per_step']:.1f} ms step ({share:.1%})"
    )
    result = {
        "model": identity,
        "batch_size": args.batch_size,
        "batches": n,
        "default_num_workers": default_workers,
        "loader": {key: {k: round(v, 2) for k, v in stats.items()} for key, stats in loaders.items()},
        "model_samples_per_s": round(model_stats["samples_per_s"], 2),
        "model_ms_per_step": round(model_stats["ms_per_step"], 2),
        "precision": model_stats["precision"],
        "ratio": round(ratio, 1),
        "data_wait_share": round(share, 4),
        "goal_met": ok,
        "wall_s": round(time.perf_counter() - wall, 1),
    }
    print(json.dumps(result))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
