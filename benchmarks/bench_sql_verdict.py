"""The SQL demo's 02 verdict (``baseline.compare``: the model's gain over the constant baseline with its 90% bootstrap
interval) timed on one validation split, for the kitlib on PYTHONPATH: before #50 B6 the built-in ``record_f1``, after
it the demo's ``demos.sql:record_f1`` (s16-metric2: its folder's ``sql_metric.py:record_f1``), which returns each
row's score. ``--scalar`` wraps the demo's metric to return only the mean, as a user metric without row scores would
(a metric call per bootstrap resample). Pinned, interleaved:

    python -c "from demos.sql import make_sql_demo; make_sql_demo('/tmp/sqlbench/demo')"
    for i in 1 2 3 4 5; do for tree in /work/main /work/wt-metric2; do
      PYTHONPATH=$tree taskset -c 1 env OMP_NUM_THREADS=1 python benchmarks/bench_sql_verdict.py /tmp/sqlbench/demo
    done; done
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

import kitlib
from kitlib.tasks.baseline import compare, most_common
from kitlib.tasks.metrics import METRICS, Metric, check_metric, get_metric


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="a folder make_sql_demo wrote")
    parser.add_argument("--rows", type=int, default=300, help="validation rows (the demo's 1,500 x its 20%%)")
    parser.add_argument("--scalar", action="store_true", help="the demo's metric returning only the mean")
    parser.add_argument("--check", action="store_true", help="time 00's check of every training reference instead")
    args = parser.parse_args()
    name = "record_f1" if "record_f1" in METRICS else "demos.sql:record_f1"
    if not hasattr(importlib.import_module("demos.sql"), "record_f1"):  # s16-metric2: the file the demo writer copies
        name = f"{args.data.resolve() / 'sql_metric.py'}:record_f1"
    metric = get_metric(name, "sequence", data_dir=args.data)
    if args.check:
        return check(metric, args.data)
    if args.scalar:
        metric = dataclasses.replace(metric, fn=lambda t, p, fn=metric.fn: float(np.mean(fn(t, p))))
    train = pd.read_csv(args.data / "train.csv")["query"].astype(str).to_numpy(dtype=object)
    rng = np.random.default_rng(0)
    y = train[rng.choice(len(train), args.rows, replace=False)]
    model = np.where(rng.random(args.rows) < 0.3, y, rng.permutation(y))  # 30% right, the rest another row's query
    baseline = np.full(args.rows, most_common(train), dtype=object)
    began = time.perf_counter()
    gap = compare(metric, y, model, baseline)
    seconds = time.perf_counter() - began
    tree = str(Path(kitlib.__file__).parents[1])
    shown = {"tree": tree, "metric": name + (" (scalar)" if args.scalar else ""), "rows": args.rows}
    print(json.dumps(shown | {"seconds": round(seconds, 4), "gain": gap.gain, "low": gap.low, "high": gap.high}))


def check(metric: Metric, data: Path) -> None:
    """00's check that every training reference runs: before, sql_metric.check_references; after, check_metric."""
    queries = pd.read_csv(data / "train.csv")["query"]
    began = time.perf_counter()
    if metric.name == "record_f1":
        from kitlib.tasks.sql_metric import check_references  # type: ignore[import-not-found]  # before B6 only

        check_references(queries, data / "shop.sqlite", source="train.csv")
    else:
        check_metric(metric, queries, "train.csv")
    seconds = time.perf_counter() - began
    tree = str(Path(kitlib.__file__).parents[1])
    print(json.dumps({"tree": tree, "check": metric.name, "rows": len(queries), "seconds": round(seconds, 4)}))


if __name__ == "__main__":
    main()
