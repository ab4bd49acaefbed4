"""What 02 and 03 show (kitlib.notebook.views), the Params summary, and the notebooks' names."""

from __future__ import annotations

import ast
import json
import types
from pathlib import Path

import pandas as pd
import pytest

from kitlib.notebook import views
from kitlib.notebook.params import Params
from kitlib.notebook.runbook import NOTEBOOKS, notebooks_dir


def _history() -> pd.DataFrame:
    return pd.DataFrame({
        "epoch": [1, 2, 3], "train_loss": [0.693147, 0.512345678, 0.40000123], "eval_loss": [0.6, 0.55, 0.58],
        "accuracy": [float("nan"), 0.712345, 0.70111], "lr": [2e-5, 1.23456e-5, 0.0],
        "samples_per_s": [405.123456, 1423.987654, 21.262387], "tokens_per_s": [14379.0, 16711.0, 0.0056284],
        "never": [float("nan")] * 3,
    })  # fmt: skip


def test_history_table_is_rounded_with_1_based_epochs_and_no_other_index() -> None:
    table = views.history_table(_history())
    assert table.index.name == "epoch" and table.index.tolist() == [1, 2, 3]  # the index is the epoch itself
    assert "epoch" not in table.columns and "never" not in table.columns
    # at most 4 significant digits, as text: a float column was padded to one width (0.509500) and 14379.0 kept 5
    assert table["train_loss"].tolist() == ["0.6931", "0.5123", "0.4"]
    assert table["samples/s"].tolist() == ["405.1", "1424", "21.26"]  # the bar's and the doctor's name
    assert table["tokens/s"].tolist() == ["14380", "16710", "0.005628"]
    assert table["lr"].tolist() == ["2.0e-05", "1.2e-05", "0.0e+00"]
    assert table["accuracy"].tolist() == ["", "0.7123", "0.7011"]  # not measured in epoch 1: blank, not NaN


def test_the_plot_puts_both_losses_on_one_axis_and_marks_the_kept_epoch() -> None:
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    result = types.SimpleNamespace(history=_history(), monitor="accuracy", best_epoch=2, best_metric=0.712345)
    ax = views.plot_history(result)  # type: ignore[arg-type]
    labels = [line.get_label() for line in ax.get_lines()]
    assert {"train loss", "eval loss"} <= set(labels)  # one axis for both
    kept = [line for line in ax.get_lines() if list(line.get_xdata()) == [2, 2]]
    assert kept, "the kept epoch is marked"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "kept: epoch 2 (best accuracy 0.7123)" in legend and "accuracy" in legend
    assert all(float(t).is_integer() for t in ax.get_xticks())  # whole epochs, never 1.2
    ax.figure.canvas.draw()
    renderer = ax.figure.canvas.get_renderer()  # type: ignore[attr-defined]
    # below the plot: "best" placed it over the kept-epoch line (it weighs only the loss axis' own lines)
    assert ax.get_legend().get_window_extent(renderer).y1 <= ax.get_window_extent(renderer).y0


def test_prediction_summary_counts_and_warns_when_every_row_gets_one_answer() -> None:
    varied = pd.DataFrame({"id": range(6), "label": ["pos", "neg", "pos", "pos", "neg", "pos"]})
    assert views.prediction_summary(varied, "id") == "label: 'pos' 4 (67%), 'neg' 2 (33%) (6 rows, 2 distinct)"
    numbers = pd.DataFrame({"id": range(101), "price": [float(i) for i in range(101)]})
    assert views.prediction_summary(numbers, "id").startswith("price: min 0, q1 25, median 50")
    constant = pd.DataFrame({"id": range(2581), "label": [1] * 2581})
    with pytest.warns(UserWarning, match="every one of the 2581 rows predicts label = 1"):
        views.prediction_summary(constant, "id")


def test_params_show_a_short_summary_not_the_dataclass_repr() -> None:
    p = Params(data_dir=Path("/data/comp"), work_dir=Path("/work"), numeric=("year",), task="tabular-text")
    text = repr(p)
    assert "PosixPath(" not in text and len(text.splitlines()) <= 6
    assert "preset balanced" in text and "/data/comp" in text and "numeric ['year']" in text


