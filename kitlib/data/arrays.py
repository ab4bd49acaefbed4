"""Arrays and plain data stored so reading runs no code (JSON + raw bytes); ``encode`` gives None for anything else."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from typing import Any

import numpy as np

# lazy: torch (+1.0 s): only tensor entries need it; `import kitlib.data.arrays` stays at numpy's cost.

RAGGED_MIN = 64  # lists of >= this many same-dtype 1-D arrays become flat + offsets (~1 JSON record per array saved)
_MAX_DEPTH = 32  # deeper structures are not featurisation results: not stored


class NotEncodable(Exception):
    """The value holds something this format cannot describe without code."""


def encode(value: Any) -> tuple[Any, list[np.ndarray]] | None:
    """``(tree, arrays)``: a JSON-able description and the arrays it refers to by index; None if not encodable."""
    arrays: list[np.ndarray] = []
    try:
        return _encode(value, arrays, 0), arrays
    except NotEncodable:
        return None


def _array_node(a: np.ndarray, arrays: list[np.ndarray], kind: str, dtype: str) -> dict[str, Any]:
    arrays.append(np.ascontiguousarray(a))
    return {kind: len(arrays) - 1, "dtype": dtype, "shape": list(a.shape)}


def _encode(value: Any, arrays: list[np.ndarray], depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise NotEncodable("too deep")
    kind = type(value)
    if value is None or kind in (bool, int, str):
        return value
    if kind is float:
        return {"float": repr(value)}  # repr round-trips nan/inf exactly, which JSON numbers cannot
    if kind is np.ndarray:
        if value.dtype.hasobject or value.dtype.fields is not None:
            raise NotEncodable("object or structured array")
        return _array_node(value, arrays, "array", value.dtype.str)
    if isinstance(value, np.generic) and not isinstance(value, np.object_):
        return {"scalar": _array_node(np.asarray(value), arrays, "array", value.dtype.str)}
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_quantized:
            raise NotEncodable("sparse or quantized tensor")
        t = value.detach().to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy()  # bytes: also covers bf16, which numpy lacks
        return {
            "tensor": _array_node(raw, arrays, "array", "|u1")["array"],
            "dtype": str(t.dtype).removeprefix("torch."),
            "shape": list(t.shape),
        }
    if kind in (list, tuple):
        if len(value) >= RAGGED_MIN and is_ragged(value):
            offsets = np.zeros(len(value) + 1, dtype=np.int64)
            np.cumsum([len(a) for a in value], out=offsets[1:])
            flat = np.concatenate(value)
            return {
                "ragged": _encode(flat, arrays, depth + 1),
                "offsets": _encode(offsets, arrays, depth + 1),
                "tuple": kind is tuple,
            }
        return {kind.__name__: [_encode(v, arrays, depth + 1) for v in value]}
    if kind is dict:
        if not all(type(k) is str for k in value):
            raise NotEncodable("dict keys that are not strings")
        return {"dict": {k: _encode(v, arrays, depth + 1) for k, v in value.items()}}
    if dataclasses.is_dataclass(value) and kind.__module__.split(".")[0] == "kitlib" and "<" not in kind.__qualname__:
        fields = {
            f.name: _encode(getattr(value, f.name), arrays, depth + 1) for f in dataclasses.fields(value) if f.init
        }
        return {"dataclass": f"{kind.__module__}:{kind.__qualname__}", "fields": fields}
    raise NotEncodable(kind.__name__)


def is_ragged(values: list[Any] | tuple[Any, ...]) -> bool:
    first = values[0]
    return (
        type(first) is np.ndarray
        and first.ndim == 1
        and not first.dtype.hasobject
        and all(type(a) is np.ndarray and a.ndim == 1 and a.dtype == first.dtype for a in values)
    )


def decode(tree: Any, arrays: list[np.ndarray]) -> Any:
    """The value :func:`encode` described. Only kitlib dataclasses are called; nothing else runs."""
    if tree is None or type(tree) in (bool, int, str):
        return tree
    if type(tree) is not dict or not tree:
        raise ValueError(f"not an encoded value: {tree!r:.80}")
    if "float" in tree:
        return float(tree["float"])
    if "array" in tree:
        return arrays[tree["array"]].view(np.dtype(tree["dtype"])).reshape(tree["shape"])
    if "scalar" in tree:
        return decode(tree["scalar"], arrays)[()]
    if "tensor" in tree:
        import torch

        return torch.from_numpy(arrays[tree["tensor"]]).view(getattr(torch, tree["dtype"])).reshape(tree["shape"])
    if "ragged" in tree:
        flat, offsets = decode(tree["ragged"], arrays), decode(tree["offsets"], arrays)
        parts = np.split(flat, offsets[1:-1])
        return tuple(parts) if tree["tuple"] else parts
    if "list" in tree:
        return [decode(v, arrays) for v in tree["list"]]
    if "tuple" in tree:
        return tuple(decode(v, arrays) for v in tree["tuple"])
    if "dict" in tree:
        return {k: decode(v, arrays) for k, v in tree["dict"].items()}
    if "dataclass" in tree:
        module, _, qualname = tree["dataclass"].partition(":")
        if module.split(".")[0] != "kitlib":  # never import or call anything outside kitlib
            raise ValueError(f"refusing to build {tree['dataclass']!r}: only kitlib's own classes are rebuilt")
        cls: Any = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise ValueError(f"{tree['dataclass']!r} is not a kitlib dataclass")
        return cls(**{k: decode(v, arrays) for k, v in tree["fields"].items()})
    raise ValueError(f"unknown node {sorted(tree)}")
