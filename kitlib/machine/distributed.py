"""Multi-process data parallel training (DDP): torchrun, multi-node, and a notebook launcher for Kaggle's 2xT4.

Only rank 0 writes files and draws progress bars. On CPU the same code runs with the gloo backend, which is how
the tests exercise it.
"""

from __future__ import annotations

import os
import pickle
import socket
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def dist_env(environ: Mapping[str, str] | None = None) -> DistEnv:
    """The process's place in the job, from the variables torchrun (and kitlib's launcher) set."""
    env = os.environ if environ is None else environ
    return DistEnv(int(env.get("RANK", 0)), int(env.get("LOCAL_RANK", 0)), int(env.get("WORLD_SIZE", 1)))


def join_process_group(device_type: str, environ: Mapping[str, str] | None = None) -> DistEnv:
    """Join the process group when launched with WORLD_SIZE > 1 (idempotent)."""
    env = dist_env(environ)
    if env.enabled and not dist.is_initialized():
        if "MASTER_ADDR" not in os.environ:
            raise RuntimeError(
                f"WORLD_SIZE={env.world_size} but MASTER_ADDR is unset: launch with `torchrun --nproc_per_node N "
                "script.py`, or from a notebook with kitlib.machine.distributed.launch(fn, nprocs=N)"
            )
        # NCCL for GPUs; gloo is the CPU backend (and what the tests use).
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo", rank=env.rank, world_size=env.world_size)
    if env.enabled and device_type == "cuda":
        torch.cuda.set_device(env.local_rank)
    return env


def device_for(device_type: str, env: DistEnv) -> torch.device:
    return torch.device(f"cuda:{env.local_rank}") if device_type == "cuda" else torch.device(device_type)


def wrap(model: nn.Module, env: DistEnv, device: torch.device) -> nn.Module:
    if not env.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def sync_context(model: nn.Module, sync: bool) -> AbstractContextManager[Any]:
    """Skip DDP's gradient all-reduce on micro-steps that do not end an accumulation window (1 sync per step)."""
    no_sync = getattr(model, "no_sync", None)
    return no_sync() if (not sync and callable(no_sync)) else nullcontext()


def all_reduce_sum(value: torch.Tensor, env: DistEnv) -> torch.Tensor:
    if env.enabled:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def broadcast_object(value: Any, env: DistEnv) -> Any:
    """Rank 0's value on every rank (e.g. the early-stopping decision, so all ranks stop together)."""
    if not env.enabled:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(env: DistEnv) -> None:
    if env.enabled:
        dist.barrier()


def patient_group(env: DistEnv) -> Any:
    """A gloo group (every rank calls this at once) whose barrier lets the other ranks wait out one rank's long
    work, a full evaluation: a NCCL collective left waiting that long trips its 10-minute watchdog and kills the job."""
    import datetime

    return dist.new_group(backend="gloo", timeout=datetime.timedelta(days=1)) if env.enabled else None


def wait_together(group: Any, env: DistEnv) -> None:
    """Every rank waits here until all arrive, on ``patient_group``'s CPU barrier (no NCCL watchdog)."""
    if env.enabled:
        dist.barrier(group=group)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _worker(local_rank: int, fn: Callable[..., Any], args: tuple[Any, ...], nprocs: int, port: int, out: str) -> None:
    os.environ.update(
        {
            "RANK": str(local_rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(nprocs),
            "LOCAL_WORLD_SIZE": str(nprocs),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    try:
        value = fn(*args)
        if local_rank == 0:
            # A file, not a pipe: a result larger than the pipe buffer (a model) would block this worker until the
            # parent reads, while the parent waits in join() for this worker to exit.
            with open(out, "wb") as f:
                pickle.dump(value, f)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def launch(fn: Callable[..., Any], *args: Any, nprocs: int | None = None) -> Any:
    """Run ``fn(*args)`` on ``nprocs`` processes (default: one per GPU) and return rank 0's result.

    For notebooks (Kaggle's 2xT4): workers are *forked*, so ``fn`` may be defined in the notebook itself. A forked
    child cannot use CUDA once the parent has initialised it, so call this before any CUDA work in the kernel
    (restart the kernel if needed); kitlib refuses early instead of failing inside the workers. A worker's error
    is re-raised here with its traceback (torch.multiprocessing.ProcessRaisedException).
    """
    import tempfile

    import torch.multiprocessing as mp

    if nprocs is None:
        nprocs = max(1, torch.cuda.device_count())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        raise RuntimeError(
            "CUDA is already initialised in this kernel, and forked workers cannot use it: restart the kernel and "
            "call kitlib.machine.distributed.launch(...) before anything touches the GPU (no .cuda()/.to('cuda') "
            "earlier)"
        )
    with tempfile.TemporaryDirectory(prefix="kitlib-launch-") as tmp:
        out = os.path.join(tmp, "rank0.pkl")
        mp.start_processes(_worker, args=(fn, args, nprocs, free_port(), out), nprocs=nprocs, start_method="fork")
        if not os.path.exists(out):
            raise RuntimeError("rank 0 ended without a result")
        with open(out, "rb") as f:
            return pickle.load(f)  # written by our own child process a moment ago, not foreign data
