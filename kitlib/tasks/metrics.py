"""Competition metrics by name, ``(y_true, y_pred)`` in the competition's units; a user's: ``"file.py:function"``
or ``"module:function"``."""

from __future__ import annotations

import hashlib
import importlib
import inspect
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING, Any, get_args

import numpy as np

from kitlib.config import Mode
from kitlib.errors import DataError, KitError, SetupError, in_setup

if TYPE_CHECKING:
    from kitlib.config import TargetRule

MetricFn = Callable[[np.ndarray, np.ndarray], "float | np.ndarray"]  # a number, or each row's score (their mean)
AUTO = {"binary": "accuracy", "multiclass": "accuracy", "regression": "rmse", "sequence": "exact_match"}  # "auto"
LOG_TARGET_METRICS = frozenset({"smape", "rmsle"})  # relative errors: a log target trains what they score


@dataclass(frozen=True)
class Metric:
    name: str
    mode: Mode  # "max": higher is better (accuracy), "min": lower is better (errors)
    fn: MetricFn
    kinds: frozenset[str]  # the target kinds it applies to ("binary", "multiclass", "regression")

    def __call__(self, y_true: np.ndarray, y_pred: np.ndarray) -> float:
        return float(np.mean(self.scores(y_true, y_pred)))

    def scores(self, y_true: np.ndarray, y_pred: np.ndarray) -> np.ndarray:
        """The score, or each row's when ``fn`` gives them (a user's may: the score is then their mean)."""
        return np.asarray(self.fn(np.asarray(y_true), np.asarray(y_pred)), dtype=np.float64)

    def better(self, a: float, b: float) -> bool:
        return a > b if self.mode == "max" else a < b


def accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    return float(np.mean(y_true == y_pred))


