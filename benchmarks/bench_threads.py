"""Intra-op threads when the process may use fewer cores than torch sized its pool for, with and without a
competing process: torch's own count against kitlib's (``kitlib.machine.threads.cpu_threads``), side by side.

    python benchmarks/bench_threads.py [--rounds 5] [--steps 10] [--width 1024]
    python benchmarks/bench_threads.py --neighbour      # every CPU usable; a busy round has one neighbour thread

torch sizes its thread pool once, for the cores it sees when it starts. A process that may use fewer (a container
whose CPU quota is below the host's cores, an affinity narrowed after start, DDP ranks sharing the machine) keeps
more threads than cores, and every parallel region then waits for a thread that is not running. This benchmark
makes that case on any machine: after torch has started it narrows its own affinity to half of its CPUs (at least
one). torch keeps its count; ``cpu_threads()`` (what fit, 01's featurising and 03's predicting run inside) takes
the usable share.

Each round times ``--steps`` training steps (forward + backward + AdamW on an MLP of three ``--width``-wide layers,
batch 64) under each setting, alternating, so both see the same machine; "busy" rounds run with a competing process
(matmuls on every CPU with torch's default threads, as another notebook or job would) started before and stopped
after them. Reported: the median seconds per step of each setting and the ratio torch's / kitlib's (above 1: kitlib
is faster), one JSON line at the end.

``--neighbour``: the affinity stays whole, and the busy rounds' competitor is one process on one thread, holding one
core (another notebook's tokenizer, a job beside the run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
from torch import nn

from kitlib.machine.hardware import usable_cpus
from kitlib.machine.threads import cpu_threads

COMPETITOR = "import torch\na = torch.randn(1024, 1024)\nwhile True:\n    a = (a @ a).tanh()\n"


def _step_timer(width: int, steps: int) -> Callable[[], float]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, width), torch.randn(64, 1)

    def seconds_per_step() -> float:
        start = time.perf_counter()
        for _ in range(steps):
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return (time.perf_counter() - start) / steps

    seconds_per_step()  # warm-up: allocator, AdamW state
    return seconds_per_step


def _rounds(timer: Callable[[], float], rounds: int) -> dict[str, list[float]]:
    """Alternating rounds: torch's pool as it is, then inside kitlib's cpu_threads(); the counts kitlib took."""
    times: dict[str, list[float]] = {"torch": [], "kitlib": [], "kitlib_threads": []}
    for _ in range(rounds):
        times["torch"].append(timer())
        with cpu_threads() as n:
            times["kitlib"].append(timer())
        times["kitlib_threads"].append(n)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--neighbour", action="store_true", help="one competing thread on one core")
    args = parser.parse_args()

    torch_threads = torch.get_num_threads()  # sized at start, for every CPU this process could see
    cpus = sorted(os.sched_getaffinity(0))
    if not args.neighbour:
        os.sched_setaffinity(0, cpus[: max(1, len(cpus) // 2)])  # now it may use half of them; torch does not notice
    with cpu_threads() as kitlib_threads:
        pass
    print(f"torch {torch.__version__}: {len(cpus)} CPUs seen at start, {usable_cpus()} usable after narrowing")
    print(f"threads: torch keeps {torch_threads}, kitlib's cpu_threads() takes {kitlib_threads}")
    timer = _step_timer(args.width, args.steps)
    results = {"idle": _rounds(timer, args.rounds)}
    own_threads = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # torch's default: every CPU
    competitor = subprocess.Popen([sys.executable, "-c", COMPETITOR],
                                  env=own_threads | ({"OMP_NUM_THREADS": "1"} if args.neighbour else {}))  # fmt: skip
    try:
        time.sleep(2.0)  # its torch import and first matmuls: it competes from the first timed round on
        results["busy"] = _rounds(timer, args.rounds)
    finally:
        competitor.terminate()
        competitor.wait()
    summary: dict[str, object] = {"torch_threads": torch_threads, "kitlib_threads": kitlib_threads}
    print(f"\n{'':6} {'torch s/step':>13} {'kitlib s/step':>14} {'ratio':>7}  (median of {args.rounds} rounds)")
    for case, times in results.items():
        torch_s, kitlib_s = statistics.median(times["torch"]), statistics.median(times["kitlib"])
        ratio = torch_s / kitlib_s
        print(f"{case:6} {torch_s:13.4f} {kitlib_s:14.4f} {ratio:7.2f}")
        spread = {k: [round(t, 4) for t in v] for k, v in times.items()}  # and the counts kitlib took
        summary[case] = {"torch_s": torch_s, "kitlib_s": kitlib_s, "ratio": ratio, "rounds": spread}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
