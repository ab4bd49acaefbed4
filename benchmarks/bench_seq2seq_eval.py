"""Seq2seq benchmark (not a test): what the executing metric costs the training loop, side by side in one run.

The text-to-SQL demo's full evaluation generates a query for every validation row and executes it against the
demo's SQLite database (record F1). Three runs of the same tiny T5 on the same features, seed and epochs:

    loss only     full_eval_every=0 (the metric once, after the last epoch)
    foreground    the metric every epoch, generation and execution on the training path (background_eval="off")
    background    the metric every epoch, generation and execution in kitlib's background eval ("thread")

For each: wall time, the mean epoch time, and the epoch gap (wall time outside the training epochs, per epoch: what
training waited for). Usage: python benchmarks/bench_seq2seq_eval.py [--epochs 4] [--rows 600]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import torch

from kitlib.engine.loop import fit
from kitlib.machine.hardware import fake_profile
from kitlib.notebook import stages
from kitlib.notebook.tasks import get_task
from kitlib.tasks.metrics import get_metric
from kitlib.tools.demo_sql import PARAMETERS, make_sql_demo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--rows", type=int, default=600, help="training rows of the demo (10%% validate)")
    args = parser.parse_args()
    hw = fake_profile("CPU", platform="local", interactive=False)
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_sql_demo(Path(tmp) / "sql", n_train=args.rows, n_test=20)
        p = stages.params(
            data_dir=paths.root, work_dir=Path(tmp) / "work", preset="balanced", model="tiny", **PARAMETERS
        )
        stages.setup(p, hw)
        stages.features(p, hw=hw, quiet=True)
        feats = stages.load_features(p)
        task, metric = get_task(p.task), get_metric("record_f1", "sequence", data_dir=paths.root)
        base = dataclasses.replace(stages._train_config(p, feats), epochs=args.epochs, save_best=False)
        runs = {
            "loss only": dataclasses.replace(base, full_eval_every=0, monitor="eval_loss", mode="min"),
            "foreground": dataclasses.replace(base, full_eval_every=1, background_eval="off"),
            "background": dataclasses.replace(base, full_eval_every=1, background_eval="thread"),
        }
        threads = torch.get_num_threads()
        print(f"{args.rows} rows ({feats.n_train} in features), {args.epochs} epochs, tiny T5, CPU x{threads}")
        print(f"{'run':<12} {'wall s':>8} {'epoch s':>8} {'gap s/epoch':>12} {'last record_f1':>15}")
        results = {}
        for name, cfg in runs.items():
            prepared = stages.prepare(p, feats, hw)
            started = time.perf_counter()
            result = fit(
                prepared.model, prepared.train, config=cfg, eval_loader=prepared.valid, hw=hw,
                full_eval=task.evaluate(feats.task, metric, prepared.valid, torch.device("cpu")),
                run_dir=Path(tmp) / name.replace(" ", "-"),
            )  # fmt: skip
            wall = time.perf_counter() - started
            epoch_s = float(result.history["epoch_s"].sum())
            gap = (wall - epoch_s) / args.epochs
            f1 = result.history["record_f1"].dropna().iloc[-1] if "record_f1" in result.history else float("nan")
            results[name] = (wall, gap)
            print(f"{name:<12} {wall:8.1f} {epoch_s / args.epochs:8.1f} {gap:12.2f} {f1:15.3f}")
        metric_cost_fg = results["foreground"][1] - results["loss only"][1]
        metric_cost_bg = results["background"][1] - results["loss only"][1]
        print(
            f"epoch gap added by the metric: foreground {metric_cost_fg:.2f} s/epoch, background {metric_cost_bg:.2f} "
            f"s/epoch; background / foreground wall = {results['background'][0] / results['foreground'][0]:.2f}"
        )


if __name__ == "__main__":
    main()
