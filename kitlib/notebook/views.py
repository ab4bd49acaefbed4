"""What 02 and 03 show: the history as a table and a plot, and a summary of the predictions (no file I/O)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from kitlib.progress import THROUGHPUT, advise, figure

# lazy: matplotlib (+0.4 s): only drawing a chart needs it

if TYPE_CHECKING:
    from kitlib.engine.loop import FitResult

_LOSSES = ("train_loss", "eval_loss")


def history_table(history: pd.DataFrame) -> pd.DataFrame:
    """``history`` as a notebook shows it: 1-based epochs, 4 significant digits, empty columns dropped."""
    table = history.dropna(axis="columns", how="all").set_index("epoch")
    shown: dict[str, Any] = {}
    for name, column in table.items():
        if name == "lr":
            shown[name] = column.map(lambda v: f"{v:.1e}")
        elif pd.api.types.is_float_dtype(column):  # blank, not NaN, where the full metric's cadence skipped it
            shown[name] = column.map(figure)  # text: pandas would pad a float column to one width (0.509500)
        else:
            shown[name] = column
    return pd.DataFrame(shown, index=table.index).rename(columns=dict(THROUGHPUT))


def plot_history(result: FitResult) -> Any:
    """Train/eval loss and the monitored metric on twin axes, the kept epoch marked. Returns the matplotlib Axes."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    history = result.history
    fig, ax = plt.subplots(figsize=(7, 4))
    for name in _LOSSES:
        if name in history and history[name].notna().any():
            ax.plot(history["epoch"], history[name], marker="o", label=name.replace("_", " "))
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    monitor = result.monitor
    lines, labels = ax.get_legend_handles_labels()
    if monitor not in _LOSSES and monitor in history and history[monitor].notna().any():
        other = ax.twinx()
        scored = history.dropna(subset=[monitor])
        other.plot(scored["epoch"], scored[monitor], marker="s", color="tab:green", label=monitor)
        other.set_ylabel(monitor)
        more, names = other.get_legend_handles_labels()
        lines, labels = lines + more, labels + names
    if result.best_epoch is not None:
        best = "" if result.best_metric is None else f" {figure(result.best_metric)}"
        kept = ax.axvline(result.best_epoch, color="grey", linestyle="--")
        lines, labels = [*lines, kept], [*labels, f"kept: epoch {result.best_epoch} (best {monitor}{best})"]
    # below the axes: inside, "best" weighs only ax's own lines, and sat on the kept-epoch line or the metric's
    ax.legend(lines, labels, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2, frameon=False)
    ax.set_title(f"training history; checkpoint kept by {monitor}")
    fig.tight_layout()
    return ax


def prediction_summary(submission: pd.DataFrame, id_column: str) -> str:
    """What 03 predicted per target (top-5 class counts or quantiles); warns when every row gets the same answer."""
    lines = []
    for name in submission.columns.drop(id_column, errors="ignore"):
        column = submission[name]
        distinct = column.nunique(dropna=False)
        if distinct == 1 and len(column) > 1:
            advise(
                f"every one of the {len(column)} rows predicts {name} = {column.tolist()[0]!r}: the model learnt a "
                "constant. Check the run's metric in 02 (a smoke run is too short to learn), the target column, and "
                "the class balance of train.csv",
                stacklevel=2,
            )
        if pd.api.types.is_numeric_dtype(column) and distinct > 20:
            q = column.quantile([0.0, 0.25, 0.5, 0.75, 1.0])
            names = ("min", "q1", "median", "q3", "max")
            figures = ", ".join(f"{k} {figure(float(v))}" for k, v in zip(names, q, strict=True))
            lines.append(f"{name}: {figures} ({len(column)} rows)")
        else:
            counts = column.value_counts(dropna=False)
            pairs = zip(counts.index.tolist()[:5], counts.tolist(), strict=False)
            top = ", ".join(f"{k!r} {v} ({v / len(column):.0%})" for k, v in pairs)
            rest = f", {distinct - 5} more" if distinct > 5 else ""
            lines.append(f"{name}: {top}{rest} ({len(column)} rows, {distinct} distinct)")
    return "\n".join(lines)
