"""benchmarks/gpu_suite.py: every declared check is reported (ran, or skipped with a reason), a check that raises,
crashes or hangs is reported failed while the suite goes on, and the exit code says only whether the suite broke."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "benchmarks" / "gpu_suite.py"

FAKE_CHECKS = """
import os, time
from gpu_checks_base import Check


def passes(ctx):
    ctx.figure("answer", 42)
    ctx.claim(True, "it holds")


def raises(ctx):
    raise ValueError("boom in a check")


def false_claim(ctx):
    ctx.claim(False, "this must hold")
    ctx.figure("still_measured", 1)


def crashes(ctx):
    os._exit(3)


def hangs(ctx):
    time.sleep(600)


def skips(ctx):
    ctx.skip("not on this machine")


def sees_env(ctx):
    ctx.claim(os.environ.get("SUITE_TEST_FLAG") == "on", "the check's env reaches its subprocess")


CHECKS = [
    Check("passes", "passes", passes),
    Check("raises", "raises", raises),
    Check("false_claim", "a false claim", false_claim),
    Check("crashes", "crashes", crashes),
    Check("hangs", "hangs", hangs),
    Check("skips", "skips itself", skips),
    Check("needs_two_gpus", "declared for 2 GPUs", passes, needs="cuda2", why_gpu="NCCL"),
    Check("sees_env", "env", sees_env, env={"SUITE_TEST_FLAG": "on"}),
]
"""


def _run(args: list[str], tmp_path: Path, **kw) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    return subprocess.run(
        [sys.executable, str(SUITE), *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600, **kw
    )


def _checks_module() -> Any:
    """benchmarks/gpu_checks.py (imports torch, transformers and kitlib: only where a test needs it)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_checks
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return gpu_checks


@pytest.mark.slow  # over 20 s on 2 cores: CI runs it (.ci/run), the test command does not
def test_a_check_that_raises_crashes_or_hangs_is_reported_failed_and_the_suite_goes_on(tmp_path: Path) -> None:
    (tmp_path / "fake_checks.py").write_text(FAKE_CHECKS)
    out = tmp_path / "report"
    proc = _run(["--checks", "fake_checks", "--out", str(out), "--timeout", "20"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "gpu_suite.json").read_text())
    status = {c["name"]: c for c in report["checks"]}
    assert list(status) == [
        "passes",
        "raises",
        "false_claim",
        "crashes",
        "hangs",
        "skips",
        "needs_two_gpus",
        "sees_env",
    ]
    assert status["passes"]["status"] == "passed" and status["passes"]["figures"] == {"answer": 42}
    assert status["raises"]["status"] == "failed" and "ValueError: boom in a check" in status["raises"]["error"]
    assert "Traceback" in status["raises"]["traceback"]
    assert status["false_claim"]["status"] == "failed" and "this must hold" in status["false_claim"]["error"]
    assert status["false_claim"]["figures"] == {"still_measured": 1}  # measured anyway
    assert status["crashes"]["status"] == "failed" and "exit code 3" in status["crashes"]["error"]
    assert status["hangs"]["status"] == "failed" and "timed out after 20 s" in status["hangs"]["error"]
    assert status["skips"] == {**status["skips"], "status": "skipped", "reason": "not on this machine"}
    assert status["needs_two_gpus"]["status"] == "skipped" and "needs 2 CUDA GPUs" in status["needs_two_gpus"]["reason"]
    assert status["sees_env"]["status"] == "passed"
    markdown = (out / "gpu_suite.md").read_text()
    assert "| raises | " in markdown and "boom in a check" in markdown
    strict = _run(["--checks", "fake_checks", "--out", str(tmp_path / "r2"), "--only", "raises", "--strict"], tmp_path)
    assert strict.returncode == 1  # --strict: a failed check fails the run


def test_parts_cover_every_check_once_within_the_budget(tmp_path: Path) -> None:
    gpu_checks = _checks_module()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_suite
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    gpu = {"gpus": 2, "cpus": 16}
    parts = gpu_suite.make_parts(gpu_checks.CHECKS, gpu, False, gpu_suite.PART_BUDGET_S)
    names = [c.name for part in parts for c in part]
    assert names == [c.name for c in gpu_checks.CHECKS]  # each once, in declared order
    for part in parts:
        cost = sum(gpu_suite.estimate(c, True, False) for c in part)
        assert cost <= gpu_suite.PART_BUDGET_S or len(part) == 1, (cost, [c.name for c in part])
    assert len({c.name for c in gpu_checks.CHECKS}) == len(gpu_checks.CHECKS)
    for finding in ("1", "2", "3", "5", "6", "7", "8", "9", "10", "11", "13"):  # the GPU-only findings have a check
        assert any(finding in c.finding.split(",") for c in gpu_checks.CHECKS), finding


