"""Several processes (DDP, FSDP's collectives): torchrun on one or more nodes, or forked notebook workers."""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import os
import pickle
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from kitlib.errors import DistributedError
from kitlib.machine.hardware import cuda_devices, local_processes, threads_per_worker


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1  # processes on this machine (they share its CPUs)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def dist_env(environ: Mapping[str, str] | None = None) -> DistEnv:
    """The process's place in the job, from the variables torchrun (and kitlib's launcher) set."""
    env = os.environ if environ is None else environ
    world = int(env.get("WORLD_SIZE", 1))
    return DistEnv(int(env.get("RANK", 0)), int(env.get("LOCAL_RANK", 0)), world, local_processes(env))


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


def wrap(model: nn.Module, env: DistEnv, device: torch.device, *, find_unused_parameters: bool = False) -> nn.Module:
    if not env.enabled:
        return model
    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, find_unused_parameters=find_unused_parameters)


@contextmanager
def every_parameter_gets_a_gradient(model: nn.Module) -> Iterator[None]:
    """Raise DistributedError naming trainable parameters without a gradient in the block (DDP fails the next step)."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    seen: set[int] = set()
    handles = [p.register_post_accumulate_grad_hook(lambda p: seen.add(id(p))) for _, p in named]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
    unused = [name for name, p in named if id(p) not in seen]
    if unused:
        shown = ", ".join(unused[:8]) + (f" and {len(unused) - 8} more" if len(unused) > 8 else "")
        raise DistributedError(
            f"{len(unused)} trainable parameter(s) of {type(model).__name__} got no gradient in the first step: "
            f"{shown}. DDP needs a gradient for every one (the next step would fail). Fix: remove or freeze them "
            "(param.requires_grad_(False)) if the model never uses them, or pass "
            "TrainConfig(find_unused_parameters=True) if some steps skip them (DDP then searches the graph every step)"
        )


def sync_context(model: nn.Module, sync: bool) -> AbstractContextManager[Any]:
    """Skip DDP's all-reduce (FSDP's reduce-scatter and reshard) on micro-steps not ending an accumulation window."""
    if callable(getattr(model, "set_requires_gradient_sync", None)):  # FSDP2
        return _fsdp_accumulating(model, sync)
    no_sync = getattr(model, "no_sync", None)
    return no_sync() if (not sync and callable(no_sync)) else nullcontext()


@contextmanager
def _fsdp_accumulating(model: Any, sync: bool) -> Iterator[None]:
    """No reduce-scatter and no reshard after backward until the window's last micro-batch."""
    model.set_requires_gradient_sync(sync)
    model.set_reshard_after_backward(sync)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
        model.set_reshard_after_backward(True)


def whole(value: torch.Tensor) -> torch.Tensor:
    """A plain tensor: FSDP's DTensor results (the gradient norm over sharded gradients) as every rank sees them."""
    return value.full_tensor() if isinstance(value, DTensor) else value


