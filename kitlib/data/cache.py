"""Content-addressed feature cache: an entry ``<name>-<key>/`` (raw buffers, a manifest, ``data.json`` or a signed
``data.pkl``) appears by one atomic rename; a bad checksum means rebuild. Only pickles signed by this machine's key
are unpickled; seed caches serve array entries only."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import json
import os
import pickle
import re
import shutil
import socket
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

import kitlib._version as kit_version
from kitlib._files import FileMismatch, explain_disk_full, read_checked, write_recorded
from kitlib.data import arrays
from kitlib.data.fingerprint import KEY_CHARS as KEY_CHARS
from kitlib.data.fingerprint import _Hasher
from kitlib.data.fingerprint import fingerprint as fingerprint
from kitlib.data.signing import is_signed, sign
from kitlib.errors import CacheError
from kitlib.machine.hardware import detect_platform

# lazy: torch (+1.0 s), pandas (+0.2 s): only tensor and DataFrame entries need them; `import kitlib.data.cache` stays
# at 0.2 s (numpy). Measured with python -X importtime.

if TYPE_CHECKING:
    import pandas as pd

FORMAT_VERSION = 3  # 2: {"bytes", "sha256"} file records (kitlib._files); 3: signed (kitlib.data.signing)
_ALIGN = 64  # out-of-band buffers start on 64-byte boundaries, so arrays load aligned for SIMD
_READ_ONLY_ROOTS = (Path("/kaggle/input"),)  # attached datasets: read-only, published by someone else

R = TypeVar("R")


class CacheWarning(UserWarning):
    pass


class _Corrupt(Exception):
    pass


@dataclasses.dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    corrupt: int = 0  # entries found damaged, reported and rebuilt
    time_saved_s: float = 0.0  # sum of build seconds of the entries that were hits
    load_s: float = 0.0
    build_s: float = 0.0

    def __str__(self) -> str:
        return (
            f"cache: {self.hits} hits, {self.misses} misses ({self.corrupt} corrupt, rebuilt), "
            f"{self.time_saved_s:.1f} s saved, {self.load_s:.2f} s loading, {self.build_s:.1f} s building"
        )


def default_cache_dir(environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> Path:
    """``$KITLIB_CACHE_DIR``; on Kaggle /kaggle/working/kitlib-cache (saved as the notebook's output, attachable to
    the next session as input); elsewhere ``./.kitlib-cache``."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    override = env.get("KITLIB_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    if detect_platform(env) == "kaggle":
        return Path("/kaggle/working/kitlib-cache")
    return (cwd or Path.cwd()) / ".kitlib-cache"


# ------------------------------------------------------------------------------------------------------- call arguments


