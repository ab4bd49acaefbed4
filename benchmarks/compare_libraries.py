"""kitlib's own code beside the well-kept library that could replace it: same result? what does each cost?

    python benchmarks/compare_libraries.py [rouge ngrams stateful papermill launch kaggle]   # default: all

The figures are in docs/architecture.md, "Libraries we compared". Packages that are no kitlib dependency were put on
PYTHONPATH, not installed: ``pip install --no-deps --target /tmp/libs rouge-score absl-py nltk torchdata papermill
entrypoints tenacity`` then ``PYTHONPATH=$PWD:/tmp/libs``. A comparison whose package is missing says so and is skipped.
Each runs in under a minute on 2 busy cores.
"""

from __future__ import annotations

import glob
import json
import os
import pickle
import random
import subprocess
import sys
import tempfile
import time
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np


def _lines(comments_only: bool) -> list[str]:
    """Text that is here on every checkout: kitlib's own source lines (comments: prose-like)."""
    lines = [line.strip() for f in sorted(glob.glob("kitlib/**/*.py", recursive=True))
             for line in Path(f).read_text().splitlines()]  # fmt: skip
    return [line.strip(' #"') for line in lines if line.startswith("#")] if comments_only else [x for x in lines if x]


def _import_seconds(module: str, after: str = "numpy") -> float:
    """Seconds to import ``module`` in a fresh interpreter that has imported ``after`` already."""
    code = f"import time, {after}; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def rouge() -> None:
    from rouge_score import rouge_scorer

    from kitlib.tasks.metrics import rouge_l

    t_import = _import_seconds("rouge_score.rouge_scorer")
    lines, rng = _lines(True), random.Random(0)
    pairs = [(rng.choice(lines), rng.choice(lines)) for _ in range(2000)]
    pairs += [("", "a b"), ("Café naïve", "cafe naive"), ("The cat's 3 toys!", "the cats 3 toys"), ("日本語", "日本語")]
    scorer = rouge_scorer.RougeScorer(["rougeL"])
    t = time.perf_counter()
    theirs = [scorer.score(a, b)["rougeL"].fmeasure for a, b in pairs]
    t_theirs = time.perf_counter() - t
    t = time.perf_counter()
    ours = [rouge_l(np.array([a], dtype=object), np.array([b], dtype=object)) for a, b in pairs]
    t_ours = time.perf_counter() - t
    differ = sum(abs(x - y) > 1e-12 for x, y in zip(ours, theirs, strict=True))
    print(f"rouge: {len(pairs)} pairs, {differ} differ; kitlib {t_ours:.2f} s, rouge-score {t_theirs:.2f} s; "
          f"import rouge_score (nltk, absl) {t_import:.2f} s")  # fmt: skip


def ngrams(buckets: int = 2**24) -> None:
    from sklearn.feature_extraction.text import HashingVectorizer, TfidfTransformer
    from sklearn.utils import murmurhash3_32

    from kitlib.data.ngrams import _TOKEN, N_BUCKETS, NgramVectorizer

    t_import, t_ours_import = _import_seconds("sklearn.feature_extraction.text"), _import_seconds("kitlib.data.ngrams")
    lines, rng = _lines(False), random.Random(0)
    texts = [" ".join(rng.choice(lines) for _ in range(8)) for _ in range(3000)]  # 3k "reviews" of ~8 lines
    train, test = texts[:2000], texts[2000:]
    for n in (N_BUCKETS, buckets):
        t = time.perf_counter()
        bags = NgramVectorizer.fit(train, n).transform(test, max_grams=10**6)
        t_ours = time.perf_counter() - t
        t = time.perf_counter()
        hashing = HashingVectorizer(
            n_features=n, ngram_range=(1, 2), token_pattern=_TOKEN.pattern, alternate_sign=False, norm=None
        )
        theirs = TfidfTransformer(sublinear_tf=True).fit(hashing.transform(train)).transform(hashing.transform(test))
        theirs = theirs.tocsr()
        t_theirs = time.perf_counter() - t

        def same(r: int, bags: Any = bags, theirs: Any = theirs) -> bool:
            a, b = np.sort(bags.weights[r][bags.weights[r] > 0]), np.sort(theirs[r].data)
            return len(a) == len(b) and bool(np.allclose(a, b, atol=1e-6))

        def grams(text: str) -> set[str]:
            w = _TOKEN.findall(text.lower())
            return {" ".join(w[i : i + k]) for k in (1, 2) for i in range(len(w) - k + 1)}

        every = set().union(*map(grams, texts))
        crc, mur = defaultdict(set), defaultdict(set)
        for g in every:
            crc[zlib.crc32(g.encode()) % n].add(g)
            mur[abs(murmurhash3_32(g, positive=False)) % n].add(g)
        shared = {g for d in (crc, mur) for s in d.values() if len(s) > 1 for g in s}
        clean = [r for r in range(len(test)) if not grams(test[r]) & shared]
        print(f"ngrams at {n} buckets: {sum(map(same, range(len(test))))}/{len(test)} rows equal, "
              f"{sum(map(same, clean))}/{len(clean)} of the rows free of hash collisions; "
              f"fit+transform kitlib {t_ours:.2f} s, scikit-learn {t_theirs:.2f} s")  # fmt: skip
    print(f"ngrams: import sklearn.feature_extraction.text {t_import:.2f} s, kitlib.data.ngrams {t_ours_import:.2f} s")


