"""Crash-safe checkpoints: CPU snapshots, atomic directory writes, verified loads, a background writer.

Layout of one checkpoint directory (e.g. ``run_dir/"last"``)::

    model.safetensors   weights (tied/shared tensors stored once; aliases listed in the manifest)
    state.pt            resume state (optimizer, scheduler, scaler, RNG, data position...); absent for weights-only
    meta.json           step, epoch, metrics, config, kitlib version (epoch: best/'s is the 1-based epoch it
                        scored; last/'s counts the epochs completed, so at an epoch end it is that epoch's number)
    manifest.json       format version, size + sha256 of every file above; written last = "this directory is complete"

A write goes to a sibling ``.<name>.tmp-<pid>-<token>`` directory, is fsynced, then swapped in with two renames
(``<name>`` -> ``.<name>.old-*``, tmp -> ``<name>``). Linux cannot atomically rename a directory over a non-empty
one, so a kill between those two renames (microseconds) leaves no ``<name>`` but two complete siblings; ``load`` /
``latest`` pick the newest complete one and the next ``write`` renames it back into place. ``<name>`` itself is
never partial. One process writes a given target (rank 0 under DDP).
"""

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
    record_file,
    write_recorded,
)
from kitlib._version import __version__
from kitlib.errors import CheckpointError
from kitlib.models.adapters import adapter_keys

MODEL_FILE = "model.safetensors"
STATE_FILE = "state.pt"
META_FILE = "meta.json"
MANIFEST_FILE = "manifest.json"
FORMAT = "kitlib.engine.checkpoint"
FORMAT_VERSION = 1
_HEADROOM = 16 << 20  # 16 MiB on top of the estimate for JSON files, safetensors header, zip overhead of state.pt

# Python types that torch.load(weights_only=True) accepts (checked against torch 2.13). Namedtuples, frozensets,
# numpy arrays, dataclasses... are refused, so snapshot() rejects them up front instead of at resume time.
_SCALARS = (int, float, complex, bool, str, bytes, type(None), torch.dtype, torch.device)
_KEY_TYPES = (int, float, bool, str, type(None))


@dataclass(frozen=True)
class Snapshot:
    """Everything to write, already copied to CPU (so training can keep mutating the live tensors)."""

    weights: dict[str, torch.Tensor]  # model state_dict, detached CPU clones (contiguous); tied names share a tensor
    state: dict[str, Any] | None  # resume state or None for weights-only
    meta: dict[str, Any]  # JSON-able: step, epoch, metrics, config dict, kitlib version


# --------------------------------------------------------------------------------------------------- snapshot


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """Strip torch.compile (``_orig_mod``) and DDP/DataParallel (``module``) wrappers, in any nesting order."""
    while True:
        inner = getattr(model, "_orig_mod", None)
        if isinstance(inner, torch.nn.Module):
            model = inner
        elif isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        else:
            return model


def saved_state(model: torch.nn.Module) -> dict[str, Any]:
    """The state_dict entries a checkpoint of ``model`` holds: all of them, or for a model with an adapter
    (kitlib.models.adapters) what trains only; its frozen pretrained weights are rebuilt from their folder."""
    state = model.state_dict()
    keys = adapter_keys(model)
    return state if keys is None else {name: state[name] for name in keys}


def _view_key(t: torch.Tensor) -> tuple[Any, ...]:
    """Identity of a tensor *view*: equal keys = the same bytes (tied weights), so they are copied/stored once."""
    return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


_STAGING_BYTES = 16 << 20  # each of the two pinned halves a CUDA snapshot streams through


