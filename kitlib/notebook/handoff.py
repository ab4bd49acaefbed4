"""What 01_features hands to 02 and 03: plain ``features/*.npy`` arrays (no pickle) and ``features.json`` (the run,
the facts, a checksum per array; written last = complete), with the run.json and parameters it was built from, so a
later stage refuses features built for another run and names the notebook to re-run."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kitlib._files import FileMismatch, read_checked, record_bytes, record_file, write_atomic
from kitlib.data.featurize import TokenizedTexts
from kitlib.data.ngrams import NgramBags
from kitlib.data.tables import TargetSpec
from kitlib.errors import DataError, MissingRunError, damaged_file
from kitlib.notebook.presets import RUN_FILE, ResolvedRun

if TYPE_CHECKING:
    from kitlib.data.lengths import LengthReport

FEATURES_FILE = "features.json"
FEATURES_DIR = "features"
FORMAT = 2  # 2: the target's spec under "spec" (1: "task")
NPY_HEADER_MAX = 65_546  # bytes: a format 1.0 .npy header is at most 10 + 65535 (its length is a uint16)


@dataclass(frozen=True)
class SideInputs:
    """Per-row model inputs besides the tokens (``model(input_ids=..., **side)``) and ``state``, the JSON-able fit
    (statistics, category lists) 02 rebuilds the model from."""

    train: Mapping[str, np.ndarray] = field(default_factory=dict)
    test: Mapping[str, np.ndarray] = field(default_factory=dict)
    state: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class Features:
    """The features of one competition for one run: everything 02 and 03 need, nothing they must recompute."""

    spec: TargetSpec  # the target as read (kind, classes, transform): kitlib.data.tables
    run: ResolvedRun  # the run fitted to the data (max_length by coverage, the batch by row count)
    model_identity: str
    max_length: int
    vocab_size: int  # the tokenizer's, to rebuild the model without loading the tokenizer
    pad_id: int
    labels: np.ndarray  # encoded targets of the training rows (int64 codes, or float32 for regression)
    train_tokens: TokenizedTexts
    test_tokens: TokenizedTexts
    test_ids: list[Any]  # the id column of test.csv, in file order (ints stay ints in the submission)
    submission_columns: tuple[str, ...]  # sample_submission.csv's header, checked when 01 ran
    embeddings: tuple[np.ndarray, np.ndarray] | None = None  # (train, test): the "head" regime's frozen features
    ngrams: tuple[NgramBags, NgramBags] | None = None
    side: SideInputs = field(default_factory=SideInputs)  # the task's per-row inputs besides the tokens
    groups: np.ndarray | None = None  # int64 group code per training row (group_column), else None
    report: LengthReport | None = None  # the length report, in the process that built the features (01's display)

    @property
    def n_train(self) -> int:
        return len(self.labels)

    @property
    def n_test(self) -> int:
        return len(self.test_ids)

    def _arrays(self) -> dict[str, np.ndarray]:
        arrays = {"labels": self.labels} | ({"train_groups": self.groups} if self.groups is not None else {})
        for split, tokens in (("train", self.train_tokens), ("test", self.test_tokens)):
            arrays |= {f"{split}_token_ids": tokens.ids, f"{split}_token_offsets": tokens.offsets}
        if self.embeddings is not None:
            arrays |= {"train_embeddings": self.embeddings[0], "test_embeddings": self.embeddings[1]}
        if self.ngrams is not None:
            for split, bags in zip(("train", "test"), self.ngrams, strict=True):
                arrays |= {f"{split}_ngram_ids": bags.ids, f"{split}_ngram_weights": bags.weights}
        for split, side in (("train", self.side.train), ("test", self.side.test)):
            arrays |= {f"{split}_side_{name}": array for name, array in side.items()}
        return arrays


def run_fingerprint(work_dir: Path) -> str:
    """sha256 of run.json as 00_setup wrote it: features record it, later stages compare."""
    path = work_dir / RUN_FILE
    return record_file(path)["sha256"] if path.is_file() else ""


def save(features: Features, work_dir: Path, built_from: Mapping[str, Any]) -> Path:
    """Write the arrays under content names (``labels-<sha256 prefix>.npy``), then features.json, the commit: a save
    cut short leaves the last good features loadable. Arrays no longer named are removed after."""
    folder = work_dir / FEATURES_DIR
    records = {}
    for name, array in features._arrays().items():
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
        record = record_bytes(buffer.getbuffer())
        file = f"{name}-{record['sha256'][:16]}.npy"
        if not (folder / file).is_file() or record_file(folder / file) != record:
            write_atomic(folder / file, buffer.getbuffer())
        records[f"{name}.npy"] = {**record, "file": file}
    summary = {
        "format": FORMAT,
        "spec": features.spec.to_dict(),
        "run": features.run.to_dict(),
        "model": features.model_identity,
        "regime": features.run.regime.name,
        "max_length": features.max_length,
        "n_train": features.n_train,
        "n_test": features.n_test,
        "tokenizer": {"vocab_size": features.vocab_size, "pad_id": features.pad_id},
        "n_buckets": features.ngrams[0].n_buckets if features.ngrams is not None else None,
        "side_state": dict(features.side.state),
        "test_ids": features.test_ids,
        "submission_columns": list(features.submission_columns),
        "built_from": {"run_json_sha256": run_fingerprint(work_dir), **dict(built_from)},
        "files": records,
    }
    written = write_atomic(work_dir / FEATURES_FILE, json.dumps(summary, indent=1, default=str) + "\n")
    named = {r["file"] for r in records.values()}
    for stale in folder.glob("*.npy"):
        if stale.name not in named:
            stale.unlink(missing_ok=True)
    return written


def load(work_dir: Path, built_from: Mapping[str, Any]) -> Features:
    """The features 01 saved in ``work_dir``; missing, damaged or built for another run: an error naming 01."""
    path = work_dir / FEATURES_FILE
    if not path.is_file():
        raise MissingRunError(f"no {FEATURES_FILE} in {work_dir}: run notebooks/01_features.ipynb first")
    with damaged_file(path, "01_features"):
        return _load(path, work_dir, built_from)


def _load(path: Path, work_dir: Path, built_from: Mapping[str, Any]) -> Features:
    summary = json.loads(path.read_text())
    if summary.get("format") != FORMAT:
        raise MissingRunError(f"{path} was written by another kitlib version: re-run notebooks/01_features.ipynb")
    _check_built_from(summary["built_from"], {"run_json_sha256": run_fingerprint(work_dir), **dict(built_from)}, path)
    arrays = {
        name.removesuffix(".npy"): _load_array(work_dir / FEATURES_DIR / record.get("file", name), record)
        for name, record in summary["files"].items()
    }
    ngrams = None
    if "train_ngram_ids" in arrays:
        ngrams = tuple(
            NgramBags(arrays[f"{split}_ngram_ids"], arrays[f"{split}_ngram_weights"], summary["n_buckets"])
            for split in ("train", "test")
        )
    return Features(
        spec=TargetSpec.from_dict(summary["spec"]),
        run=ResolvedRun.from_dict(summary["run"]),
        model_identity=summary["model"],
        max_length=int(summary["max_length"]),
        vocab_size=int(summary["tokenizer"]["vocab_size"]),
        pad_id=int(summary["tokenizer"]["pad_id"]),
        labels=arrays["labels"],
        train_tokens=TokenizedTexts(arrays["train_token_ids"], arrays["train_token_offsets"], summary["max_length"]),
        test_tokens=TokenizedTexts(arrays["test_token_ids"], arrays["test_token_offsets"], summary["max_length"]),
        test_ids=list(summary["test_ids"]),
        submission_columns=tuple(summary["submission_columns"]),
        embeddings=(arrays["train_embeddings"], arrays["test_embeddings"]) if "train_embeddings" in arrays else None,
        ngrams=ngrams,  # type: ignore[arg-type]
        side=SideInputs(_side(arrays, "train"), _side(arrays, "test"), summary.get("side_state") or {}),
        groups=arrays.get("train_groups"),
    )


def _side(arrays: Mapping[str, np.ndarray], split: str) -> dict[str, np.ndarray]:
    prefix = f"{split}_side_"
    return {name.removeprefix(prefix): array for name, array in arrays.items() if name.startswith(prefix)}


def _check_built_from(saved: Mapping[str, Any], now: Mapping[str, Any], path: Path) -> None:
    # A parameter added after these features were built, left at its default, changes nothing they hold.
    changed = [k for k in now if str(saved.get(k)) != str(now[k]) and (k in saved or now[k] not in ([], "", None))]
    if now.get("test_sha256") is None or saved.get("test_sha256") is None:  # data not here (02 does not need it)
        changed = [k for k in changed if k != "test_sha256"]
    if not changed:
        return
    if "test_sha256" in changed:
        raise MissingRunError(
            f"test.csv changed after {path.name} was built: its rows are not the ones 01 tokenized (a code "
            "competition's rerun swaps in the hidden test set). Fix: re-run notebooks/01_features.ipynb; for a code "
            "competition, submit the single kernel (python -m kitlib kaggle build --single), which re-reads test.csv"
        )
    if "run_json_sha256" in changed:
        raise MissingRunError(
            f"run.json changed after {path.name} was built (00_setup ran again, e.g. with another preset): "
            "re-run notebooks/01_features.ipynb, then train"
        )
    what = ", ".join(f"{k}: {saved.get(k)!r} -> {now[k]!r}" for k in changed)
    raise MissingRunError(f"{path.name} was built with other parameters ({what}): re-run notebooks/01_features.ipynb")


def _load_array(path: Path, record: Mapping[str, Any]) -> np.ndarray:
    try:
        blob = read_checked(path, record)
    except FileMismatch as err:
        raise DataError(f"{path} is damaged ({err}): re-run notebooks/01_features.ipynb") from None
    return _npy_array(blob)


def _npy_array(blob: bytearray) -> np.ndarray:
    """The array of a .npy file's bytes as a writable view of ``blob``, without np.load's extra copies
    (docs/measurements.md); headers this writer never makes go through np.load, which refuses pickles."""
    header = io.BytesIO(memoryview(blob)[:NPY_HEADER_MAX])
    version = np.lib.format.read_magic(header)
    if version not in ((1, 0), (2, 0)):
        return np.load(io.BytesIO(blob), allow_pickle=False)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran_order, dtype = read_header(header)
    if fortran_order or dtype.hasobject:
        return np.load(io.BytesIO(blob), allow_pickle=False)
    count, offset = int(np.prod(shape, dtype=np.int64)), header.tell()
    if len(blob) - offset != count * dtype.itemsize:
        raise ValueError(f"{len(blob) - offset} data bytes for {shape} {dtype} (truncated or padded)")
    return np.frombuffer(blob, dtype=dtype, count=count, offset=offset).reshape(shape)
