"""strategy="fsdp" (FSDP2 per block, DCP checkpoints) under torchrun on two simulated nodes of two gloo processes,
against DDP and one process with the same effective batch (tests/_fsdp_job.py: a 2-layer Llama from a config)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kitlib.engine import checkpoint
from kitlib.machine.distributed import free_port

JOB = Path(__file__).with_name("_fsdp_job.py")
ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def two_nodes(out: Path, *args: str) -> list[subprocess.CompletedProcess[str]]:
    """``torchrun --nnodes 2 --nproc_per_node 2`` twice (one agent per simulated node), localhost rendezvous."""
    port = free_port()
    cmd = ["torchrun", "--nnodes", "2", "--nproc_per_node", "2", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", f"t{port}", str(JOB), str(out), *args]  # fmt: skip
    nodes = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())
             for _ in range(2)]  # fmt: skip
    done = []
    for node in nodes:
        stdout, _ = node.communicate(timeout=400)
        done.append(subprocess.CompletedProcess(cmd, node.returncode, stdout, ""))
    return done


def one_process(out: Path, *args: str) -> dict[str, object]:
    proc = subprocess.run([sys.executable, str(JOB), str(out), *args], capture_output=True, text=True, env=_env(),
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return dict(torch.load(out / "result.pt", weights_only=False))


def result(out: Path) -> dict[str, object]:
    return dict(torch.load(out / "result.pt", weights_only=False))


@pytest.mark.slow  # ~3 min on 2 shared cores (three runs of 4, 4 and 1 processes)
def test_fsdp_on_two_nodes_matches_ddp_and_one_process(tmp_path: Path) -> None:
    for strategy in ("fsdp", "ddp"):  # 4 ranks x micro 4 x accum 2 = 32 rows a step
        for node in two_nodes(tmp_path / strategy, strategy, "4", "2"):
            assert node.returncode == 0, node.stdout[-3000:]
    single = one_process(tmp_path / "one", "ddp", "4", "8")  # 1 process x micro 4 x accum 8 = 32
    fsdp, ddp = result(tmp_path / "fsdp"), result(tmp_path / "ddp")
    # the logged loss is every rank's rows' (all-reduced), the same curve as one process's
    torch.testing.assert_close(fsdp["losses"], single["losses"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fsdp["losses"], ddp["losses"], rtol=1e-5, atol=1e-6)
    for name, weight in single["weights"].items():  # type: ignore[attr-defined]
        torch.testing.assert_close(fsdp["weights"][name], weight, rtol=1e-4, atol=1e-5)  # type: ignore[index]
        torch.testing.assert_close(ddp["weights"][name], weight, rtol=1e-4, atol=1e-5)  # type: ignore[index]
    run = fsdp["timing"]["run"]  # type: ignore[index]
    assert (run["strategy"], run["world_size"], run["nodes"]) == ("fsdp", 4, 2)
    # best/ and last/ are DCP directories (every rank its shards); one process reads best/ whole (what 03 does)
    best = tmp_path / "fsdp" / "run" / "best"
    assert sorted(p.name for p in best.glob("*.distcp")) == [f"__{r}_0.distcp" for r in range(4)]
    whole = checkpoint.load(checkpoint.latest(tmp_path / "fsdp" / "run", "best"))  # type: ignore[arg-type]
    for name, weight in fsdp["weights"].items():  # type: ignore[attr-defined]
        assert torch.equal(whole.weights[name], weight), name


@pytest.mark.slow  # ~3 min: a killed run of 4 processes, its resume, and the same run uninterrupted
def test_a_killed_rank_ends_clearly_and_the_dcp_resume_is_bit_exact(tmp_path: Path) -> None:
    killed = two_nodes(tmp_path / "a", "fsdp", "4", "2", "save_every=1", "kill_at=2")
    logs = "".join(n.stdout for n in killed)
    assert any(n.returncode != 0 for n in killed)
    assert "Signal 9 (SIGKILL)" in logs or "exitcode  : -9" in logs, logs[-3000:]
    assert checkpoint.latest(tmp_path / "a" / "run", "last") is not None
    for node in two_nodes(tmp_path / "a", "fsdp", "4", "2", "save_every=1", "resume"):
        assert node.returncode == 0, node.stdout[-3000:]
    for node in two_nodes(tmp_path / "b", "fsdp", "4", "2", "save_every=1"):
        assert node.returncode == 0, node.stdout[-3000:]
    resumed, whole = result(tmp_path / "a"), result(tmp_path / "b")
    for name, weight in whole["weights"].items():  # type: ignore[attr-defined]
        assert torch.equal(resumed["weights"][name], weight), name  # type: ignore[index]
