from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kitlib.data.tables import DataError, TargetSpec, infer_target, read_table


def write(tmp_path: Path, name: str, content: str) -> Path:
    path = tmp_path / name
    path.write_text(content)
    return path


def test_a_good_table_reads_and_keeps_strings(tmp_path: Path) -> None:
    path = write(tmp_path, "train.csv", "id,text,label\n1,good film,1\n2,bad film,0\n")
    df = read_table(path, text="text", target="label", id="id")
    assert list(df.columns) == ["id", "text", "label"] and df["text"].tolist() == ["good film", "bad film"]


@pytest.mark.parametrize(
    ("content", "kwargs", "expected"),
    [
        ("", {}, r"train\.csv is empty"),
        ("id,text,label\n", {}, r"train\.csv has a header .* but no data rows"),
        ("id,body,label\n1,a,1\n", {}, r"no column 'text' \(the text column\); available columns: \['id', 'body'"),
        ("id,text,y\n1,a,1\n", {"target": "label"}, r"no column 'label' \(the target column\)"),
        ("id,text,label\n1,a,1\n2,b,\n", {"target": "label"}, r"target column 'label' is missing at row 1 \(line 3"),
        ("id,text,label\n1,a,1.5\n2,b,abc\n", {"target": "label"}, r"column 'label' is not numeric at row 1.*'abc'"),
        ("id,text,label\n1,a,x\n", {"target": "label", "rule": "regress"}, r"'label' is not numeric at row 0"),
        ("id,text,label\n1,5,1\n2,6,0\n", {}, r"text column 'text' holds int 5 at row 0 .*astype\(str\)"),
        ("id,text\n1,a\n1,b\n", {"id": "id"}, r"id column 'id' repeats 1 at row 1"),
    ],
    ids=[
        "empty-file",
        "header-only",
        "missing-text",
        "missing-target",
        "nan-target",
        "non-numeric-target",
        "non-numeric-regression",
        "non-string-text",
        "duplicate-id",
    ],
)
def test_bad_inputs_raise_one_clear_data_error(tmp_path: Path, content: str, kwargs: dict, expected: str) -> None:
    path = write(tmp_path, "train.csv", content)
    with pytest.raises(DataError, match=expected) as info:
        read_table(path, **kwargs)
    assert isinstance(info.value, ValueError)
    if content:
        assert str(path) in str(info.value)  # names the file


def test_a_blank_text_cell_is_the_empty_text_with_a_warning(tmp_path: Path) -> None:
    """A CSV cannot hold '' apart from missing: a blank cell (train or test) is text with no words, never an error."""
    path = write(tmp_path, "test.csv", 'id,text\n1,a\n2,\n3,""\n')
    with pytest.warns(UserWarning, match=r"text column 'text' is blank at row 1 .*2 such rows.*empty text ''"):
        df = read_table(path, id="id")
    assert df["text"].tolist() == ["a", "", ""]


def test_unknown_path_lists_what_is_there(tmp_path: Path) -> None:
    write(tmp_path, "train.csv", "text\na\n")
    with pytest.raises(DataError, match=r"no file at .*trian\.csv; files in .*\['train\.csv'\]"):
        read_table(tmp_path / "trian.csv")
    with pytest.raises(DataError, match="does not exist either"):
        read_table(tmp_path / "nope" / "train.csv")


def test_class_names_are_a_valid_target(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "text,label\na,fresh\nb,rotten\nc,fresh\n")
    df = read_table(path, target="label")
    spec = infer_target(df["label"])
    assert spec == TargetSpec("binary", 2, ("fresh", "rotten"))
    assert spec.encode(df["label"]).tolist() == [0, 1, 0]
    assert spec.decode(np.array([1, 0])).tolist() == ["rotten", "fresh"]
    with pytest.raises(DataError, match=r"'meh'.*not one of the classes"):
        spec.encode(["meh"])


@pytest.mark.parametrize(
    ("values", "kind", "num_labels", "classes"),
    [
        ([0, 1, 1, 0], "binary", 2, (0, 1)),
        ([True, False], "binary", 2, (False, True)),
        (["a", "b", "c", "a"], "multiclass", 3, ("a", "b", "c")),
        ([3, 7, 9, 3], "multiclass", 3, (3, 7, 9)),  # sparse class ids get codes 0..2
        ([1.0, 2.0, 5.0], "multiclass", 3, (1.0, 2.0, 5.0)),
        ([0.5, 1.25, 3.0], "regression", 1, ()),
        (list(range(100)), "regression", 1, ()),  # many distinct integers: a quantity, not classes
    ],
)
def test_infer_target(values: list, kind: str, num_labels: int, classes: tuple) -> None:
    spec = infer_target(pd.Series(values, name="y"))
    assert (spec.kind, spec.num_labels, spec.classes) == (kind, num_labels, classes)
    encoded = spec.encode(values)
    assert encoded.dtype == (np.float32 if kind == "regression" else np.int64)
    assert spec.to_dict()["num_labels"] == num_labels


def test_infer_target_rejects_a_single_class_and_honours_hints() -> None:
    with pytest.raises(DataError, match="single value"):
        infer_target(pd.Series([1, 1, 1], name="y"))
    assert infer_target(pd.Series([0, 1, 2]), rule="regress").kind == "regression"
    assert infer_target(pd.Series(["1", "2", "x"]), rule="classify").num_labels == 3


def test_whole_numbers_that_could_be_codes_or_a_quantity_ask_for_task() -> None:
    codes = pd.Series(np.repeat(np.arange(100, 150), 10), name="category")  # 50 category codes, 10 rows each
    with pytest.raises(DataError, match=r"'category' holds 50 distinct whole numbers over 500 rows.*task = 'classify'"):
        infer_target(codes)
    as_classes = infer_target(codes, rule="classify")
    assert as_classes.kind == "multiclass" and as_classes.num_labels == 50 and as_classes.classes[0] == 100
    assert infer_target(codes, rule="regress").kind == "regression"
    assert infer_target(pd.Series(np.arange(500) * 3, name="price")).kind == "regression"  # mostly distinct
