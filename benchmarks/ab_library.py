"""Two checkouts' feature cache and checkpoints side by side (#50 A3/A4): lines, import time, one cache miss + hit of
the demo's features, one checkpoint save + load (synchronous and background); each sample in a fresh process, the
checkouts interleaved, medians. Then the libraries not taken, measured in the after checkout.

    taskset -c 1 env OMP_NUM_THREADS=1 python benchmarks/ab_library.py /tmp/before /work/wt-library --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

FILES = ("kitlib/data/cache.py", "kitlib/data/fingerprint.py", "kitlib/data/arrays.py", "kitlib/_files.py",
         "kitlib/engine/checkpoint.py")  # fmt: skip
IMPORT = (
    "import time, importlib; t = time.perf_counter(); importlib.import_module({m!r}); print(time.perf_counter() - t)"
)
CACHE = """
import json, sys, tempfile, time
import pandas as pd
from demos.reviews import make_demo
from kitlib.data.cache import Cache
from kitlib.data.featurize import embed_texts, tokenize_texts
from kitlib.models.loading import load_text_encoder
texts = pd.read_csv(make_demo(sys.argv[1]).train)["text"].tolist()
tok, model, _ = load_text_encoder(train_texts=texts, tiny=True)
root, out = tempfile.mkdtemp(), {}
for run in ("miss", "hit"):
    cache = Cache(root, log=None)
    t = time.perf_counter()
    tokenize_texts(texts, tok, max_length=128, cache=cache)
    embed_texts(texts[:500], tok, model, batch_size=64, max_length=128, cache=cache)
    out[f"cache_{run}_s"] = time.perf_counter() - t
print(json.dumps(out))
"""
# A 28 MB model (7M fp32 weights) with AdamW's two moments and the RNG: what fit() writes to last/.
CHECKPOINT = """
import json, tempfile, time
from pathlib import Path
import torch
from kitlib.engine import checkpoint as ck
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(7)])
opt = torch.optim.AdamW(model.parameters())
model(torch.randn(4, 1024)).sum().backward()
opt.step()
root, out = Path(tempfile.mkdtemp()), {}
state = {"optimizer": opt.state_dict(), "rng": ck.rng_state(), "step": 1}
t = time.perf_counter()
ck.write(ck.snapshot(model, state=state, meta={"step": 1}), root / "sync")
out["ckpt_save_sync_s"] = time.perf_counter() - t
t = time.perf_counter()
snap = ck.load(root / "sync")
ck.restore_model(model, snap)
out["ckpt_load_s"] = time.perf_counter() - t
writer = ck.BackgroundWriter()
t = time.perf_counter()
writer.submit(ck.snapshot(model, state=state, meta={"step": 2}), root / "bg")
out["ckpt_bg_submit_s"] = time.perf_counter() - t  # what the training thread waits for
writer.close()
out["ckpt_bg_total_s"] = time.perf_counter() - t
back = ck.load(root / "bg").weights
assert all(torch.equal(t, back[k]) for k, t in model.state_dict().items())  # bit-exact
print(json.dumps(out))
"""


def sample(checkout: str, code: str, *args: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": checkout}
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=checkout, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{checkout}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def lines(checkout: str) -> dict[str, float]:
    return {f"lines {Path(f).name}": len((Path(checkout) / f).read_text().splitlines()) for f in FILES}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    demo = tempfile.mkdtemp()
    got: dict[str, dict[str, list[float]]] = {
        c: {k: [v] for k, v in lines(c).items()} for c in (args.before, args.after)
    }
    codes = [IMPORT.format(m=m) for m in ("kitlib.data.cache", "kitlib.engine.checkpoint")] + [CACHE, CHECKPOINT]
    for i in range(args.runs):
        for checkout in (args.before, args.after) if i % 2 == 0 else (args.after, args.before):
            for n, code in enumerate(codes):
                value = sample(checkout, code, demo)
                named = value if isinstance(value, dict) else {f"import {('cache', 'checkpoint')[n]}_s": value}
                for name, v in named.items():
                    got[checkout].setdefault(name, []).append(v)
        print(f"| measure (median of {i + 1}) | before | after | after/before |")  # after each run: a partial table
        print("| --- | --- | --- | --- |")
        for name in got[args.before]:
            b, a = statistics.median(got[args.before][name]), statistics.median(got[args.after][name])
            print(f"| {name} | {b:.3f} | {a:.3f} | {a / b:.2f} |", flush=True)


if __name__ == "__main__":
    main()
