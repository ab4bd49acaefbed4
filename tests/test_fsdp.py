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
    with checkpoint.BackgroundWriter() as writer:
        sharded.save(
            tmp_path / "last",
            model,
            optimizer,
            DistEnv(),
            writer,
            group=None,
            state={"run": {"step": 1}},
            meta={"epoch": 1},
        )
    found = checkpoint.latest(tmp_path, "last")
    assert found is not None and sharded_dir(found)
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


def test_an_async_sharded_save_returns_before_its_shards_are_written_and_the_writers_wait_swaps_it_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a process group, with a run's writer: the save holds the training thread for DCP's CPU copy only; the shards
    are written meanwhile and the writer's wait (the next save's, the run's end) swaps last/ in; a failed write is a
    CheckpointError there, with the previous last/ kept."""
    import threading

    import torch.distributed as dist
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    from kitlib.engine import sharded
    from kitlib.errors import CheckpointError
    from kitlib.machine.distributed import DistEnv

    gate, write_data = threading.Event(), FileSystemWriter.write_data

    def held(self, plan, planner):  # type: ignore[no-untyped-def]
        assert gate.wait(60), "the save waited for its own shards"
        return write_data(self, plan, planner)

    def failing(self, plan, planner):  # type: ignore[no-untyped-def]
        raise OSError(28, "No space left on device")

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)

    def step() -> None:
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    writer, group = checkpoint.BackgroundWriter(), sharded.saves_group()
    try:
        step()
        saved = {k: v.clone() for k, v in model.state_dict().items()}
        monkeypatch.setattr(FileSystemWriter, "write_data", held)
        sharded.save(tmp_path / "last", model, optimizer, DistEnv(), writer, group=group,
                     state={"run": {"step": 1}}, meta={"step": 1})  # fmt: skip
        assert checkpoint.latest(tmp_path, "last") is None  # returned, its shards not written yet
        step()  # training goes on meanwhile: the checkpoint keeps the weights of the save
        gate.set()
        writer.wait()
        whole = checkpoint.load(tmp_path / "last")
        assert whole.meta["step"] == 1 and all(torch.equal(whole.weights[k], v) for k, v in saved.items())
        monkeypatch.setattr(FileSystemWriter, "write_data", failing)
        sharded.save(tmp_path / "last", model, optimizer, DistEnv(), writer, group=group,
                     state={"run": {"step": 2}}, meta={"step": 2})  # fmt: skip
        with pytest.raises(CheckpointError, match="No space left on device"):
            writer.wait()
        assert checkpoint.load(tmp_path / "last").meta["step"] == 1  # the previous last/, complete
    finally:
        gate.set()
        writer.close()
        sharded.release(group)
        dist.destroy_process_group()


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


def guide_blocks() -> list[str]:
    """The bash blocks of docs/guide.md's multi-node section, backslash-continued lines joined."""
    section = (ROOT / "docs" / "guide.md").read_text().split("## Several GPUs and machines")[1].split("\n## ")[0]
    return [b.replace("\\\n", "") for b in re.findall(r"```bash\n(.*?)```", section, re.S)]


FAKE_SRUN = """#!/bin/bash
# Slurm itself is faked: one copy of the command per node of SLURM_JOB_NODELIST, each with the variables a task has
i=0; pids=()
for host in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do
    SLURMD_NODENAME=$host SLURM_NODEID=$i SLURM_PROCID=$i SLURM_LOCALID=0 SLURM_NTASKS=$SLURM_NNODES "$@" &
    pids+=($!); i=$((i + 1))
done
rc=0; for pid in "${pids[@]}"; do wait "$pid" || rc=1; done; exit $rc
"""
FAKE_SCONTROL = """#!/bin/bash
# scontrol show hostnames LIST: one name a line (the fake job's nodes are named localhost,localhost)
tr ',' '\\n' <<< "$3"
"""


