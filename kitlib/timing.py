"""Wall-clock accounting per phase of a run: where did the time go?

Cost: two ``perf_counter`` calls per phase per step (~0.1 us each), negligible next to any real step. On CUDA,
kernels run asynchronously, so host-side phase times shift work into whichever phase syncs next; the totals and
the wall-clock are still true.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PHASES = ("data_wait", "h2d", "compute", "optimizer", "eval", "full_eval", "checkpoint", "logging")


class PhaseTimer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self.start = time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        begin = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - begin)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] += seconds
        self.counts[name] += 1

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def record(self) -> dict[str, object]:
        """JSON-able summary: seconds and share of wall time per phase, plus what no phase covered."""
        wall = self.elapsed
        covered = sum(self.seconds.values())
        phases = {
            name: {
                "seconds": round(self.seconds[name], 4),
                "count": self.counts[name],
                "share": round(self.seconds[name] / wall, 4) if wall else 0.0,
            }
            for name in sorted(self.seconds, key=lambda n: PHASES.index(n) if n in PHASES else len(PHASES))
        }
        return {"wall_seconds": round(wall, 4), "other_seconds": round(max(0.0, wall - covered), 4), "phases": phases}

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.record(), indent=2) + "\n")
