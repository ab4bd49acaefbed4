"""The compute threads a block of work runs on: torch's intra-op pool and the tokenizers', set and restored."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from kitlib.machine.hardware import local_processes, threads_per_worker

# lazy: torch (+1.0 s): the stages decorate with cpu_threads and stay light to import (python -X importtime).


@contextlib.contextmanager
def cpu_threads(threads: int | None = None) -> Iterator[int]:
    """Compute threads for the block (torch's pool and RAYON_NUM_THREADS), restored afterwards; yields the count.
    Default: this process's share of its usable CPUs (affinity, cgroup quota, split between the training processes
    here: ``threads_per_worker``), never more than torch already has."""
    import torch

    before = torch.get_num_threads()
    n = threads if threads is not None else min(before, threads_per_worker(max(1, local_processes())))
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