def stateful() -> None:
    from torch.utils.data import DataLoader
    from torchdata.stateful_dataloader import StatefulDataLoader

    from kitlib.data.samplers import BucketSampler
    from kitlib.engine.batches import skip_batches

    lengths, rows = np.random.default_rng(0).integers(1, 200, 1000), list(range(1000))

    def sampler() -> BucketSampler:
        s = BucketSampler(lengths, 16, seed=3)
        s.set_epoch(2)
        return s

    full = [b.tolist() for b in DataLoader(rows, batch_sampler=sampler())]
    ours = [b.tolist() for b in skip_batches(DataLoader(rows, batch_sampler=sampler()), 20)]
    print(f"stateful: kitlib (seed, epoch, 20 batches) resume equal: {ours == full[20:]}")
    for workers in (0, 2):
        first = StatefulDataLoader(rows, batch_sampler=sampler(), num_workers=workers)
        it = iter(first)
        for _ in range(20):
            next(it)
        state = first.state_dict()
        again = StatefulDataLoader(rows, batch_sampler=sampler(), num_workers=workers)
        again.load_state_dict(state)
        print(f"stateful: torchdata workers={workers} resume equal: {[b.tolist() for b in again] == full[20:]}, "
              f"state {len(pickle.dumps(state))} bytes")  # fmt: skip


def papermill() -> None:
    """kitlib's runner injects with papermill since #50: what its Python translator writes, read back."""
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    t_import = _import_seconds("papermill.parameterize", after="nbformat")
    values = {"micro_batch_size": 8, "lr": 3e-05, "text": 'it\'s "quoted"\n', "work_dir": None, "big": float("inf")}
    nb = parameterize_notebook(load_notebook_node("notebooks/00_setup.ipynb"), values, kernel_name="python3")
    cell = next(c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", []))
    scope: dict[str, Any] = {}
    exec(cell.source, {"__builtins__": {"float": float}}, scope)
    print(f"papermill: injects at cell {nb.cells.index(cell)}; values round-trip: {scope == values}")
    print(f"papermill: import papermill.parameterize {t_import:.2f} s (after nbformat)")


def _returns_its_rank() -> dict[str, Any]:
    import torch

    return {"rank": int(os.environ["RANK"]), "weights": torch.ones(3)}


def launch() -> None:
    from accelerate import notebook_launcher

    from kitlib.machine.distributed import launch as kit_launch

    print(f"launch: kitlib launch(nprocs=2) returns {kit_launch(_returns_its_rank, nprocs=2)}")
    theirs = notebook_launcher(_returns_its_rank, num_processes=2)
    print(f"launch: accelerate notebook_launcher(num_processes=2) returns {theirs!r}")


def kaggle() -> None:
    from kitlib.cli import kernel_tool

    _problems, kaggle_loader_check = kernel_tool()._problems, kernel_tool().kaggle_loader_check

    good = {"id": "alice/kitlib-train", "title": "kitlib train", "code_file": "02_train.ipynb", "language": "python",
            "kernel_type": "notebook", "enable_internet": False, "enable_gpu": True, "machine_shape": "NvidiaTeslaT4",
            "is_private": True, "kernel_sources": ["alice/kitlib-features"]}  # fmt: skip
    mistakes = {"none": {}, "typo enable_gpus": {"enable_gpus": True}, "GPU, no machine_shape": {"machine_shape": None},
                "title/slug differ": {"title": "my training run"}, "source slug < 5": {"kernel_sources": ["alice/ab"]},
                "sources list itself": {"kernel_sources": ["alice/kitlib-train"]},
                "no enable_internet": {"enable_internet": None}}  # fmt: skip
    for name, change in mistakes.items():
        meta = {k: v for k, v in {**good, **change}.items() if v is not None}
        with tempfile.TemporaryDirectory() as d:
            Path(d, "kernel-metadata.json").write_text(json.dumps(meta))
            Path(d, "02_train.ipynb").write_text('{"cells": []}')
            print(f"kaggle: mistake {name!r}: kaggle's own loader {kaggle_loader_check(Path(d))['status']}, "
                  f"kitlib {len(_problems(meta, Path(d)))} problem(s)")  # fmt: skip


COMPARISONS = {"rouge": rouge, "ngrams": ngrams, "stateful": stateful, "papermill": papermill, "launch": launch,
               "kaggle": kaggle}  # fmt: skip

if __name__ == "__main__":
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for name in sys.argv[1:] or COMPARISONS:
        try:
            COMPARISONS[name]()
        except ModuleNotFoundError as err:
            print(f"{name}: skipped, {err.name} is not installed (see this file's docstring)")
