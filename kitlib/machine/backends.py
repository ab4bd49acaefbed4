"""Backend speed flags (TF32, cuDNN autotuning, matmul precision), changed only inside a restoring context."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal, TypedDict

import torch

from kitlib.machine.precision import PrecisionPlan

MatmulPrecision = Literal["highest", "high", "medium"]


class SpeedFlagKwargs(TypedDict):
    """The keyword arguments of ``speed_flags`` (a plain dict at runtime; typed so ``**`` type-checks)."""

    tf32: bool | None
    cudnn_benchmark: bool | None
    matmul_precision: MatmulPrecision | None


# Setting one flag silently rewrites others (torch's Context.cpp); those must be restored too.
_IMPLIES: dict[str, tuple[str, ...]] = {
    "float32_matmul_precision": ("cuda.matmul.fp32_precision", "mkldnn.matmul.fp32_precision"),
    "cudnn.allow_tf32": ("cudnn.conv.fp32_precision", "cudnn.rnn.fp32_precision"),
    "cuda.matmul.allow_tf32": ("float32_matmul_precision",),
}
# Every flag speed_flags may touch, in restore order (a flag whose setter rewrites others comes first); on the legacy
# API the matmul allow_tf32 is derived from float32_matmul_precision, so that one is restored last.
_NEW_API = ("float32_matmul_precision", "cudnn.allow_tf32", "cuda.matmul.fp32_precision",
            "mkldnn.matmul.fp32_precision", "cudnn.conv.fp32_precision", "cudnn.rnn.fp32_precision",
            "cudnn.benchmark")  # fmt: skip
_LEGACY_API = ("cuda.matmul.allow_tf32", "cudnn.allow_tf32", "float32_matmul_precision", "cudnn.benchmark")


def _backend(path: str) -> Any:
    """``torch.backends.<path>``, looked up now. Typed Any: cudnn.conv etc. are attached at runtime (PropModule)."""
    obj: Any = torch.backends
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part)
    return obj


def _flag(name: str, *value: Any) -> Any:
    """Read flag ``name`` (a ``torch.backends`` path, or float32_matmul_precision), or set it to ``value``. Quietly:
    new torch touches the legacy allow_tf32 only to keep it in step, and its deprecation warning is noise."""
    path, _, attr = name.rpartition(".")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if name == "float32_matmul_precision":
            return torch.set_float32_matmul_precision(*value) if value else torch.get_float32_matmul_precision()
        return setattr(_backend(path), attr, *value) if value else getattr(_backend(path), attr)


def _has_fp32_precision_api() -> bool:
    """torch 2.9+: per-backend ``fp32_precision`` ("ieee"/"tf32"/"none" = inherit); older torch: ``allow_tf32``."""
    return hasattr(torch.backends.cuda.matmul, "fp32_precision") and hasattr(torch.backends.cudnn, "conv")


def _snapshot(names: Iterable[str]) -> dict[str, Any]:
    saved = {}
    for name in names:
        # AttributeError: backend absent. RuntimeError: a flag left in a mixed legacy/new state cannot be restored
        with contextlib.suppress(AttributeError, RuntimeError):
            saved[name] = _flag(name)
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
    order = _NEW_API if new_api else _LEGACY_API
    saved = _snapshot(order)
    changed: set[str] = set()

    def put(name: str, value: Any) -> None:
        _flag(name, value)
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
        _restore([name for name in order if name in changed and name in saved], saved)


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


def _restore(names: list[str], saved: dict[str, Any]) -> None:
    """Put every changed flag back; one failing setter must not leave the others changed."""
    errors = []
    for name in names:
        try:
            _flag(name, saved[name])
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
        "matmul_precision": _snapshot(["float32_matmul_precision"]).get("float32_matmul_precision"),  # None: mixed
    }


def flags_for(plan: PrecisionPlan, *, shapes_vary: bool) -> SpeedFlagKwargs:
    """``speed_flags`` kwargs: TF32 as planned; cuDNN autotuning only for fixed shapes on CUDA (pytorch#2759)."""
    if plan.device_type != "cuda":
        return {"tf32": None, "cudnn_benchmark": None, "matmul_precision": None}
    return {"tf32": plan.tf32, "cudnn_benchmark": not shapes_vary, "matmul_precision": None}
