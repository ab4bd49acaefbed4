"""Kill -9 at a random step, resume, finish: the final weights equal an uninterrupted run (CPU, fp32, same seed)."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from pathlib import Path

import torch

JOBS = Path(__file__).with_name("_jobs.py")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(JOBS), *args], capture_output=True, text=True, timeout=300)


def test_kill_at_random_step_then_resume_matches_uninterrupted(tmp_path: Path) -> None:
    full = _run("resume", str(tmp_path / "full"), "0", "0")
    assert full.returncode == 0, full.stderr
    # 160 rows / (8 x 2) = 10 steps per epoch, 30 in all; checkpoints every 3 steps; kill mid-epoch somewhere.
    kill_at = random.Random().randint(7, 28)
    killed = _run("resume", str(tmp_path / "cut"), str(kill_at), "0")
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr)
    assert not (tmp_path / "cut" / "final.pt").exists()
    meta = json.loads((tmp_path / "cut" / "last" / "meta.json").read_text())
    assert 0 < meta["step"] <= kill_at, (meta, kill_at)  # a real mid-run resume point
    resumed = _run("resume", str(tmp_path / "cut"), "0", "1")
    assert resumed.returncode == 0, resumed.stderr
    expected = torch.load(tmp_path / "full" / "final.pt")
    got = torch.load(tmp_path / "cut" / "final.pt")
    for name, tensor in expected.items():
        assert torch.equal(tensor, got[name]), f"{name} differs after kill at step {kill_at} and resume"