@pytest.mark.slow
def test_the_cpu_run_reports_every_declared_check_with_a_status(tmp_path: Path) -> None:
    """The real checks on this CPU (a cheap subset runs; the GPU ones must say why they were skipped)."""
    gpu_checks = _checks_module()
    out = tmp_path / "s"
    cheap = "env,tf32,exact_resume," + ",".join(c.name for c in gpu_checks.CHECKS if c.needs != "any")
    proc = _run(["--only", cheap, "--out", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "gpu_suite.json").read_text())
    assert report["machine"]["torch"] and report["machine"]["transformers"] and report["machine"]["cpus"]
    by_name = {c["name"]: c for c in report["checks"]}
    assert set(by_name) == set(cheap.split(","))
    for check in report["checks"]:
        assert check["status"] in ("passed", "failed", "skipped"), check
        if check["status"] == "skipped":
            assert check["reason"], check
        assert f"| {check['name']} |" in (out / "gpu_suite.md").read_text()
    for name in cheap.split(",")[3:]:  # every GPU check: skipped here, with its reason
        assert by_name[name]["status"] == "skipped" and "CUDA" in by_name[name]["reason"], by_name[name]
    assert by_name["exact_resume"]["status"] == "passed", by_name["exact_resume"]
    assert by_name["tf32"]["status"] == "passed", by_name["tf32"]  # flags restored, also on CPU


@pytest.mark.parametrize("carried", [False, True])
def test_the_custom_demo_names_its_factory_where_its_data_lies(
    carried: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """00 accepts the custom demo's parameters, synthetic or carried from the machine that made the data (the
    factory file's full path is only known where the data lies)."""
    from demos.custom import PARAMETERS
    from kitlib.notebook import stages

    checks = _checks_module()
    monkeypatch.setenv(checks.DATA_ENV, str(tmp_path / "carried"))
    if carried:  # made elsewhere (--make-data), then moved: its parameters name no path of this machine
        checks.synthetic_competition("custom", tmp_path / "made" / "custom", 40)
        (tmp_path / "made" / "custom" / "suite_parameters.json").write_text(json.dumps(PARAMETERS))
        (tmp_path / "made").rename(tmp_path / "carried")
    data, params, source = checks.demo_inputs("custom", tmp_path / "scratch", 40)
    assert ("carried" in source) is carried
    p = stages.params(data_dir=data, work_dir=tmp_path / "work", preset="smoke", model="tiny", **params)
    assert p.model_factory == f"{(data / 'bilstm.py').resolve()}:build"


def test_the_grad_scaler_watch_records_each_steps_outcome_as_a_bool() -> None:
    """fit reports a step's outcome as a device flag; the GPU check's claims (``applied[k] is False``) and its JSON
    figures need plain bools. Shown with fp32 on the CPU: an inf loss in window 1 is skipped."""
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from kitlib import TrainConfig, fit

    checks = _checks_module()
    calls = [0]

    def loss_fn(model: nn.Module, batch: Any) -> Any:
        calls[0] += 1
        loss = nn.functional.mse_loss(model(batch[0]), batch[1])
        return loss * float("inf") if calls[0] == 2 else loss

    x = torch.randn(24, 4)
    watch = checks._Watch()
    cfg = TrainConfig(epochs=1, micro_batch_size=8, precision="fp32", save_best=False, log_every_steps=100)
    fit(nn.Linear(4, 1), DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8), config=cfg,
        loss_fn=loss_fn, callbacks=[watch])  # fmt: skip
    assert watch.applied[1] is False and watch.applied[0] is True and watch.applied[2] is True
    assert json.loads(json.dumps(watch.applied)) == [True, False, True]


def test_the_session_is_declared_checks_in_order_within_one_command() -> None:
    """--session: every name a declared check, in SESSION's order; the report folder named by the GPU and the date
    (docs/gpu/h200-<date>, as the 2026-11-26 run); the plan says what the 540 s command leaves for a second one."""
    import argparse
    import datetime as dt

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_suite
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    by_name = {c.name: c for c in _checks_module().CHECKS}
    assert set(gpu_suite.SESSION) <= set(by_name), set(gpu_suite.SESSION) - set(by_name)
    assert "step_overhead" in gpu_suite.SESSION
    args = argparse.Namespace(only="", deadline=0.0, out=None)
    gpu_suite.session(args, {"gpus": 1, "gpu_name": "NVIDIA H200"})
    assert args.only.split(",") == list(gpu_suite.SESSION) and args.deadline == gpu_suite.SESSION_DEADLINE_S
    assert args.out == ROOT / "docs" / "gpu" / f"h200-{dt.date.today().isoformat()}"
    plan = gpu_suite.session_plan([by_name[n] for n in gpu_suite.SESSION], True, False, 100.0)
    assert plan[1].split()[0] == gpu_suite.SESSION[0] and "runs" in plan[1]
    assert any("second command" in line for line in plan)
