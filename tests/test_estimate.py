"""The picker's estimate of a whole run (kitlib.notebook.estimate.estimate_run), against the run it estimates."""

from __future__ import annotations

import dataclasses

import pytest

from kitlib.machine.hardware import fake_profile
from kitlib.notebook import presets
from kitlib.notebook.estimate import estimate_run
from kitlib.notebook.widgets import preset_picker

CPU = dataclasses.replace(fake_profile("CPU", interactive=False), cpu_count=2)
LENGTHS = [30] * 4000


def test_the_estimate_covers_features_training_and_inference_where_each_regime_does_the_work() -> None:
    """The head regime runs the encoder over train and test rows in 01; fine-tuning trains it in 02 and runs it over
    the test rows in 03. Each part grows with the rows it processes and nothing else."""
    fast = presets.resolve("fast", CPU, lengths=LENGTHS)
    small, more_test = estimate_run(fast, 4000, 1000, CPU), estimate_run(fast, 4000, 3000, CPU)
    assert more_test.features_s > small.features_s and more_test.infer_s == small.infer_s
    assert small.features_s > 5 * (small.train_s + small.infer_s)  # the embedding pass is the head's cost

    balanced = presets.resolve("balanced", CPU, lengths=LENGTHS)
    small, more_test = estimate_run(balanced, 4000, 1000, CPU), estimate_run(balanced, 4000, 3000, CPU)
    assert more_test.infer_s > small.infer_s and more_test.train_s == small.train_s
    assert small.train_s > 5 * small.features_s  # fine-tuning's cost is training
    more_rows = estimate_run(balanced, 8000, 1000, CPU)
    assert 1.8 < (more_rows.train_s - 2) / (small.train_s - 2) < 2.2  # twice the rows, twice the epochs' work
    assert small.total_s == pytest.approx(small.features_s + small.train_s + small.infer_s)

    smoke = presets.resolve("smoke", CPU, lengths=LENGTHS)  # at most 256 training rows, every test row
    assert estimate_run(smoke, 4000, 1000, CPU).train_s == estimate_run(smoke, 40000, 1000, CPU).train_s


def test_the_picker_shows_the_whole_run_with_test_rows() -> None:
    picker = preset_picker(CPU, default="fast", n_rows=4000, n_test=1000, lengths=LENGTHS, show=False)
    text = picker.estimate_text()
    assert text == estimate_run(picker.resolved, 4000, 1000, CPU).text()
    assert text.startswith("~") and "for the whole run: 01 embedding pass" in text and "1000 test rows" in text
    assert "02 training" in text and "03 predict" in text
    assert "for the whole run" in repr(picker)


# Against the real run: benchmarks/bench_estimate.py prints estimate/measured per task and preset (a ratio, on a
# machine whose load it states); a timed assertion here failed whenever the machine was busy.
