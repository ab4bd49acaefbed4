"""The step ledger's cost inside a real CPU fit, old kitlib against new, in one process (interleaved rounds, the
order flipped every other round: the side run second reads slower on a shared core).

Each fit's ``ledger.tally`` + ``ledger.step`` are timed around, less the optimizer's own ``step`` inside them: the
ledger's bookkeeping per step, beside the whole fit's ms per step. The old kitlib is a renamed copy importable as
``kitlib_old`` (bench_engine_ab.py's recipe):

    mkdir -p /tmp/old && git archive <commit> kitlib | tar -x -C /tmp/old && mv /tmp/old/kitlib /tmp/old/kitlib_old
    grep -rl kitlib /tmp/old/kitlib_old | xargs sed -i -E 's/\\bkitlib\\b/kitlib_old/g'
    PYTHONPATH=/tmp/old:. taskset -c 1 env OMP_NUM_THREADS=1 python benchmarks/bench_ledger.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import bench_engine as b

import kitlib
from kitlib.machine.hardware import fake_profile

SIZES = {  # name: (hidden, layers, batch, length, steps)
    "tiny": (32, 1, 4, 16, 200),
    "small": (128, 2, 8, 64, 60),
    "minilm": (384, 6, 8, 128, 8),
}


class Clock:
    """Seconds spent in the wrapped calls (process CPU time, which time-sharing of the core does not inflate)."""

    def __init__(self) -> None:
        self.tally = self.step = self.optimizer = 0.0

    def wrap(self, fn: Callable[..., Any], field: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                setattr(self, field, getattr(self, field) + time.process_time() - start)

        return timed


def run_fit(lib: Any, hw: Any, size: str, batches: Any, clock: Clock) -> float:
    hidden, layers, *_ = SIZES[size]

    class Watch(lib.Callback):  # type: ignore[misc,name-defined]
        def on_fit_start(self, loop: Any) -> None:
            ledger, optimizer = loop.ledger, loop.optimizer
            ledger.tally = clock.wrap(ledger.tally, "tally")
            ledger.step = clock.wrap(ledger.step, "step")
            optimizer.step = clock.wrap(optimizer.step, "optimizer")

    config = lib.TrainConfig(epochs=1, lr=1e-4, schedule="linear", warmup_ratio=0.1, precision="fp32",
                             log_every_steps=10_000, save_best=False)  # fmt: skip
    model = b.make_model(hidden, layers)
    start = time.process_time()
    lib.fit(model, b.loader_of(batches), config=config, hw=hw, callbacks=[Watch()])
    return time.process_time() - start


def main() -> None:
    import kitlib_old  # type: ignore[import-not-found]
    from kitlib_old.machine.hardware import fake_profile as old_profile  # type: ignore[import-not-found]

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    sides = {"old": (kitlib_old, old_profile("CPU", platform="local", interactive=False)),
             "new": (kitlib, fake_profile("CPU", platform="local", interactive=False))}  # fmt: skip
    print("| size | side | tally us | step less optimizer.step us | optimizer.step us | ledger % of step | fit ms/step "
          "| fit new - old |\n| --- | --- | --- | --- | --- | --- | --- | --- |")  # fmt: skip
    for size in args.sizes.split(","):
        hidden, layers, batch, length, steps = SIZES[size]
        batches = b.make_batches(steps, batch, length)
        for lib, hw in sides.values():  # warm-up
            run_fit(lib, hw, size, batches[:3], Clock())
        tally: dict[str, list[float]] = {k: [] for k in sides}
        step: dict[str, list[float]] = {k: [] for k in sides}
        optimizer: dict[str, list[float]] = {k: [] for k in sides}
        fits: dict[str, list[float]] = {k: [] for k in sides}
        for round_ in range(args.repeats):
            for name in sorted(sides, reverse=round_ % 2 == 1):  # each side first in every other round
                lib, hw = sides[name]
                clock = Clock()
                fits[name].append(run_fit(lib, hw, size, batches, clock) / steps)
                tally[name].append(clock.tally / steps)
                step[name].append((clock.step - clock.optimizer) / steps)
                optimizer[name].append(clock.optimizer / steps)
        fit = {k: statistics.median(v) for k, v in fits.items()}
        for name in sides:
            own = statistics.median(tally[name]), statistics.median(step[name])
            print(f"| {size} ({hidden}x{layers}, {batch}x{length}) | {name} | {1e6 * own[0]:.1f} | {1e6 * own[1]:.1f} "
                  f"| {1e6 * statistics.median(optimizer[name]):.0f} "
                  f"| {100 * sum(own) / fit[name]:.2f} | {1e3 * fit[name]:.2f} "
                  f"| {1e6 * (fit['new'] - fit['old']):+.0f} us |")  # fmt: skip


if __name__ == "__main__":
    main()
