"""Progress bars that suit where they run.

Interactive notebooks get a widget bar (tqdm.auto). Headless runs (nbconvert, papermill, Kaggle "Save & Run All",
CI) get a plain-text bar redrawn at most every ``headless_interval_s``: every redraw becomes a saved output line
there, and an unthrottled bar turns an executed notebook into megabytes of progress (cmip6-cookbook#83).
"""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm

HEADLESS_INTERVAL_S = 30.0  # one saved line per 30 s: a 1-hour run adds ~120 lines (~12 kB) to the notebook


def progress_bar(
    total: int | None,
    *,
    desc: str,
    interactive: bool,
    disable: bool = False,
    initial: int = 0,
    headless_interval_s: float = HEADLESS_INTERVAL_S,
) -> tqdm[Any]:
    if interactive and not disable:
        try:
            import ipywidgets  # noqa: F401  (tqdm.auto silently falls back to text without it)
            from tqdm.auto import tqdm as auto_tqdm

            return auto_tqdm(total=total, desc=desc, initial=initial, dynamic_ncols=True)
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
    )
