"""GPU suite (issue #18): proves or disproves each GPU-only finding and takes the timings worth having.

Each check runs in a fresh ``python`` subprocess with its own timeout, so one that hangs, crashes or initialises CUDA
cannot take the others down or leak state into them. Results land in ``--out`` as ``gpu_suite.json`` and
``gpu_suite.md`` (written after every check: a part cut short still leaves its report). On a machine without a GPU
the checks that apply run (``--quick`` sizes, the default there) and the rest are listed as skipped with the reason.

    python benchmarks/gpu_suite.py --list                   # the checks, their estimated seconds, and the parts
    python benchmarks/gpu_suite.py --out /tmp/s             # everything (CPU: quick sizes, ~2-3 min)
    python benchmarks/gpu_suite.py --part 2 --out $OUT      # part 2 of the plan (each part <= --part-budget s)
    python benchmarks/gpu_suite.py --only tf32,sync_debug --out /tmp/s
    python benchmarks/gpu_suite.py --merge out1 out2 --out docs/gpu/h100-2026-11-20   # one report from parts

Exit code 0 unless the suite itself breaks; ``--strict`` exits 1 when a check failed. See benchmarks/GPU_SUITE.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_CHECKS = "gpu_checks"
PART_BUDGET_S = 480  # 8 minutes: the device machine allows 10 per command; the rest is start-up and the report
STARTUP_S = 6  # a child's python + torch + transformers import, on top of each check's own estimate
TAIL = 3000  # characters of a failed child's output kept in the report


# ------------------------------------------------------------------------------------------------- the machine
def probe_machine() -> dict[str, Any]:
    """What this machine has, read in a subprocess so this process never touches CUDA (a later fork stays clean)."""
    code = (
        "import json, os, torch\n"
        "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
        "name = torch.cuda.get_device_name(0) if n else ''\n"
        "print(json.dumps({'gpus': n, 'cpus': os.cpu_count(), 'torch': torch.__version__, 'gpu_name': name}))\n"
    )
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))
    except (subprocess.SubprocessError, ValueError, IndexError) as e:
        return {"gpus": 0, "cpus": os.cpu_count(), "probe_error": f"{type(e).__name__}: {e}"}


# ------------------------------------------------------------------------------------------------- the plan
def load_checks(module: str) -> list[Any]:
    sys.path.insert(0, str(HERE))
    return list(importlib.import_module(module).CHECKS)


def estimate(check: Any, gpu: bool, quick: bool) -> float:
    seconds = check.gpu_s if gpu else check.cpu_s
    return STARTUP_S + (seconds if not quick or not gpu else max(1.0, seconds / 3))


def why_skipped(check: Any, machine: dict[str, Any]) -> str | None:
    gpus = int(machine.get("gpus", 0))
    if check.needs == "cuda" and gpus < 1:
        return f"needs a CUDA GPU; this machine has none ({check.why_gpu})"
    if check.needs == "cuda2" and gpus < 2:
        have = "none" if gpus == 0 else "one"
        return f"needs 2 CUDA GPUs; this machine has {have} ({check.why_gpu})"
    return None


def make_parts(checks: Sequence[Any], machine: dict[str, Any], quick: bool, budget: float) -> list[list[Any]]:
    """Checks in declared order, cut into parts whose estimates sum to at most ``budget`` (a longer check alone)."""
    gpu = int(machine.get("gpus", 0)) > 0
    parts: list[list[Any]] = [[]]
    used = 0.0
    for check in checks:
        cost = 0.0 if why_skipped(check, machine) else estimate(check, gpu, quick)
        if parts[-1] and used + cost > budget:
            parts.append([])
            used = 0.0
        parts[-1].append(check)
        used += cost
    return parts


def print_plan(parts: list[list[Any]], machine: dict[str, Any], quick: bool, budget: float) -> None:
    gpu = int(machine.get("gpus", 0)) > 0
    print(f"machine: {machine.get('gpus', 0)} GPU(s), {machine.get('cpus')} CPUs; {'quick' if quick else 'full'} sizes")
    for number, part in enumerate(parts, 1):
        total = sum(0.0 if why_skipped(c, machine) else estimate(c, gpu, quick) for c in part)
        print(f"part {number} (~{total:.0f} s of at most {budget:.0f}):")
        for c in part:
            skip = why_skipped(c, machine)
            cost = "skip" if skip else f"~{estimate(c, gpu, quick):.0f} s"
            print(f"  {c.name:<24} {cost:>8}  {c.title}" + (f"  [skipped: {skip}]" if skip else ""))


# ------------------------------------------------------------------------------------------------- running a check
def run_child(module: str, name: str, quick: bool, result_file: Path, scratch: Path) -> None:
    """The subprocess side: run one check and write its result (a failure is a result too)."""
    from gpu_checks_base import run_check  # beside this file: the Ctx, the statuses, the error capture

    sys.path.insert(0, str(HERE))
    check = next(c for c in load_checks(module) if c.name == name)
    result = run_check(check, quick=quick, scratch=scratch)
    result_file.write_text(json.dumps(result, indent=1, default=str) + "\n")


def run_in_subprocess(check: Any, module: str, quick: bool, timeout: float, scratch: Path) -> dict[str, Any]:
    result_file = scratch / f"{check.name}.result.json"
    work = scratch / check.name
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), str(HERE), env.get("PYTHONPATH", "")]))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.update(check.env)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", check.name, "--checks", module]
    cmd += ["--result", str(result_file), "--scratch", str(work)] + (["--quick"] if quick else [])
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=timeout)
        output, code = (proc.stdout or "") + (proc.stderr or ""), proc.returncode
    except subprocess.TimeoutExpired as e:
        output = _text(e.stdout) + _text(e.stderr)
        return {
            "status": "failed",
            "error": f"timed out after {timeout:.0f} s (the subprocess was killed; the suite went on)",
            "output_tail": output[-TAIL:],
            "seconds": round(time.perf_counter() - started, 1),
        }
    seconds = round(time.perf_counter() - started, 1)
    if result_file.is_file():
        result = dict(json.loads(result_file.read_text()))
        result["seconds"] = seconds
        if result["status"] == "failed":
            result["output_tail"] = output[-TAIL:]
        return result
    return {
        "status": "failed",
        "error": f"the check's process ended with exit code {code} and no result (crashed)",
        "output_tail": output[-TAIL:],
        "seconds": seconds,
    }


def _text(data: Any) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


# ------------------------------------------------------------------------------------------------- the report
def header(machine: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
    """The machine's facts: the env check's figures when it ran, else the probe's."""
    env = next((r for r in results if r["name"] == "env" and r["status"] == "passed"), None)
    facts = dict(machine)
    if env:
        facts.update(env.get("figures", {}))
    return facts