class _Staging:
    """Device -> host copies through one bounded pinned buffer into pageable memory, double-buffered.

    Why not a pinned copy per tensor: the caching host allocator rounds each pinned block up to a power of two and
    never returns it to the OS, so ``last/`` (weights + AdamW's two moments = 3x the fp32 weights) plus a pending
    ``best/`` snapshot (1x) kept 4x the weights, up to 8x with the rounding, locked in RAM for the rest of the session:
    a 300M-parameter model is 1.2 GB of weights, 5-10 GB locked of a Colab T4's 12.7 GB. Here 32 MiB are pinned (the
    allocator hands the same block back at every save), and the pageable copies are freed once written. Speed: DMA
    into one half overlaps the memcpy out of the other, so a save runs at about min(PCIe, memcpy) ~ 5-12 GB/s
    against ~12-25 GB/s into pinned tensors: ~0.1-0.3 s more per GB saved (reasoned, not measured).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.halves = [_pinned_bytes(_STAGING_BYTES) for _ in range(2)]
        self.copied: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[], []]  # (pageable target, staged bytes)
        self.done: list[torch.cuda.Event | None] = [None, None]
        self.half, self.used = 0, 0

    def copy(self, src: torch.Tensor, out: torch.Tensor) -> None:
        """Queue the copy of ``src`` (on this device) into ``out`` (pageable CPU, same shape and dtype)."""
        source, target = _bytes(src), _bytes(out)
        at = 0
        while at < source.numel():
            if self.used == _STAGING_BYTES:
                self._switch()
            take = min(source.numel() - at, _STAGING_BYTES - self.used)
            staged = self.halves[self.half][self.used : self.used + take]
            staged.copy_(source[at : at + take], non_blocking=True)
            self.copied[self.half].append((target[at : at + take], staged))
            self.used, at = self.used + take, at + take

    def finish(self) -> None:
        self._switch()  # drains the older half
        self._drain(1 - self.half)

    def _switch(self) -> None:
        """Mark the current half's copies, then move to the other half once its copies are drained."""
        with torch.cuda.device(self.device):
            event = torch.cuda.Event()
            event.record()
        self.done[self.half] = event
        self.half, self.used = 1 - self.half, 0
        self._drain(self.half)

    def _drain(self, half: int) -> None:
        event = self.done[half]
        if event is not None:
            event.synchronize()
        for target, staged in self.copied[half]:
            target.copy_(staged)
        self.copied[half].clear()
        self.done[half] = None


def _pinned_bytes(size: int) -> torch.Tensor:
    return torch.empty(size, dtype=torch.uint8, pin_memory=True)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


class _Copier:
    """Copies tensors to CPU memory of their own; CUDA tensors stream through a bounded pinned buffer (``_Staging``)."""

    def __init__(self) -> None:
        self.staging: dict[torch.device, _Staging] = {}
        self.memo: dict[int, torch.Tensor] = {}  # id(live tensor) -> copy: a tensor referenced twice is copied once

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        done = self.memo.get(id(t))
        if done is not None:
            return done
        src = t.detach()
        if src.device.type == "cuda":
            out = torch.empty(src.shape, dtype=src.dtype)
            if src.numel():
                staging = self.staging.get(src.device) or self.staging.setdefault(src.device, _Staging(src.device))
                staging.copy(src.contiguous(), out)
        elif src.device.type == "cpu":
            out = src.clone(memory_format=torch.contiguous_format)
        else:  # mps/xla/...: a blocking copy (to() always copies across devices)
            out = src.to("cpu").contiguous()
        self.memo[id(t)] = out
        return out

    def finish(self) -> None:
        """Wait for the queued copies: the outputs hold garbage until then."""
        for staging in self.staging.values():
            staging.finish()


def _copy_state(obj: Any, copier: _Copier, where: str) -> Any:
    """Deep copy with tensors moved to CPU, keeping only types that torch.load(weights_only=True) can read back."""
    if isinstance(obj, torch.Tensor):
        return copier.tensor(obj)
    if type(obj) in (dict, OrderedDict):
        out = type(obj)()
        for k, v in obj.items():
            if not isinstance(k, _KEY_TYPES):
                raise CheckpointError(f"checkpoint state key {where}[{k!r}] has type {type(k).__name__}; use str/int")
            out[k] = _copy_state(v, copier, f"{where}[{k!r}]")
        return out
    if type(obj) in (list, tuple, set):
        return type(obj)(_copy_state(v, copier, f"{where}[{i}]") for i, v in enumerate(obj))
    if type(obj) is torch.Size or type(obj) in _SCALARS:  # exact types: IntEnum, np.float64 (a float) would not load
        return obj
    if type(obj).__module__ == "numpy" and hasattr(obj, "item") and getattr(obj, "ndim", None) == 0:
        return obj.item()  # numpy scalar (e.g. a metric) -> python number
    raise CheckpointError(
        f"checkpoint state {where} has type {type(obj).__module__}.{type(obj).__qualname__}, which "
        "torch.load(weights_only=True) cannot read back. Fix: store tensors, numbers, strings and plain "
        "dict/list/tuple only (e.g. obj.state_dict(), array.tolist(), dataclasses.asdict(obj))."
    )