def all_reduce_sum(value: torch.Tensor, env: DistEnv) -> torch.Tensor:
    if env.enabled:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def comm_seconds(params: list[nn.Parameter], env: DistEnv, device: torch.device, *, sharded: bool, accum: int) -> float:
    """Seconds a step spends communicating: one all-reduce of up to 32 MB timed after a warm-up, scaled to the
    trainable fp32 bytes; FSDP moves (2 x accum + 1) / 2 of that (a gather each forward and backward pass, one
    reduce-scatter; an all-reduce is both). As if nothing overlapped backward: an upper bound."""
    total = sum(p.numel() for p in params) * 4  # fp32 gradients (FSDP: reduce_dtype fp32)
    buffer = torch.zeros(min(total, 32 * 2**20) // 4 or 1, device=device)
    for _ in range(2):  # the first call sets the group's connections up
        started = time.perf_counter()
        dist.all_reduce(buffer)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - started
    passes = (2 * accum + 1) / 2 if sharded else 1.0
    return seconds * total / (buffer.numel() * 4) * passes


def broadcast_object(value: Any, env: DistEnv) -> Any:
    """Rank 0's value on every rank (e.g. the early-stopping decision, so all ranks stop together)."""
    if not env.enabled:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_object(value: Any, env: DistEnv) -> list[Any]:
    """Every rank's ``value`` on rank 0, in rank order (``[value]`` without DDP, ``[]`` on the other ranks)."""
    if not env.enabled:
        return [value]
    box: list[Any] | None = [None] * env.world_size if env.is_main else None
    dist.gather_object(value, box, dst=0)
    return box or []


def barrier(env: DistEnv) -> None:
    if env.enabled:
        dist.barrier()


def regrouped(
    meta: Mapping[str, Any], micro: int, accum: int, world_size: int, batch: int
) -> tuple[dict[str, Any], int]:
    """A checkpoint's config as this world size continues it, and its position ``batch`` (micro-batches this epoch,
    per rank) in this run's micro-batches: another world size must keep the effective batch, else DistributedError
    names the accumulation that does."""
    saved, then = dict(meta.get("config", {})), int(meta.get("world_size", world_size))
    if then == world_size:
        return saved, batch
    rows = saved["micro_batch_size"] * saved["grad_accum_steps"] * then  # a step's rows: the same run needs them
    if micro * accum * world_size != rows:
        fix, part = divmod(rows, micro * world_size)
        raise DistributedError(
            f"the checkpoint was saved by {then} ranks, each step {rows} rows (micro-batch {saved['micro_batch_size']}"
            f" x accumulation {saved['grad_accum_steps']} x {then} ranks); on {world_size} ranks micro-batch {micro} x "
            f"accumulation {accum} makes {micro * accum * world_size}, another run. Fix: "
            + (f"grad_accum_steps={fix}" if fix and not part else f"a micro-batch and accumulation making {rows} rows")
        )
    done = batch * saved["micro_batch_size"] * then  # rows this epoch has consumed, all ranks together
    return {**saved, "micro_batch_size": micro, "grad_accum_steps": accum}, done // (micro * world_size)


def patient_group(env: DistEnv) -> Any:
    """A gloo group whose barrier outlasts one rank's long full eval (NCCL's 10-minute watchdog would kill the job)."""
    return dist.new_group(backend="gloo", timeout=datetime.timedelta(days=1)) if env.enabled else None


def wait_together(group: Any, env: DistEnv) -> None:
    """Every rank waits here until all arrive, on ``patient_group``'s CPU barrier (no NCCL watchdog)."""
    if env.enabled:
        dist.barrier(group=group)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _worker(
    local_rank: int, fn: Callable[..., Any], args: tuple[Any, ...], nprocs: int, port: int, out: str, threads: int
) -> None:
    os.environ.update(
        {
            "RANK": str(local_rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(nprocs),
            "LOCAL_WORLD_SIZE": str(nprocs),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": str(threads),  # for the worker's own children; this process is set just below
        }
    )
    torch.set_num_threads(threads)
    try:
        value = fn(*args)
        if local_rank == 0:
            # a file, not a pipe: a large result would block the worker while the parent waits in join()
            with open(out, "wb") as f:
                pickle.dump(value, f)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def cuda_driver_initialised() -> bool:
    """Whether this process initialised the CUDA driver (cuInit), without initialising it (~1 ms)."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:  # no NVIDIA driver (or not Linux): nothing to have initialised
        return False
    return int(libcuda.cuDeviceGetCount(ctypes.byref(ctypes.c_int()))) == 0


class WorkerDied(DistributedError):
    """A worker process of ``launch`` was killed; the message says which and how."""


@contextmanager
def _forwarding_sigterm(pids: list[int]) -> Iterator[None]:
    """Forward SIGTERM to the workers (which save ``last/``) and keep waiting; main thread only."""

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum: int, frame: Any) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def launch(fn: Callable[..., Any], *args: Any, nprocs: int | None = None) -> Any:
    """Run ``fn(*args)`` on ``nprocs`` forked processes (one per GPU), returning rank 0's; call before any CUDA work."""
    if nprocs is None:
        nprocs = max(1, len(cuda_devices()))
    if torch.cuda.is_initialized() or cuda_driver_initialised():  # neither call initialises CUDA
        raise DistributedError(
            "CUDA is already initialised in this kernel, and forked workers cannot use it: restart the kernel and "
            "call kitlib.machine.distributed.launch(...) before anything touches the GPU (no .cuda()/.to('cuda'), "
            "no torch.cuda.is_available() earlier: kitlib.detect() is safe, or set PYTORCH_NVML_BASED_CUDA_CHECK=1 "
            "for an availability check that leaves CUDA alone)"
        )
    threads = threads_per_worker(nprocs)
    with tempfile.TemporaryDirectory(prefix="kitlib-launch-") as tmp:
        out = os.path.join(tmp, "rank0.pkl")
        workers = mp.start_processes(
            _worker, args=(fn, args, nprocs, free_port(), out, threads), nprocs=nprocs, start_method="fork", join=False
        )
        with _forwarding_sigterm([p.pid for p in workers.processes]):
            try:
                while not workers.join():
                    pass
            except mp.ProcessExitedException as err:  # killed (SIGKILL, the OOM killer): its peers cannot go on
                how = f"signal {err.signal_name}" if err.signal_name else f"exit code {err.exit_code}"
                raise WorkerDied(
                    f"worker {err.error_index} of {nprocs} (pid {err.error_pid}) ended with {how}, and the others were "
                    "stopped with it: nothing after the last checkpoint write was saved. Fix: see what killed it (the "
                    "out-of-memory killer: dmesg; a host stop), then run again: fit(resume='auto') continues from last/"
                ) from None
        if not os.path.exists(out):
            raise RuntimeError("rank 0 ended without a result")
        with open(out, "rb") as f:
            return pickle.load(f)  # written by our own child process a moment ago, not foreign data
