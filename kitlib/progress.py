"""Progress bars: a tqdm.auto widget when interactive, a plain-text bar every ``headless_interval_s`` headless."""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from tqdm import tqdm

THROUGHPUT = MappingProxyType({"samples_per_s": "samples/s", "tokens_per_s": "tokens/s"})


def throughput(rows: float, tokens: float, seconds: float, world: int = 1) -> dict[str, float]:
    """Rows and real tokens per second of the pass's wall time, all ``world`` processes, loading included."""
    rates = {"samples_per_s": rows * world / seconds}
    if tokens:
        rates["tokens_per_s"] = float(tokens) * world / seconds
    return rates


def shown(rates: Mapping[str, float]) -> dict[str, str]:
    """Throughput figures as every display shows them: under THROUGHPUT's names, by ``figure``."""
    return {THROUGHPUT[k]: figure(v) for k, v in rates.items() if k in THROUGHPUT}


def advise(message: str, category: type[Warning] = UserWarning, stacklevel: int = 1) -> None:
    """``warnings.warn`` shown as ``UserWarning: message`` alone (no kernel file); ``stacklevel`` from the caller."""
    plain, warnings.formatwarning = warnings.formatwarning, lambda m, c, *_, **__: f"{c.__name__}: {m}\n"
    try:
        warnings.warn(message, category, stacklevel=stacklevel + 1)
    finally:
        warnings.formatwarning = plain


def figure(value: float) -> str:
    """A figure for people: at most 4 significant digits, no padding (0.5095, 14380, 1.235e-05); "" for NaN."""
    if math.isnan(value):
        return ""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    if abs(value) >= 1e4:  # whole: "14380", not 1.438e+04
        return f"{round(value, 3 - math.floor(math.log10(abs(value)))):.0f}"
    return f"{value:.4g}"  # positional down to 1e-4, then scientific


HEADLESS_INTERVAL_S = 30.0  # one saved line per 30 s: a 1-hour run adds ~120 lines (~12 kB) to the notebook
# tqdm's format without its rate: bars show ``throughput``'s samples/s in their postfix
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
    # smoothing 0: remaining time at the average pace (evals included), not tqdm's jumpy recent rate
    style: dict[str, Any] = {"bar_format": NO_RATE, "smoothing": 0, "total": total, "desc": desc, "initial": initial}
    if interactive and not disable:
        try:
            import ipywidgets  # noqa: F401  (tqdm.auto silently falls back to text without it)
            from tqdm.auto import tqdm as auto_tqdm

            return auto_tqdm(dynamic_ncols=True, **style)
        except ImportError:
            pass
    return tqdm(
        disable=disable,
        file=sys.stdout,
        ascii=True,
        ncols=100,
        mininterval=headless_interval_s,
        maxinterval=headless_interval_s * 4,
        **style,
    )


def advance(bar: tqdm[Any], rows: int, tokens: float = 0.0) -> None:
    """``rows`` more rows (``tokens`` real tokens) on a row bar; its rate is the pass's so far."""
    bar.update(rows)
    if not bar.disable:
        bar.tokens = getattr(bar, "tokens", 0.0) + tokens
        seconds = bar.format_dict["elapsed"] or 1e-9  # the first update can come within the clock's resolution
        bar.set_postfix(shown(throughput(bar.n, bar.tokens, seconds)), refresh=False)


def close_as_done(bar: tqdm[Any]) -> None:
    """Close ``bar`` as finished though it stopped short (early stop, budget), so tqdm's widget ends green, not red."""
    if bar.total is not None and bar.n < bar.total:
        bar.total = bar.n
        container = getattr(bar, "container", None)  # tqdm.notebook: (label, IntProgress, label) widgets
        if container is not None:
            container.children[1].max = bar.n
    bar.close()  # redraws the final state (the notebook widget: green when n == total)