def snapshot(
    model: torch.nn.Module, *, state: dict[str, Any] | None = None, meta: dict[str, Any] | None = None
) -> Snapshot:
    """Copy model weights (+ optional resume state) to CPU so a writer can serialise them while training goes on.

    Cost: one device->host copy of the weights (and of the optimizer state if passed: ~2x weights for AdamW);
    on CUDA ~10-25 GB/s over PCIe, i.e. tens of ms for a 500 MB model. Raises CheckpointError for state or meta
    that could not be read back, so the problem surfaces now and not at resume time.
    """
    copier = _Copier()
    by_view: dict[tuple[Any, ...], torch.Tensor] = {}
    weights: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, t in saved_state(unwrap_model(model)).items():
            if not isinstance(t, torch.Tensor):  # get_extra_state() payloads
                raise CheckpointError(f"model state_dict entry {name!r} is a {type(t).__name__}, not a tensor")
            key = _view_key(t) if t.numel() else ("empty", name)
            if key not in by_view:  # tied weights (GPT-2 lm_head/wte) -> one copy shared by both names
                by_view[key] = copier.tensor(t)
            weights[name] = by_view[key]
        state_copy = None if state is None else _copy_state(state, copier, "state")
    copier.finish()
    full_meta = {"kitlib_version": __version__, **(meta or {})}
    try:  # JSON round trip = deep copy + JSON-ability check; what load() returns equals what was written
        meta_copy = json.loads(json.dumps(full_meta))
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint meta is not JSON-serialisable: {e}. Fix: pass plain numbers/str.") from e
    return Snapshot(weights=weights, state=state_copy, meta=meta_copy)


# --------------------------------------------------------------------------------------------------- RNG


def rng_state() -> dict[str, Any]:
    """Python, numpy (legacy global) and torch CPU generator states, and that of this process's own GPU, as
    weights_only-loadable types. Under DDP each rank has its own (fit saves them all: ``rank_rngs``)."""

    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    assert isinstance(keys, np.ndarray)  # legacy=True: ('MT19937', uint32[624], pos, has_gauss, cached_gaussian)
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [str(name), keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    # Only once CUDA is in use (else reading it initialises CUDA: ~1 s, and forked workers break), and only the
    # current device: get_rng_state_all() would open a context (~300 MiB) on every other visible GPU, and under DDP
    # those belong to the other ranks.
    if torch.cuda.is_initialized():
        state["cuda_device"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Inverse of rng_state() in the process that resumes; keys that are absent are left untouched."""

    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in state:
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "torch" in state:
        torch.set_rng_state(state["torch"].cpu())  # .cpu(): load(map_location="cuda") moves it; set_ needs CPU
    cuda = state.get("cuda_device")
    if cuda is None and state.get("cuda"):  # older checkpoints: every visible device's state, in device order
        cuda = state["cuda"][torch.cuda.current_device() if torch.cuda.is_available() else 0]
    if cuda is not None:
        if not torch.cuda.is_available():
            warnings.warn(
                "checkpoint has a CUDA RNG state but CUDA is unavailable; GPU randomness will differ", stacklevel=2
            )
            return
        torch.cuda.set_rng_state(cuda.cpu())  # the current device: this process's own


# --------------------------------------------------------------------------------------------------- write


def _rename(src: Path, dst: Path) -> None:
    os.rename(src, dst)


def _dedupe(weights: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Unique tensors for safetensors (which refuses shared storage) + {alias name: stored name}."""
    unique: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    by_view: dict[tuple[Any, ...], str] = {}
    storages: set[int] = set()
    for name, t in weights.items():
        if t.numel() == 0:
            unique[name] = t.contiguous()
            continue
        key = _view_key(t)
        if key in by_view:  # first name in state_dict order is kept (wte before lm_head, as HF save_pretrained does)
            aliases[name] = by_view[key]
            continue
        ptr = t.untyped_storage().data_ptr()
        if ptr in storages or not t.is_contiguous():  # a different view of seen storage: give it its own bytes
            t = t.clone(memory_format=torch.contiguous_format)
        storages.add(ptr)
        by_view[key] = name
        unique[name] = t
    return unique, aliases


def _tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple, set)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def estimate_bytes(snap: Snapshot) -> int:
    """Approximate on-disk size of ``snap`` (tensor bytes + fixed headroom for headers and JSON)."""
    unique, _ = _dedupe(snap.weights)
    return sum(t.nbytes for t in unique.values()) + _tensor_bytes(snap.state) + _HEADROOM


def _siblings(directory: Path) -> list[Path]:
    """Leftovers of earlier writes to ``directory``: unfinished temps and not-yet-deleted old versions."""
    if not directory.parent.is_dir():
        return []
    pattern = (f".{directory.name}.tmp-", f".{directory.name}.old-")
    return sorted(p for p in directory.parent.iterdir() if p.name.startswith(pattern))


def _read_manifest(directory: Path) -> dict[str, Any]:
    path = directory / MANIFEST_FILE
    if not path.is_file():
        raise CheckpointError(f"{MANIFEST_FILE} is missing (the write never finished, or this is not a checkpoint)")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{MANIFEST_FILE} is unreadable ({e})") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{MANIFEST_FILE} is not a {FORMAT} manifest")
    if manifest.get("version", 0) > FORMAT_VERSION:
        raise CheckpointError(f"format version {manifest.get('version')} is newer than this kitlib ({__version__})")
    return manifest


