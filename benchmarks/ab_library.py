"""Two checkouts' feature cache and checkpoints side by side (#50 A3/A4): lines, import time, one cache build + hit
of the demo's features (ab_cache.py's script), one checkpoint save + load (synchronous and background); each sample in
a fresh process, the checkouts interleaved, medians. The libraries not taken: benchmarks/library_reasons.py.

    taskset -c 1 env OMP_NUM_THREADS=1 python benchmarks/ab_library.py /tmp/before /work/wt-library --runs 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from ab_cache import BUILD_HIT, sample  # the cache's build + hit script, and the fresh-process sampler

FILES = ("kitlib/data/cache.py", "kitlib/data/fingerprint.py", "kitlib/data/arrays.py", "kitlib/_files.py",
         "kitlib/engine/checkpoint.py")  # fmt: skip
IMPORT = (
    "import time, importlib; t = time.perf_counter(); importlib.import_module({m!r}); print(time.perf_counter() - t)"
)
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
    codes = [IMPORT.format(m=m) for m in ("kitlib.data.cache", "kitlib.engine.checkpoint")] + [BUILD_HIT, CHECKPOINT]
    for i in range(args.runs):
        for checkout in (args.before, args.after) if i % 2 == 0 else (args.after, args.before):
            for n, code in enumerate(codes):
                named = sample(checkout, code, demo)
                if "import_s" in named:  # ab_cache's name for an import time: say which module
                    named = {f"import {('cache', 'checkpoint')[n]}_s": named["import_s"]}
                for name, v in named.items():
                    got[checkout].setdefault(name, []).append(v)
        print(f"| measure (median of {i + 1}) | before | after | after/before |")  # after each run: a partial table
        print("| --- | --- | --- | --- |")
        for name in got[args.before]:
            b, a = statistics.median(got[args.before][name]), statistics.median(got[args.after][name])
            print(f"| {name} | {b:.3f} | {a:.3f} | {a / b:.2f} |", flush=True)


if __name__ == "__main__":
    main()
