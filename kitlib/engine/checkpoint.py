"""Crash-safe checkpoints: a CPU snapshot, safetensors weights + torch state, manifest last, one atomic rename."""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
import time
import uuid
import warnings
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

from kitlib._files import (
    FileMismatch,
    check_file,
    explain_disk_full,
    free_bytes,
    fsync_dir,
    fsync_file,
    nbytes,
    read_manifest,
    record_file,
    write_manifest,
    write_recorded,
)
from kitlib._version import __version__
from kitlib.errors import CheckpointError
from kitlib.machine.distributed import whole
from kitlib.models.adapters import adapter_keys

MODEL_FILE, STATE_FILE, META_FILE, MANIFEST_FILE = "model.safetensors", "state.pt", "meta.json", "manifest.json"
FORMAT, FORMAT_VERSION = "kitlib.engine.checkpoint", 1
_HEADROOM = 16 << 20  # bytes beyond the tensors: JSON files, safetensors header, state.pt's zip overhead
# What torch.load(weights_only=True) reads back: snapshot() refuses the rest now, not at resume time.
_SCALARS = (int, float, complex, bool, str, bytes, type(None), torch.dtype, torch.device, torch.Size)
_KEY_TYPES = (int, float, bool, str, type(None))
# Optimizer state bytes per trainable weight byte: AdamW's two moments, Kahan's compensation, 8-bit's pair.
STATE_PER_WEIGHT_BYTE = {"adamw": 2.0, "adamw-kahan": 3.0, "adamw8bit": 0.5}


