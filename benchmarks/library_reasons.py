"""Why the feature cache and checkpoints do not sit on joblib.Memory / accelerate.save_state (#50 A3/A4): each reason
measured here, medians of ``--runs`` interleaved samples, in this checkout.

    taskset -c 1 env OMP_NUM_THREADS=1 python benchmarks/library_reasons.py --runs 5
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import joblib
import pandas as pd
import torch
from accelerate import Accelerator

from demos.reviews import make_demo
from kitlib.data.cache import Cache, cached, fingerprint
from kitlib.engine import checkpoint as ck


def first_line(path: str) -> str:
    return Path(path).read_text().splitlines()[0]


class Planted:
    def __init__(self, proof: Path) -> None:
        self.proof = proof

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.proof,))  # unpickling this creates ``proof``: code from the cache folder ran


def stale_and_pickle(root: Path) -> dict[str, Any]:
    """joblib.Memory keys a str path by its name (a changed file is a stale hit) and loads entries by unpickling."""
    data = root / "train.csv"
    data.write_text("a\n")
    memory = joblib.Memory(root / "joblib", verbose=0)
    first_line_joblib = memory.cache(first_line)
    kit = Cache(root / "kit", log=None)
    before = first_line_joblib(str(data)), cached(first_line, str(data), cache=kit)
    data.write_text("b\n")
    after = first_line_joblib(str(data)), cached(first_line, str(data), cache=kit)
    for out in (root / "joblib").rglob("output.pkl"):  # a seed folder someone else published
        out.write_bytes(pickle.dumps(Planted(root / "proof")))
    first_line_joblib(str(data))
    return {"before": before, "after a change (joblib, kitlib)": after, "planted pickle ran": (root / "proof").exists()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp())
    texts = pd.read_csv(make_demo(root / "demo").train)["text"].tolist()
    print(stale_and_pickle(root))

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(7)])
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 1024)).sum().backward()
    opt.step()
    accelerator = Accelerator(cpu=True)
    a_model, a_opt = accelerator.prepare(model, opt)
    writer = ck.BackgroundWriter()
    times: dict[str, list[float]] = {}

    def timed(name: str, fn: Any) -> None:
        t = time.perf_counter()
        fn()
        times.setdefault(name, []).append(time.perf_counter() - t)

    state = {"optimizer": opt.state_dict(), "rng": ck.rng_state(), "step": 1}
    for i in range(args.runs):
        steps = [
            ("hash texts: joblib.hash", lambda: joblib.hash(texts)),
            ("hash texts: kitlib fingerprint", lambda: fingerprint(texts)),
            ("training thread: accelerate save_state", lambda i=i: accelerator.save_state(root / f"acc{i}")),
            ("training thread: kitlib submit", lambda: writer.submit(ck.snapshot(model, state=state), root / "ckpt")),
        ]
        for name, fn in steps if i % 2 == 0 else steps[::-1]:
            timed(name, fn)
        writer.wait()
    writer.close()
    del a_model, a_opt
    print(f"| measure (median of {args.runs}, s) | value |")
    print("| --- | --- |")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.3f} |")


if __name__ == "__main__":
    main()
