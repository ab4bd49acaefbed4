"""Engine benchmark (not a test): kitlib's fit() against a bare PyTorch loop, side by side in one run.

1. Throughput: a small transformer classifier trained on identical pre-built batches, same precision and optimizer,
   by fit() and by the loop a careful user writes by hand. Goal: kitlib >= 0.97 of the bare loop.
2. Checkpoint stall: step time with no checkpoint, with last/ saved in the background, the same saves made
   synchronously, and last/ at the epoch end only.
3. Precision on this CPU: bf16 autocast vs fp32, speed ratio and final loss (bf16 only pays on AMX CPUs).

Runs are interleaved (A, B, A, B, ...) and the median is reported, so drift on a shared machine hits both sides.
Usage: python benchmarks/bench_engine.py [--steps 60] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from kitlib import TrainConfig, fit
from kitlib.machine.hardware import detect, fake_profile
from kitlib.machine.precision import decide_precision


def make_model(hidden: int, layers: int) -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=8000,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=4 * hidden,
        max_position_embeddings=128,
        num_labels=2,
    )
    return BertForSequenceClassification(config)


def make_batches(n: int, batch: int, length: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        {
            "input_ids": torch.randint(5, 8000, (batch, length), generator=g),
            "attention_mask": torch.ones(batch, length, dtype=torch.long),
            "labels": torch.randint(0, 2, (batch,), generator=g),
        }
        for _ in range(n)
    ]


def loader_of(batches: list[dict[str, torch.Tensor]]) -> DataLoader[Any]:
    return DataLoader(batches, batch_size=None, shuffle=False)  # pre-built batches, yielded as they are


def bare_loop(model: nn.Module, batches: list[dict[str, torch.Tensor]], lr: float) -> float:
    """What a careful user writes: same optimizer as fit's (fused AdamW, no decay on biases and norms: two param
    groups, as Hugging Face's Trainer), clipping and schedule-free constant lr. One group instead (``--one-group``,
    the loop before 2026-11-28) is ~0.2 ms a step cheaper on this CPU at the small size: the optimizer's own cost."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups if TWO_GROUPS else model.parameters(), lr=lr, weight_decay=0.01, fused=True)
    model.train()
    loss = torch.zeros(())
    for batch in loader_of(batches):
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return loss.item()


TWO_GROUPS = True  # --one-group: the bare loop's single param group (the comparison before 2026-11-28)


def kitlib_fit(
    model: nn.Module,
    batches: list[dict[str, torch.Tensor]],
    lr: float,
    hw: Any,
    run_dir: Path | None = None,
    callbacks: Sequence[object] = (),
    **overrides: Any,
) -> Any:
    settings: dict[str, Any] = {"precision": "fp32", "log_every_steps": 10_000, "save_best": False, **overrides}
    config = TrainConfig(epochs=1, lr=lr, schedule="constant", warmup_ratio=0.0, **settings)
    return fit(model, loader_of(batches), config=config, hw=hw, run_dir=run_dir, callbacks=callbacks)


CLOCK = time.perf_counter  # --clock cpu: time.process_time, the process's CPU seconds (all its threads)


def timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
    """Seconds of ``fn``: wall time, or with ``--clock cpu`` this process's CPU time, which a shared, loaded core
    does not inflate (time the process waits for the core is not counted; its own work, the writer thread's too, is)."""
    start = CLOCK()
    fn(*args, **kwargs)
    return CLOCK() - start


def throughput(args: argparse.Namespace, hw: Any) -> dict[str, float]:
    batches = make_batches(args.steps, args.batch, args.length)
    samples = args.steps * args.batch
    bare_times, kit_times = [], []
    timed(bare_loop, make_model(args.hidden, args.layers), batches[:5], 1e-4)  # warm-up (allocator, kernels)
    for _ in range(args.repeats):
        bare_times.append(timed(bare_loop, make_model(args.hidden, args.layers), batches, 1e-4))
        kit_times.append(timed(kitlib_fit, make_model(args.hidden, args.layers), batches, 1e-4, hw))
    bare, kit = statistics.median(bare_times), statistics.median(kit_times)
    print(
        f"\n[1] throughput, {args.steps} steps x batch {args.batch} x {args.length} tokens, fp32, median of "
        f"{args.repeats} interleaved runs (whole calls: model build and set-up count on both sides)"
    )
    print(f"    bare PyTorch loop : {samples / bare:8.1f} samples/s  ({bare:.2f} s)")
    print(f"    kitlib fit()      : {samples / kit:8.1f} samples/s  ({kit:.2f} s)")
    print(f"    ratio kitlib/bare : {bare / kit:.3f}   (goal >= 0.97)")
    return {"bare_samples_per_s": samples / bare, "kitlib_samples_per_s": samples / kit, "throughput_ratio": bare / kit}


