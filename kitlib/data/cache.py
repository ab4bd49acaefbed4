"""Content-addressed feature cache: entries appear by one atomic rename, sha256-checked; nothing is ever unpickled."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import json
import os
import re
import shutil
import socket
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

import kitlib._version as kit_version
from kitlib._files import FileMismatch as _Corrupt  # a damaged entry: missing, truncated, corrupted, unreadable
from kitlib._files import explain_disk_full, read_checked, read_manifest, write_manifest, write_recorded
from kitlib.data import arrays
from kitlib.data.fingerprint import KEY_CHARS as KEY_CHARS
from kitlib.data.fingerprint import _Hasher
from kitlib.data.fingerprint import fingerprint as fingerprint
from kitlib.errors import CacheError
from kitlib.machine.hardware import detect_platform

# lazy: pandas (+0.2 s): only `list()` builds a DataFrame

if TYPE_CHECKING:
    import pandas as pd

FORMAT_VERSION = 4  # 4: no pickles at all (3 held signed ones)
_ALIGN = 64  # buffers start on 64-byte boundaries, so arrays load aligned for SIMD
_READ_ONLY_ROOTS = (Path("/kaggle/input"),)  # attached datasets: read-only, published by someone else

R = TypeVar("R")


class CacheWarning(UserWarning):
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
    """``$KITLIB_CACHE_DIR``; on Kaggle /kaggle/working/kitlib-cache (the notebook's output); else ./.kitlib-cache."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    if env.get("KITLIB_CACHE_DIR"):
        return Path(env["KITLIB_CACHE_DIR"]).expanduser()
    if detect_platform(env) == "kaggle":
        return Path("/kaggle/working/kitlib-cache")
    return (cwd or Path.cwd()) / ".kitlib-cache"


def _bind(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature
        return {"*args": tuple(args), **kwargs}
    bound = sig.bind(*args, **kwargs)  # a wrong call fails here, as calling fn would
    bound.apply_defaults()  # f(x) and f(x, n=3) with default n=3 are the same entry
    return dict(bound.arguments)


def _write_entry(tmp: Path, result: Any, manifest: dict[str, Any]) -> None:
    encoded = arrays.encode(result)
    if encoded is None:
        raise CacheError(f"a {type(result).__name__} is not arrays or plain data (the cache never pickles)")
    tree, values = encoded
    chunks: list[bytes | memoryview] = []
    layout, offset = [], 0
    for a in values:
        raw = np.ascontiguousarray(a).reshape(-1).view(np.uint8).data  # the array's bytes, no copy
        pad = -offset % _ALIGN
        chunks += [b"\0" * pad, raw]
        layout.append([offset + pad, raw.nbytes])
        offset += pad + raw.nbytes
    files = {"data.json": write_recorded(tmp / "data.json", [json.dumps(tree, separators=(",", ":")).encode()])}
    if values:
        files["buffers.bin"] = write_recorded(tmp / "buffers.bin", chunks)
    manifest.update(files=files, buffers=layout, size_bytes=sum(f["bytes"] for f in files.values()))
    write_manifest(tmp, manifest)


def _read_entry(entry: Path, key: str, where: str) -> tuple[Any, dict[str, Any]]:
    """The entry's result, checked against its manifest; reading runs no code (only kitlib dataclasses are built)."""
    manifest = read_manifest(entry)
    if manifest.get("key") != key or manifest.get("format") != FORMAT_VERSION:
        raise _Corrupt(f"manifest is for key {manifest.get('key')!r}, format {manifest.get('format')!r}")
    files = manifest.get("files", {})
    if "data.json" not in files:
        if "data.pkl" in files:
            raise _Corrupt(f"it is a pickle in {where} cache (kitlib never writes one), so it was not unpickled")
        raise _Corrupt("manifest lists no data.json")
    blobs = {name: read_checked(entry / name, record) for name, record in files.items()}  # arrays: views of these
    view = memoryview(blobs.get("buffers.bin", bytearray()))
    buffers = [np.frombuffer(view[o : o + n], dtype=np.uint8) for o, n in manifest.get("buffers", [])]
    try:
        return arrays.decode(json.loads(blobs["data.json"]), buffers), manifest
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, ImportError) as err:
        raise _Corrupt(f"data.json does not decode ({type(err).__name__}: {err})") from err


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


class Cache:
    """A feature cache in ``dir`` (default ``default_cache_dir()``); hits in read-only ``seed_dirs`` are copied in."""

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
        resolved = self.dir.resolve()
        read_only = resolved.exists() and not os.access(resolved, os.W_OK)
        if read_only or any(resolved.is_relative_to(root) for root in _READ_ONLY_ROOTS):
            raise CacheError(
                f"cache dir {str(self.dir)!r} is read-only (an attached dataset?): the cache writes its entries "
                "there. Fix: give a writable dir and read this one as a seed: "
                f"Cache('kitlib-cache', seed_dirs=[{str(self.dir)!r}]) (its entries load as they are; nothing in it "
                "is unpickled)"
            )
        self.copy_seed_hits = copy_seed_hits
        self.log = log
        self.stats = CacheStats()

    def __repr__(self) -> str:
        return f"Cache({str(self.dir)!r}, seeds={len(self.seed_dirs)}, {self.stats})"

    def kitlib_identity(self) -> str:
        return "kitlib.Cache"  # where a result is stored is no input to it (and .stats change every call)

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
        h.add(["kitlib-cache", FORMAT_VERSION, kit_version.__version__])  # read per call: a version bump misses
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
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        *,
        name: str | None,
        identity: Any,
        ignore: Iterable[str],
    ) -> R:
        start = time.perf_counter()  # a hit costs hashing the inputs + loading: both count
        key = self.key(fn, args, kwargs, identity=identity, ignore=ignore)
        label = re.sub(r"[^A-Za-z0-9_.]+", "_", str(name or getattr(fn, "__name__", "feature")))[:60] or "feature"
        entry = f"{label}-{key}"
        found = self._lookup(entry, key)
        if found is not None:
            result, manifest = found
            load_s, build_s = time.perf_counter() - start, float(manifest.get("build_s", 0.0))
            self.stats.hits += 1
            self.stats.load_s += load_s
            self.stats.time_saved_s += build_s
            if self.log is not None:
                self.log(f"cache hit {label}[{key[:8]}] {load_s:.2f} s (built in {build_s:.1f} s)")
            return result
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        build_s = time.perf_counter() - start
        self.stats.misses += 1
        self.stats.build_s += build_s
        manifest = {
            "format": FORMAT_VERSION,
            "key": key,
            "name": label,
            "function": f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}",
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "created_ts": time.time(),
            "build_s": round(build_s, 3),
            "kitlib_version": kit_version.__version__,
        }

        def write(tmp: Path) -> None:
            with explain_disk_full(self.dir / entry, "cache entry"):
                _write_entry(tmp, result, manifest)

        stored = f"stored {manifest['size_bytes'] / 1e6:.1f} MB" if self._publish(entry, write) else "not stored"
        if self.log is not None:
            self.log(f"cache miss {label}[{key[:8]}] built in {build_s:.1f} s, {stored}")
        return result

    def _lookup(self, entry: str, key: str) -> tuple[Any, dict[str, Any]] | None:
        """(result, manifest) from this cache or a seed; a damaged entry warns, and in this cache goes."""
        for root in (self.dir, *self.seed_dirs):
            path = root / entry
            try:
                found = _read_entry(path, key, "this" if root == self.dir else "a seed") if path.is_dir() else None
            except _Corrupt as err:
                self.stats.corrupt += 1
                warnings.warn(f"cache entry {entry} in {root} cannot be used: {err}; rebuilding it", CacheWarning,
                              stacklevel=3)  # fmt: skip
                # out of the way, so the rebuilt entry can be renamed in (a rival's good entry published since our
                # read goes too: one more rebuild, never a wrong result)
                if root == self.dir:
                    trash = self.dir / f".trash-{uuid.uuid4().hex[:8]}"
                    with contextlib.suppress(OSError):
                        os.rename(path, trash)
                    shutil.rmtree(trash, ignore_errors=True)
                continue
            except FileNotFoundError:  # cleared by someone else while we read: a plain miss
                continue
            if found is not None and root != self.dir and self.copy_seed_hits:
                self._publish(entry, functools.partial(shutil.copytree, path, dirs_exist_ok=True))
            if found is not None:
                return found
        return None

    def _publish(self, entry: str, fill: Callable[[Path], Any]) -> bool:
        """Fill a temp dir and rename it to ``entry`` (atomic); a rival's complete entry stays; problems warn."""
        tmp: Path | None = None
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._sweep()
            tmp = self.dir / f".tmp-{entry}-{_host()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            tmp.mkdir()
            fill(tmp)
            try:
                os.rename(tmp, self.dir / entry)  # fails on an existing non-empty directory instead of merging
            except OSError:
                if not (self.dir / entry).is_dir():
                    raise
            return True  # ours, or a concurrent writer's (same key, same content)
        except Exception as err:
            warnings.warn(f"cache: could not store {entry}: {type(err).__name__}: {err}", CacheWarning, stacklevel=4)
            return False
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)

    def _sweep(self) -> None:
        """Remove temp dirs of writers that died (SIGKILL, OOM, session end); live writers' temp dirs stay."""
        host = _host()
        for path in self.dir.glob(".t*-*"):
            match = re.fullmatch(r"\.tmp-.+-(?P<host>[^-]+)-(?P<pid>\d+)-[0-9a-f]{8}", path.name)
            with contextlib.suppress(OSError):
                if match is None:
                    dead = path.name.startswith(".trash-")
                elif match["host"] == host:
                    dead = not _pid_alive(int(match["pid"]))
                else:  # another machine's writer: give it a day
                    dead = time.time() - path.stat().st_mtime > 86400
                if dead:
                    shutil.rmtree(path, ignore_errors=True)

    def _entries(self) -> Iterator[tuple[Path, dict[str, Any]]]:
        if not self.dir.is_dir():
            return
        for path in sorted(self.dir.iterdir()):
            if path.name.startswith(".") or not path.is_dir() or path.is_symlink():
                continue
            try:
                yield path, read_manifest(path)
            except _Corrupt:
                yield path, {"function": "(damaged)", "created_ts": path.stat().st_mtime}

    def list(self) -> pd.DataFrame:
        """One row per entry: key, name, size (bytes), created (UTC), build_s, function, path."""
        import pandas as pd

        rows = [
            {
                "key": m.get("key", path.name.rsplit("-", 1)[-1]),
                "name": m.get("name", "?"),
                "size": sum(f.stat().st_size for f in path.iterdir() if f.is_file()),
                "created": m.get("created_ts", path.stat().st_mtime),
                "build_s": m.get("build_s", float("nan")),
                "function": m.get("function", "?"),
                "path": str(path),
            }
            for path, m in self._entries()
        ]
        table = pd.DataFrame(rows, columns=["key", "name", "size", "created", "build_s", "function", "path"])
        table["created"] = pd.to_datetime(table["created"].astype(float), unit="s", utc=True).dt.floor("s")
        return table.sort_values("created", ignore_index=True)

    def size_bytes(self) -> int:
        """Bytes on disk under ``dir``, including leftovers of interrupted writes."""
        if not self.dir.is_dir():
            return 0
        return sum(f.stat().st_size for f in self.dir.rglob("*") if f.is_file() and not f.is_symlink())

    def clear(self, older_than: float | timedelta | None = None, name: str | None = None) -> int:
        """Delete entries (all, older than ``older_than`` s, or one ``name``) inside ``dir`` only; returns how many."""
        max_age = older_than.total_seconds() if isinstance(older_than, timedelta) else older_than
        now, removed = time.time(), 0
        for path, manifest in list(self._entries()):
            if name is not None and manifest.get("name") != name:
                continue
            if max_age is not None and now - float(manifest.get("created_ts", path.stat().st_mtime)) < max_age:
                continue
            shutil.rmtree(path)  # an entry inside dir (_entries skips symlinks): never a folder elsewhere
            removed += 1
        if older_than is None and name is None and self.dir.is_dir():
            self._sweep()
        return removed


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
