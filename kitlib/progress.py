"""Progress bars that suit where they run: a widget bar (tqdm.auto) when interactive, a plain-text bar redrawn at
most every ``headless_interval_s`` when headless (each redraw is a saved output line there)."""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from tqdm import tqdm

# The history's throughput columns and the one name every display gives them (the bars, 02's table, the doctor).
THROUGHPUT = MappingProxyType({"samples_per_s": "samples/s", "tokens_per_s": "tokens/s"})


def throughput(rows: float, tokens: float, seconds: float, world: int = 1) -> dict[str, float]:
    """The one throughput computation: every process's rows, and real tokens (no padding), per second of the pass's
    wall time, data loading included (``world``: processes). No tokens/s when none were counted (0.0 reads stalled)."""
    rates = {"samples_per_s": rows * world / seconds}
    if tokens:
        rates["tokens_per_s"] = float(tokens) * world / seconds
    return rates


def shown(rates: Mapping[str, float]) -> dict[str, str]:
    """Throughput figures as every display shows them: under THROUGHPUT's names, by ``figure``."""
    return {THROUGHPUT[k]: figure(v) for k, v in rates.items() if k in THROUGHPUT}


def advise(message: str, category: type[Warning] = UserWarning, stacklevel: int = 1) -> None:
    """``warnings.warn`` shown as ``UserWarning: message`` alone, without a notebook kernel's temporary file name
    and source line; filters and pytest.warns see it as ever (``stacklevel`` counts from ``advise``'s caller)."""
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
# tqdm's format without its own rate (smoothed, and named it/s or in tqdm's 3 digits): every bar shows the samples/s
# of ``throughput`` in its postfix instead (the training bar's is the history's, a row bar's its rows over its time)
NO_RATE = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"


def progress_bar(
    total: int | None,
    *,
    desc: str,
    interactive: bool,
    disable: bool = False,
    initial: int = 0,
    headless_interval_s: float = HEADLESS_INTERVAL_S,
) -> tqdm[Any]:
    """A bar of optimizer steps (the training bar) or of rows (updated by ``advance``)."""
    # smoothing 0: the remaining time at the average pace so far, evals and saves between epochs included, so it
    # converges on the real end; tqdm's default (recent updates) jumps at each eval, then forgets it.
    style: dict[str, Any] = {"bar_format": NO_RATE, "smoothing": 0}
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


def advance(bar: tqdm[Any], rows: int, tokens: float = 0.0) -> None:
    """``rows`` more rows (``tokens`` real tokens) done on a row bar: its samples/s (and tokens/s) are the pass's so
    far, ``throughput`` of its rows over its wall time since it opened."""
    bar.update(rows)
    if not bar.disable:
        bar.tokens = getattr(bar, "tokens", 0.0) + tokens
        seconds = bar.format_dict["elapsed"] or 1e-9  # the first update can come within the clock's resolution
        bar.set_postfix(shown(throughput(bar.n, bar.tokens, seconds)), refresh=False)


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