def _check(directory: Path, *, verify: bool) -> dict[str, Any]:
    """Manifest of a complete checkpoint, else CheckpointError(problem). Sizes always; sha256 if verify."""
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
    """Recover from a kill in the swap window, then delete leftovers of killed writes (frees their disk space)."""
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


def _check_space(directory: Path, needed: int) -> None:
    # Only the filesystem's free space is visible here; Kaggle's 20 GB /kaggle/working *output* quota is
    # enforced when the notebook is saved, so keep runs (all checkpoints) under it yourself.
    free = shutil.disk_usage(directory.parent).free
    if free < needed:
        raise CheckpointError(
            f"not enough disk space to write checkpoint {directory}: needs ~{needed / 1e9:.2f} GB, "
            f"{free / 1e9:.2f} GB free on {directory.parent}. Fix: delete old runs/checkpoints, save fewer "
            "checkpoints, or point the run directory at a bigger disk."
        )


# Optimizer state a trainable parameter adds to last/, per byte of the parameter: AdamW's two moments in its dtype,
# Kahan AdamW's compensation too, 8-bit AdamW's two 1-byte moments (of a 4-byte weight; block scales ignored).
STATE_PER_WEIGHT_BYTE = {"adamw": 2.0, "adamw-kahan": 3.0, "adamw8bit": 0.5}


def room_for_last(directory: Path, model: torch.nn.Module, optimizer: str) -> str | None:
    """None when ``directory`` has room for ``last/`` (the weights a checkpoint holds and the optimizer's state, twice:
    the old copy stays until the new one is complete) beside ``best/`` (twice too), else why not. Checked before the
    first step: a 7B full fine-tune's last/ is ~56 GB (bf16 weights + Kahan state), and finding that out when a
    time budget stops the run, hours later, loses the hours."""
    weights = sum(t.nbytes for t in _dedupe(saved_state(model))[0].values())
    state = sum(p.nbytes for p in model.parameters() if p.requires_grad) * STATE_PER_WEIGHT_BYTE.get(optimizer, 2.0)
    needed = 2 * (2 * weights + state) + 4 * _HEADROOM
    free, where = free_bytes(directory)
    if free >= needed:
        return None
    return (f"last/ (weights and {optimizer} state, {(weights + state) / 1e9:.1f} GB) and best/ ({weights / 1e9:.1f} "
            f"GB), each twice while it is replaced, need ~{needed / 1e9:.1f} GB and {where} has {free / 1e9:.1f} GB "
            "free")  # fmt: skip


def _write_files(snap: Snapshot, tmp: Path, unique: dict[str, torch.Tensor], aliases: dict[str, str]) -> None:
    # metadata format=pt: transformers' from_pretrained refuses safetensors files without it.
    save_file(unique, tmp / MODEL_FILE, metadata={"format": "pt"})
    fsync_file(tmp / MODEL_FILE)
    if snap.state is not None:
        with open(tmp / STATE_FILE, "wb") as f:
            torch.save(snap.state, f)
            f.flush()
            os.fsync(f.fileno())
    write_recorded(tmp / META_FILE, [json.dumps(snap.meta, indent=1).encode()])
    # One sha256 pass per file, read back from the page cache (~1-2 GB/s): the manifest proves completeness.
    files = {p.name: record_file(p) for p in sorted(tmp.iterdir()) if p.name in (MODEL_FILE, STATE_FILE, META_FILE)}
    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "kitlib_version": __version__,
        "created_unix": time.time(),
        "files": files,
        "aliases": aliases,
    }
    write_recorded(tmp / MANIFEST_FILE, [json.dumps(manifest, indent=1).encode()])  # last: marks completeness
    fsync_dir(tmp)