def _bind(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature
        return {"*args": tuple(args), **kwargs}
    bound = sig.bind(*args, **kwargs)  # a wrong call fails here, as calling fn would
    bound.apply_defaults()  # f(x) and f(x, n=3) with default n=3 are the same entry
    return dict(bound.arguments)


def _summary(value: Any) -> Any:
    """A short, JSON-able description of one argument for the manifest."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return value if len(value) <= 80 else value[:77] + "..."
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"{type(value).__name__}{tuple(shape)}"
    if isinstance(value, list | tuple | dict | set):
        return f"{type(value).__name__}[{len(value)}]"
    name = getattr(value, "name_or_path", None)
    return f"{type(value).__name__}({name})" if name else type(value).__name__


# --------------------------------------------------------------------------------------------------------- storage


class _Ragged:
    """A list of same-dtype 1-D arrays pickled as one flat array + offsets (two buffers instead of 10k objects)."""

    def __init__(self, parts: list[Any] | tuple[Any, ...]) -> None:
        self.offsets = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in parts], out=self.offsets[1:])
        self.flat = np.concatenate(parts)
        self.as_tuple = isinstance(parts, tuple)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_unragged, (self.flat, self.offsets, self.as_tuple))


def _unragged(flat: np.ndarray, offsets: np.ndarray, as_tuple: bool) -> list[Any] | tuple[Any, ...]:
    parts = np.split(flat, offsets[1:-1])
    return tuple(parts) if as_tuple else parts


def _pack(obj: Any, depth: int = 0) -> Any:
    kind = type(obj)
    if kind in (list, tuple) and len(obj) >= arrays.RAGGED_MIN:
        return _Ragged(obj) if arrays.is_ragged(obj) else obj
    if depth < 3 and kind is dict:
        return {k: _pack(v, depth + 1) for k, v in obj.items()}
    if depth < 3 and kind in (list, tuple):
        return kind(_pack(v, depth + 1) for v in obj)
    return obj


def _tensor_from_bytes(raw: np.ndarray, dtype: str, shape: tuple[int, ...]) -> Any:
    import torch

    return torch.from_numpy(raw).view(getattr(torch, dtype)).reshape(shape)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        # torch's own tensor pickling copies the data in-band through torch.save; a uint8 numpy view instead goes
        # out-of-band like any array (and covers bf16, which numpy lacks). Loads on CPU, without requires_grad.
        if torch is not None and isinstance(obj, torch.Tensor) and obj.layout == torch.strided and not obj.is_quantized:
            t = obj.detach().to("cpu").contiguous()
            raw = t.reshape(-1).view(torch.uint8).numpy()
            return (_tensor_from_bytes, (raw, str(t.dtype).removeprefix("torch."), tuple(t.shape)))
        return NotImplemented


def _raw_bytes(a: np.ndarray) -> memoryview:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8).data  # a memoryview over the array's bytes, no copy


def _write_entry(tmp: Path, result: Any, manifest: dict[str, Any]) -> None:
    """Arrays and plain data as data.json + buffers.bin (reading runs no code); anything else as a pickle."""
    encoded = arrays.encode(result)
    if encoded is not None:
        tree, values = encoded
        head_name, head = "data.json", json.dumps(tree, separators=(",", ":")).encode()
        raws = [_raw_bytes(a) for a in values]
    else:
        buffers: list[pickle.PickleBuffer] = []
        out = io.BytesIO()
        _Pickler(out, protocol=5, buffer_callback=buffers.append).dump(_pack(result))
        head_name, head, raws = "data.pkl", out.getvalue(), [b.raw() for b in buffers]
    layout: list[list[int]] = []
    chunks: list[bytes | memoryview] = []
    offset = 0
    for raw in raws:
        pad = -offset % _ALIGN
        chunks += [b"\0" * pad, raw]
        layout.append([offset + pad, raw.nbytes])
        offset += pad + raw.nbytes
    files = {head_name: write_recorded(tmp / head_name, [head])}
    if raws:
        files["buffers.bin"] = write_recorded(tmp / "buffers.bin", chunks)
    manifest.update(files=files, buffers=layout, size_bytes=sum(f["bytes"] for f in files.values()))
    manifest["signature"] = sign(files)  # this machine's key, kept outside the cache: see kitlib.data.signing
    write_recorded(tmp / "manifest.json", [json.dumps(manifest, indent=1).encode()])


def _read_manifest(entry: Path) -> dict[str, Any]:
    try:
        manifest: dict[str, Any] = json.loads((entry / "manifest.json").read_bytes())
    except FileNotFoundError:
        raise _Corrupt("manifest.json is missing") from None
    except (ValueError, OSError) as err:
        raise _Corrupt(f"manifest.json is unreadable ({err})") from err
    return manifest


def _read_entry(entry: Path, key: str, *, seed: bool = False) -> tuple[Any, dict[str, Any]]:
    """The entry's result. data.json entries run no code when read; data.pkl ones are unpickled only from the
    cache's own dir (never a ``seed``) and only when this machine signed them."""
    manifest = _read_manifest(entry)
    if manifest.get("key") != key or manifest.get("format") != FORMAT_VERSION:
        raise _Corrupt(f"manifest is for key {manifest.get('key')!r}, format {manifest.get('format')!r}")
    blobs: dict[str, bytearray] = {}
    for name, record in manifest.get("files", {}).items():
        try:  # read once into memory the arrays then view directly (no extra copy), checked on the way
            blobs[name] = read_checked(entry / name, record)
        except FileMismatch as err:
            raise _Corrupt(str(err)) from None
    view = memoryview(blobs.get("buffers.bin", bytearray()))
    buffers = [view[o : o + n] for o, n in manifest.get("buffers", [])]
    if "data.json" in blobs:
        try:
            tree = json.loads(blobs["data.json"])
            return arrays.decode(tree, [np.frombuffer(b, dtype=np.uint8) for b in buffers]), manifest
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, ImportError) as err:
            raise _Corrupt(f"data.json does not decode ({type(err).__name__}: {err})") from err
    if "data.pkl" not in blobs:
        raise _Corrupt("manifest lists no data.json or data.pkl")
    if seed:
        raise _Corrupt(
            "it is a pickle in a seed cache (someone else's files), so it was not unpickled (unpickling runs code)"
        )
    if not is_signed(manifest["files"], manifest.get("signature")):
        raise _Corrupt(
            "it is a pickle not signed by this machine's kitlib key, so it was not unpickled (unpickling runs code)"
        )
    try:
        result = pickle.loads(blobs["data.pkl"], buffers=buffers)
    except Exception as err:  # e.g. a class from a notebook that no longer exists
        raise _Corrupt(f"unpickling failed ({type(err).__name__}: {err})") from err
    return result, manifest


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname())  # no '-': temp dir names split on it


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_read_only(path: Path) -> bool:
    resolved = path.expanduser().resolve()
    if any(resolved.is_relative_to(root) for root in _READ_ONLY_ROOTS):
        return True
    return resolved.exists() and not os.access(resolved, os.W_OK)


