"""Hashed word n-grams with tf-idf weights (crc32 buckets, no vocabulary) in fixed-width rows for EmbeddingBag."""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

N_BUCKETS = 2**18  # 262k buckets x num_labels weights; ~100k distinct uni+bigrams in the demo: few collisions
MAX_GRAMS = 512  # per row; longer rows keep their highest-weighted grams (bounds memory at rows x 512 x 12 bytes)
_TOKEN = re.compile(r"\w+|[^\w\s]")  # words (any script) and single punctuation marks ("!" carries sentiment)


@dataclass(frozen=True)
class NgramBags:
    ids: npt.NDArray[np.int64]  # [rows, width] bucket ids, 0 where padded
    weights: npt.NDArray[np.float32]  # [rows, width] tf-idf weights with unit L2 norm per row, 0 where padded
    n_buckets: int

    def __len__(self) -> int:
        return len(self.ids)


def hashed_grams(text: str, n_buckets: int = N_BUCKETS, max_n: int = 2) -> npt.NDArray[np.int64]:
    """Bucket ids of the lower-cased word 1..max_n-grams of one text, one entry per occurrence."""
    words = _TOKEN.findall(text.lower())
    grams = [" ".join(words[i : i + n]) for n in range(1, max_n + 1) for i in range(len(words) - n + 1)]
    return np.fromiter((zlib.crc32(g.encode()) % n_buckets for g in grams), dtype=np.int64, count=len(grams))


@dataclass(frozen=True)
class NgramVectorizer:
    """Inverse document frequencies learnt from the training texts; ``transform`` weights any texts with them."""

    idf: npt.NDArray[np.float64]  # [n_buckets], smoothed: log((1 + docs) / (1 + df)) + 1, as scikit-learn's
    max_n: int = 2

    @property
    def n_buckets(self) -> int:
        return len(self.idf)

    @classmethod
    def fit(cls, texts: Sequence[str], n_buckets: int = N_BUCKETS, max_n: int = 2) -> NgramVectorizer:
        if n_buckets < 1 or max_n < 1:
            raise ValueError(f"n_buckets and max_n must be >= 1, got {n_buckets}, {max_n}")
        df = np.zeros(n_buckets)
        for text in texts:
            df[np.unique(hashed_grams(text, n_buckets, max_n))] += 1
        return cls(np.log((1 + len(texts)) / (1 + df)) + 1, max_n)

    def transform(self, texts: Sequence[str], max_grams: int = MAX_GRAMS) -> NgramBags:
        rows = [self._row(text, max_grams) for text in texts]
        width = max((len(ids) for ids, _ in rows), default=0) or 1
        ids = np.zeros((len(rows), width), dtype=np.int64)
        weights = np.zeros((len(rows), width), dtype=np.float32)
        for r, (row_ids, row_weights) in enumerate(rows):
            ids[r, : len(row_ids)] = row_ids
            weights[r, : len(row_ids)] = row_weights
        return NgramBags(ids, weights, self.n_buckets)

    def _row(self, text: str, max_grams: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        buckets, counts = np.unique(hashed_grams(text, self.n_buckets, self.max_n), return_counts=True)
        weights = (1 + np.log(counts)) * self.idf[buckets]  # sublinear tf: the 5th "great" adds less than the 1st
        if len(buckets) > max_grams:
            keep = np.argsort(-weights, kind="stable")[:max_grams]
            buckets, weights = buckets[keep], weights[keep]
        norm = float(np.sqrt((weights**2).sum()))
        return buckets, weights / norm if norm > 0 else weights
