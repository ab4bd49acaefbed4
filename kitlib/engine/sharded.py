"""strategy="fsdp": FSDP2 per transformer block then the root, and DCP checkpoints any world size loads."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from kitlib._files import fsync_dir, fsync_file, record_file, write_manifest, write_recorded
from kitlib._version import __version__
from kitlib.engine import checkpoint
from kitlib.errors import DistributedError
from kitlib.machine.distributed import DistEnv, barrier

_HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}


def blocks(model: nn.Module, names: tuple[str, ...] = ()) -> list[nn.Module]:
    """The modules sharded on their own: ``_no_split_modules``, else ``names``, else ModuleList blocks (outermost)."""
    wanted = set(names)
    for m in model.modules():
        wanted |= set(getattr(m, "_no_split_modules", None) or ())
    found = {n: m for n, m in model.named_modules() if n and type(m).__name__ in wanted}
    if not found:
        lists = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.ModuleList)]
        found = {f"{n}.{i}": b for n, m in lists for i, b in enumerate(m)}
    return [m for n, m in found.items() if not any(n.startswith(f"{o}.") for o in found)]


def shard(model: nn.Module, dtype: str, names: tuple[str, ...] = ()) -> nn.Module:
    """``model`` sharded in place; ``dtype`` bf16/fp16 computes and gathers in it, weights and optimizer stay fp32."""
    found = blocks(model, names)
    if not found:
        raise DistributedError(
            f"strategy='fsdp': {type(model).__name__} has no transformer blocks to shard (no _no_split_modules, no "
            "ModuleList). Fix: TrainConfig(checkpoint_modules=('MyBlock',)) names the block class, or strategy='ddp'"
        )
    half = _HALF.get(dtype)
    policy = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32 if half else None)
    base = getattr(model, "get_base_model", lambda: None)()  # peft's: its generate() runs the base model, not ours
    for block in [*found, *([base] if base is not None else [])]:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def save(
    directory: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    env: DistEnv,
    writer: checkpoint.BackgroundWriter,
    *,
    group: Any,
    state: dict[str, Any] | None = None,
    meta: dict[str, Any],
) -> None:
    """Every rank's shards through DCP's ``async_save``: copied to CPU here, written on DCP's thread meanwhile; then
    ``writer``'s thread has rank 0 add meta and the manifest (last) and swap the directory in. ``writer.wait()`` (or
    close) completes it; the next save calls it first: one in flight, a failed one raises its CheckpointError.
    ``group``: ``saves_group()``'s (None without ranks). Rank 0's wait returns with the directory swapped in, the
    others' with their shards written."""
    writer.wait()
    tmp = directory.parent / f".{directory.name}.tmp-dcp"
    if env.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        if state is not None:  # now: the live objects it holds change on
            torch.save(state, tmp / checkpoint.STATE_FILE)
            fsync_file(tmp / checkpoint.STATE_FILE)
    barrier(env)
    content: dict[str, Any] = {"model": get_model_state_dict(model)}
    if optimizer is not None:
        content["optim"] = get_optimizer_state_dict(model, optimizer)
    full_meta = json.dumps({"kitlib_version": __version__, **meta}, indent=1).encode()
    written = dcp.async_save(content, checkpoint_id=tmp, process_group=group)

    def finish() -> None:
        written.result()  # type: ignore[union-attr]  # a Future: no async stager was given
        if not env.is_main:
            return
        write_recorded(tmp / checkpoint.META_FILE, [full_meta])
        manifest = {"format": checkpoint.FORMAT, "version": checkpoint.FORMAT_VERSION, "sharded": True,
                    "kitlib_version": __version__, "created_unix": time.time(),
                    "files": {p.name: record_file(p) for p in sorted(tmp.iterdir()) if p.is_file()}}  # fmt: skip
        write_manifest(tmp, manifest)
        fsync_dir(tmp)
        checkpoint.swap_in(tmp, directory, directory.parent / f".{directory.name}.old-{os.getpid()}")

    writer.run(finish)


def saves_group() -> Any:
    """The gloo group a run's async saves use (every rank calls it, once a run; None without ranks): DCP's collectives
    run on its own thread, and gloo pairs a group's calls in issue order, so they never share the training's group.
    The training thread destroys it once its writer closed (``release``)."""
    return dist.new_group(backend="gloo") if dist.is_initialized() else None


def release(group: Any) -> None:
    if group is not None:
        dist.destroy_process_group(group)


def load_into(directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> checkpoint.Snapshot:
    """Every rank loads ``model`` and ``optimizer`` in place from a sharded checkpoint of any world size."""
    content: dict[str, Any] = {"model": get_model_state_dict(model)}
    if optimizer is not None:
        content["optim"] = get_optimizer_state_dict(model, optimizer)
    dcp.load(content, checkpoint_id=directory, no_dist=not dist.is_initialized())
    set_model_state_dict(model, content["model"])
    state = None
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, content["optim"])
        state = torch.load(directory / checkpoint.STATE_FILE, weights_only=True)
        state["optimizer"] = optimizer.state_dict()
    meta = json.loads((directory / checkpoint.META_FILE).read_text())
    return checkpoint.Snapshot(weights={}, state=state, meta=meta)
