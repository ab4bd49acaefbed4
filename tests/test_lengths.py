from __future__ import annotations

import numpy as np
import pytest

from kitlib.data.lengths import batch_efficiency, length_report, suggest_max_length


def skewed_lengths(n: int = 4000, seed: int = 0) -> np.ndarray:
    """Log-normal token counts like short reviews with a long tail (median ~27, p99 ~110)."""
    return np.clip(np.random.default_rng(seed).lognormal(3.3, 0.6, n).astype(np.int64), 3, 600)


def test_suggest_max_length_covers_the_requested_fraction() -> None:
    assert suggest_max_length([10, 12, 30, 200], coverage=0.75) == 32
    assert suggest_max_length([10, 12, 30, 200], coverage=1.0) == 200
    assert suggest_max_length(list(range(1, 101)), coverage=0.99) == 104  # 99 rounded up to a multiple of 8
    assert suggest_max_length([5], multiple_of=1) == 5
    lens = skewed_lengths()
    m = suggest_max_length(lens, 0.95)
    assert m % 8 == 0 and (lens <= m).mean() >= 0.95
    with pytest.raises(ValueError, match="empty"):
        suggest_max_length([])
    with pytest.raises(ValueError, match="coverage"):
        suggest_max_length([1, 2], coverage=0)


def test_bucketing_beats_dynamic_beats_fixed_on_skewed_lengths() -> None:
    report = length_report(skewed_lengths(), batch_size=32)
    fixed, dynamic, bucket = (report.efficiency(n) for n in ("fixed", "dynamic", "bucket"))
    assert bucket > dynamic > fixed
    assert bucket >= 0.95
    assert report.efficiency("token_budget") >= 0.95
    for s in report.strategies:  # rounding widths up to a multiple of 8 can only add padding
        assert 0 < s.efficiency_padded <= s.efficiency + 1e-12 <= 1 + 1e-12


def test_report_contents_and_table() -> None:
    lens = np.array([4] * 90 + [100] * 10)
    report = length_report(lens, batch_size=10, max_length=50)
    assert report.rows == 100 and report.max == 100 and report.max_length == 50
    assert report.truncated_fraction == pytest.approx(0.10)
    assert report.percentiles[50] == 4 and report.percentiles[99] == 100
    # fixed at 50: real tokens are 90*4 + 10*50 (truncated) out of 100*50
    assert report.efficiency("fixed") == pytest.approx((360 + 500) / 5000)
    table = report.table()
    assert list(table.index) == ["fixed", "dynamic", "bucket", "token_budget", "packed"]
    assert {"efficiency", "efficiency_padded", "batches", "mean_rows"} <= set(table.columns)
    text = str(report)
    assert "bucket" in text and "10.00% of rows truncated" in text


def test_batch_efficiency_counts_padding() -> None:
    lens = np.array([2, 4, 8, 8])
    assert batch_efficiency(lens, [[0, 1], [2, 3]]) == pytest.approx(22 / 24)
    assert batch_efficiency(lens, [[0, 1], [2, 3]], multiple_of=8) == pytest.approx(22 / 32)


def test_the_report_names_the_strategy_training_uses_and_its_table_is_rounded() -> None:
    """01 prints the report once: the strategy 02 batches with marked, and a table (if shown) at 3 decimals."""
    report = length_report(np.array([4] * 90 + [100] * 10), batch_size=10, max_length=50, used="bucket")
    marked = [line for line in str(report).splitlines() if "training batches this way" in line]
    assert len(marked) == 1 and marked[0].strip().startswith("bucket") and "batching='bucket'" in marked[0]
    assert all(round(v, 3) == v for v in report.table()["efficiency"])
