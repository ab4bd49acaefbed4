"""Progress bars that suit where they run.

Interactive notebooks get a widget bar (tqdm.auto). Headless runs (nbconvert, papermill, Kaggle "Save & Run All",
CI) get a plain-text bar redrawn at most every ``headless_interval_s``: every redraw becomes a saved output line
there, and an unthrottled bar turns an executed notebook into megabytes of progress (cmip6-cookbook#83).
"""

from __future__ import annotations

import math
import sys
import warnings
from types import MappingProxyType
from typing import Any

from tqdm import tqdm

# The history's throughput columns and the one name every display gives them (the bar, 02's table, the doctor):
# samples (real tokens, no padding) per second of training wall time, evals and checkpoints between epochs left
# out: the epoch's so far in the bar, each epoch's in the history, all epochs' together in the doctor.
THROUGHPUT = MappingProxyType({"samples_per_s": "samples/s", "tokens_per_s": "tokens/s"})


def advise(message: str, category: type[Warning] = UserWarning, stacklevel: int = 1) -> None:
    """``warnings.warn`` for a warning a person reads in a notebook, shown as ``UserWarning: message`` alone: by
    default Python prefixes the caller's file, which in a notebook is the kernel's temporary one
    (``/tmp/ipykernel_NNN/123.py:1:``), and echoes the cell's source line. Filters and pytest.warns see it as ever
    (``stacklevel`` counts from the caller of ``advise``)."""
    plain, warnings.formatwarning = warnings.formatwarning, lambda m, c, *_, **__: f"{c.__name__}: {m}\n"
    try:
        warnings.warn(message, category, stacklevel=stacklevel + 1)
    finally:
        warnings.formatwarning = plain


def figure(value: float) -> str:
    """The one rule for a figure a person reads (tables, bars, plots, verdicts): at most 4 significant digits, no
    padding: 0.5095, 0.005628, 935.2, 14380, 1.235e-05; "" for NaN (a figure not measured)."""
    if math.isnan(value):
        return ""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    if abs(value) >= 1e4:  # whole: "14380", not 1.438e+04
        return f"{round(value, 3 - math.floor(math.log10(abs(value)))):.0f}"
    return f"{value:.4g}"  # positional down to 1e-4, then scientific


HEADLESS_INTERVAL_S = 30.0  # one saved line per 30 s: a 1-hour run adds ~120 lines (~12 kB) to the notebook
# tqdm's format without its own rate: a bar counting optimizer steps would read "it/s" beside the samples/s it sets
NO_RATE = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"


def progress_bar(
    total: int | None,
    *,
    desc: str,
    interactive: bool,
    disable: bool = False,
    initial: int = 0,
    counts: str = "samples",
    headless_interval_s: float = HEADLESS_INTERVAL_S,
) -> tqdm[Any]:
    """``counts``: what one update is. "samples" (rows): tqdm's rate reads samples/s, the one throughput name;
    "steps" (the training bar, which sets samples/s in its postfix): no rate of its own."""
    # smoothing 0: the rate is the samples over the bar's wall time (tqdm's default, a moving average of the last
    # updates, said 789 samples/s for a pass of 10,227 rows in 83 s); unit_scale: 3 significant digits (1.23k).
    # Steps: the remaining time at the run's average pace so far, evals and saves between epochs included, so it
    # converges on the real end; tqdm's default (recent steps) jumps at each eval, then forgets it.
    rate = {"unit": " samples", "unit_scale": True, "smoothing": 0}
    style: dict[str, Any] = rate if counts == "samples" else {"bar_format": NO_RATE, "smoothing": 0}
    if interactive and not disable:
        try:
            import ipywidgets  # noqa: F401  (tqdm.auto silently falls back to text without it)
            from tqdm.auto import tqdm as auto_tqdm

            return auto_tqdm(total=total, desc=desc, initial=initial, dynamic_ncols=True, **style)
        except ImportError:
            pass
    return tqdm(
        total=total,
        desc=desc,
        initial=initial,
        disable=disable,
        file=sys.stdout,
        ascii=True,
        ncols=100,
        mininterval=headless_interval_s,
        maxinterval=headless_interval_s * 4,
        **style,
    )


def close_as_done(bar: tqdm[Any]) -> None:
    """Close ``bar`` as finished although it stopped short of its total (early stopping, a time budget: normal ends).
    tqdm's notebook widget turns red when closed with ``n < total``, as for an error; so the total becomes the steps
    done first, and the widget's own maximum with it, and it closes full and green (the text bar reads n/n)."""
    if bar.total is not None and bar.n < bar.total:
        bar.total = bar.n
        container = getattr(bar, "container", None)  # tqdm.notebook: (label, IntProgress, label) widgets
        if container is not None:
            container.children[1].max = bar.n
    bar.close()  # redraws the final state (the notebook widget: green when n == total)
