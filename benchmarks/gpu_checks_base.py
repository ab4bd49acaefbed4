"""The GPU suite's check protocol: a declared ``Check``, the ``Ctx`` a check records into, and ``run_check``.

A check is a function ``fn(ctx)`` that measures (``ctx.figure``), states what must hold (``ctx.claim``: a false
claim fails the check, the others still run), or skips itself (``ctx.skip``). An exception fails the check with its
error and traceback; the suite runs each check in its own subprocess, so nothing a check does reaches another.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Needs = Literal["any", "cuda", "cuda2"]


@dataclass(frozen=True)
class Check:
    name: str
    title: str  # one line: what it proves or measures
    fn: Callable[[Ctx], None]
    finding: str = ""  # issue #18's finding number(s) it proves or disproves ("" for timings)
    needs: Needs = "any"
    why_gpu: str = ""  # why it needs the GPU(s): said in the skip reason
    gpu_s: float = 30.0  # estimated seconds on an H100, full sizes (the parts are cut from these)
    cpu_s: float = 10.0  # estimated seconds on a 2-core CPU, quick sizes
    env: Mapping[str, str] = field(default_factory=dict)  # set in the check's subprocess (allocator config...)


class Skip(Exception):
    """Raised by ``Ctx.skip``: the check does not apply here; the reason is reported."""


class Ctx:
    def __init__(self, *, quick: bool, scratch: Path) -> None:
        self.quick, self.scratch = quick, scratch
        self.figures: dict[str, Any] = {}
        self.claims: list[dict[str, Any]] = []
        self.notes: list[str] = []

    def figure(self, name: str, value: Any) -> Any:
        self.figures[name] = value
        return value

    def claim(self, ok: bool, what: str) -> bool:
        """Something the finding's fix must make true; False fails the check (after the rest has run)."""
        self.claims.append({"ok": bool(ok), "what": what})
        return bool(ok)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def skip(self, reason: str) -> None:
        raise Skip(reason)

    def size(self, quick: Any, full: Any) -> Any:
        return quick if self.quick else full


def run_check(check: Check, *, quick: bool, scratch: Path) -> dict[str, Any]:
    ctx = Ctx(quick=quick, scratch=scratch)
    started = time.perf_counter()
    result: dict[str, Any]
    try:
        check.fn(ctx)
    except Skip as s:
        result = {"status": "skipped", "reason": str(s)}
    except BaseException as e:  # a check's failure is its result, whatever it raised (SystemExit too)
        result = {"status": "failed", "error": f"{type(e).__name__}: {e}"[:2000], "traceback": traceback.format_exc()}
    else:
        broken = [c["what"] for c in ctx.claims if not c["ok"]]
        if broken:
            result = {"status": "failed", "error": "claim(s) false: " + "; ".join(broken)}
        else:
            result = {"status": "passed"}
    result.update(
        figures=ctx.figures,
        claims=ctx.claims,
        summary="; ".join(ctx.notes),
        check_seconds=round(time.perf_counter() - started, 2),
    )
    return result
