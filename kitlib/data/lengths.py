"""Row lengths: percentiles, truncation, and each batching strategy's padding efficiency (kitlib's own samplers)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kitlib.data.samplers import (
    BucketSampler,
    PackingSampler,
    RandomBatchSampler,
    TokenBudgetSampler,
    as_lengths,
    packing_layout,
    round_up,
)

# lazy: pandas (+0.2 s): only the report table needs it

if TYPE_CHECKING:
    import pandas as pd

PERCENTILES = (50, 90, 95, 99)


def suggest_max_length(lengths: Sequence[int] | np.ndarray, coverage: float = 0.99, multiple_of: int = 8) -> int:
    """The smallest multiple of ``multiple_of`` that holds ``coverage`` of the rows untruncated."""
    if not 0.0 < coverage <= 1.0:
        raise ValueError(f"coverage must be in (0, 1], got {coverage}")
    arr = as_lengths(lengths)
    if arr.size == 0:
        raise ValueError("no lengths: cannot suggest a max_length for an empty dataset")
    # k-th smallest with k = ceil(coverage * n); the epsilon stops 0.99 * 100 rounding up to 100
    k = max(math.ceil(coverage * arr.size - 1e-9), 1)
    length = int(np.partition(arr, k - 1)[k - 1])
    return round_up(max(length, 1), multiple_of)


@dataclass(frozen=True)
class StrategyStats:
    name: str
    efficiency: float  # real tokens / tokens computed when each batch is padded to its longest row
    efficiency_padded: float  # the same with the width rounded up to pad_to_multiple_of (what a GPU run computes)
    batches: int
    mean_rows: float  # rows per batch


@dataclass(frozen=True)
class LengthReport:
    rows: int
    batch_size: int
    percentiles: dict[int, int]  # percentile -> tokens
    max: int
    mean: float
    max_length: int  # truncation point used for every strategy
    truncated_fraction: float  # rows longer than max_length
    pad_to_multiple_of: int
    strategies: tuple[StrategyStats, ...]
    used: str | None = None  # the strategy training batches with (TrainConfig.batching), marked in the report
    what: str = "rows"  # what was counted, in words (01: "rows of the input column 'text'; targets are never cut")

    def efficiency(self, name: str) -> float:
        return next(s.efficiency for s in self.strategies if s.name == name)

    def table(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame([vars(s) for s in self.strategies]).set_index("name").round(3)

    def __str__(self) -> str:
        pct = ", ".join(f"p{p} {v}" for p, v in self.percentiles.items())
        lines = [
            f"{self.rows} rows; tokens: mean {self.mean:.1f}, {pct}, max {self.max}",
            f"max_length {self.max_length}: {self.truncated_fraction:.2%} of rows truncated ({self.what})",
            f"padding efficiency at batch {self.batch_size} (real tokens / tokens computed; "
            f"'x{self.pad_to_multiple_of}' = width rounded up to a multiple of {self.pad_to_multiple_of}):",
        ]
        for s in self.strategies:
            used = f"  <- training batches this way (batching={s.name!r})" if s.name == self.used else ""
            lines.append(
                f"  {s.name:<13} {s.efficiency:6.3f}   x{self.pad_to_multiple_of}: {s.efficiency_padded:6.3f}   "
                f"{s.batches:6d} batches of {s.mean_rows:6.1f} rows{used}"
            )
        return "\n".join(lines)


def batch_efficiency(lengths: np.ndarray, batches: Sequence[Sequence[int]], multiple_of: int = 1) -> float:
    """Real tokens / tokens computed for these batches, each padded to its longest row (rounded up)."""
    real = computed = 0
    for batch in batches:
        lens = lengths[np.asarray(batch, dtype=np.int64)]
        real += int(lens.sum())
        computed += len(lens) * round_up(max(int(lens.max()), 1), multiple_of)
    return real / computed if computed else 1.0


def length_report(
    lengths: Sequence[int] | np.ndarray,
    batch_size: int,
    *,
    max_length: int | None = None,
    coverage: float = 0.99,
    max_tokens: int | None = None,
    pad_to_multiple_of: int = 8,
    mega_batch_factor: int = 50,
    seed: int = 0,
    used: str | None = None,
) -> LengthReport:
    """Length percentiles, truncation at ``max_length`` and each batching's padding efficiency on epoch 0."""
    raw = as_lengths(lengths)
    if raw.size == 0:
        raise ValueError("no lengths: the dataset is empty")
    max_length = suggest_max_length(raw, coverage) if max_length is None else max_length
    lens = np.minimum(raw, max_length)  # truncated rows cost max_length, whatever the strategy
    budget = batch_size * max_length if max_tokens is None else max_tokens
    samplers = {
        "dynamic": RandomBatchSampler(len(lens), batch_size, seed=seed),
        "bucket": BucketSampler(lens, batch_size, seed=seed, mega_batch_factor=mega_batch_factor, drop_last=False),
        "token_budget": TokenBudgetSampler(lens, budget, seed=seed, pad_to_multiple_of=pad_to_multiple_of),
    }
    n_fixed = -(-len(lens) // batch_size)
    fixed_eff = float(lens.sum()) / (len(lens) * max_length)
    stats = [StrategyStats("fixed", fixed_eff, fixed_eff, n_fixed, len(lens) / n_fixed)]
    for name, sampler in samplers.items():
        b = sampler.batches()
        efficiency = (batch_efficiency(lens, b), batch_efficiency(lens, b, pad_to_multiple_of))
        stats.append(StrategyStats(name, *efficiency, len(b), len(lens) / len(b)))
    tokens, per = packing_layout(lens, batch_size, max_length)  # the loader's layout: bins of tokens, per batch
    bins = PackingSampler(lens, tokens, seed=seed).batches()  # one bin each (a row)
    rows = [bins[i : i + per] for i in range(0, len(bins), per)]
    packed = float(lens.sum()) / sum(len(b) * max(int(lens[r].sum()) for r in b) for b in rows)
    stats.append(StrategyStats("packed", packed, packed, len(rows), len(lens) / len(rows)))  # padding: rows' ends
    return LengthReport(
        rows=len(raw),
        batch_size=batch_size,
        percentiles={p: int(np.percentile(raw, p, method="higher")) for p in PERCENTILES},
        max=int(raw.max()),
        mean=float(raw.mean()),
        max_length=max_length,
        truncated_fraction=float((raw > max_length).mean()),
        pad_to_multiple_of=pad_to_multiple_of,
        strategies=tuple(stats),
        used=used,
    )