def _assigned(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def test_notebook_cells_never_reuse_a_parameters_name() -> None:
    # In one kernel (Kaggle's single kernel, or re-running 00 after 02) a cell that reassigns a parameter changes
    # what 00's setup cell reads: 02's plot once set metric = [...], and 00 then refused it.
    cells = {n: json.loads((notebooks_dir() / n).read_text())["cells"] for n in NOTEBOOKS}
    code = {n: [c for c in cs if c["cell_type"] == "code"] for n, cs in cells.items()}
    tagged = [c for cs in code.values() for c in cs if "parameters" in c["metadata"].get("tags", [])]
    parameters = {n for c in tagged for n in _assigned("".join(c["source"]))}
    assert {"metric", "data_dir", "preset", "work_dir"} <= parameters
    # The install cell alone may move the three paths: on Colab it replaces the Kaggle defaults by Drive folders (the
    # same folders in every notebook, so a second run of it changes nothing).
    colab = {"data_dir", "work_dir", "wheels_dir"}

    def reuses(cell: dict) -> set[str]:  # type: ignore[type-arg]
        tags = cell["metadata"].get("tags", [])
        return (
            set()
            if "parameters" in tags
            else _assigned("".join(cell["source"])) & parameters - (colab if "install" in tags else set())
        )

    reused = {(name, sorted(reuses(c)).__repr__()) for name, cs in code.items() for c in cs if reuses(c)}
    assert reused == set()


def test_one_throughput_figure_under_one_name_in_the_bar_the_history_and_the_doctor(cpu_hw, tmp_path: Path) -> None:
    """Samples and real tokens per second of each epoch's training wall time: the bar ends each epoch on the figures
    02's history table shows for it, and the doctor (on the result and on the run folder) says the same figures by
    epoch (a slow first step makes an instantaneous rate, the epoch's and the run's all different)."""
    import time
    from unittest import mock

    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    import kitlib
    from kitlib import TrainConfig, fit
    from kitlib.engine.events import Callback, StepEnd

    class SlowFirstStep(Callback):
        def on_fit_start(self, loop: object) -> None:
            self.loop = loop

        def on_step_end(self, step: StepEnd) -> None:
            if self.loop.state.epoch == 0 and self.loop.state.batch_in_epoch == 1:  # type: ignore[attr-defined]
                time.sleep(0.2)

    class Bar:  # a stand-in for tqdm that records the postfix each epoch ended on (the refreshed one)
        n, ends = 0, []

        def update(self, k: int = 1) -> None: ...

        def set_postfix(self, postfix: dict[str, str], refresh: bool = True) -> None:
            if refresh:
                self.ends.append(dict(postfix))

        def close(self) -> None: ...

    g = torch.Generator().manual_seed(0)
    rows = [
        {"x": torch.randn(4, generator=g), "attention_mask": (torch.arange(6) < 2 + i % 5).long()} for i in range(64)
    ]
    loader = DataLoader(rows, batch_size=8)  # dict batches with masks: real tokens counted
    cfg = TrainConfig(epochs=2, micro_batch_size=8, lr=1e-2, precision="fp32", log_every_steps=3)
    bar = Bar()
    with mock.patch("kitlib.engine.policies.progress_bar", return_value=bar), \
            mock.patch("kitlib.engine.policies.close_as_done"):  # fmt: skip
        result = fit(
            nn.Linear(4, 1), loader, config=cfg, loss_fn=lambda m, b: m(b["x"]).pow(2).mean(), hw=cpu_hw,
            callbacks=[SlowFirstStep()], run_dir=tmp_path / "run",
        )  # fmt: skip
    table = views.history_table(result.history)
    assert [{k: e[k] for k in ("samples/s", "tokens/s")} for e in bar.ends] == table[["samples/s", "tokens/s"]].to_dict(
        "records"
    )
    said = f"throughput by epoch: {', '.join(table['samples/s'])} samples/s; {', '.join(table['tokens/s'])} tokens/s"
    assert said in str(kitlib.diagnose(result)) and said in str(kitlib.diagnose(tmp_path / "run"))
    assert len(set(table["samples/s"])) == 2  # the slow first step: two different figures, both said


def test_notebooks_show_each_thing_once() -> None:
    """00 does not reprint the picker's summary, 01 not the length report as a second table, 02 not the doctor's
    findings as a table that truncates the text it just printed."""
    code = {
        n: "\n".join("".join(c["source"]) for c in json.loads((notebooks_dir() / n).read_text())["cells"])
        for n in NOTEBOOKS
    }
    setup, features, train = (code[n] for n in NOTEBOOKS[:3])
    assert "run.summary()" not in setup and "picker" in setup
    assert "print(feats.report)" in features and "\nfeats.report.table()" not in features
    assert "print(report)" in train and "\nreport.table()" not in train


def test_the_two_embedding_bars_say_train_and_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """The head regime embeds train then test in 01: each bar is named for its rows."""
    import numpy as np

    from kitlib.notebook.tasks import base
    from kitlib.notebook.tasks.base import Encoder, Task

    bars: list[object] = []

    def embed(texts: list[str], **kw: object) -> np.ndarray:
        bars.append(kw["progress"])
        return np.zeros((len(texts), 4), dtype=np.float32)

    monkeypatch.setattr(base, "embed_texts", embed)  # the head regime's own name for it
    run = types.SimpleNamespace(
        preset=types.SimpleNamespace(precision="fp32", regime="head"), config=types.SimpleNamespace(precision="fp32")
    )
    model = types.SimpleNamespace(config=types.SimpleNamespace(num_hidden_layers=6))
    from kitlib.machine.hardware import fake_profile

    encoder = Encoder(None, model, 16, run, fake_profile("CPU", interactive=False), None, progress=True)  # type: ignore[arg-type]
    Task().extra(["a good film", "dull"], ["fine"], encoder)
    assert bars == ["embed train", "embed test"]


def test_every_bar_names_its_rate_samples_per_s(cpu_hw, tmp_path, capsys) -> None:
    """tqdm's own rate reads "it/s": on the training bar (which counts optimizer steps) a second throughput figure
    beside its samples/s, on the embedding and predict bars (which count rows) the same figure under another name
    (and in tqdm's 3 digits, not ``figure``'s 4). Every bar shows ``throughput``'s samples/s in its postfix."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from kitlib import TrainConfig, fit
    from kitlib.progress import advance, progress_bar

    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    cfg = TrainConfig(epochs=1, micro_batch_size=8, lr=1e-2, precision="fp32", log_every_steps=1)
    fit(
        nn.Linear(4, 1), loader, config=cfg, loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]),
        hw=cpu_hw, run_dir=tmp_path / "run",
    )  # fmt: skip
    rows = progress_bar(10, desc="predict", interactive=False, headless_interval_s=0)
    advance(rows, 10)
    rows.close()
    shown = capsys.readouterr().out
    train, predict = shown.split("\rpredict", 1)
    assert "samples/s=" in train and "samples/s=" in predict  # each bar's in its postfix
    assert "it/s" not in shown


def test_the_bar_ends_each_epoch_on_its_history_rows_throughput(cpu_hw, tmp_path: Path) -> None:
    """With log_every_steps larger than one, the last log step comes before the epoch's tail; the bar's figure must
    still end the epoch as the history row records it (one throughput figure, whatever the log cadence)."""
    import time
    from unittest import mock

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from kitlib import TrainConfig, fit

    postfixes: list[dict[str, str]] = []

    class Bar:  # a stand-in for tqdm that records what the bar showed
        n = 0

        def update(self, k: int = 1) -> None:
            time.sleep(0.01)  # each step's tail: after the last log step, the two figures would differ

        def set_postfix(self, postfix: dict[str, str], refresh: bool = True) -> None:
            postfixes.append(dict(postfix))

        def close(self) -> None: ...

    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    cfg = TrainConfig(epochs=2, micro_batch_size=8, lr=1e-2, precision="fp32", log_every_steps=3)
    with mock.patch("kitlib.engine.policies.progress_bar", return_value=Bar()), \
            mock.patch("kitlib.engine.policies.close_as_done"):  # fmt: skip
        result = fit(
            nn.Linear(4, 1), loader, config=cfg, loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]),
            hw=cpu_hw, run_dir=tmp_path / "run",
        )  # fmt: skip
    from kitlib.progress import figure

    shown = [p["samples/s"] for p in postfixes]  # as displayed: figure() keeps fewer digits above 1,000
    rows = [figure(r) for r in result.history["samples_per_s"]]
    assert len(rows) == 2 and all(r in shown for r in rows), (shown, rows)
    assert shown[-1] == rows[-1]  # the bar's last word is the last row's figure


def test_a_warning_for_a_person_shows_no_temporary_file_path() -> None:
    """03's warnings read `/tmp/ipykernel_NNN/123.py:1: UserWarning: ...` plus the echoed cell line."""
    import subprocess
    import sys

    code = "import pandas as pd\nfrom kitlib.notebook import views\n" + (
        "views.prediction_summary(pd.DataFrame({'id': range(3), 'label': [1, 1, 1]}), 'id')"
    )
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    assert shown.startswith("UserWarning: every one of the 3 rows predicts label = 1") and ".py:" not in shown
    assert "prediction_summary(" not in shown  # no echoed source line


def test_the_training_bars_remaining_time_converges_on_the_runs_end() -> None:
    """02's bar counts optimizer steps over the whole run: its remaining time (elapsed + remaining = the end it
    predicts) follows the run's average pace, the evals between epochs included, so after the first epoch it is
    within 25% of the real end and in the last epoch within 10%. 4 epochs of 25 one-second steps, a 10 s eval
    after each of the first three: the run ends at 130 s."""
    import re

    from tqdm import tqdm

    from kitlib.progress import progress_bar

    clock = [0.0]
    bar = progress_bar(100, desc="train", interactive=False, headless_interval_s=0)
    bar._time = lambda: clock[0]  # type: ignore[attr-defined]
    bar.start_t = bar.last_print_t = 0.0
    ends = []
    for step in range(1, 101):
        clock[0] += 1.0 + (10.0 if step in (26, 51, 76) else 0.0)  # the eval before this epoch's first step
        bar.update(1)
        text = tqdm.format_meter(**bar.format_dict)
        minutes, seconds = map(int, re.search(r"<(\d+):(\d+)", text).groups())  # type: ignore[union-attr]
        ends.append(clock[0] + 60 * minutes + seconds)
    bar.close()
    assert all(abs(end / 130 - 1) <= 0.25 for end in ends[25:]), ends
    assert all(abs(end / 130 - 1) <= 0.10 for end in ends[75:]), ends
