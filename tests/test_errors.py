"""kitlib's user-facing errors: one short paragraph in a notebook, the last good submission never lost."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from kitlib.errors import TRACEBACK_ENV, DataError, KitError, PrecisionError
from kitlib.notebook.submission import write_submission


def test_notebooks_show_kitlib_errors_as_one_paragraph(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    err = PrecisionError("bf16 on a T4 is emulated. Fix: precision='fp16'")
    assert isinstance(err, KitError) and isinstance(err, ValueError)  # old `except ValueError` still catches it
    assert err._render_traceback_() == [
        "\x1b[1;31mPrecisionError\x1b[0m: bf16 on a T4 is emulated. Fix: precision='fp16'"
    ]
    monkeypatch.setenv(TRACEBACK_ENV, "1")
    with pytest.raises(NotImplementedError):  # IPython then shows its full traceback
        err._render_traceback_()


def test_a_new_submission_keeps_the_previous_one_and_a_bad_one_replaces_nothing(tmp_path: Path) -> None:
    path = tmp_path / "submission.csv"
    first = pd.DataFrame({"id": [1, 2], "label": [0, 1]})
    write_submission(first, ("id", "label"), 2, path)
    write_submission(first.assign(label=[1, 1]), ("id", "label"), 2, path)
    assert path.read_text() == "id,label\n1,1\n2,1\n"
    assert (tmp_path / "submission.prev.csv").read_text() == "id,label\n1,0\n2,1\n"
    before = path.read_bytes(), (tmp_path / "submission.prev.csv").read_bytes()
    with pytest.raises(DataError, match="missing values"):
        write_submission(first.assign(label=[1, None]), ("id", "label"), 2, path)
    assert (path.read_bytes(), (tmp_path / "submission.prev.csv").read_bytes()) == before


def test_a_generated_carriage_return_stays_inside_its_row(tmp_path: Path) -> None:
    # pandas reads a bare '\r' as a line end; minimal quoting leaves it bare (fails on the unquoted writer: 3 rows)
    path = tmp_path / "submission.csv"
    frame = pd.DataFrame({"id": [1, 2], "response": ["a\rb", "c"]})
    write_submission(frame, ("id", "response"), 2, path)
    back = pd.read_csv(path)
    assert back["id"].tolist() == [1, 2] and back["response"].tolist() == ["a\rb", "c"]
