"""Progress bars that suit where they run.

Interactive notebooks get a widget bar (tqdm.auto). Headless runs (nbconvert, papermill, Kaggle "Save & Run All",
CI) get a plain-text bar redrawn at most every ``headless_interval_s``: every redraw becomes a saved output line
there, and an unthrottled bar turns an executed notebook into megabytes of progress (cmip6-cookbook#83).
"""

from __future__ import annotations

import sys
from types import MappingProxyType
from typing import Any

from tqdm import tqdm

# The history's throughput columns and the one name every display gives them (the bar, 02's table, the doctor):
# samples (real tokens, no padding) per second of training wall time, evals and checkpoints between epochs left
# out: the epoch's so far in the bar, each epoch's in the history, all epochs' together in the doctor.
THROUGHPUT = MappingProxyType({"samples_per_s": "samples/s", "tokens_per_s": "tokens/s"})
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
    style: dict[str, Any] = {"unit": " samples"} if counts == "samples" else {"bar_format": NO_RATE, "smoothing": 0}
    # smoothing 0 (steps): the remaining time at the run's average pace so far, evals and saves between epochs
    # included, so it converges on the real end; tqdm's default (recent steps) jumps at each eval, then forgets it.
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