@dataclass(frozen=True)
class Snapshot:
    """What a checkpoint holds, on the CPU: training can go on changing the live tensors."""

    weights: dict[str, torch.Tensor]  # contiguous CPU copies; tied names share one tensor
    state: dict[str, Any] | None  # resume state, None for weights only
    meta: dict[str, Any]  # JSON: step, epoch, metrics, config, kitlib version


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` without torch.compile (``_orig_mod``) and DDP/DataParallel (``module``) wrappers, in any order."""
    while True:
        inner = getattr(model, "_orig_mod", None)
        if isinstance(inner, torch.nn.Module):
            model = inner
        elif isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        else:
            return model


def saved_state(model: torch.nn.Module) -> dict[str, Any]:
    """The state_dict entries a checkpoint of ``model`` holds: all, or with an adapter only what trains (FSDP's
    shards gathered whole: every rank calls it)."""
    state = model.state_dict()
    keys = adapter_keys(model)
    return state if keys is None else {name: whole(state[name]) for name in keys}


def _view_key(t: torch.Tensor) -> tuple[Any, ...]:
    """Equal for two views of the same bytes (tied weights), which are then copied and stored once."""
    return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def _copy_state(obj: Any, copy: Any, where: str) -> Any:
    """Deep copy, tensors to CPU, keeping only what torch.load(weights_only=True) reads back."""
    kind = type(obj)
    if kind in _SCALARS:  # exact types: an IntEnum or np.float64 would not load
        return obj
    if isinstance(obj, torch.Tensor):
        return copy(obj)
    if kind in (dict, OrderedDict):
        bad = next((k for k in obj if not isinstance(k, _KEY_TYPES)), None)
        if bad is not None:
            raise CheckpointError(f"checkpoint state key {where}[{bad!r}] has type {type(bad).__name__}; use str/int")
        return kind((k, _copy_state(v, copy, f"{where}[{k!r}]")) for k, v in obj.items())
    if kind in (list, tuple, set):
        return kind(_copy_state(v, copy, f"{where}[{i}]") for i, v in enumerate(obj))
    if kind.__module__ == "numpy" and getattr(obj, "ndim", None) == 0:
        return obj.item()  # a numpy scalar (a metric) -> a Python number
    raise CheckpointError(
        f"checkpoint state {where} has type {kind.__module__}.{kind.__qualname__}, which torch.load(weights_only=True) "
        "cannot read back. Fix: store tensors, numbers, strings and plain dict/list/tuple only (e.g. obj.state_dict(), "
        "array.tolist(), dataclasses.asdict(obj))."
    )


def snapshot(
    model: torch.nn.Module, *, state: dict[str, Any] | None = None, meta: dict[str, Any] | None = None
) -> Snapshot:
    """CPU copies of the weights (tied ones once) and ``state`` for a writer; CheckpointError if not reloadable."""
    memo: dict[Any, torch.Tensor] = {}  # one copy per live tensor (id) and per view of the same bytes (ties)

    def copy(t: torch.Tensor, key: Any = None) -> torch.Tensor:
        key = id(t) if key is None else key
        if key not in memo:  # pageable copies: pinned ones would stay locked all session
            src = t.detach()
            cpu = src.device.type == "cpu"
            memo[key] = src.clone(memory_format=torch.contiguous_format) if cpu else src.to("cpu").contiguous()
        return memo[key]

    weights: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, t in saved_state(unwrap_model(model)).items():
            if not isinstance(t, torch.Tensor):  # get_extra_state() payloads
                raise CheckpointError(f"model state_dict entry {name!r} is a {type(t).__name__}, not a tensor")
            weights[name] = copy(t, _view_key(t) if t.numel() else name)
        state_copy = None if state is None else _copy_state(state, copy, "state")
    try:  # a JSON round trip: a deep copy, and what load() returns equals what was written
        meta_copy = json.loads(json.dumps({"kitlib_version": __version__, **(meta or {})}))
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint meta is not JSON-serialisable: {e}. Fix: pass plain numbers/str.") from e
    return Snapshot(weights=weights, state=state_copy, meta=meta_copy)


def rng_state() -> dict[str, Any]:
    """Python, numpy, torch CPU and (once CUDA is in use) this GPU's RNG states, as tensors (one copy each)."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": [version, torch.tensor(internal, dtype=torch.int64), gauss],
        "numpy": [str(name), torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(pos), int(has_gauss), cached],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_initialized():
        state["cuda_device"] = torch.cuda.get_rng_state()
    return state


def _ints(values: Any) -> list[int]:
    return values.tolist() if isinstance(values, torch.Tensor) else list(values)  # a list: checkpoints before 0.9


def set_rng_state(state: dict[str, Any]) -> None:
    """Inverse of rng_state(); absent keys are left untouched."""
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(_ints(internal)), gauss))
    if "numpy" in state:
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.asarray(_ints(keys), dtype=np.uint32), pos, has_gauss, float(cached)))
    if "torch" in state:
        torch.set_rng_state(state["torch"].cpu())  # load(map_location="cuda") may have moved it
    cuda = state.get("cuda_device")
    if cuda is None and state.get("cuda"):  # older checkpoints: every visible device's state, in device order
        cuda = state["cuda"][torch.cuda.current_device() if torch.cuda.is_available() else 0]
    if cuda is not None and not torch.cuda.is_available():
        warnings.warn(
            "checkpoint has a CUDA RNG state but CUDA is unavailable; GPU randomness will differ", stacklevel=2
        )
    elif cuda is not None:
        torch.cuda.set_rng_state(cuda.cpu())


def _rename(src: Path, dst: Path) -> None:
    os.rename(src, dst)


def _unique(weights: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors stored once (safetensors refuses shared ones) + {alias: stored name}; the first name is kept."""
    first: dict[Any, str] = {}  # snapshot() copied each distinct view apart: only ties (same view) share storage
    for name, t in weights.items():
        first.setdefault(_view_key(t) if t.numel() else name, name)
    unique = {name: weights[name].contiguous() for name in first.values()}
    return unique, {name: first[_view_key(t)] for name, t in weights.items() if name not in unique}


def room_for_last(directory: Path, model: torch.nn.Module, optimizer: str) -> str | None:
    """None when ``directory`` has room for ``last/`` and ``best/`` twice each (while replaced); else why not."""
    weights = nbytes(_unique(saved_state(model))[0])
    state = sum(p.nbytes for p in model.parameters() if p.requires_grad) * STATE_PER_WEIGHT_BYTE.get(optimizer, 2.0)
    needed = 2 * (2 * weights + state) + 4 * _HEADROOM
    free, where = free_bytes(directory)
    if free >= needed:
        return None
    return (f"last/ (weights and {optimizer} state, {(weights + state) / 1e9:.1f} GB) and best/ ({weights / 1e9:.1f} "
            f"GB), each twice while it is replaced, need ~{needed / 1e9:.1f} GB and {where} has {free / 1e9:.1f} GB "
            "free")  # fmt: skip


def _siblings(directory: Path) -> list[Path]:
    """Leftovers of earlier writes to ``directory``: unfinished temps and not-yet-deleted old versions."""
    if not directory.parent.is_dir():
        return []
    pattern = (f".{directory.name}.tmp-", f".{directory.name}.old-")
    return sorted(p for p in directory.parent.iterdir() if p.name.startswith(pattern))


def _read_manifest(directory: Path) -> dict[str, Any]:
    try:
        manifest = read_manifest(directory)
    except FileMismatch as e:
        raise CheckpointError(f"{e} (the write never finished, or this is not a checkpoint)") from None
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{MANIFEST_FILE} is not a {FORMAT} manifest")
    if manifest.get("version", 0) > FORMAT_VERSION:
        raise CheckpointError(f"format version {manifest.get('version')} is newer than this kitlib ({__version__})")
    return manifest


def _check(directory: Path, *, verify: bool) -> dict[str, Any]:
    """The manifest of a complete checkpoint, else CheckpointError: sizes always, sha256 if ``verify``."""
    manifest = _read_manifest(directory)
    files: dict[str, dict[str, Any]] = manifest.get("files", {})
    for required in (META_FILE,) if manifest.get("sharded") else (MODEL_FILE, META_FILE):  # sharded: DCP's files
        if required not in files:
            raise CheckpointError(f"{MANIFEST_FILE} does not list {required}")
    for name, record in files.items():
        try:
            check_file(directory / name, record, verify=verify)
        except FileMismatch as err:
            raise CheckpointError(str(err)) from None
    return manifest


def _complete(directory: Path) -> dict[str, Any] | None:
    try:
        return _check(directory, verify=False)
    except (CheckpointError, OSError, KeyError, TypeError):
        return None


def _resolve(directory: Path) -> Path | None:
    """``directory`` if it exists, else the newest complete leftover (a kill between the two swap renames)."""
    if directory.exists():
        return directory
    found = [(m.get("created_unix", 0.0), p) for p in _siblings(directory) if (m := _complete(p)) is not None]
    return max(found)[1] if found else None


def _prepare(directory: Path) -> None:
    """Recover from a kill in the swap window, refuse a directory that is no checkpoint, delete killed writes."""
    if not directory.exists() and (best := _resolve(directory)) is not None:
        _rename(best, directory)
    if directory.exists() and any(directory.iterdir()):
        try:
            _read_manifest(directory)
        except CheckpointError as e:  # never rename away (then delete) a directory we did not create
            raise CheckpointError(
                f"refusing to replace {directory}: it is not a kitlib checkpoint ({e}). "
                "Fix: choose a checkpoint path that is not an existing data directory."
            ) from None
    for leftover in _siblings(directory):
        shutil.rmtree(leftover, ignore_errors=True)


def _write_files(snap: Snapshot, tmp: Path) -> None:
    unique, aliases = _unique(snap.weights)
    save_file(unique, tmp / MODEL_FILE, metadata={"format": "pt"})  # format=pt: from_pretrained refuses others
    fsync_file(tmp / MODEL_FILE)
    files = {MODEL_FILE: record_file(tmp / MODEL_FILE)}  # read back from the page cache, not a copy in RAM
    if snap.state is not None:
        torch.save(snap.state, tmp / STATE_FILE)
        fsync_file(tmp / STATE_FILE)
        files[STATE_FILE] = record_file(tmp / STATE_FILE)
    files[META_FILE] = write_recorded(tmp / META_FILE, [json.dumps(snap.meta, indent=1).encode()])
    manifest = {"format": FORMAT, "version": FORMAT_VERSION, "kitlib_version": __version__,
                "created_unix": time.time(), "files": dict(sorted(files.items())), "aliases": aliases}  # fmt: skip
    write_manifest(tmp, manifest)
    fsync_dir(tmp)


def write(snap: Snapshot, directory: Path) -> Path:
    """Write ``snap`` to ``directory`` atomically (the previous version stays until the new one is complete)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    _prepare(directory)
    # Only the filesystem's free space is visible: Kaggle's 20 GB output quota is enforced when the notebook is saved.
    needed = nbytes([_unique(snap.weights)[0], snap.state]) + _HEADROOM
    free = shutil.disk_usage(directory.parent).free
    if free < needed:
        raise CheckpointError(
            f"not enough disk space to write checkpoint {directory}: needs ~{needed / 1e9:.2f} GB, "
            f"{free / 1e9:.2f} GB free on {directory.parent}. Fix: delete old runs/checkpoints, save fewer "
            "checkpoints, or point the run directory at a bigger disk."
        )
    # uuid4 draws from os.urandom: writing must not perturb the training RNG streams.
    tmp, old = (
        directory.parent / f".{directory.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}" for kind in ["tmp", "old"]
    )
    tmp.mkdir()
    try:
        with explain_disk_full(directory, "checkpoint"):  # the estimate can be short (the disk fills meanwhile)
            _write_files(snap, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    swap_in(tmp, directory, old)
    return directory


def swap_in(tmp: Path, directory: Path, old: Path) -> None:
    """The complete ``tmp`` becomes ``directory``; the previous version, moved to ``old``, goes only once it is in."""
    if directory.exists():
        _rename(directory, old)
    _rename(tmp, directory)
    fsync_dir(directory.parent)
    shutil.rmtree(old, ignore_errors=True)


def load(directory: Path, *, map_location: str | torch.device = "cpu", verify: bool = True) -> Snapshot:
    """Read a checkpoint written by write(), checked first (sizes always, sha256 if ``verify``)."""
    target = _resolve(Path(directory))
    if target is None:
        raise CheckpointError(f"no checkpoint at {directory}. Fix: check the path, or use latest(run_dir).")
    try:
        manifest = _check(target, verify=verify)
        meta = json.loads((target / META_FILE).read_text(encoding="utf-8"))
        if manifest.get("sharded"):  # an FSDP run's (kitlib.engine.sharded): its shards gathered here
            return Snapshot(weights=_read_sharded(target), state=None, meta=meta)
        weights = load_file(target / MODEL_FILE, device=str(torch.device(map_location)))
        weights |= {alias: weights[stored] for alias, stored in manifest.get("aliases", {}).items()}  # ties again
        state = None
        if STATE_FILE in manifest["files"]:  # weights_only: a downloaded checkpoint runs no code
            state = torch.load(target / STATE_FILE, map_location=map_location, weights_only=True)
    except Exception as e:  # safetensors/zip/unpickling errors of a file that passed the size check (verify=False)
        problem = str(e) if isinstance(e, CheckpointError) else f"{type(e).__name__}: {e}"
        raise CheckpointError(
            f"checkpoint {target} is unusable: {problem}. Fix: load another checkpoint (e.g. 'best', or 'last' of an "
            "earlier run), or delete this directory and start from scratch; a full disk or an interrupted "
            "copy/upload is the usual cause."
        ) from (None if isinstance(e, CheckpointError) else e)
    return Snapshot(weights=weights, state=state, meta=meta)


def _read_sharded(directory: Path) -> dict[str, torch.Tensor]:
    """One process: the whole model's weights from a DCP directory (kitlib.engine.sharded.save, any world size)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        raise CheckpointError("a sharded checkpoint gathers whole in one process: on every rank use sharded.load_into")
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        found = _load_state_dict_from_keys({"model"}, checkpoint_id=str(directory))
    return {k: v for k, v in found["model"].items() if isinstance(v, torch.Tensor)}


def restore_model(model: torch.nn.Module, snap: Snapshot, *, strict: bool = True) -> None:
    """Load ``snap.weights`` into ``model`` in place; ties kept; one name of a tied pair or a prefix loads too."""
    target = unwrap_model(model)
    live = saved_state(target)
    partial = len(live) < len(target.state_dict())  # an adapter: the frozen base is the model's own
    weights = dict(snap.weights)
    for prefix in ("module.", "_orig_mod."):
        if weights and all(k.startswith(prefix) for k in weights) and not any(k.startswith(prefix) for k in live):
            weights = {k[len(prefix) :]: v for k, v in weights.items()}
    groups: dict[tuple[Any, ...], list[str]] = {}
    for name, t in live.items():
        if t.numel():
            groups.setdefault(_view_key(t), []).append(name)
    for names in groups.values():
        present = [n for n in names if n in weights]
        weights.update({n: weights[present[0]] for n in names if present and n not in weights})
    try:
        result = target.load_state_dict(weights, strict=strict and not partial)  # copy_: ties and devices kept
        if partial:  # strict over what a checkpoint of this model holds, not over the frozen base
            missing = [k for k in live if k not in weights]
            if strict and (missing or result.unexpected_keys):
                raise RuntimeError(f"missing keys {missing[:5]}, unexpected keys {result.unexpected_keys[:5]}")
            result = result._replace(missing_keys=missing)
    except RuntimeError as e:
        raise CheckpointError(
            f"checkpoint weights do not fit this model: {e}. Fix: build the same architecture/config as the run "
            "that saved it, or pass strict=False to load the matching subset."
        ) from e
    if result.missing_keys or result.unexpected_keys:  # strict=False: say what did not match
        warnings.warn(
            f"restore_model(strict=False): {len(result.missing_keys)} model keys not in the checkpoint "
            f"{result.missing_keys[:5]}, {len(result.unexpected_keys)} checkpoint keys unused "
            f"{result.unexpected_keys[:5]}",
            stacklevel=2,
        )


def latest(run_dir: Path, name: str = "last") -> Path | None:
    """The complete checkpoint ``run_dir/name`` (or its surviving copy after a kill mid-swap), else None."""
    found = _resolve(Path(run_dir) / name)
    return found if found is not None and _complete(found) is not None else None


class BackgroundWriter:
    """write() on one worker thread; a newer snapshot replaces one still waiting for its target; close() before exit
    (a pool thread, not a daemon: an unclosed writer's queued writes finish before the interpreter exits)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="kitlib-checkpoint-writer")  # its thread: first submit
        self._lock = threading.Lock()
        self._pending: dict[Path, Snapshot] = {}
        self._futures: list[Future[None]] = []
        self._error: BaseException | None = None  # the first background failure, raised on the training thread
        self._closed = False
        self.busy_seconds = 0.0  # wall seconds in write() (serialise, hash, fsync, swap)
        self.writes = 0  # completed writes (replaced snapshots are not counted)

    def _raise_error(self) -> None:
        with self._lock:  # the worker sets it under the lock: an error between the read and the reset is not lost
            err, self._error = self._error, None
        if isinstance(err, CheckpointError):
            raise err
        if err is not None:
            raise CheckpointError(f"background checkpoint write failed: {type(err).__name__}: {err}") from err

    def submit(self, snap: Snapshot, directory: Path) -> None:
        self._raise_error()
        if self._closed:
            raise CheckpointError("BackgroundWriter.submit() after close(). Fix: create a new writer.")
        directory = Path(directory).absolute()
        with self._lock:
            queued = directory in self._pending
            self._pending[directory] = snap
        if not queued:
            self._futures.append(self._pool.submit(self._write, directory))

    def run(self, job: Callable[[], None]) -> None:
        """``job`` (a sharded save's finish) on the writer's thread after what came before, errors like a write's."""
        self._raise_error()
        if self._closed:
            raise CheckpointError("BackgroundWriter.run() after close(). Fix: create a new writer.")
        self._futures.append(self._pool.submit(self._timed, job))

    def _write(self, directory: Path) -> None:
        with self._lock:
            snap = self._pending.pop(directory)
        self._timed(lambda: write(snap, directory))

    def _timed(self, job: Callable[[], Any]) -> None:
        start = time.perf_counter()
        try:
            job()
            self.writes += 1
        except BaseException as e:  # reported to the training thread, never swallowed
            with self._lock:
                self._error = self._error or e
        self.busy_seconds += time.perf_counter() - start

    def wait(self) -> None:
        """Block until everything submitted is on disk; re-raises a background error."""
        futures, self._futures = self._futures, []
        wait_all(futures)
        self._raise_error()

    def close(self) -> None:
        """wait(), then stop the thread. Idempotent."""
        self._closed = True
        self._pool.shutdown(wait=True)
        self.wait()

    def __enter__(self) -> BackgroundWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            self.close()
        except CheckpointError as err:
            if exc is None:
                raise
            warnings.warn(f"checkpoint writer error while handling another exception: {err}", stacklevel=2)


class RunOutput:
    """Where a run's files go: ``path`` (None: nowhere), rank 0 writes, checkpoints through one ``BackgroundWriter``."""

    def __init__(self, path: str | Path | None, *, is_main: bool) -> None:
        self.path = Path(path) if path is not None else None
        self.writes = self.path is not None and is_main
        self.writer = BackgroundWriter()

    def save(self, name: str, snap: Snapshot) -> None:
        assert self.path is not None
        self.writer.submit(snap, self.path / name)
