"""Seq2seq benchmark (not a test): what the executing metric costs the training loop, side by side in one run.

The text-to-SQL demo's full evaluation generates a query for every validation row and executes it against the
demo's SQLite database (record F1). Three runs of the same tiny T5 on the same features, seed and epochs:

    loss only     full_eval_every=0 (the loss every epoch, the metric once after the last)
    foreground    the metric every epoch, generation and execution on the training path (background_eval="off")
    background    the metric every epoch, generation and execution in kitlib's background eval ("thread")

For each: wall time, the mean epoch time, and the epoch gap (wall time outside the training epochs, per epoch: what
training waited for). Usage: python benchmarks/bench_seq2seq_eval.py [--epochs 3] [--warmup 15] [--rows 600]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's demos/: not in the installed kitlib

import torch

from demos.sql import make_sql_demo, parameters
from kitlib.engine.loop import fit
from kitlib.machine.hardware import fake_profile
from kitlib.notebook import stages, training
from kitlib.notebook.tasks import get_task
from kitlib.tasks.metrics import get_metric


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per run")
    parser.add_argument("--warmup", type=int, default=15, help="epochs trained first (generation then has length)")
    parser.add_argument("--rows", type=int, default=600, help="training rows of the demo (10%% validate)")
    args = parser.parse_args()
    hw = fake_profile("CPU", platform="local", interactive=False)
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_sql_demo(Path(tmp) / "sql", n_train=args.rows, n_test=20)
        p = stages.params(
            data_dir=paths.root, work_dir=Path(tmp) / "work", preset="balanced", model="tiny", **parameters(paths.root)
        )
        stages.setup(p, hw)
        stages.features(p, hw=hw, quiet=True)
        feats = stages.load_features(p)
        task, metric = get_task(p.task), get_metric(p.metric, "sequence", data_dir=paths.root)
        base = dataclasses.replace(training._train_config(p, feats), epochs=args.epochs, save_best=False)
        # Generation costs what the model generates: a fresh model stops at once. Train first, then time each way
        # from those weights, in the order A B C C B A (drift on a shared machine hits every side alike).
        warm = training.prepare(p, feats, hw).model
        fit(warm, training.prepare(p, feats, hw).train, config=dataclasses.replace(base, epochs=args.warmup,
            full_eval_every=0, monitor="train_loss"), hw=hw)  # fmt: skip
        trained = {k: v.clone() for k, v in warm.state_dict().items()}
        runs = {
            "loss only": dataclasses.replace(base, full_eval_every=0, monitor="eval_loss", mode="min"),
            "foreground": dataclasses.replace(base, full_eval_every=1, background_eval="off"),
            "background": dataclasses.replace(base, full_eval_every=1, background_eval="thread"),
        }
        threads = torch.get_num_threads()
        print(f"{feats.n_train} rows, {args.warmup} warm-up epochs, {args.epochs} timed epochs per run; CPU x{threads}")
        walls: dict[str, list[float]] = {name: [] for name in runs}
        gaps: dict[str, list[float]] = {name: [] for name in runs}
        f1s: dict[str, float] = {}
        for name in [*runs, *reversed(runs)]:
            prepared = training.prepare(p, feats, hw)
            prepared.model.load_state_dict(trained)
            started = time.perf_counter()
            result = fit(
                prepared.model, prepared.train, config=runs[name], eval_loader=prepared.valid, hw=hw,
                full_eval=task.evaluate(feats.spec, metric, prepared.valid, torch.device("cpu")),
            )  # fmt: skip
            wall = time.perf_counter() - started
            walls[name].append(wall)
            gaps[name].append((wall - float(result.history["epoch_s"].sum())) / args.epochs)
            if p.metric in result.history:
                f1s[name] = float(result.history[p.metric].dropna().iloc[-1])
        print(f"{'run':<12} {'wall s':>8} {'gap s/epoch':>12} {'last record_f1':>15}")
        for name in runs:
            wall, gap = statistics.mean(walls[name]), statistics.mean(gaps[name])
            print(f"{name:<12} {wall:8.1f} {gap:12.2f} {f1s.get(name, float('nan')):15.3f}")
        gap = {name: statistics.mean(values) for name, values in gaps.items()}
        wall = {name: statistics.mean(values) for name, values in walls.items()}
        print(
            f"epoch gap added by the metric: foreground {gap['foreground'] - gap['loss only']:.2f} s/epoch, "
            f"background {gap['background'] - gap['loss only']:.2f} s/epoch; wall vs loss only: foreground "
            f"{wall['foreground'] / wall['loss only']:.2f}x, background {wall['background'] / wall['loss only']:.2f}x"
        )


if __name__ == "__main__":
    main()
