"""strategy="fsdp" (FSDP2 per block, DCP checkpoints) under torchrun on two simulated nodes of two gloo processes,
against DDP and one process with the same effective batch (tests/_fsdp_job.py: a 2-layer Llama from a config)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
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


def standalone(out: Path, nprocs: int, *args: str) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc_per_node N``: one node."""
    cmd = ["torchrun", "--standalone", "--nproc_per_node", str(nprocs), str(JOB), str(out), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=400)


def rows_read(run: dict[str, object]) -> Counter[int]:
    return Counter(i for rank in run["seen"] for i in rank)  # type: ignore[attr-defined]


def step_of(last: Path) -> int:
    return int(json.loads((last / "meta.json").read_text())["step"])


@pytest.mark.slow  # ~6 min on 2 cores: runs of 4 (FSDP), 4 (DDP), 1; a killed run of 4, resumed on 4, then on 2
def test_fsdp_on_two_nodes_matches_ddp_and_one_process_and_a_killed_rank_resumes_bit_exact(tmp_path: Path) -> None:
    # one test, so the uninterrupted FSDP run is also the reference of the killed, SIGTERMed and resharded runs
    for strategy, options in (("fsdp", ["save_every=1", "keep=4"]), ("ddp", [])):  # 4 ranks x micro 4 x accum 2
        for node in two_nodes(tmp_path / strategy, strategy, "4", "2", *options):
            assert node.returncode == 0, node.stdout[-3000:]
    single = one_process(tmp_path / "one", "ddp", "4", "8")  # 1 process x micro 4 x accum 8 = 32 rows a step
    fsdp, ddp = result(tmp_path / "fsdp"), result(tmp_path / "ddp")
    # the logged loss is every rank's rows' (all-reduced), the same curve as one process's
    torch.testing.assert_close(fsdp["losses"], single["losses"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fsdp["losses"], ddp["losses"], rtol=1e-5, atol=1e-6)
    for name, weight in single["weights"].items():  # type: ignore[attr-defined]
        torch.testing.assert_close(fsdp["weights"][name], weight, rtol=1e-4, atol=1e-5)  # type: ignore[index]
        torch.testing.assert_close(ddp["weights"][name], weight, rtol=1e-4, atol=1e-5)  # type: ignore[index]
    run = fsdp["timing"]["run"]  # type: ignore[index]
    assert (run["strategy"], run["world_size"], run["nodes"]) == ("fsdp", 4, 2)
    assert len(run["rank_peak_memory_bytes"]) == 4 and min(run["rank_peak_memory_bytes"]) > 2**20  # every rank's
    assert rows_read(fsdp) == Counter({i: 2 for i in range(96)})  # 2 epochs: each row twice, on one rank
    # best/ and last/ are DCP directories (every rank its shards); one process reads best/ whole (what 03 does)
    best = tmp_path / "fsdp" / "run" / "best"
    assert sorted(p.name for p in best.glob("*.distcp")) == [f"__{r}_0.distcp" for r in range(4)]
    whole = checkpoint.load(checkpoint.latest(tmp_path / "fsdp" / "run", "best"))  # type: ignore[arg-type]
    for name, weight in fsdp["weights"].items():  # type: ignore[attr-defined]
        assert torch.equal(whole.weights[name], weight), name

    killed = two_nodes(tmp_path / "a", "fsdp", "4", "2", "save_every=1", "kill_at=2")
    logs = "".join(n.stdout for n in killed)
    assert any(n.returncode != 0 for n in killed)
    assert "Signal 9 (SIGKILL)" in logs or "exitcode  : -9" in logs, logs[-3000:]
    at = step_of(tmp_path / "a" / "run" / "last")
    # resumed on 4 ranks; at step 3 both agents get SIGTERM (a cluster's stop): every rank stops and saves at step 4
    termed = two_nodes(tmp_path / "a", "fsdp", "4", "2", "save_every=1", "resume", "term_at=3")
    logs = "".join(n.stdout for n in termed)
    assert re.search(r"SIGTERM after \d of 2 epochs \(last/ saved: run again to continue\)", logs), logs[-3000:]
    stopped = result(tmp_path / "a")
    assert stopped["stop"] == "sigterm" and stopped["losses"] == fsdp["losses"][at:4]  # type: ignore[index]
    last = checkpoint.load(tmp_path / "a" / "run" / "last")
    assert last.meta["step"] == 4
    for name, weight in checkpoint.load(tmp_path / "fsdp" / "last-4").weights.items():  # the reference's step 4
        assert torch.equal(last.weights[name], weight), name

    # the SIGTERM's last/ on 2 ranks of one node: DCP reshards; twice the accumulation keeps 32 rows a step
    proc = standalone(tmp_path / "a", 2, "fsdp", "4", "4", "save_every=1", "resume")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    halved = result(tmp_path / "a")
    torch.testing.assert_close(halved["losses"], fsdp["losses"][4:], rtol=1e-5, atol=1e-6)  # type: ignore[index]
    for name, weight in fsdp["weights"].items():  # type: ignore[attr-defined]
        torch.testing.assert_close(halved["weights"][name], weight, rtol=1e-4, atol=1e-5)  # type: ignore[index]
    assert rows_read(halved) == Counter(p % 96 for p in range(32 * 4, 192))  # the rest of the run, once each


def test_a_resume_on_another_world_size_keeps_the_effective_batch_or_names_the_accumulation_that_does() -> None:
    from kitlib.errors import DistributedError
    from kitlib.machine.distributed import regrouped

    meta = {"world_size": 4, "config": {"micro_batch_size": 4, "grad_accum_steps": 2, "lr": 0.01}}
    assert regrouped(meta, 4, 2, 4, 6) == (meta["config"], 6)  # the same world size: as saved
    # 2 ranks x accumulation 4: the same 32 rows a step; 6 micro-batches of 4 ranks = 12 of 2 ranks
    assert regrouped(meta, 4, 4, 2, 6) == ({**meta["config"], "grad_accum_steps": 4}, 12)
    assert regrouped(meta, 8, 2, 2, 6) == ({**meta["config"], "micro_batch_size": 8}, 6)
    with pytest.raises(DistributedError, match=r"each step 32 rows .* makes 16, another run. Fix: grad_accum_steps=4"):
        regrouped(meta, 4, 2, 2, 6)
    with pytest.raises(DistributedError, match="Fix: a micro-batch and accumulation making 32 rows"):
        regrouped(meta, 4, 2, 3, 6)


def test_a_sharded_checkpoint_is_complete_loads_whole_on_one_process_and_resumes_in_place(tmp_path: Path) -> None:
    """One process (no process group): DCP writes and reads the same directories the ranks of a job do."""
    from kitlib.engine import sharded
    from kitlib.machine.distributed import DistEnv

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    sharded.save(tmp_path / "last", model, optimizer, DistEnv(), state={"run": {"step": 1}}, meta={"epoch": 1})
    found = checkpoint.latest(tmp_path, "last")
    assert found is not None and sharded.is_sharded(found)
    whole = checkpoint.load(found)  # what 03 reads: every weight, gathered
    assert whole.meta["epoch"] == 1
    for name, weight in model.state_dict().items():
        assert torch.equal(whole.weights[name], weight)
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    fresh(torch.randn(3, 4)).sum().backward()
    fresh_opt.step()  # its own state, replaced by the checkpoint's
    snap = sharded.load_into(found, fresh, fresh_opt)
    assert snap.state is not None and snap.state["run"] == {"step": 1}
    for a, b in zip(fresh.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)
        assert torch.equal(fresh_opt.state[a]["exp_avg"], optimizer.state[b]["exp_avg"])
    (found / "__0_0.distcp").unlink()  # a shard lost: not a checkpoint any more
    assert checkpoint.latest(tmp_path, "last") is None


def test_01_prints_the_torchrun_command_for_a_plan_with_more_gpus(tmp_path: Path, capsys, cpu_hw) -> None:  # type: ignore[no-untyped-def]
    from sft_fixtures import sft_frame, write_competition

    from kitlib.notebook import stages

    data = write_competition(tmp_path / "data", sft_frame(40))
    p = stages.params(data_dir=data, work_dir=tmp_path / "work", preset="smoke", model="tiny", task="causal-lm",
                      text="prompt", target="response", metric="exact_match", hardware="8xH100",
                      strategy="fsdp")  # fmt: skip
    stages.setup(p, cpu_hw)
    run = stages.features(p, hw=cpu_hw).run
    assert (run.world_size, run.config.strategy) == (8, "fsdp")
    said = capsys.readouterr().out
    assert f"torchrun --standalone --nproc_per_node 8 -m kitlib train --work-dir {p.work_dir}" in said
    assert any(r.startswith("strategy fsdp: as requested") for r in run.reasons)


@pytest.mark.slow  # ~2 min: 00 and 01 here, then 02 under torchrun (2 processes, FSDP), and 03 unchanged
def test_the_train_command_under_torchrun_then_03_unchanged(tmp_path: Path) -> None:
    # FSDP's weights equal DDP's and one process's in the test above; this one is the notebooks' route around them
    from sft_fixtures import llama_folder, sft_frame, write_competition

    from kitlib.machine.hardware import detect
    from kitlib.notebook import stages, training
    from kitlib.notebook.params import load_params

    train = sft_frame(48)
    data = write_competition(tmp_path / "data", train)
    folder = llama_folder(tmp_path / "llama", [*train["prompt"], *train["response"]], positions=256)
    work = tmp_path / "fsdp"
    p = stages.params(data_dir=data, work_dir=work, preset="smoke", model=str(folder), task="causal-lm",
                      text="prompt", target="response", metric="exact_match", strategy="fsdp")  # fmt: skip
    stages.setup(p, detect())
    stages.features(p, hw=detect(), quiet=True)
    cmd = ["torchrun", "--standalone", "--nproc_per_node", "2", "-m", "kitlib", "train", "--work-dir", str(work)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "stopped: completed" in proc.stdout
    ran = json.loads((work / "run" / "config.json").read_text())
    assert (ran["strategy"], ran["world_size"]) == ("fsdp", 2)
    assert sharded_dir(work / "run" / "best")
    submission = training.infer(load_params(work))
    test = pd.read_csv(data / "test.csv")
    assert list(submission["id"]) == list(test["id"]) and submission["response"].notna().all()


def sharded_dir(directory: Path) -> bool:
    from kitlib.engine import sharded

    return sharded.is_sharded(directory)


@pytest.mark.parametrize("preset", ["balanced", "best"])
def test_strategy_none_takes_the_plans_fsdp_where_the_run_fits_the_gpus_only_sharded(
    tmp_path: Path, cpu_hw, preset: str
) -> None:  # type: ignore[no-untyped-def]
    # A 7B full fine-tune on 8xH100 needs ~122 GB a GPU whole, ~55 GB sharded (tests/test_memory_plan.py): strategy
    # None (the plan's) is FSDP there; a strategy asked for by name, or one GPU, keeps what was asked.
    import dataclasses

    from sft_fixtures import sft_frame, write_competition

    from kitlib.notebook import stages

    data = write_competition(tmp_path / "data", sft_frame(40))
    p = stages.params(data_dir=data, work_dir=tmp_path / "work", preset=preset, model="tiny", task="causal-lm",
                      text="prompt", target="response", metric="exact_match", hardware="8xH100")  # fmt: skip
    p = dataclasses.replace(p, model="llama-7b")  # the plan's known 7B shape (no weights are read)
    run = stages.resolve_run(p, cpu_hw, lengths=[1536] * 200)
    assert (run.world_size, run.config.strategy) == (8, "ddp")
    planned = stages.planned_strategy(p, cpu_hw, run)
    assert planned.config.strategy == "fsdp" and planned.reasons[-1].startswith("strategy fsdp: the plan's")
    asked = dataclasses.replace(p, strategy="ddp")
    assert stages.planned_strategy(asked, cpu_hw, stages.resolve_run(asked, cpu_hw)).config.strategy == "ddp"
