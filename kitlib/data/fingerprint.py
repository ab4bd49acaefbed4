"""Content hashes of everything a computation depends on, for the cache's keys (``kitlib_identity()`` where defined)."""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import inspect
import json
import os
import pickle
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

KEY_CHARS = 32  # hex chars of sha256 kept: 128 bits, collisions need ~2**64 entries
_CHUNK = 1 << 20  # 1 MiB reads: a 100 MB csv is hashed in one streamed pass (~0.07 s at ~1.4 GB/s sha256)


class _Hasher:
    """sha256 over a tagged, length-prefixed stream, so ("ab", "c") and ("a", "bc") never collide."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self._active: set[int] = set()  # functions being hashed: a recursive closure refers to itself

    def hexdigest(self) -> str:
        return self._h.hexdigest()[:KEY_CHARS]

    def tag(self, tag: str, payload: bytes | memoryview = b"") -> None:
        self._h.update(f"{tag}:{len(payload)}|".encode())
        self._h.update(payload)

    def file(self, path: Path) -> None:
        if path.is_dir():  # a dataset folder: relative names + contents, in a stable order
            files = sorted(p for p in path.rglob("*") if p.is_file())
            self.tag("dir", str(len(files)).encode())
            for p in files:
                self.tag("name", p.relative_to(path).as_posix().encode())
                self.file(p)
            return
        try:
            self.tag("file", str(path.stat().st_size).encode())
            with path.open("rb") as f:
                while chunk := f.read(_CHUNK):
                    self._h.update(chunk)
        except FileNotFoundError:
            raise FileNotFoundError(f"cache key: input file {str(path)!r} does not exist") from None

    def add(self, obj: Any) -> None:  # one flat dispatch reads better than a registry
        torch, pd = sys.modules.get("torch"), sys.modules.get("pandas")  # never import them just to hash
        if obj is None or isinstance(obj, bool | int | float | complex):
            self.tag(type(obj).__name__, repr(obj).encode())
        elif isinstance(obj, str):
            self.tag("str", obj.encode("utf-8", "surrogatepass"))
        elif isinstance(obj, bytes | bytearray | memoryview):
            self.tag("bytes", bytes(obj))
        elif isinstance(obj, os.PathLike):
            self.file(Path(obj))
        elif isinstance(obj, np.ndarray | np.generic):
            self._array(np.asarray(obj))
        elif torch is not None and isinstance(obj, torch.Tensor):
            flat = obj.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
            self.tag("tensor", f"{obj.dtype}{tuple(obj.shape)}".encode())
            self.tag("data", flat.data)
        elif pd is not None and isinstance(obj, pd.DataFrame | pd.Series | pd.Index):
            self._pandas(obj, pd)
        elif callable(getattr(obj, "kitlib_identity", None)):
            self.tag("identity")
            self.add(obj.kitlib_identity())
        elif hasattr(obj, "backend_tokenizer") or hasattr(obj, "get_vocab"):
            self._tokenizer(obj)
        elif torch is not None and isinstance(obj, torch.nn.Module):
            self._module(obj, torch)
        elif isinstance(obj, type):
            self.tag("type", f"{obj.__module__}.{obj.__qualname__}".encode())
        elif callable(obj) and (inspect.isroutine(obj) or isinstance(obj, functools.partial)):
            self._function(obj)
        elif isinstance(obj, enum.Enum):
            self.tag("enum", f"{type(obj).__qualname__}.{obj.name}".encode())
        elif isinstance(obj, Mapping):
            self.tag("dict", str(len(obj)).encode())
            for k, v in sorted(obj.items(), key=lambda kv: repr(kv[0])):
                self.add(k)
                self.add(v)
        elif isinstance(obj, list | tuple):
            if obj and all(type(s) is str for s in obj):  # texts: one joined buffer, ~100x faster than per item
                lengths = np.fromiter((len(s) for s in obj), dtype=np.int64, count=len(obj))
                self.tag("strs", lengths.data)
                self.tag("text", "".join(obj).encode("utf-8", "surrogatepass"))
            else:
                self.tag(type(obj).__name__, str(len(obj)).encode())
                for item in obj:
                    self.add(item)
        elif isinstance(obj, set | frozenset):
            digests = sorted(fingerprint(item) for item in obj)
            self.tag("set", "".join(digests).encode())
        elif dataclasses.is_dataclass(obj):
            self.tag("dataclass", f"{type(obj).__module__}.{type(obj).__qualname__}".encode())
            self.add({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)})
        else:
            try:
                self.tag(f"pickle:{type(obj).__qualname__}", pickle.dumps(obj, protocol=5))
            except Exception as err:
                raise TypeError(
                    f"cache key: cannot fingerprint a {type(obj).__qualname__} ({err}); pass identity=... to cached(), "
                    "list the argument in ignore=..., or give the class a kitlib_identity() method"
                ) from err

    def _array(self, a: np.ndarray) -> None:
        self.tag("array", f"{a.dtype.str}{a.shape}".encode())
        if a.dtype.hasobject:
            for item in a.reshape(-1).tolist():
                self.add(item)
        else:
            self.tag("data", np.ascontiguousarray(a).data.cast("B"))

    def _pandas(self, obj: Any, pd: Any) -> None:
        columns = list(obj.columns) if isinstance(obj, pd.DataFrame) else [getattr(obj, "name", None)]
        dtypes = [str(t) for t in (obj.dtypes if isinstance(obj, pd.DataFrame) else [obj.dtype])]
        self.tag(type(obj).__name__, repr((columns, dtypes, obj.shape)).encode())
        try:  # 64-bit hash per row (values + index), vectorised: ~50 ms for 100k rows of text
            rows = pd.util.hash_pandas_object(obj, index=not isinstance(obj, pd.Index)).to_numpy()
            self.tag("rows", np.ascontiguousarray(rows).data.cast("B"))
        except TypeError:  # unhashable cells (lists, dicts): slow path, cell by cell
            frame = obj.to_frame() if not isinstance(obj, pd.DataFrame) else obj
            self.add([frame[c].tolist() for c in frame.columns])
            self.add(list(frame.index))

    def _tokenizer(self, tok: Any) -> None:
        self.tag("tokenizer", type(tok).__qualname__.encode())
        backend = getattr(tok, "backend_tokenizer", None)
        if backend is not None:
            self.tag("tokenizer.json", _strip_call_state(backend.to_str()).encode())
        else:  # slow (Python) tokenizer: the vocabulary + constructor options
            self.add(sorted(tok.get_vocab().items()))
            options = getattr(tok, "init_kwargs", {})
            self.add({k: v for k, v in options.items() if isinstance(v, str | int | float | bool)})
        self.add([getattr(tok, a, None) for a in ("padding_side", "truncation_side", "model_max_length")])

    def _module(self, model: Any, torch: Any) -> None:
        self.tag("module", f"{type(model).__module__}.{type(model).__qualname__}".encode())
        config = getattr(model, "config", None)
        if config is not None and hasattr(config, "to_dict"):
            self.add({k: v for k, v in config.to_dict().items() if k != "_name_or_path"})  # moved folder: same model
        # Weights: ~256 strided values per tensor (full hashing costs ~0.15 s per 100 MB every call)
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            flat = tensor.detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // 256)].to("cpu").contiguous()
            self.tag("param", f"{name}{tensor.dtype}{tuple(tensor.shape)}".encode())
            self.tag("sample", sample.view(torch.uint8).numpy().data)

    def _function(self, fn: Any) -> None:
        if isinstance(fn, functools.partial):
            self.tag("partial")
            self.add([fn.func, fn.args, fn.keywords])
            return
        if inspect.ismethod(fn):
            self.tag("method")
            self.add(fn.__self__)
            fn = fn.__func__
        fn = inspect.unwrap(fn)
        if id(fn) in self._active:
            self.tag("recursion")
            return
        self._active.add(id(fn))
        self.tag("function", f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}".encode())
        code = getattr(fn, "__code__", None)
        try:  # source text: editing the function (even a comment) is a miss
            if code is not None and fn.__name__ == "<lambda>":
                raise TypeError("getsource() of a lambda is its whole line, including the call around it")
            self.tag("source", inspect.getsource(fn).encode())
        except (OSError, TypeError):  # no usable source (lambdas, builtins, exec'd code): the bytecode
            self.tag("code")
            self.add(_code_summary(code) if code is not None else None)
        for cell in getattr(fn, "__closure__", None) or ():  # captured variables are inputs too
            try:
                self.add(cell.cell_contents)
            except (TypeError, ValueError):  # unhashable or empty cell: its type at least
                self.tag("cell", type(getattr(cell, "cell_contents", None)).__qualname__.encode())
        self._active.discard(id(fn))


_CALL_STATE = re.compile(r'"truncation":(null|\{[^{}]*\}),"padding":(null|\{(?:[^{}]|\{[^{}]*\})*\}),')


def _strip_call_state(tokenizer_json: str) -> str:
    """Drop truncation/padding: transformers rewrites them on the backend at every call, they are not the vocab."""
    stripped, n = _CALL_STATE.subn("", tokenizer_json[:4096], count=1)  # they sit at the top of to_str() output
    if n == 1:
        return stripped + tokenizer_json[4096:]
    data = json.loads(tokenizer_json)  # layout changed: slower but exact (~0.1 s for a 30k-token vocab)
    data.pop("truncation", None)
    data.pop("padding", None)
    return json.dumps(data, sort_keys=True)


def _code_summary(code: Any) -> tuple[Any, ...]:
    consts = tuple(_code_summary(c) if inspect.iscode(c) else c for c in code.co_consts)
    return (code.co_code, consts, code.co_names)


def fingerprint(*objs: Any) -> str:
    """The content hash the cache uses for ``objs`` (hex). Handy to see why two runs miss."""
    h = _Hasher()
    for obj in objs:
        h.add(obj)
    return h.hexdigest()
