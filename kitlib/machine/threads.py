"""The compute threads a block of work runs on: torch's intra-op pool and the tokenizers', set and restored."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from kitlib.machine.hardware import local_processes, threads_per_worker

# lazy: torch (+1.0 s) and kitlib.machine.speed (imports torch): the stages decorate with cpu_threads and stay light
# to import (python -X importtime).


def share() -> int:
    """This process's share of the CPUs it may use (its affinity and cgroup quota, split between the training
    processes on this machine: ``threads_per_worker``), never more than torch already has."""
    import torch

    return min(torch.get_num_threads(), threads_per_worker(max(1, local_processes())))


def measurable(most: int) -> bool:
    """Whether a count up to ``most`` is chosen by measuring: more than one thread to choose from, no
    OMP_NUM_THREADS (the user chose), and no GPU in this process (its compute is there, the CPU's threads feed it)."""
    import torch

    if most < 2 or os.environ.get("OMP_NUM_THREADS"):
        return False
    return not (torch.cuda.is_available() or torch.backends.mps.is_available())


@contextlib.contextmanager
def cpu_threads(threads: int | None = None, *, measure: bool = False) -> Iterator[int]:
    """Compute threads for the block (torch's pool and RAYON_NUM_THREADS), restored afterwards; yields the count.
    Default: this process's ``share`` (torch sizes its pool from the host's cores, more than a quota allows);
    ``measure``: fewer where fewer ran faster just now (``fastest_threads``, ~0.8 s)."""
    import torch

    from kitlib.machine import speed

    before = torch.get_num_threads()
    n = threads if threads is not None else share()
    if measure and threads is None and measurable(n):
        share_, (n, speedup) = n, speed.fastest_threads(n)
        if n < share_:
            print(f"threads: {n} of {share_} CPUs (a step on {n} ran {speedup:.1f}x faster than on {share_} just now: "
                  "other processes hold the rest)")  # fmt: skip
    saved = os.environ.get("RAYON_NUM_THREADS")
    os.environ["RAYON_NUM_THREADS"] = str(n)
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)
        if saved is None:
            os.environ.pop("RAYON_NUM_THREADS", None)
        else:
            os.environ["RAYON_NUM_THREADS"] = saved