# ----------------------------------------------------------------------------------------------------------- Cache


class Cache:
    """A feature cache in ``dir`` (default: ``default_cache_dir()``); ``.stats`` adds up. ``seed_dirs``: read-only
    caches looked up after ``dir``: their array entries load, their pickles never; hits are copied into ``dir``
    (``copy_seed_hits``)."""

    def __init__(
        self,
        dir: str | os.PathLike[str] | None = None,
        *,
        seed_dirs: Iterable[str | os.PathLike[str]] = (),
        copy_seed_hits: bool = True,
        log: Callable[[str], None] | None = print,
    ) -> None:
        self.dir = Path(dir).expanduser() if dir is not None else default_cache_dir()
        self.seed_dirs = tuple(Path(d).expanduser() for d in seed_dirs)
        if _is_read_only(self.dir):
            raise CacheError(
                f"cache dir {str(self.dir)!r} is read-only (an attached dataset?): the cache writes its entries "
                "there. Fix: give a writable dir and read this one as a seed: "
                f"Cache('kitlib-cache', seed_dirs=[{str(self.dir)!r}]) (its array entries load as they are; nothing "
                "in it is unpickled)"
            )
        self.copy_seed_hits = copy_seed_hits
        self.log = log
        self.stats = CacheStats()

    def __repr__(self) -> str:
        return f"Cache({str(self.dir)!r}, seeds={len(self.seed_dirs)}, {self.stats})"

    def kitlib_identity(self) -> str:
        return "kitlib.Cache"  # where a result is stored is no input to it (and .stats change every call)

    # ---- keys and lookups

    def key(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        identity: Any = None,
        ignore: Iterable[str] = (),
    ) -> str:
        """The entry key for ``fn(*args, **kwargs)``; arguments named in ``ignore`` do not count."""
        skip = set(ignore)
        h = _Hasher()
        h.add(["kitlib-cache", FORMAT_VERSION, _version()])
        h.add(fn)
        for name, value in _bind(fn, args, kwargs or {}).items():
            if name in skip:
                continue
            h.tag("arg", name.encode())
            h.add(value)
            if isinstance(value, str) and len(value) < 4096 and os.path.isfile(value):
                h.file(Path(value))  # a path given as str: its bytes count too (pass a Path to hash bytes only)
        h.tag("identity")
        h.add(identity)
        return h.hexdigest()

    def _get_or_build(
        self,
        fn: Callable[..., R],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
        identity: Any = None,
        ignore: Iterable[str] = (),
    ) -> R:
        """``cached``'s work: ``fn(*args, **kwargs)`` from an entry with the same key, else built and stored."""
        start = time.perf_counter()  # a hit costs hashing the inputs + loading: both count
        kwargs = dict(kwargs or {})
        ignore = tuple(ignore)
        key = self.key(fn, args, kwargs, identity=identity, ignore=ignore)
        label = re.sub(r"[^A-Za-z0-9_.]+", "_", str(name or getattr(fn, "__name__", "feature")))[:60] or "feature"
        entry = f"{label}-{key}"
        found, stale = self._lookup(entry, key)
        if found is not None:
            result, manifest = found
            load_s = time.perf_counter() - start
            self.stats.hits += 1
            self.stats.load_s += load_s
            self.stats.time_saved_s += float(manifest.get("build_s", 0.0))
            self._say(f"cache hit {label}[{key[:8]}] {load_s:.2f} s (built in {manifest.get('build_s', 0.0):.1f} s)")
            return result
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        build_s = time.perf_counter() - start
        self.stats.misses += 1
        self.stats.build_s += build_s
        params = {k: _summary(v) for k, v in _bind(fn, args, kwargs).items() if k not in ignore}
        size = self._store(
            entry,
            result,
            {
                "format": FORMAT_VERSION,
                "key": key,
                "name": label,
                "function": f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}",
                "params": params,
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "created_ts": time.time(),
                "build_s": round(build_s, 3),
                "kitlib_version": _version(),
                "writer": uuid.uuid4().hex,
            },
            stale,
        )
        stored = f"stored {size / 1e6:.1f} MB" if size is not None else "not stored"
        self._say(f"cache miss {label}[{key[:8]}] built in {build_s:.1f} s, {stored}")
        return result

    def _lookup(self, entry: str, key: str) -> tuple[tuple[Any, dict[str, Any]] | None, str | None]:
        """((result, manifest) or None, writer id of a damaged own entry that a store may replace)."""
        stale: str | None = None
        for root in (self.dir, *self.seed_dirs):
            path = root / entry
            if not path.is_dir():
                continue
            try:
                # arrays (data.json) load from anywhere; pickles only from this dir, signed here
                found = _read_entry(path, key, seed=root != self.dir)
            except _Corrupt as err:
                self.stats.corrupt += 1
                warnings.warn(
                    f"cache entry {entry} in {root} cannot be used: {err}; rebuilding it", CacheWarning, stacklevel=3
                )
                if root == self.dir:
                    with contextlib.suppress(_Corrupt):
                        stale = str(_read_manifest(path).get("writer"))
                    stale = stale or "unreadable"
                continue
            except FileNotFoundError:  # cleared by someone else while we read: a plain miss
                continue
            if root != self.dir and self.copy_seed_hits:
                self._copy_in(path, entry, stale)
            return found, None
        return None, stale

    # ---- writes

    def _tmp(self, entry: str) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._sweep()
        tmp = self.dir / f".tmp-{entry}-{_host()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        return tmp

    def _store(self, entry: str, result: Any, manifest: dict[str, Any], stale: str | None) -> int | None:
        tmp: Path | None = None
        try:
            tmp = self._tmp(entry)
            with explain_disk_full(self.dir / entry, "cache entry"):
                _write_entry(tmp, result, manifest)
            self._install(tmp, self.dir / entry, stale)
        except Exception as err:  # never lose the computed result over a cache problem (disk full, unpicklable)
            warnings.warn(f"cache: could not store {entry}: {type(err).__name__}: {err}", CacheWarning, stacklevel=3)
            return None
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        return int(manifest["size_bytes"])

    def _install(self, tmp: Path, final: Path, stale: str | None) -> None:
        """Publish ``tmp`` as ``final`` with one rename. If another writer got there first with a complete entry,
        theirs stays (same key, same content); a damaged entry (writer ``stale``) is moved aside and replaced."""
        for _ in range(5):
            try:
                os.rename(tmp, final)  # atomic; fails on an existing non-empty directory instead of merging
                return
            except OSError:
                if not final.exists():
                    continue
            try:
                writer: str | None = str(_read_manifest(final).get("writer"))
            except _Corrupt:
                writer = None
            if writer is not None and writer != stale:
                return  # a concurrent writer installed a complete entry
            trash = self.dir / f".trash-{uuid.uuid4().hex[:8]}"
            with contextlib.suppress(FileNotFoundError):
                os.rename(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        raise CacheError(f"could not install {final.name}: it keeps changing under concurrent writers")

    def _copy_in(self, seed_entry: Path, entry: str, stale: str | None) -> None:
        tmp = self._tmp(entry)
        try:
            shutil.copytree(seed_entry, tmp, dirs_exist_ok=True)
            manifest = _read_manifest(tmp)  # an array entry (a seed's pickles never hit): its copy is signed here
            manifest["signature"] = sign(manifest["files"])
            write_recorded(tmp / "manifest.json", [json.dumps(manifest, indent=1).encode()])
            self._install(tmp, self.dir / entry, stale)
        except (OSError, CacheError, _Corrupt) as err:
            warnings.warn(f"cache: could not copy {entry} from {seed_entry.parent}: {err}", CacheWarning, stacklevel=4)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _sweep(self) -> None:
        """Remove temp dirs of writers that died (SIGKILL, OOM, session end); live writers' temp dirs stay."""
        host = _host()
        for path in self.dir.glob(".t*-*"):
            if path.name.startswith(".trash-"):
                shutil.rmtree(path, ignore_errors=True)
                continue
            match = re.fullmatch(r"\.tmp-.+-(?P<host>[^-]+)-(?P<pid>\d+)-[0-9a-f]{8}", path.name)
            if match is None:
                continue
            mine = match["host"] == host
            with contextlib.suppress(OSError):
                old = time.time() - path.stat().st_mtime > 86400  # another machine's writer: give it a day
                if (mine and not _pid_alive(int(match["pid"]))) or (not mine and old):
                    shutil.rmtree(path, ignore_errors=True)

    # ---- housekeeping

    def _entries(self) -> Iterator[tuple[Path, dict[str, Any] | None]]:
        if not self.dir.is_dir():
            return
        for path in sorted(self.dir.iterdir()):
            if path.name.startswith(".") or not path.is_dir() or path.is_symlink():
                continue
            try:
                yield path, _read_manifest(path)
            except _Corrupt:
                yield path, None

    def list(self) -> pd.DataFrame:
        """One row per entry: key, name, size (bytes), created (UTC), build_s, function, path."""
        import pandas as pd

        rows = [
            {
                "key": (m or {}).get("key", path.name.rsplit("-", 1)[-1]),
                "name": (m or {}).get("name", "?"),
                "size": sum(f.stat().st_size for f in path.iterdir() if f.is_file()),
                "created": (m or {}).get("created_ts", path.stat().st_mtime),
                "build_s": (m or {}).get("build_s", float("nan")),
                "function": (m or {}).get("function", "(damaged)"),
                "path": str(path),
            }
            for path, m in self._entries()
        ]
        columns = ["key", "name", "size", "created", "build_s", "function", "path"]
        table = pd.DataFrame(rows, columns=columns)
        table["created"] = pd.to_datetime(table["created"].astype(float), unit="s", utc=True).dt.floor("s")
        return table.sort_values("created", ignore_index=True)

    def size_bytes(self) -> int:
        """Bytes on disk under ``dir``, including leftovers of interrupted writes."""
        if not self.dir.is_dir():
            return 0
        return sum(f.stat().st_size for f in self.dir.rglob("*") if f.is_file() and not f.is_symlink())

    def clear(self, older_than: float | timedelta | None = None, name: str | None = None) -> int:
        """Delete entries (all, older than ``older_than`` seconds, or of one ``name``); returns how many. Only entry
        folders directly inside ``dir``: never ``dir`` itself, never a symlink's target."""
        max_age = older_than.total_seconds() if isinstance(older_than, timedelta) else older_than
        now, removed = time.time(), 0
        for path, manifest in list(self._entries()):
            if name is not None and (manifest or {}).get("name") != name:
                continue
            created = (manifest or {}).get("created_ts", path.stat().st_mtime)
            if max_age is not None and now - float(created) < max_age:
                continue
            if path.parent.resolve() != self.dir.resolve():
                continue
            shutil.rmtree(path)
            removed += 1
        if older_than is None and name is None and self.dir.is_dir():
            self._sweep()
        return removed

    def _say(self, message: str) -> None:
        if self.log is not None:
            self.log(message)


def _version() -> str:
    return kit_version.__version__  # read at call time: a version bump (patched in tests) misses the cache


# ----------------------------------------------------------------------------------- the one way to memoise a call


def cached(
    fn: Callable[..., R],
    /,
    *args: Any,
    cache: Cache | None = None,
    name: str | None = None,
    identity: Any = None,
    ignore: Iterable[str] = (),
    **kwargs: Any,
) -> R:
    """``fn(*args, **kwargs)`` through the cache (a default ``Cache`` when ``cache`` is None)."""
    return (cache or Cache())._get_or_build(fn, args, kwargs, name=name, identity=identity, ignore=ignore)