def write(snap: Snapshot, directory: Path) -> Path:
    """Synchronously and atomically write ``snap`` to ``directory``; returns ``directory``.

    Cost: serialisation at disk speed + one sha256 pass over the files (from page cache) + fsyncs. Needs free space
    for a second copy while the previous version is still in place.
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    _prepare(directory)
    unique, aliases = _dedupe(snap.weights)
    _check_space(directory, estimate_bytes(snap))
    # uuid4 draws from os.urandom, not the `random` module: writing must not perturb the training RNG streams.
    tmp = directory.parent / f".{directory.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        with explain_disk_full(directory, "checkpoint"):  # the estimate can be short (e.g. the disk fills meanwhile)
            _write_files(snap, tmp, unique, aliases)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if directory.exists():
        old = directory.parent / f".{directory.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        _rename(directory, old)
    _rename(tmp, directory)
    fsync_dir(directory.parent)
    if old is not None:  # only now: the new version is in place
        shutil.rmtree(old, ignore_errors=True)
    return directory


# --------------------------------------------------------------------------------------------------- load


def _fail(directory: Path, problem: str) -> CheckpointError:
    return CheckpointError(
        f"checkpoint {directory} is unusable: {problem}. Fix: load another checkpoint (e.g. 'best', or 'last' "
        "of an earlier run), or delete this directory and start from scratch; a full disk or an interrupted "
        "copy/upload is the usual cause."
    )


def load(directory: Path, *, map_location: str | torch.device = "cpu", verify: bool = True) -> Snapshot:
    """Read a checkpoint written by write(); validates it first (sizes always, sha256 if ``verify``)."""
    directory = Path(directory)
    target = _resolve(directory)
    if target is None:
        raise CheckpointError(f"no checkpoint at {directory}. Fix: check the path, or use latest(run_dir).")
    try:
        manifest = _check(target, verify=verify)
        if manifest.get("sharded"):  # an FSDP run's (kitlib.engine.sharded): its shards gathered here
            return _read_sharded(target)
        weights = load_file(target / MODEL_FILE, device=str(torch.device(map_location)))
        for alias, stored in manifest.get("aliases", {}).items():
            weights[alias] = weights[stored]  # restore tied weights as one shared tensor
        state = None
        if STATE_FILE in manifest["files"]:
            # weights_only=True: snapshot() only admits types this accepts, and it keeps a downloaded checkpoint
            # (a Kaggle dataset) from running code; the manifest proves integrity, not trust.
            state = torch.load(target / STATE_FILE, map_location=map_location, weights_only=True)
        meta = json.loads((target / META_FILE).read_text(encoding="utf-8"))
    except CheckpointError as e:
        raise _fail(target, str(e)) from None
    except Exception as e:  # safetensors/zip/unpickling errors of a file that passed the size check (verify=False)
        raise _fail(target, f"{type(e).__name__}: {e}") from e
    return Snapshot(weights=weights, state=state, meta=meta)


def _read_sharded(directory: Path) -> Snapshot:
    """One process: the whole model's weights from a DCP directory (kitlib.engine.sharded.save, any world size)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        raise CheckpointError("a sharded checkpoint gathers whole in one process: on every rank use sharded.load_into")
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        found = _load_state_dict_from_keys({"model"}, checkpoint_id=str(directory))
    weights = {k: v for k, v in found["model"].items() if isinstance(v, torch.Tensor)}
    return Snapshot(weights=weights, state=None, meta=json.loads((directory / META_FILE).read_text(encoding="utf-8")))


def _strip_prefix(weights: dict[str, torch.Tensor], expected: set[str]) -> dict[str, torch.Tensor]:
    """Drop 'module.'/'_orig_mod.' prefixes left by checkpoints saved from wrapped models by other tools."""
    for prefix in ("module.", "_orig_mod."):
        if weights and all(k.startswith(prefix) for k in weights) and not any(k.startswith(prefix) for k in expected):
            weights = {k[len(prefix) :]: v for k, v in weights.items()}
    return weights


