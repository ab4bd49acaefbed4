"""Padding efficiency of fixed / dynamic / bucket / token-budget batching on the demo's training set.

    python -m kitlib demo /tmp/demo && python -m benchmarks.bench_padding /tmp/demo [--batch-size 32]

Lengths are real token counts from the demo model's tokenizer (all-MiniLM-L6-v2 when installed, else the tiny
fallback's WordPiece). Goal: bucketing >= 0.95 at batch 32.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from kitlib.data.lengths import length_report
from kitlib.data.tables import read_table
from kitlib.models.loading import load_text_classifier


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("demo_dir", type=Path)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=None, help="default: 99%% coverage, multiple of 8")
    args = parser.parse_args()

    df = read_table(args.demo_dir / "train.csv", text="text", target="label", id="id")
    tokenizer, _, identity = load_text_classifier(2, train_texts=df["text"])
    start = time.perf_counter()
    ids = tokenizer(df["text"].tolist(), truncation=True, max_length=tokenizer.model_max_length)["input_ids"]
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    elapsed = time.perf_counter() - start
    print(f"tokenizer: {identity}; {len(df)} rows tokenised in {elapsed:.2f} s")
    report = length_report(lengths, args.batch_size, max_length=args.max_length)
    print(report)
    model_max = int(min(tokenizer.model_max_length, 4096))
    naive = float(np.minimum(lengths, model_max).sum()) / (len(lengths) * model_max)
    print(f"  (padding='max_length' to the model's {model_max} tokens: {naive:.3f})")
    bucket = report.efficiency("bucket")
    print(f"bucket efficiency {bucket:.3f} ({'meets' if bucket >= 0.95 else 'MISSES'} the 0.95 goal)")
    return 0 if bucket >= 0.95 else 1


if __name__ == "__main__":
    sys.exit(main())