def macro_f1(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """The unweighted mean of each class's F1 over the classes in ``y_true`` or ``y_pred`` (sklearn's "macro")."""
    scores = []
    for c in np.unique(np.concatenate([y_true, y_pred])):
        tp = np.sum((y_pred == c) & (y_true == c))
        predicted, actual = np.sum(y_pred == c), np.sum(y_true == c)
        scores.append(0.0 if tp == 0 else 2 * tp / (predicted + actual))
    return float(np.mean(scores))


def rmse(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    return float(np.sqrt(np.mean((y_pred.astype(np.float64) - y_true.astype(np.float64)) ** 2)))


def mae(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    return float(np.mean(np.abs(y_pred.astype(np.float64) - y_true.astype(np.float64))))


def smape(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Symmetric mean absolute percentage error, 0-200 (Kaggle's): mean of 200 |F - A| / (|A| + |F|), 0/0 = 0."""
    a, f = y_true.astype(np.float64), y_pred.astype(np.float64)
    denominator = np.abs(a) + np.abs(f)
    ratio = np.divide(np.abs(f - a), denominator, out=np.zeros_like(a), where=denominator != 0)
    return float(200 * np.mean(ratio))


def exact_match(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Share of generated texts equal to the reference, ignoring surrounding whitespace."""
    return float(np.mean([str(t).strip() == str(p).strip() for t, p in zip(y_true, y_pred, strict=True)]))


def rouge_l(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Mean ROUGE-L F1 (word LCS) of texts against references, 0 to 1, words as rouge-score's ``rougeL`` splits them."""
    scores = []
    for reference, generated in zip(y_true, y_pred, strict=True):
        a, b = _rouge_words(reference), _rouge_words(generated)
        common = _lcs(a, b)
        scores.append(0.0 if common == 0 else 2 * common / (len(a) + len(b)))  # 2PR/(P+R), P = lcs/|b|, R = lcs/|a|
    return float(np.mean(scores))


def _rouge_words(text: Any) -> list[str]:
    return re.findall(r"[a-z0-9]+", str(text).lower())


def _lcs(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence (one row of the dynamic programme at a time)."""
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def rmsle(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Root mean squared log error; negative predictions count as 0 (Kaggle clips them the same way)."""
    a, f = np.log1p(np.clip(y_true, 0, None).astype(np.float64)), np.log1p(np.clip(y_pred, 0, None).astype(np.float64))
    return float(np.sqrt(np.mean((f - a) ** 2)))


_CLASSES, _NUMBERS, _TEXTS = frozenset({"binary", "multiclass"}), frozenset({"regression"}), frozenset({"sequence"})
_WHAT = {_CLASSES: "classes", _NUMBERS: "numbers", _TEXTS: "generated texts"}
METRICS: Mapping[str, Metric] = MappingProxyType(
    {
        m.name: m
        for m in (
            Metric("accuracy", "max", accuracy, _CLASSES),
            Metric("macro_f1", "max", macro_f1, _CLASSES),
            Metric("rmse", "min", rmse, _NUMBERS),
            Metric("mae", "min", mae, _NUMBERS),
            Metric("smape", "min", smape, _NUMBERS),
            Metric("rmsle", "min", rmsle, _NUMBERS),
            Metric("exact_match", "max", exact_match, _TEXTS),
            Metric("rouge_l", "max", rouge_l, _TEXTS),
        )
    }
)


def get_metric(name: str, kind: str, *, data_dir: Path | None = None) -> Metric:
    """The metric ``name`` ("auto": by ``kind``; or a user's "file.py:function") for the target, else a SetupError."""
    if name == "auto":
        name = AUTO[kind]
    if ":" in name:
        fn = import_object(name, "metric")
        if not callable(fn):
            raise SetupError(f"metric = {name!r} is a {type(fn).__name__}: name a function (y_true, y_pred) -> float")
        mode = getattr(fn, "mode", "max")
        if mode not in get_args(Mode):
            raise SetupError(f"metric {name!r} has mode = {mode!r}: set it to 'min' or 'max' on the function")
        return Metric(name, "min" if mode == "min" else "max", _users(name, fn, data_dir), _CLASSES | _NUMBERS | _TEXTS)
    if name not in METRICS:
        raise SetupError(
            f"metric = {name!r} is not one of {['auto', *METRICS]} and is not a 'file.py:function' or "
            f"'module:function' of your own. Fix: set metric {in_setup('metric', env=True)}"
        )
    metric = METRICS[name]
    if kind not in metric.kinds:
        fits = [m for m, v in METRICS.items() if kind in v.kinds]
        raise SetupError(
            f"metric = {name!r} scores {_WHAT[metric.kinds]}, but the target is "
            f"{kind}: use one of {fits}, or set task (classify/regress) if the target was read as the wrong kind"
        )
    return metric


def _users(spec: str, fn: Callable[..., Any], data_dir: Path | None) -> MetricFn:
    """The user's metric (given ``data_dir=`` when it takes it), with kitlib's error naming the parameter and the fix
    when it raises or gives neither a number nor one per row; a kitlib error it raises (about the data) as it is."""
    try:
        given = {"data_dir": data_dir} if "data_dir" in inspect.signature(fn).parameters else {}
    except (TypeError, ValueError):  # a builtin without a Python signature takes no data_dir
        given = {}

    def metric(y_true: np.ndarray, y_pred: np.ndarray) -> np.ndarray:
        try:
            scores = np.asarray(fn(y_true, y_pred, **given), dtype=np.float64)
            if scores.ndim and scores.shape != (len(y_true),):
                raise ValueError(f"it returned {scores.shape} scores for {len(y_true)} rows")
            if not np.isfinite(scores).all():  # a NaN would make the score, best/ and the verdict NaN, silently
                bad = np.unravel_index(np.argmin(np.isfinite(scores)), scores.shape)  # the first one; () for a number
                raise ValueError(f"it returned {scores[bad]}" + (f" (row {bad[0]})" if scores.ndim else ""))
            return scores
        except KitError:
            raise
        except Exception as err:
            raise SetupError(
                f"metric = {spec!r} failed on {len(y_true)} rows: {type(err).__name__}: {err}. Fix the function: it "
                "gets (y_true, y_pred), numpy arrays in the target's units (and data_dir= when it takes it), and must "
                "return a finite number, or each row's score, for any predictions (a perfect one included); then "
                "re-run 00_setup"
            ) from err

    return metric


def target_rule(rule: TargetRule, metric: str) -> TargetRule:
    """How the target is read: the task's word, else the named metric's kind, else ``rule`` ("auto": by its values)."""
    if rule != "auto" or metric not in METRICS:
        return rule
    kinds = METRICS[metric].kinds
    return "regress" if kinds == _NUMBERS else "classify" if kinds == _CLASSES else rule


def check_metric_fits(target: Sequence[Any], name: str, rule: TargetRule, metric: str) -> None:
    """Refuse a numeric metric on a two-valued target (it would train as a regression and submit decimals)."""
    if rule != "auto" or target_rule(rule, metric) != "regress" or len(values := sorted(set(target), key=str)) != 2:
        return
    raise SetupError(
        f"metric = {metric!r} scores numbers, but target column {name!r} holds two values ({values[0]!r}, "
        f"{values[1]!r}): a class to predict. Fix: metric = 'accuracy' or 'macro_f1' (or 'auto') to predict the class, "
        "or task = 'regress' if the target really is a number to predict as decimals (00_setup's parameters cell; "
        "--metric / --task headless)"
    )


CHECK_ROWS = 20_000  # rows check_metric scores: a Python-loop metric stays ~1 s in 00 on a large train.csv


def check_metric(metric: Metric, target: Sequence[Any], source: str = "the target") -> None:
    """Call a user's metric once on a perfect prediction of the first CHECK_ROWS rows (as 02 scores rows), so one
    that cannot score, or data it refuses (a DataError, prefixed with ``source``), stops 00."""
    if ":" in metric.name:
        y = np.asarray(target)[:CHECK_ROWS]
        try:
            metric(y, y.copy())
        except DataError as err:
            raise DataError(f"{source}: {err}") from err


def import_object(spec: str, what: str) -> Any:
    """``"file.py:name"`` (a file's path, compiled from its source: no __pycache__ beside it, data_dir is read-only)
    or ``"package.module:name"`` -> the object, with a SetupError naming ``what`` and the fix when it does not load."""
    where, _, attr = spec.rpartition(":")
    if not where or not attr:
        raise SetupError(f"{what} = {spec!r}: expected 'file.py:function' or 'module:function', e.g. 'metric.py:score'")
    if not where.endswith(".py"):
        try:
            module = importlib.import_module(where)
        except ImportError as err:
            raise SetupError(
                f"{what} = {spec!r}: module {where!r} does not import ({err}). Fix: put {where}.py beside the "
                f"notebooks (or on sys.path / in an installed package), or name the file: '{where}.py:{attr}'"
            ) from err
    else:
        path = Path(where).expanduser().absolute()
        if not path.is_file():
            raise SetupError(
                f"{what} = {spec!r}: no file {path}. Fix: put {path.name} beside the notebook, or give its full path "
                f"(e.g. '/kaggle/input/<dataset>/{path.name}:{attr}'), or name an importable module:function"
            )
        # registered under a name of its own: dataclasses (and pickle) look a class's module up in sys.modules
        name = f"kitlib_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
        module = sys.modules[name] = ModuleType(name)
        module.__file__ = str(path)
        try:
            exec(compile(path.read_bytes(), str(path), "exec"), vars(module))
        except Exception as err:
            del sys.modules[name]
            raise SetupError(f"{what} = {spec!r}: {path} failed to load: {type(err).__name__}: {err}") from err
    found = getattr(module, attr, None)
    if found is None:
        raise SetupError(f"{what} = {spec!r}: {where} has no {attr!r} (it has: {_public(module)})")
    return found


def _public(module: object) -> list[str]:
    return sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))[:10]
