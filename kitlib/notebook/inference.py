"""A code competition's rerun: predict a hidden test set with a published run (checked first), never training."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from kitlib._files import free_bytes
from kitlib._version import __version__
from kitlib.data.featurize import TokenizedTexts, tokenize_texts
from kitlib.data.tables import TargetSpec, read_table
from kitlib.errors import MissingRunError, SetupError
from kitlib.notebook.estimate import duration
from kitlib.notebook.handoff import FEATURES_FILE, Features, SideInputs
from kitlib.notebook.params import PARAMS_FILE, Params, kaggle_input, load_params
from kitlib.notebook.presets import ResolvedRun
from kitlib.notebook.stages import TOKENIZER_DIR
from kitlib.notebook.submission import check_sample_submission
from kitlib.notebook.tasks import get_task
from kitlib.tasks.tabular import Columns

CARD_FILE = "kitlib-model.json"  # what a published run predicts: the inference kernel's check reads it
KAGGLE_WORKING = "/kaggle/working"
START_S = 60.0  # seconds to install kitlib, import torch and load the checkpoints, over the per-row time (a guess)

# lazy: transformers (+0.6 s), pandas (+0.2 s): the checks before any work read only JSON


def _fix(card: Mapping[str, Any], what: str) -> str:
    return (
        f"the published model ({card['task']} of {card['target']!r}, kitlib {card['kitlib']}) {what}. Fix: attach the "
        "model published from a run trained on this competition's data (python -m kitlib kaggle publish), or train one"
    )


def check_against_data(card: Mapping[str, Any], data_dir: Path, params: Mapping[str, Any]) -> int:
    """Refuse a published model that cannot predict this data (version, columns, task, labels); returns test rows."""
    if card["kitlib"] != __version__:
        raise SetupError(
            f"the published model was trained with kitlib {card['kitlib']}, this kernel runs kitlib {__version__}: "
            f"checkpoints and features may differ. Fix: attach the wheels dataset of kitlib {card['kitlib']} "
            "(python -m kitlib kaggle wheels from that version), or publish a run trained with this one"
        )
    test_path, sample_path = data_dir / params["test_file"], data_dir / params["sample_submission"]
    import pandas as pd

    header = list(pd.read_csv(test_path, nrows=0).columns)
    needed = [card["text"], card["id"], *card["numeric"], *card["categorical"]]
    if missing := [c for c in needed if c not in header]:
        raise SetupError(_fix(card, f"reads columns {missing} that {test_path.name} lacks (its columns: {header})"))
    sample = pd.read_csv(sample_path)
    if set(sample.columns) != {card["id"], card["target"]}:
        wanted = [card["id"], card["target"]]
        raise SetupError(_fix(card, f"writes columns {wanted}, {sample_path.name} has {list(sample.columns)}"))
    values = sample[card["target"]]
    numeric = pd.api.types.is_numeric_dtype(values)
    if card["kind"] == "regression" and not numeric:
        raise SetupError(_fix(card, f"predicts a number, but {sample_path.name}'s {card['target']!r} holds text"))
    if card["kind"] in ("binary", "multiclass"):
        labels = {str(v) for v in card["labels"]}
        unknown = sorted({str(v) for v in values.dropna()} - labels)
        if unknown and (not numeric or not values.dropna().astype(float).isin([0.0, 0.5]).all()):
            raise SetupError(
                _fix(card, f"predicts the labels {sorted(labels)}, but {sample_path.name} holds {unknown[:5]}")
            )
    return len(pd.read_csv(test_path, usecols=[card["id"]]))


def predicted_seconds(card: Mapping[str, Any], n_test: int) -> tuple[float, str]:
    """03's predicted seconds for ``n_test`` rows (02's measured seconds per row x rows x models + START_S), and how."""
    per_row = card.get("seconds_per_row")
    if not per_row:
        raise MissingRunError(
            "the published run records no timed evaluation (run/timing.json has no full_eval), so 03's time cannot be "
            "predicted. Fix: publish a run whose 02 evaluated at least once (full_eval_every >= 0, the default)"
        )
    models = int(card["folds"])
    seconds = START_S + per_row * n_test * models
    how = f"measured: {per_row * 1e3:.2f} ms a row in 02's evaluations on {card['measured_on']} x {models} model(s)"
    return seconds, how


def published_run(
    published: str | Path, *, data_dir: str | Path, work_dir: str | Path, inference_limit: float | None = None
) -> Params:
    """Check the published folder, then copy what 03 reads into ``work_dir`` (nothing written before the checks)."""
    model, data, work = kaggle_input(Path(published)), kaggle_input(Path(data_dir)), Path(work_dir)
    if not (model / CARD_FILE).is_file():
        raise MissingRunError(
            f"no {CARD_FILE} in {model}: not a published kitlib run. Fix: attach the dataset that `python -m kitlib "
            "kaggle publish` made (model_dataset in the kernel build)"
        )
    card = json.loads((model / CARD_FILE).read_text())
    params = json.loads((model / PARAMS_FILE).read_text())
    n_test = check_against_data(card, data, params)
    limit_h = float(inference_limit if inference_limit is not None else params.get("inference_limit", 9.0))
    seconds, how = predicted_seconds(card, n_test)
    print(f"inference only (02 does not run): predicted {duration(seconds)} for {n_test} test rows ({how}), "
          f"inference_limit {limit_h:g} h")  # fmt: skip
    if seconds > limit_h * 3600:
        raise SetupError(
            f"predicting {n_test} test rows takes about {duration(seconds)}, over inference_limit = {limit_h:g} h: "
            "Kaggle would stop the rerun (Notebook Timeout). Fix: a faster GPU (machine_shape), fewer folds, a smaller "
            "model or a shorter max_length; or raise inference_limit if the competition allows more"
        )
    _check_room(model, work, params)
    work.mkdir(parents=True, exist_ok=True)  # not copytree's: it would copy the read-only input's mode onto work_dir
    for entry in (e for e in model.iterdir() if e.name != PARAMS_FILE):  # params.json: below, with this data
        if entry.is_dir():
            shutil.copytree(entry, work / entry.name, dirs_exist_ok=True)
        else:
            shutil.copy2(entry, work / entry.name)
    limit = {} if inference_limit is None else {"inference_limit": inference_limit}
    values = {**params, "data_dir": str(data), **limit}
    (work / PARAMS_FILE).write_text(json.dumps(values, indent=2) + "\n")
    return load_params(work)


def free_memory() -> int:
    """Bytes of memory available now (Linux: MemAvailable; elsewhere the free pages)."""
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
        return int(next(line for line in lines if line.startswith("MemAvailable:")).split()[1]) * 1024
    except (OSError, StopIteration, ValueError):
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def _check_room(model: Path, work: Path, params: Mapping[str, Any]) -> None:
    """Refuse before any work when the published run cannot fit the disk, or one model loaded twice the memory."""
    need = sum(f.stat().st_size for f in model.rglob("*") if f.is_file())
    free, _ = free_bytes(work)
    if need * 1.2 > free:  # the copy plus the submission and a margin
        raise SetupError(
            f"copying the published model ({need / 1e9:.2f} GB) needs more than the {free / 1e9:.2f} GB free in "
            f"{work} (Exceeded Allowed Compute). Fix: publish fewer folds or a smaller model"
        )
    base = kaggle_input(Path(str(params.get("model", ""))))
    weights = [*(model / "run" / "best").glob("*.safetensors"), *(base.glob("*.safetensors") if base.is_dir() else [])]
    memory, available = 2 * sum(f.stat().st_size for f in weights), free_memory()
    if memory > available:
        raise SetupError(
            f"loading one model ({memory / 2e9:.2f} GB of weights, read and built: {memory / 1e9:.2f} GB) needs more "
            f"than the {available / 1e9:.2f} GB of memory free here (Exceeded Allowed Compute). Fix: a machine with "
            "more memory, or a smaller model"
        )


def test_features(p: Params) -> Features:
    """The published features' recipe with test.csv tokenized by the published tokenizer; never reads train.csv."""
    from transformers import AutoTokenizer

    summary = json.loads((p.work_dir / FEATURES_FILE).read_text())
    run = ResolvedRun.from_dict(summary["run"])
    if run.regime.features_need_accelerator:
        raise SetupError(
            f"preset {run.name!r} ({run.regime.name} regime) predicts from 01's embeddings of every row, which this "
            "inference-only route does not compute. Fix: publish a run of a fine-tuning preset (smoke, balanced, best)"
        )
    test_path = p.data_dir / p.test_file
    test = read_table(test_path, text=p.text, id=p.id)
    test_ids = [i.item() if isinstance(i, np.generic) else i for i in test[p.id]]
    columns = check_sample_submission(p.data_dir / p.sample_submission, test_ids, id=p.id, target=p.target)
    tokenizer = AutoTokenizer.from_pretrained(p.work_dir / TOKENIZER_DIR)
    texts = get_task(p.task).prompts(test[p.text].tolist(), tokenizer)
    max_length = int(summary["max_length"])
    card = json.loads((p.work_dir / CARD_FILE).read_text())
    state = {**(summary.get("side_state") or {}), **({"limits": card["limits"]} if card.get("limits") else {})}
    side: dict[str, np.ndarray] = {}
    if p.numeric or p.categorical:
        side = Columns.from_dict(state).transform(test, path=test_path)
    empty = TokenizedTexts(np.zeros(0, np.int32), np.zeros(1, np.int64), max_length)
    spec = TargetSpec.from_dict(summary["spec"])
    return Features(
        spec=spec,
        run=run,
        model_identity=summary["model"],
        max_length=max_length,
        vocab_size=int(summary["tokenizer"]["vocab_size"]),
        pad_id=int(summary["tokenizer"]["pad_id"]),
        labels=np.zeros(0, np.float32 if spec.kind == "regression" else np.int64),
        train_tokens=empty,
        test_tokens=tokenize_texts(texts, tokenizer, max_length=max_length),
        test_ids=test_ids,
        submission_columns=columns,
        side=SideInputs({k: v[:0] for k, v in side.items()}, side, state),
    )


def written(p: Params) -> Path:
    """submission.csv where Kaggle looks for it (``/kaggle/working`` there), or a loud error if it is missing."""
    path = p.work_dir / "submission.csv"
    if os.environ.get("KAGGLE_KERNEL_RUN_TYPE") and p.work_dir.resolve() != Path(KAGGLE_WORKING):
        raise SetupError(f"submission written to {path}, but Kaggle scores /kaggle/working/submission.csv only. "
                         "Fix: work_dir = '/kaggle/working'")  # fmt: skip
    if not path.is_file():
        raise MissingRunError(f"no submission at {path}: 03 did not write one")
    return path