@pytest.mark.slow  # 00 and 01 4x; the Slurm script (FSDP), torchrun lines (DDP), LoRA on 2 ranks (FSDP, DDP); 03 each
def test_the_guides_slurm_script_and_torchrun_lines_on_localhost_give_equal_submissions(tmp_path: Path) -> None:
    # The commands are read from docs/guide.md's code blocks; only the host (localhost), the port (a free one), the
    # work dir and the GPUs a node (8 -> 1: two simulated nodes of one gloo process) are substituted. Slurm is faked:
    # a srun and scontrol first on PATH (FAKE_SRUN) start one copy of the command per node with SLURM_* set.
    # The same work dir shape twice: 00 and 01 once (strategy fsdp), then a copy where 00 runs again with
    # strategy="ddp" and 01 again (its feature cache copied along: nothing tokenized twice).
    import dataclasses
    import shutil

    from sft_fixtures import llama_folder, sft_frame, write_competition

    from kitlib.machine.hardware import detect
    from kitlib.notebook import stages

    train = sft_frame(48)
    data = write_competition(tmp_path / "data", train)
    folder = llama_folder(tmp_path / "llama", [*train["prompt"], *train["response"]], positions=256)
    p = stages.params(data_dir=data, work_dir=tmp_path / "fsdp", preset="smoke", model=str(folder), task="causal-lm",
                      text="prompt", target="response", metric="exact_match", strategy="fsdp")  # fmt: skip
    stages.setup(p, detect())
    stages.features(p, hw=detect(), quiet=True)
    ddp = dataclasses.replace(p, work_dir=tmp_path / "ddp", strategy="ddp")
    lora = {s: dataclasses.replace(p, work_dir=tmp_path / f"lora-{s}", strategy=s, adapter="lora")
            for s in ("fsdp", "ddp")}  # fmt: skip
    for copy in (ddp, *lora.values()):
        shutil.copytree(p.work_dir, copy.work_dir, dirs_exist_ok=True)
        stages.setup(copy, detect())
        stages.features(copy, hw=detect(), quiet=True)

    blocks = guide_blocks()
    multi_node = next(b for b in blocks if b.startswith("torchrun --nnodes")).strip()
    slurm = next(b for b in blocks if b.startswith("#!/bin/bash"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {**_env(), "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}"}

    def local(command: str, work: Path, port: int) -> str:
        assert "/shared/work" in command and ":29500" in command and "--nproc_per_node 8" in command, command
        for guide, here in (("/shared/work", str(work)), ("node1:", "localhost:"), (":29500", f":{port}"),
                            ("--nproc_per_node 8", "--nproc_per_node 1")):  # fmt: skip
            command = command.replace(guide, here)
        return command

    port = free_port()
    slurm_env = {**env, "SLURM_JOB_NODELIST": "localhost,localhost", "SLURM_NNODES": "2", "SLURM_JOB_ID": str(port)}
    script = tmp_path / "job.sbatch"
    script.write_text(local(slurm, p.work_dir, port))
    job = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=slurm_env, timeout=400)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert job.stdout.count("stopped: completed") == 1  # rank 0 of the two nodes prints the summary

    port = free_port()
    agents = [subprocess.Popen(["bash", "-c", local(multi_node, ddp.work_dir, port)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=env) for _ in range(2)]  # fmt: skip
    for agent in agents:
        said, _ = agent.communicate(timeout=400)
        assert agent.returncode == 0, said[-3000:]
    from kitlib.notebook.params import load_params
    from kitlib.notebook.training import infer

    submission = {"ddp": infer(load_params(ddp.work_dir))}  # 03 as the guide's script runs it (python -c)
    for work in (p.work_dir, ddp.work_dir):
        ran = json.loads((work / "run" / "config.json").read_text())
        assert (ran["strategy"], ran["world_size"], ran["nodes"]) == (work.name, 2, 2), ran
        timing = json.loads((work / "run" / "timing.json").read_text())["run"]
        assert timing["comm_seconds_per_step"] > 0  # the doctor's communication rule reads it
    assert sharded_dir(p.work_dir / "run" / "best") and not sharded_dir(ddp.work_dir / "run" / "best")
    submission["fsdp"] = pd.read_csv(p.work_dir / "submission.csv")
    test = pd.read_csv(data / "test.csv")
    assert list(submission["fsdp"]["id"]) == list(test["id"]) and submission["fsdp"]["response"].notna().all()
    # the sharded best/ gathered on one process holds DDP's whole best/ (float tolerance) and predicts the same text
    whole = {w.name: checkpoint.load(checkpoint.latest(w / "run", "best")).weights for w in (p.work_dir, ddp.work_dir)}  # type: ignore[arg-type]
    assert whole["fsdp"].keys() == whole["ddp"].keys()
    for name, weight in whole["ddp"].items():
        torch.testing.assert_close(whole["fsdp"][name], weight, rtol=1e-4, atol=1e-5)
    assert list(submission["fsdp"]["response"]) == list(submission["ddp"]["response"])
    print(submission["fsdp"]["response"].tolist())

    # LoRA on the sharded base, 02 on 2 ranks of one node: best/ holds the adapter only, as one process writes it
    # (gathered whole to rank 0), and 03 predicts what the DDP LoRA run's best/ does
    for run in lora.values():
        cmd = f"torchrun --standalone --nproc_per_node 2 -m kitlib train --work-dir {run.work_dir}".split()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=400)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    adapters = {s: checkpoint.load(r.work_dir / "run" / "best").weights for s, r in lora.items()}
    assert not sharded_dir(lora["fsdp"].work_dir / "run" / "best") and adapters["fsdp"].keys() == adapters["ddp"].keys()
    assert all(".lora_" in name for name in adapters["fsdp"]), list(adapters["fsdp"])  # the adapter only
    for name, weight in adapters["ddp"].items():
        torch.testing.assert_close(adapters["fsdp"][name], weight, rtol=1e-4, atol=1e-5)
    answers = {s: list(infer(load_params(r.work_dir))["response"]) for s, r in lora.items()}
    assert answers["fsdp"] == answers["ddp"], answers


def sharded_dir(directory: Path) -> bool:
    return bool(json.loads((directory / checkpoint.MANIFEST_FILE).read_text()).get("sharded"))


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


def test_out_of_memory_under_fsdp_or_ddp_stops_the_rank_with_the_next_strategy_rather_than_replaying_alone(
    cpu_hw,
) -> None:  # type: ignore[no-untyped-def]
    # Loop builds its back-off with distributed=env.enabled, whatever the strategy: one rank cannot replay a step
    # while the others wait in its collectives (DDP's all-reduce, FSDP's gathers), so it raises and the launcher
    # (torchrun's agent, kitlib's forked workers) ends every rank of the job.
    from kitlib.config import TrainConfig
    from kitlib.engine.backoff import MicroBatchBackoff
    from kitlib.errors import DoesNotFitError
    from kitlib.machine.amp import Precision
    from kitlib.machine.precision import decide_precision

    model = torch.nn.Linear(2, 2)
    cfg = TrainConfig(micro_batch_size=8, strategy="fsdp")
    precision = Precision(decide_precision(cpu_hw, "fp32"))
    calls: list[int] = []

    def train(pieces: list[dict[str, torch.Tensor]]) -> None:
        calls.append(len(pieces))
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    backoff = MicroBatchBackoff(cfg, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), precision=precision,
                                device=torch.device("cpu"), distributed=True, next_strategy="gradient checkpointing",
                                say=print)  # fmt: skip
    with pytest.raises(DoesNotFitError, match=r"one cannot replay a step alone .* Fix: gradient checkpointing"):
        backoff.run([{"x": torch.zeros(8, 2)}], train, step=0)
    assert calls == [1] and backoff.parts == 1  # tried once, at the configured micro-batch: no replay