@contextlib.contextmanager
def synchronous_saves() -> Iterator[None]:
    """fit's own saves (the same full resume state: weights, optimizer, scheduler, scaler, RNG, data position),
    written on the training thread instead of the background writer: what a loop without one does."""
    from kitlib.engine import checkpoint

    def save(self: checkpoint.RunOutput, name: str, snap: checkpoint.Snapshot) -> None:
        assert self.path is not None
        checkpoint.write(snap, self.path / name)

    original = checkpoint.RunOutput.save
    checkpoint.RunOutput.save = save  # type: ignore[method-assign]
    try:
        yield
    finally:
        checkpoint.RunOutput.save = original  # type: ignore[method-assign]


def checkpoint_stall(args: argparse.Namespace, hw: Any) -> dict[str, float]:
    """Step time with no checkpoint, with last/ every ``--save-every`` steps written in the background and the same
    saves written synchronously, and with last/ at the epoch end only (background): one fit each, interleaved."""
    batches = make_batches(args.steps, args.batch, args.length)
    every = args.save_every
    variants: dict[str, tuple[dict[str, Any], Any]] = {
        "none": ({}, contextlib.nullcontext),
        "background": ({"save_every_steps": every}, contextlib.nullcontext),
        "synchronous": ({"save_every_steps": every}, synchronous_saves),
        "epoch_end": ({"save_last": True}, contextlib.nullcontext),
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name, (settings, mode) in variants.items():
                run_dir = Path(tmp) / f"{name}{r}" if settings else None
                with mode():
                    model = make_model(args.hidden, args.layers)
                    times[name].append(timed(kitlib_fit, model, batches, 1e-4, hw, run_dir=run_dir, **settings))
    ms = {k: 1000 * statistics.median(v) / args.steps for k, v in times.items()}
    size_mb = sum(p.numel() * 4 for p in make_model(args.hidden, args.layers).parameters()) / 1e6
    print(
        f"\n[2] last/ (full resume state: weights {size_mb:.1f} MB + AdamW state, scheduler, RNG, position), ms per "
        f"step, median of {args.repeats} interleaved fits of {args.steps} steps"
    )
    print(f"    no checkpoint                 : {ms['none']:7.2f} ms")
    for name, label in (("background", f"every {every} steps, background"),
                        ("synchronous", f"every {every} steps, synchronous"),
                        ("epoch_end", "at the epoch end, background")):  # fmt: skip
        print(f"    {label:30}: {ms[name]:7.2f} ms  (x{ms[name] / ms['none']:.3f})")
    print(f"    background / synchronous      : x{ms['background'] / ms['synchronous']:.3f}   (goal < 1)")
    return {f"step_ms_{k}": v for k, v in ms.items()}


def precision_on_cpu(args: argparse.Namespace) -> dict[str, float]:
    real = detect()
    auto = decide_precision(real, "auto")
    steps = max(4, args.steps // 6)  # bf16 without AMX is emulated and can be ~50x slower: keep this part short
    batches = make_batches(steps, args.batch, args.length)
    result: dict[str, float] = {}
    for name, hw, precision in (
        ("fp32", fake_profile("CPU", platform="local", interactive=False), "fp32"),
        ("bf16", fake_profile("CPU-AMX", platform="local", interactive=False), "bf16"),
    ):
        start = time.perf_counter()
        out = kitlib_fit(make_model(args.hidden, args.layers), batches, 3e-4, hw, precision=precision)
        result[f"{name}_s"] = time.perf_counter() - start
        result[f"{name}_final_loss"] = float(out.history["train_loss"].iloc[-1])
    print(
        f"\n[3] precision on this CPU ({'AMX' if real.cpu_amx else 'no AMX'}; kitlib auto -> {auto.dtype}: "
        f"{auto.reason})"
    )
    print(
        f"    {steps} steps: fp32 {result['fp32_s']:.2f} s, loss {result['fp32_final_loss']:.6f} | bf16 autocast "
        f"{result['bf16_s']:.2f} s, loss {result['bf16_final_loss']:.6f}"
    )
    print(f"    bf16 speed-up over fp32: x{result['fp32_s'] / result['bf16_s']:.3f}")
    result["bf16_speedup"] = result["fp32_s"] / result["bf16_s"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--save-every", type=int, default=5, help="the checkpoint part's save_every_steps")
    parser.add_argument("--quick", action="store_true", help="a few steps only: checks that the script runs")
    parser.add_argument("--one-group", action="store_true", help="the bare loop's AdamW with one param group")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall", help="cpu: for a machine shared by others")
    parser.add_argument("--parts", default="throughput,checkpoint,precision", help="which parts run, comma-separated")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeats = 6, 1
    global TWO_GROUPS, CLOCK
    TWO_GROUPS = not args.one_group
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    hw = fake_profile("CPU", platform="local", interactive=False)  # fp32 on both sides of the comparison
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {detect().summary().splitlines()[0]}")
    parts = {"throughput": lambda: throughput(args, hw), "checkpoint": lambda: checkpoint_stall(args, hw),
             "precision": lambda: precision_on_cpu(args)}  # fmt: skip
    results: dict[str, float] = {}
    for name in args.parts.split(","):
        results |= parts[name]()
    print("\n" + json.dumps({k: round(v, 4) for k, v in results.items()}))


if __name__ == "__main__":
    main()
