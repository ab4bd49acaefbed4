"""Two checkouts' feature caches side by side: import time of ``kitlib.data.cache`` and one build + one hit of the
demo's token and embedding features, each sample in a fresh process, the checkouts interleaved, medians.

    taskset -c 1 env OMP_NUM_THREADS=1 python benchmarks/ab_cache.py /work/main /path/to/this/checkout --runs 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

IMPORT = "import time; t = time.perf_counter(); import kitlib.data.cache; print(time.perf_counter() - t)"
BUILD_HIT = """
import json, sys, tempfile, time
import pandas as pd
from demos.reviews import make_demo
from kitlib.data.cache import Cache
from kitlib.data.featurize import embed_texts, tokenize_texts
from kitlib.models.loading import load_text_encoder
texts = pd.read_csv(make_demo(sys.argv[1]).train)["text"].tolist()
tok, model, _ = load_text_encoder(train_texts=texts, tiny=True)
root, out = tempfile.mkdtemp(), {}
for run in ("build", "hit"):
    cache = Cache(root, log=None)
    t = time.perf_counter()
    tokenize_texts(texts, tok, max_length=128, cache=cache)
    out[f"tokens_{run}"] = time.perf_counter() - t
    t = time.perf_counter()
    embed_texts(texts[:2000], tok, model, batch_size=64, max_length=128, cache=cache)
    out[f"embed2k_{run}"] = time.perf_counter() - t
    assert (cache.stats.hits, cache.stats.misses) == ((2, 0) if run == "hit" else (0, 2)), cache.stats
print(json.dumps(out))
"""


def sample(checkout: str, code: str, *args: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": checkout}
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=checkout, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{checkout}: {out.stderr[-2000:]}")
    last = out.stdout.strip().splitlines()[-1]
    return json.loads(last) if last.startswith("{") else {"import_s": float(last)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    demo = tempfile.mkdtemp()
    got: dict[str, dict[str, list[float]]] = {args.before: {}, args.after: {}}
    for i in range(args.runs):
        for checkout in (args.before, args.after) if i % 2 == 0 else (args.after, args.before):
            for code in (IMPORT, BUILD_HIT):
                for name, value in sample(checkout, code, demo).items():
                    got[checkout].setdefault(name, []).append(value)
    print(f"| measure (median of {args.runs}, seconds) | before | after | after/before |")
    print("| --- | --- | --- | --- |")
    for name in got[args.before]:
        b, a = statistics.median(got[args.before][name]), statistics.median(got[args.after][name])
        print(f"| {name} | {b:.3f} | {a:.3f} | {a / b:.2f} |")


if __name__ == "__main__":
    main()