def comm_record(strategy: str, comm_ms: float, accum: int = 1) -> dict[str, object]:
    """A timing.json of 10 steps of 100 ms (forward 30, backward 60, optimizer 10) on 4 ranks."""
    per_step = {"data_wait": 0.0, "h2d": 0.0, "forward": 0.03, "backward": 0.06, "optimizer": 0.01}
    phases = {name: {"seconds": 10 * s, "count": 10} for name, s in per_step.items()}
    run = {"steps": 10, "world_size": 4, "nodes": 2, "strategy": strategy, "micro_batch_size": 2,
           "grad_accum_steps": accum, "comm_seconds_per_step": comm_ms / 1e3}  # fmt: skip
    return {"wall_seconds": 1.2, "phases": phases, "per_step_seconds": per_step, "run": run}


@pytest.mark.parametrize(
    ("strategy", "accum", "changes", "saved_ms"),
    [
        ("ddp", 1, {"grad_accum_steps": 2}, 35.0),  # one all-reduce per twice the rows
        ("fsdp", 1, {"strategy": "ddp"}, 70 / 3),  # 1.5 all-reduces a step -> 1
        ("fsdp", 4, {"micro_batch_size": 8, "grad_accum_steps": 1}, 70 * (1 - 3 / 9)),  # 9 half-passes -> 3
    ],
)
def test_the_doctor_says_when_communication_takes_most_of_the_step(
    cpu_hw, strategy: str, accum: int, changes: dict[str, object], saved_ms: float
) -> None:  # type: ignore[no-untyped-def]
    from kitlib.doctor.rules import RULES, RunRecord

    rule = next(r for r in RULES if r.name == "communication")
    config = {"micro_batch_size": 2, "grad_accum_steps": accum}
    found = rule(RunRecord(comm_record(strategy, 70.0, accum), config), cpu_hw)
    assert found is not None and found.changes == changes, found
    assert found.estimated_saving_s == pytest.approx(10 * saved_ms / 1e3)  # over the 10 steps
    assert "~70.0 ms of 100.0 ms a step communicating" in found.evidence and "fewer ranks" in found.fix
    assert rule(RunRecord(comm_record(strategy, 40.0, accum), config), cpu_hw) is None  # under half: compute-bound
    assert rule(RunRecord({**comm_record(strategy, 70.0), "run": {"steps": 10}}, config), cpu_hw) is None  # no figure