def write_report(out: Path, machine: dict[str, Any], results: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    data = {"suite": "kitlib gpu_suite", **meta, "machine": header(machine, results), "checks": results}
    (out / "gpu_suite.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    (out / "gpu_suite.md").write_text(markdown(data))


def markdown(data: dict[str, Any]) -> str:
    m = data["machine"]
    keys = ("device", "gpus", "capability", "driver", "cuda", "torch", "transformers", "arch_list", "cpus")
    lines = [f"# kitlib GPU suite: {m.get('device', 'no GPU')}", ""]
    lines += [f"- {k}: {m[k]}" for k in keys if k in m]
    lines += [f"- run: {data.get('started')} ({data.get('sizes')} sizes, {data.get('selection')})", ""]
    counts: dict[str, int] = {}
    for r in data["checks"]:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    lines += [", ".join(f"{v} {k}" for k, v in sorted(counts.items())), ""]
    lines += ["| check | finding | status | seconds | result |", "| --- | --- | --- | --- | --- |"]
    for r in data["checks"]:
        why = r.get("reason") or r.get("error") or r.get("summary") or ""
        cell = str(why).replace("|", "/").replace("\n", " ")[:300]
        lines.append(f"| {r['name']} | {r.get('finding', '')} | {r['status']} | {r.get('seconds', '')} | {cell} |")
    lines.append("")
    if data.get("closing_note"):
        lines += [f"**closing note:** {data['closing_note']}", ""]
    for r in data["checks"]:
        lines += [f"## {r['name']}: {r['status']}", "", str(r.get("title", "")), ""]
        for key in ("reason", "error"):
            if r.get(key):
                lines += [f"**{key}:** {r[key]}", ""]
        for claim in r.get("claims", []):
            lines.append(f"- [{'x' if claim['ok'] else ' '}] {claim['what']}")
        if r.get("claims"):
            lines.append("")
        if r.get("figures"):
            lines += ["```json", json.dumps(r["figures"], indent=1, default=str)[:6000], "```", ""]
        if r.get("traceback") or r.get("output_tail"):
            tail = (r.get("traceback") or r.get("output_tail") or "")[-1500:]
            lines += ["<details><summary>output</summary>", "", "```", tail, "```", "</details>", ""]
    return "\n".join(lines)


def merge(dirs: Sequence[Path], out: Path) -> None:
    """One report from several parts' ``gpu_suite.json`` (a check run twice keeps its last result)."""
    by_name: dict[str, dict[str, Any]] = {}
    machine: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    for d in dirs:
        data = json.loads((Path(d) / "gpu_suite.json").read_text())
        machine.update(data["machine"])
        meta = {k: v for k, v in data.items() if k not in ("machine", "checks")}
        for r in data["checks"]:
            if r["status"] != "skipped" or r["name"] not in by_name:
                by_name[r["name"]] = r
    meta["selection"] = f"merged from {len(dirs)} part(s)"
    write_report(out, machine, list(by_name.values()), meta)
    print(f"merged {len(by_name)} checks into {out}/gpu_suite.md")


# ------------------------------------------------------------------------------------------------- main
def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="folder for gpu_suite.json and gpu_suite.md")
    ap.add_argument("--only", default="", help="comma-separated check names")
    ap.add_argument(
        "--session",
        action="store_true",
        help="the one command for a short GPU window (SESSION, in order "
        "of value, --deadline 540, report in docs/gpu/<device>-<date>/); on a CPU: its plan, and what runs",
    )
    ap.add_argument("--part", type=int, default=0, help="run only this part of the plan (1-based; see --list)")
    ap.add_argument("--part-budget", type=float, default=PART_BUDGET_S, help="seconds per part (default 480)")
    ap.add_argument("--list", action="store_true", help="print the checks, estimates and parts, run nothing")
    ap.add_argument("--quick", action="store_true", default=None, help="small sizes (default on a machine w/o GPU)")
    ap.add_argument("--full", dest="quick", action="store_false", help="full sizes also without a GPU")
    ap.add_argument("--gpus", type=int, help="plan (--list/--part) as if this machine had N GPUs")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a check failed")
    ap.add_argument("--timeout", type=float, default=0, help="per-check timeout in s (default: from its estimate)")
    ap.add_argument("--deadline", type=float, default=0, help="seconds for the whole run: later checks are skipped")
    ap.add_argument("--checks", default=DEFAULT_CHECKS, help=argparse.SUPPRESS)  # a module of CHECKS (tests)
    ap.add_argument("--merge", nargs="+", type=Path, help="merge these report folders into --out")
    ap.add_argument("--make-data", type=Path, help="write the real demos' data here (to carry; see GPU_SUITE.md)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


# A GPU lent for ~15 minutes, at most 10 a command, minutes to start: the checks not run on a GPU since their fix, in
# order of value (what a wrong result would cost a user first), as ONE command of SESSION_DEADLINE_S (60 s of the 10
# minutes left for start-up and the copy back). A check that no longer fits is reported as not started.
SESSION = ("qlora", "oom_backoff", "sync_debug", "step_overhead", "throughput", "fork_launch", "ddp_default_model",
           "compile", "seq2seq_eval", "demo_custom")  # fmt: skip
SESSION_DEADLINE_S = 540.0


def session(args: argparse.Namespace, machine: dict[str, Any]) -> None:
    """``--session``: SESSION in its order, the deadline, and the report folder named by device and date."""
    args.only = ",".join(SESSION)
    args.deadline = args.deadline or SESSION_DEADLINE_S
    if args.out is None:
        # "NVIDIA H200" -> h200 (the folder of the one GPU run so far: docs/gpu/h200-2026-11-26)
        words = str(machine.get("gpu_name") or "cpu").lower().replace("nvidia", "").split()
        args.out = HERE.parent / "docs" / "gpu" / f"{(words or ['gpu'])[0]}-{dt.date.today().isoformat()}"


def session_plan(checks: Sequence[Any], gpu: bool, quick: bool, deadline: float) -> list[str]:
    """Lines: each SESSION check's estimate on a GPU (full sizes) and whether it starts within ``deadline``."""
    lines, spent = [f"plan for a GPU window: one command, --deadline {deadline:.0f} s, in this order"], 0.0
    for check in checks:
        cost = check.gpu_s
        fits = spent + cost <= deadline
        spent += cost if fits else 0.0
        lines.append(f"  {check.name:<20} ~{cost:4.0f} s on a GPU  {'runs' if fits else 'left for a second command'}")
    lines.append(f"  estimated total {spent:.0f} s of {deadline:.0f} s")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.child:
        run_child(args.checks, args.child, bool(args.quick), args.result, args.scratch)
        return 0
    if args.make_data:
        sys.path.insert(0, str(HERE))
        importlib.import_module(args.checks).make_demo_data(args.make_data)
        return 0
    if args.merge:
        if args.out is None:
            raise SystemExit("--merge needs --out")
        merge(args.merge, args.out)
        return 0
    checks = load_checks(args.checks)
    names = {c.name for c in checks}
    wanted = [n for n in args.only.split(",") if n]
    unknown = sorted(set(wanted) - names)
    if unknown:
        raise SystemExit(f"unknown check(s) {unknown}; known: {', '.join(c.name for c in checks)}")
    machine = probe_machine()
    if args.gpus is not None:
        machine["gpus"] = args.gpus
    if args.session:
        session(args, machine)
        wanted = list(SESSION)
    gpu = int(machine.get("gpus", 0)) > 0
    quick = (not gpu) if args.quick is None else bool(args.quick)
    parts = make_parts(checks, machine, quick, args.part_budget)
    if args.list:
        print_plan(parts, machine, quick, args.part_budget)
        return 0
    if args.out is None:
        raise SystemExit("--out DIR is required (or --list)")
    if args.part:
        if not 1 <= args.part <= len(parts):
            raise SystemExit(f"--part {args.part}: the plan has parts 1..{len(parts)} (see --list)")
        selected, selection = parts[args.part - 1], f"part {args.part} of {len(parts)}"
    elif args.session:
        by_name = {c.name: c for c in checks}
        selected, selection = [by_name[n] for n in SESSION], "session (in order of value)"
        print("\n".join(session_plan(selected, gpu, quick, args.deadline)), flush=True)
    elif wanted:
        selected, selection = [c for c in checks if c.name in wanted], f"only {','.join(wanted)}"
    else:
        selected, selection = checks, "all"
    env_check = next((c for c in checks if c.name == "env"), None)
    if env_check is not None and env_check not in selected:
        selected = [env_check, *selected]  # every report names its machine
    return run(selected, args, machine, quick, selection)


def run(checks: Sequence[Any], args: argparse.Namespace, machine: dict[str, Any], quick: bool, selection: str) -> int:
    gpu = int(machine.get("gpus", 0)) > 0
    meta = {
        "started": dt.datetime.now().isoformat(timespec="seconds"),
        "sizes": "quick" if quick else "full",
        "selection": selection,
    }
    results: list[dict[str, Any]] = []
    began = time.perf_counter()
    print(f"gpu_suite: {len(checks)} check(s), {selection}, {meta['sizes']} sizes; report in {args.out}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu-suite-") as tmp:
        for check in checks:
            base = {"name": check.name, "title": check.title, "finding": check.finding}
            skip = why_skipped(check, machine)
            cost = estimate(check, gpu, quick)
            left = args.deadline - (time.perf_counter() - began) if args.deadline else float("inf")
            if skip is None and cost > left:
                skip = f"not started: ~{cost:.0f} s estimated, {max(0.0, left):.0f} s left of --deadline"
            if skip is not None:
                result = {**base, "status": "skipped", "reason": skip}
            else:
                timeout = min(args.timeout or max(60.0, 3 * cost + 30), max(30.0, left))
                print(f"  {check.name} ... (~{cost:.0f} s, timeout {timeout:.0f} s)", flush=True)
                try:
                    result = {**base, **run_in_subprocess(check, args.checks, quick, timeout, Path(tmp))}
                except Exception as e:  # the suite's own fault: reported, and the run goes on
                    result = {
                        **base,
                        "status": "failed",
                        "error": f"suite error: {e!r}",
                        "traceback": traceback.format_exc(),
                    }
            results.append(result)
            print(f"  {check.name:<24} {result['status']:<8} {_line(result)}", flush=True)
            write_report(args.out, machine, results, meta)
    failed = [r["name"] for r in results if r["status"] == "failed"]
    took = time.perf_counter() - began
    ran = [r["name"] for r in results if r["status"] not in ("skipped",)]
    meta["closing_note"] = (
        f"{'a GPU was available' if gpu else 'no GPU was available'}: ran {', '.join(ran) or 'nothing'} in {took:.0f} s"
        f"{'' if gpu else ' (CPU, quick sizes); the GPU checks were skipped and wait for a GPU window'}"
    )
    write_report(args.out, machine, results, meta)
    print(f"gpu_suite: {meta['closing_note']}")
    print(f"gpu_suite: {len(results)} checks in {took:.0f} s; failed: {', '.join(failed) or 'none'}")
    print(f"report: {args.out / 'gpu_suite.md'}")
    return 1 if (args.strict and failed) else 0


def _line(result: dict[str, Any]) -> str:
    text = result.get("reason") or result.get("error") or result.get("summary") or ""
    return str(text).replace("\n", " ")[:160]


if __name__ == "__main__":
    sys.exit(main())
