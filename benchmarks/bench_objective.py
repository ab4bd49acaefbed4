"""The loss follows the metric: test SMAPE with the metric's objective (``objective="auto"``: absolute error on
log1p for SMAPE) against the previous one (squared error on log1p, ``objective="log_mse"``), same data, preset,
model and seed, on the price demo and on the Superstore table (benchmarks/outside_data.py).

    python benchmarks/bench_objective.py [--preset fast] [--model tiny] [--rows 2500]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's demos/: not in the installed kitlib
sys.path.insert(0, str(Path(__file__).resolve().parent))

from outside_data import score, superstore

from kitlib.machine.hardware import fake_profile
from kitlib.notebook import stages, training


def test_smape(data: Path, work: Path, parameters: dict[str, object], objective: str, preset: str, model: str) -> float:
    hw = fake_profile("CPU", platform="local", interactive=False)
    p = stages.params(data_dir=data, work_dir=work, preset=preset, model=model, objective=objective, **parameters)
    stages.setup(p, hw)
    stages.features(p, hw=hw, quiet=True)
    print(training.train(p, hw=hw).summary())
    training.infer(p, hw=hw)
    return score(data, work / "submission.csv")["smape"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="fast")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--rows", type=int, default=2500, help="Superstore rows")
    parser.add_argument("--only", choices=("price demo", "superstore"), help="one table (default: both)")
    args = parser.parse_args()
    from demos.price import PARAMETERS, make_price_demo

    work = Path(tempfile.mkdtemp(prefix="bench-objective-"))
    price = make_price_demo(work / "price").root
    (price / "params.json").write_text('{"target": "box_office", "metric": "smape"}')  # what score() reads
    store = superstore(work / "store", args.rows)
    store_params = json.loads((store / "params.json").read_text())
    tables = (("price demo", price, PARAMETERS), ("superstore", store, store_params))
    rows = []
    for name, data, parameters in [t for t in tables if args.only in (None, t[0])]:
        scores = {}
        for objective in ("log_mse", "auto"):
            start = time.perf_counter()
            scores[objective] = test_smape(data, work / f"{name}-{objective}", parameters, objective, args.preset,
                                           args.model)  # fmt: skip
            print(f"{name} objective={objective}: test SMAPE {scores[objective]:.2f} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)  # fmt: skip
        baseline = score(data, work / f"{name}-auto" / "submission.csv")["baseline"]
        rows.append((name, scores["log_mse"], scores["auto"], baseline))
    print(f"\n| table ({args.preset}, model {args.model}) | previous: squared error on log1p | metric's: absolute "
          "error on log1p | trivial baseline |\n| --- | --- | --- | --- |")  # fmt: skip
    for name, before, after, baseline in rows:
        print(f"| {name} | {before:.2f} | {after:.2f} | {baseline:.2f} |")


if __name__ == "__main__":
    main()
