"""Backend speed flags (TF32, cuDNN autotuning, matmul precision), changed only inside a restoring context."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

import torch

from kitlib.machine.precision import PrecisionPlan

MatmulPrecision = Literal["highest", "high", "medium"]


class SpeedFlagKwargs(TypedDict):
    """The keyword arguments of ``speed_flags`` (a plain dict at runtime; typed so ``**`` type-checks)."""

    tf32: bool | None
    cudnn_benchmark: bool | None
    matmul_precision: MatmulPrecision | None


@dataclass(frozen=True)
class _Flag:
    name: str
    get: Callable[[], Any]
    set: Callable[[Any], None]


# Setting one flag silently rewrites others (torch's Context.cpp); those must be restored too.
_IMPLIES: dict[str, tuple[str, ...]] = {
    "float32_matmul_precision": ("cuda.matmul.fp32_precision", "mkldnn.matmul.fp32_precision"),
    "cudnn.allow_tf32": ("cudnn.conv.fp32_precision", "cudnn.rnn.fp32_precision"),
    "cuda.matmul.allow_tf32": ("float32_matmul_precision",),
}


def _backend(path: str) -> Any:
    """``torch.backends.<path>``, looked up now. Typed Any: cudnn.conv etc. are attached at runtime (PropModule)."""
    obj: Any = torch.backends
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part)
    return obj


@contextlib.contextmanager
def _silenced(active: bool) -> Iterator[None]:
    if not active:
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _attr_flag(path: str, attr: str, *, legacy: bool = False) -> _Flag:
    # new torch: the legacy allow_tf32 is touched only to keep it in step; its deprecation warning is noise
    def get() -> Any:
        with _silenced(legacy):
            return getattr(_backend(path), attr)

    def put(value: Any) -> None:
        with _silenced(legacy):
            setattr(_backend(path), attr, value)

    return _Flag(f"{path}.{attr}", get, put)


def _has_fp32_precision_api() -> bool:
    """torch 2.9+: per-backend ``fp32_precision`` ("ieee"/"tf32"/"none" = inherit); older torch: ``allow_tf32``."""
    return hasattr(torch.backends.cuda.matmul, "fp32_precision") and hasattr(torch.backends.cudnn, "conv")


def _flags(new_api: bool) -> dict[str, _Flag]:
    """Every flag speed_flags may touch, in restore order (a flag whose setter rewrites others comes first)."""
    matmul_precision = _Flag(
        "float32_matmul_precision",
        lambda: torch.get_float32_matmul_precision(),
        lambda v: torch.set_float32_matmul_precision(v),
    )
    if new_api:
        order = [
            matmul_precision,
            _attr_flag("cudnn", "allow_tf32", legacy=True),
            *(_attr_flag(p, "fp32_precision") for p in ("cuda.matmul", "mkldnn.matmul", "cudnn.conv", "cudnn.rnn")),
            _attr_flag("cudnn", "benchmark"),
        ]
    else:
        # Legacy matmul allow_tf32 is derived from float32_matmul_precision, so that one is restored last.
        order = [
            _attr_flag("cuda.matmul", "allow_tf32"),
            _attr_flag("cudnn", "allow_tf32"),
            matmul_precision,
            _attr_flag("cudnn", "benchmark"),
        ]
    return {f.name: f for f in order}


def _snapshot(flags: Iterable[_Flag]) -> dict[str, Any]:
    saved = {}
    for flag in flags:
        try:
            saved[flag.name] = flag.get()
        except (AttributeError, RuntimeError):
            # AttributeError: backend absent. RuntimeError: a flag left in a mixed legacy/new state cannot be restored
            continue
    return saved


@contextlib.contextmanager
def speed_flags(
    *,
    tf32: bool | None = None,
    cudnn_benchmark: bool | None = None,
    matmul_precision: MatmulPrecision | None = None,
) -> Iterator[dict[str, object]]:
    """Set backend flags for the block and restore them all after; None: leave alone. Yields the effective values."""
    if tf32 is not None and matmul_precision is not None and tf32 != (matmul_precision != "highest"):
        raise ValueError(
            f"tf32={tf32} contradicts matmul_precision={matmul_precision!r} ('high'/'medium' allow TF32 matmuls, "
            f"'highest' forbids them). Fix: pass only one of them"
        )
    new_api = _has_fp32_precision_api()
    flags = _flags(new_api)
    saved = _snapshot(flags.values())
    changed: set[str] = set()

    def put(name: str, value: Any) -> None:
        flags[name].set(value)
        changed.update((name, *_IMPLIES.get(name, ())))

    try:
        if matmul_precision is not None:
            put("float32_matmul_precision", matmul_precision)
        if tf32 is not None and new_api:
            _set_tf32_new_api(tf32, saved, put, matmul_precision_given=matmul_precision is not None)
        elif tf32 is not None:
            put("cuda.matmul.allow_tf32", tf32)
            put("cudnn.allow_tf32", tf32)
        if cudnn_benchmark is not None:
            put("cudnn.benchmark", cudnn_benchmark)
        yield _effective(new_api)
    finally:
        _restore([f for name, f in flags.items() if name in changed and name in saved], saved)


def _set_tf32_new_api(
    tf32: bool, saved: dict[str, Any], put: Callable[[str, Any], None], *, matmul_precision_given: bool
) -> None:
    value = "tf32" if tf32 else "ieee"
    # torch's legacy readers (inductor: cuda.matmul and cudnn allow_tf32) raise when the APIs disagree: keep in step
    current = saved.get("float32_matmul_precision")  # None: unreadable, already mixed by other code; leave it
    if not matmul_precision_given and current is not None and (current != "highest") != tf32:
        put("float32_matmul_precision", "high" if tf32 else "highest")
    put("cuda.matmul.fp32_precision", value)
    # The legacy cudnn getter needs conv == rnn == a bool only the legacy setter changes: set it first, if it differs
    if "cudnn.allow_tf32" in saved and saved["cudnn.allow_tf32"] != tf32:
        put("cudnn.allow_tf32", tf32)
    put("cudnn.conv.fp32_precision", value)
    if "cudnn.rnn.fp32_precision" in saved:
        put("cudnn.rnn.fp32_precision", value)


def _restore(flags: list[_Flag], saved: dict[str, Any]) -> None:
    """Put every changed flag back; one failing setter must not leave the others changed."""
    errors = []
    for flag in flags:
        try:
            flag.set(saved[flag.name])
        except (AttributeError, RuntimeError, ValueError) as e:
            errors.append(e)
    if errors:
        raise errors[0]


def _resolve(value: str) -> str:
    """'none' means inherit: op -> backend 'all' (cudnn.fp32_precision is cuda/all) -> generic (torch.backends)."""
    for parent in ("cudnn", ""):
        if value != "none":
            break
        value = _backend(parent).fp32_precision
    return value


def _read_or_none(getter: Callable[[], Any]) -> Any:
    try:
        return getter()
    except RuntimeError:  # mixed-API state left by other code
        return None


def _effective(new_api: bool) -> dict[str, object]:
    if new_api:
        tf32_matmul = _resolve(_backend("cuda.matmul").fp32_precision) == "tf32"
        tf32_cudnn = _resolve(_backend("cudnn.conv").fp32_precision) == "tf32"
    else:
        tf32_matmul, tf32_cudnn = bool(_backend("cuda.matmul").allow_tf32), bool(_backend("cudnn").allow_tf32)
    return {
        "api": "fp32_precision" if new_api else "allow_tf32",
        "tf32_matmul": tf32_matmul,
        "tf32_cudnn": tf32_cudnn,
        "cudnn_benchmark": bool(_backend("cudnn").benchmark),
        "matmul_precision": _read_or_none(torch.get_float32_matmul_precision),
    }


def flags_for(plan: PrecisionPlan, *, shapes_vary: bool) -> SpeedFlagKwargs:
    """``speed_flags`` kwargs: TF32 as planned; cuDNN autotuning only for fixed shapes on CUDA (pytorch#2759)."""
    if plan.device_type != "cuda":
        return {"tf32": None, "cudnn_benchmark": None, "matmul_precision": None}
    return {"tf32": plan.tf32, "cudnn_benchmark": not shapes_vary, "matmul_precision": None}