def restore_model(model: torch.nn.Module, snap: Snapshot, *, strict: bool = True) -> None:
    """Load ``snap.weights`` into ``model`` (wrapped or not), in place; tied parameters stay tied."""
    target = unwrap_model(model)
    live = saved_state(target)
    partial = len(live) < len(target.state_dict())  # an adapter: the frozen base is the model's own
    weights = _strip_prefix(dict(snap.weights), set(live))
    # A file that stored only one name of a tied pair (e.g. HF drops lm_head.weight): fill the other from it.
    groups: dict[tuple[Any, ...], list[str]] = {}
    for name, t in live.items():
        if t.numel():
            groups.setdefault(_view_key(t), []).append(name)
    for names in groups.values():
        present = [n for n in names if n in weights]
        for n in names:
            if n not in weights and present:
                weights[n] = weights[present[0]]
    try:
        result = target.load_state_dict(weights, strict=strict and not partial)  # copy_: ties/devices kept
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
    if result.missing_keys or result.unexpected_keys:  # strict=False: say what did not match instead of hiding it
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


# --------------------------------------------------------------------------------------------------- background


class BackgroundWriter:
    """One daemon worker thread; submit() returns immediately.

    At most one pending write per target directory: a newer snapshot replaces a queued-but-not-started one, so
    a disk slower than the save cadence skips stale 'last' checkpoints instead of queueing them (RAM bound: per
    target, one snapshot being written + one pending). Errors in the thread are re-raised on the next
    submit()/wait()/close(). Call close() (or use as a context manager) before exit: a daemon thread dies with the
    interpreter, and an unfinished write then leaves the previous checkpoint (still intact) in place.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending: dict[Path, Snapshot] = {}  # insertion order = FIFO across targets
        self._active = False
        self._closed = False
        self._errors: list[BaseException] = []
        self._thread: threading.Thread | None = None  # started on first submit: no thread if never used
        self._busy = 0.0
        self._writes = 0

    def _raise_error(self) -> None:  # caller holds the lock
        if self._errors:
            err, self._errors = self._errors[0], []
            if isinstance(err, CheckpointError):
                raise err
            raise CheckpointError(f"background checkpoint write failed: {type(err).__name__}: {err}") from err

    def submit(self, snap: Snapshot, directory: Path) -> None:
        with self._cond:
            self._raise_error()
            if self._closed:
                raise CheckpointError("BackgroundWriter.submit() after close(). Fix: create a new writer.")
            self._pending[Path(directory).absolute()] = snap  # replaces a stale queued snapshot for this target
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kitlib-checkpoint-writer", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:  # closed and drained
                    return
                directory = next(iter(self._pending))
                snap = self._pending.pop(directory)
                self._active = True
            start = time.perf_counter()
            error = None
            try:
                write(snap, directory)
            except BaseException as e:  # reported to the training thread, never swallowed
                error = e
            elapsed = time.perf_counter() - start
            del snap  # free the CPU copy before waiting for the next one
            with self._cond:
                self._active = False
                self._busy += elapsed
                if error is None:
                    self._writes += 1
                else:
                    self._errors.append(error)
                self._cond.notify_all()

    def wait(self) -> None:
        """Block until everything submitted is on disk; re-raises a background error."""
        with self._cond:
            while self._pending or self._active:
                self._cond.wait()
            self._raise_error()

    def close(self) -> None:
        """wait(), then stop the thread. Idempotent."""
        with self._cond:
            while self._pending or self._active:
                self._cond.wait()
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
        with self._cond:
            self._raise_error()

    def __enter__(self) -> BackgroundWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.close()
            return
        try:  # already unwinding: still flush, but do not mask the original exception
            self.close()
        except CheckpointError as err:
            warnings.warn(f"checkpoint writer error while handling another exception: {err}", stacklevel=2)

    @property
    def busy_seconds(self) -> float:
        """Wall seconds the worker spent in write() (serialise + hash + fsync + swap)."""
        with self._cond:
            return self._busy

    @property
    def writes(self) -> int:
        """Completed successful writes (coalesced snapshots are not counted)."""
        with self._cond:
            return self._writes


class RunOutput:
    """Where a run's files go: ``path`` (None: nowhere), written by rank 0 alone (``writes``), checkpoints through
    one ``BackgroundWriter`` (the snapshot is taken on the training thread, the disk write is not)."""

    def __init__(self, path: str | Path | None, *, is_main: bool) -> None:
        self.path = Path(path) if path is not None else None
        self.writes = self.path is not None and is_main
        self.writer = BackgroundWriter()

    def save(self, name: str, snap: Snapshot) -> None:
        assert self.path is not None
        self.writer.submit(snap, self.path / name)
