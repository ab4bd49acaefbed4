"""Wall-clock seconds per phase; on CUDA one step in ``sample_every`` syncs at phase boundaries to be true."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kitlib._files import write_atomic

PHASES = ("data_wait", "h2d", "forward", "backward", "optimizer", "eval", "full_eval", "checkpoint", "logging")
STEP_PHASES = ("data_wait", "h2d", "forward", "backward", "optimizer")


class PhaseTimer:
    def __init__(self, sync: Callable[[], None] | None = None, sample_every: int = 25) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self.sampled: dict[str, float] = defaultdict(float)  # step phases of sampled steps only
        self.sampled_steps = 0
        self.sync, self.sample_every = sync, sample_every if sync is not None else 1
        self._sampling = sync is None
        self.start = time.perf_counter()
        self.extra: dict[str, Any] = {}  # run facts recorded beside the phases (tokens, memory, workers, ...)

    def begin_step(self, index: int) -> None:
        """Mark the start of optimizer step ``index``; decides whether this step is a (synchronised) sample."""
        self._sampling = index % self.sample_every == 0
        if self._sampling:
            self.sampled_steps += 1
            if self.sync is not None:
                self.sync()

    def discard_step(self) -> None:
        """The step begun last had no batch (the epoch's end): do not count it as a sample."""
        if self._sampling:
            self.sampled_steps -= 1
            self._sampling = False

    def phase(self, name: str) -> _Phase:
        """``with timer.phase(name):`` charges the block's wall time to ``name`` (~0.4 us: not a generator)."""
        return _Phase(self, name)

    def _close(self, name: str, begin: float) -> None:
        if self._sampling and self.sync is not None:
            self.sync()
        seconds = time.perf_counter() - begin
        self.add(name, seconds)
        if self._sampling and name in STEP_PHASES:
            self.sampled[name] += seconds

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] += seconds
        self.counts[name] += 1

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def record(self) -> dict[str, Any]:
        """JSON-able summary: seconds and share per phase, uncovered time, sampled steps' breakdown, ``extra`` facts."""
        wall = self.elapsed
        covered = sum(v for k, v in self.seconds.items() if k in PHASES)
        phases = {
            name: {
                "seconds": round(self.seconds[name], 4),
                "count": self.counts[name],
                "share": round(self.seconds[name] / wall, 4) if wall else 0.0,
            }
            for name in sorted(self.seconds, key=lambda n: PHASES.index(n) if n in PHASES else len(PHASES))
        }
        per_step = {
            name: round(self.sampled[name] / self.sampled_steps, 6) for name in STEP_PHASES if self.sampled_steps
        }
        return {
            "wall_seconds": round(wall, 4),
            "other_seconds": round(max(0.0, wall - covered), 4),
            "phases": phases,
            "per_step_seconds": per_step,
            "sampled_steps": self.sampled_steps,
            "run": self.extra,
        }

    def save(self, path: Path) -> None:
        write_atomic(path, json.dumps(self.record(), indent=2, default=str) + "\n")


class _Phase:
    __slots__ = ("begin", "name", "timer")

    def __init__(self, timer: PhaseTimer, name: str) -> None:
        self.timer, self.name = timer, name

    def __enter__(self) -> None:
        self.begin = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.timer._close(self.name, self.begin)
