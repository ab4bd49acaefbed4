"""Faults over a checkpointing fit(), each followed by a resume: is every resume exact?

    python benchmarks/kill_campaign.py --kills 100            # ~10 min on 2 cores (~1 min a trial at load 9-16)
    python benchmarks/kill_campaign.py --kills 10 --workers 1 # a quick look
    python benchmarks/kill_campaign.py --kills 18 --faults ddp-kill-worker,sigterm-group,oom,full-disk
    python benchmarks/kill_campaign.py --route notebooks --kills 9 --workers 3  # ~33 min at load 9-16 on 2 cores

Each trial starts a training job (its own process, in a session of its own) with ``resume="auto"`` and ``last/``
every 3 optimizer steps, written in the background, and injects one fault (``--faults``, in turn):

    kill              SIGKILL at a uniformly random time of the run
    kill-in-write     SIGKILL at the first sight of a checkpoint write in progress after a random moment
    ddp-kill-worker   2 gloo processes through kitlib's launch (the notebooks' DDP): SIGKILL of one worker
    ddp-kill-parent   the same, SIGKILL of the launching process (the kernel); the orphaned workers are killed
                      2 s later, as a container's teardown does
    sigterm-kernel    SIGTERM to the job's process alone (a hosted session ending): it must save last/ and stop
    sigterm-group     SIGTERM to the job's whole process group (a container stop, Ctrl-C's SIGINT alike)
    ddp-sigterm-group the same over 2 gloo processes (the launcher forwards it; the workers also get it directly)
    oom               torch.OutOfMemoryError injected at a random step (the back-off path), then SIGKILL later
    full-disk         ENOSPC on the fsync of a random checkpoint write (the disk fills): the job must stop with
                      kitlib's DiskFullError and leave the previous last/ intact

Then it checks what the fault left on disk (a checkpoint that does not load and verify = corrupt), resumes the job
to the end (a non-zero exit = failed to resume) and compares the final weights with an uninterrupted run of the
same job (same processes, same injected OOM step), bit for bit (exact or mismatched). Single-process jobs alternate
between a user's plain ``DataLoader(shuffle=True)`` and kitlib's own ``make_train_loader``; the model has dropout,
so the RNG streams must be restored too.

Prints ``kills N, exact R, mismatched M, corrupt C, failed-to-resume F`` and one such line per fault.

``--route notebooks`` takes the route a user runs instead: ``python -m kitlib notebooks run`` (00->03, the demo cut
to 300 training and 40 test rows, ``--preset smoke --model tiny``) with one fault during 02's training, then the
resume the run's own message names (``Resume: ...``; the same command where the message names none):

    sigterm-group     SIGTERM to the runner's process group (a container stop): the kernel must save last/
    sigterm-kernel    SIGTERM to 02's kernel alone (a hosted session ending): 02 saves last/, 03 refuses to predict
    kill-kernel       SIGKILL of 02's kernel (the out-of-memory killer): a kitlib message, then 02 starts again
    ddp-kill-worker   --hardware 2xT4, rehearsed (KIT_REHEARSE=1: 2 gloo workers through 02's launch): SIGKILL of one
    oom               an out-of-memory error at step 9 (the back-off halves the micro-batch), SIGTERM later
    full-disk         ENOSPC on the fsync of 02's checkpoint weights: kitlib's DiskFullError; the resume has room

The faults reach the kernels through IPython's startup folder (IPYTHONDIR), not through kitlib. Each resumed run
must continue 02 from last/ where the fault saved one, end with a submission.csv that `python -m kitlib score`
accepts with every test id, within a budget of twice the uninterrupted run + 60 s, and give the uninterrupted
run's best/ weights and submission bit for bit (the CPU route is deterministic: same seeds, same threads).
Prints the same counts per fault, plus lost submissions and how many resumes continued from last/.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOADERS = ("plain", "kitlib")
FAULTS = ("kill", "kill-in-write", "ddp-kill-worker", "ddp-kill-parent", "sigterm-kernel", "sigterm-group",
          "ddp-sigterm-group", "oom", "full-disk")  # fmt: skip
OOM_STEPS = (4, 13)  # the steps an injected OOM may hit (a reference run each): early, and past the first last/


# ------------------------------------------------------------------------------------------------ the job (child)
def job(run_dir: Path, loader_kind: str, procs: int = 1, oom_step: int = 0, full_write: int = 0) -> None:
    import torch

    torch.set_num_threads(1)
    if procs > 1:
        from kitlib.machine.distributed import launch

        stop = launch(_fit, run_dir, loader_kind, oom_step, full_write, nprocs=procs)
    else:
        stop = _fit(run_dir, loader_kind, oom_step, full_write)
    print("done" if stop == "completed" else f"stopped: {stop}", flush=True)


def _fit(run_dir: Path, loader_kind: str, oom_step: int, full_write: int) -> str:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from kitlib import Callback, TrainConfig, fit
    from kitlib.data.loaders import make_train_loader
    from kitlib.machine.hardware import fake_profile

    g = torch.Generator().manual_seed(0)
    x = torch.randn(384, 64, generator=g)
    y = x @ torch.randn(64, 1, generator=g) + 0.1 * torch.randn(384, 1, generator=g)
    torch.manual_seed(1)
    # ~1.2 M parameters (5 MB of weights + 10 MB of AdamW state): a checkpoint write takes long enough to be hit.
    model = nn.Sequential(
        nn.Linear(64, 1024), nn.ReLU(), nn.Dropout(0.2), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1)
    )
    cfg = TrainConfig(
        epochs=3,
        micro_batch_size=16,
        grad_accum_steps=2,
        lr=1e-3,
        precision="fp32",
        save_best=False,
        save_every_steps=3,
        log_every_steps=1,
        seed=7,
        num_workers=0,
    )
    hw = fake_profile("CPU", platform="local", interactive=False)
    data = TensorDataset(x, y)
    loader = (
        DataLoader(data, batch_size=16, shuffle=True)
        if loader_kind == "plain"
        else make_train_loader(
            data, cfg, hw, collate=lambda rows: tuple(torch.stack(t) for t in zip(*rows, strict=True))
        )
    )
    step = [0]  # the optimizer step about to run: what the injected OOM keys on, restored by a resume

    class Started(Callback):
        def on_fit_start(self, loop: object) -> None:
            self.loop = loop
            step[0] = loop.state.step  # type: ignore[attr-defined]
            print("started", flush=True)  # the parent's clock for a random fault starts here (imports done)

        def on_step_end(self, end: object) -> None:
            step[0] = self.loop.state.step  # type: ignore[attr-defined]

    def mse(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if oom_step and step[0] >= oom_step and len(batch[0]) > 8:  # the back-off replays the window at 8 rows
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return nn.functional.mse_loss(m(batch[0]), batch[1])

    if full_write:  # the disk fills during checkpoint write number `full_write` (its weights' fsync fails)
        real_fsync, writes = os.fsync, [0]

        def fsync(fd: int) -> None:
            if os.fstat(fd).st_size > 1_000_000:
                writes[0] += 1
                if writes[0] == full_write:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real_fsync(fd)

        os.fsync = fsync
    result = fit(model, loader, config=cfg, loss_fn=mse, run_dir=run_dir, resume="auto", hw=hw, callbacks=[Started()])
    if result.stop_reason == "completed" and os.environ.get("RANK", "0") == "0":
        torch.save(result.model.state_dict(), run_dir / "final.pt")
    return result.stop_reason


# --------------------------------------------------------------------------------------------- the campaign (parent)
@dataclass
class Trial:
    fault: str
    loader: str
    outcome: str  # exact | mismatched | corrupt | failed-to-resume | finished-before-fault
    during_write: bool
    detail: str = ""


def _command(run_dir: Path, loader: str, procs: int, oom_step: int = 0, full_write: int = 0) -> list[str]:
    return [sys.executable, __file__, "--job", str(run_dir), "--loader", loader, "--procs", str(procs),
            "--oom-step", str(oom_step), "--full-write", str(full_write)]  # fmt: skip


def _start(command: list[str]) -> subprocess.Popen[str]:  # a session of its own: killpg reaches it and its workers
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdout is not None
    for got in proc.stdout:  # kitlib prints its own lines (precision, progress) too
        if line in got:  # tqdm's \r-lines (no newline) may carry it at their end
            return


def _writing(run_dir: Path) -> bool:
    return any(p.name.startswith((".last.tmp-", ".last.old-")) for p in run_dir.glob(".last.*"))


def _corrupt(run_dir: Path) -> str:
    """'' when what the fault left loads and verifies (or nothing was saved yet), else the problem."""
    from kitlib.engine import checkpoint

    found = checkpoint.latest(run_dir, "last")
    if found is None:
        return ""
    try:
        checkpoint.load(found, verify=True)
    except Exception as err:  # anything that stops a resume is corruption here
        return f"{type(err).__name__}: {err}"
    return ""


def _children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in found]


def _setup(fault: str, index: int, rng: random.Random) -> tuple[str, int, int, int]:
    """(loader, processes, OOM step, full-disk write) of a trial."""
    ddp = fault.startswith("ddp-")
    loader = "kitlib" if ddp else LOADERS[index % len(LOADERS)]
    oom = OOM_STEPS[index % len(OOM_STEPS)] if fault == "oom" else 0
    return loader, 2 if ddp else 1, oom, rng.randint(1, 6) if fault == "full-disk" else 0


def _reference_key(loader: str, procs: int, oom: int) -> str:
    return f"{loader}-{procs}p-oom{oom}"


def trial(index: int, fault: str, root: Path, run_seconds: dict[str, float], reference: dict[str, Path]) -> Trial:
    import torch

    rng = random.Random(index)
    loader, procs, oom, full_write = _setup(fault, index, rng)
    key = _reference_key(loader, procs, oom)
    run_dir = root / f"trial-{index:03d}"
    run_dir.mkdir()
    proc = _start(_command(run_dir, loader, procs, oom, full_write))
    _wait_for(proc, "started")
    seconds = run_seconds[key]
    deadline = time.monotonic() + (rng.uniform(0.3, 0.9) * seconds if fault == "kill-in-write" else
                                   rng.uniform(0.5 if fault == "oom" else 0.0, 1.0) * seconds)  # fmt: skip
    said = ""
    if fault == "full-disk":  # no signal: the job meets the full disk itself
        said = proc.communicate()[1]
    else:
        time.sleep(max(0.0, deadline - time.monotonic()))
        while fault == "kill-in-write" and proc.poll() is None and not _writing(run_dir):
            time.sleep(0.0005)
    during = _writing(run_dir)
    if proc.poll() is None:
        if fault == "ddp-kill-worker" and (workers := _children(proc.pid)):
            os.kill(rng.choice(workers), signal.SIGKILL)
        elif fault == "ddp-kill-parent":
            proc.send_signal(signal.SIGKILL)
            time.sleep(2.0)  # the container's teardown comes after
        elif fault == "sigterm-kernel":
            proc.send_signal(signal.SIGTERM)
        elif fault in ("sigterm-group", "ddp-sigterm-group"):
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGKILL)
        try:
            said = proc.communicate(timeout=60)[1]  # a SIGTERM'd job saves last/ and exits by itself
        except subprocess.TimeoutExpired:
            said = "did not stop within 60 s"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the job (orphaned workers)
    proc.communicate()
    if (run_dir / "final.pt").exists() and fault != "full-disk":
        return Trial(fault, loader, "finished-before-fault", during)
    if fault == "full-disk" and "no space left writing checkpoint" not in said:
        return Trial(fault, loader, "failed-to-resume", during, f"no DiskFullError: {said.strip()[-200:]}")
    if "sigterm" in fault and not (run_dir / "last").is_dir():
        return Trial(fault, loader, "failed-to-resume", during, f"SIGTERM left no last/: {said.strip()[-200:]}")
    problem = _corrupt(run_dir)
    if problem:
        return Trial(fault, loader, "corrupt", during, problem)
    resumed = subprocess.run(_command(run_dir, loader, procs, oom), capture_output=True, text=True)
    if resumed.returncode != 0 or not (run_dir / "final.pt").exists():
        return Trial(fault, loader, "failed-to-resume", during, (resumed.stderr.strip().splitlines() or [""])[-1])
    expected, got = torch.load(reference[key]), torch.load(run_dir / "final.pt")
    worst = max(float((expected[k] - got[k]).abs().max()) for k in expected)
    return Trial(fault, loader, "exact" if worst == 0.0 else "mismatched", during, f"max |diff| {worst:.3g}")


OUTCOMES = ("exact", "mismatched", "corrupt", "failed-to-resume", "finished-before-fault")


def _line(trials: list[Trial]) -> str:
    count = {o: sum(t.outcome == o for t in trials) for o in OUTCOMES}
    kills = len(trials) - count["finished-before-fault"]
    return (
        f"kills {kills}, exact {count['exact']}, mismatched {count['mismatched']}, corrupt {count['corrupt']}, "
        f"failed-to-resume {count['failed-to-resume']}  ({sum(t.during_write for t in trials)} during a checkpoint "
        f"write; {count['finished-before-fault']} runs finished before their fault came)"
    )


# ---------------------------------------------------------------------------- the notebooks' route (--route notebooks)
NB_FAULTS = ("sigterm-group", "sigterm-kernel", "kill-kernel", "ddp-kill-worker", "oom", "full-disk")
NB_OOM_STEPS = (9,)  # the optimizer step an injected OOM hits in 02 (a smoke run has ~29): a reference each
NB_PARAMS = ("--preset", "smoke", "--model", "tiny")
# Injected into every notebook kernel through IPython's startup folder (IPYTHONDIR): no hook inside kitlib. OOM: the
# back-off's window of step >= N raises while the micro-batch is whole (its `parts`, resume state, is 1); full disk:
# the fsync of checkpoint write number N's weights (in a .tmp- folder) fails with ENOSPC.
STARTUP = """
import errno, os
if os.environ.get("CAMPAIGN_OOM_STEP"):
    import torch
    from kitlib.engine import backoff
    _oom, _run = int(os.environ["CAMPAIGN_OOM_STEP"]), backoff.MicroBatchBackoff.run
    def run(self, window, train, *, step):
        def failing(pieces):
            if step >= _oom and self.parts == 1:
                open(os.environ["CAMPAIGN_MARK"], "a").close()  # the parent's clock for the later SIGTERM
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
            return train(pieces)
        return _run(self, window, failing, step=step)
    backoff.MicroBatchBackoff.run = run
if os.environ.get("CAMPAIGN_FULL_WRITE"):
    _fsync, _writes = os.fsync, [0]
    def fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        if ".tmp-" in path and path.endswith(".safetensors"):
            _writes[0] += 1
            if _writes[0] == int(os.environ["CAMPAIGN_FULL_WRITE"]):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        _fsync(fd)
    os.fsync = fsync
"""


@dataclass
class Route:
    """An uninterrupted notebooks run: its wall seconds, 02's training seconds, what it left to compare."""

    seconds: float
    train_seconds: float
    work: Path


def small_demo(root: Path, train_rows: int = 300, test_rows: int = 40) -> Path:
    """The reviews demo cut to a smoke run's size (the preset trains on 256 rows at most)."""
    import pandas as pd

    full, data = root / "demo-full", root / "data"
    subprocess.run([sys.executable, "-m", "kitlib", "demo", str(full)], check=True, capture_output=True)
    data.mkdir()
    pd.read_csv(full / "train.csv").head(train_rows).to_csv(data / "train.csv", index=False)
    test = pd.read_csv(full / "test.csv").head(test_rows)
    test.to_csv(data / "test.csv", index=False)
    for name in ("sample_submission.csv", "solution.csv"):
        rows = pd.read_csv(full / name)
        rows[rows["id"].isin(test["id"])].to_csv(data / name, index=False)
    return data


def _nb_command(data: Path, work: Path, ddp: bool) -> list[str]:
    hardware = ["--hardware", "2xT4"] if ddp else []  # rehearsed: 2 gloo workers through 02's launch (KIT_REHEARSE)
    return [sys.executable, "-m", "kitlib", "notebooks", "run", "--data", str(data), "--work", str(work),
            *NB_PARAMS, *hardware]  # fmt: skip


def _nb_env(root: Path, work: Path, ddp: bool, oom: int, full_write: int) -> dict[str, str]:
    ipython = root / "ipython"
    if not ipython.exists():
        (ipython / "profile_default" / "startup").mkdir(parents=True)
        (ipython / "profile_default" / "startup" / "00-campaign.py").write_text(STARTUP)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KIT_", "CAMPAIGN_"))}
    env |= {"IPYTHONDIR": str(ipython), "CAMPAIGN_MARK": str(work) + ".oom"}
    env |= {"KIT_REHEARSE": "1"} if ddp else {}
    env |= {"CAMPAIGN_OOM_STEP": str(oom)} if oom else {}
    return env | ({"CAMPAIGN_FULL_WRITE": str(full_write)} if full_write else {})


def _nb_run(command: list[str], env: dict[str, str], log: Path, work: Path | None = None) -> tuple[int, float, float]:
    """(exit code, wall seconds, 02's training seconds) of one ``notebooks run``: from 02 staging run.new/ to its
    publishing run/ (0 when ``work`` is None, not watched)."""
    t0, staged, published = time.monotonic(), 0.0, 0.0
    with log.open("w") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        while proc.poll() is None:
            if work is not None:
                staged = staged or (time.monotonic() if (work / "run.new" / "inputs.json").exists() else 0.0)
                published = published or (time.monotonic() if (work / "run").exists() else 0.0)
            time.sleep(0.05)
    return proc.returncode, time.monotonic() - t0, published - staged if staged and published else 0.0


def _weights(work: Path) -> dict[str, object]:
    from safetensors.torch import load_file

    return load_file(work / "run" / "best" / "model.safetensors")


def _scored(data: Path, work: Path) -> str:
    """'' when work's submission.csv scores against the held-out answers (every id, no extra), else the problem."""
    import pandas as pd

    submission = work / "submission.csv"
    if not submission.is_file():
        return "no submission.csv"
    got, want = pd.read_csv(submission), pd.read_csv(data / "solution.csv")
    if sorted(got["id"]) != sorted(want["id"]) or got.isna().any().any():
        return f"submission has {len(got)} rows for {len(want)} ids (or empty cells)"
    score = subprocess.run([sys.executable, "-m", "kitlib", "score", str(data / "solution.csv"), str(submission)],
                           capture_output=True, text=True)  # fmt: skip
    return "" if score.returncode == 0 else f"score failed: {(score.stdout + score.stderr).strip()[-200:]}"


def _ref_key(ddp: bool, oom: int) -> str:
    return f"{'2xT4' if ddp else 'cpu'}-oom{oom}"


def nb_reference(root: Path, data: Path, ddp: bool, oom: int) -> Route:
    work = root / f"reference-{_ref_key(ddp, oom)}"
    code, seconds, train = _nb_run(_nb_command(data, work, ddp), _nb_env(root, work, ddp, oom, 0),
                                   work.with_suffix(".log"), work)  # fmt: skip
    assert code == 0 and not _scored(data, work), work.with_suffix(".log").read_text()[-3000:]
    return Route(seconds, train, work)


@dataclass
class NbTrial:
    fault: str
    outcome: str  # exact | mismatched | corrupt | failed-to-resume | finished-before-fault
    submission: bool  # the resumed run ended with a submission.csv that scores, every test id in it
    seconds: float  # the faulted run plus the resume, wall
    continued: bool  # the resume continued 02 from last/ (else 02 started again)
    detail: str = ""
    during_write: bool = False  # a checkpoint write was in progress when the fault came
    budget: float = 0.0  # the seconds the faulted run and its resume may take: 2 x the uninterrupted run + 60 s


def nb_trial(
    index: int, fault: str, root: Path, data: Path, refs: dict[str, Route], moment: float | None = None
) -> NbTrial:
    """One fault during 02, at ``moment`` (a fraction of 02's training time; random when None), then the resume."""
    rng = random.Random(index)
    ddp, oom = fault.startswith("ddp-"), NB_OOM_STEPS[index % len(NB_OOM_STEPS)] if fault == "oom" else 0
    ref = refs[_ref_key(ddp, oom)]
    work = root / f"nb-{index:03d}"
    full_write = 1 if fault == "full-disk" else 0  # a smoke run writes one checkpoint (best/ at the epoch's end)
    command, log = _nb_command(data, work, ddp), work.with_suffix(".log")
    t0 = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(command, env=_nb_env(root, work, ddp, oom, full_write), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        started = work / "run.new" / "inputs.json"  # 02 is staging its training
        while proc.poll() is None and not started.exists():
            time.sleep(0.05)
        if oom:  # the SIGTERM comes after the back-off (the injection marks it)
            while proc.poll() is None and not Path(str(work) + ".oom").exists():
                time.sleep(0.05)
        at = rng.uniform(0.0, 0.6 if oom else 1.0) if moment is None else moment
        time.sleep(at * ref.train_seconds)
        training = (work / "run.new").is_dir()  # 02 has not published run/ yet
        kernel = _children(proc.pid)
        during = _writing(work / "run.new")

        def ended(*fields: Any) -> NbTrial:  # the faulted run's work is at most one run, the resume (00->03 again,
            return NbTrial(fault, *fields, during_write=during, budget=2 * ref.seconds + 60.0)  # 02 continuing) another

        if proc.poll() is None and fault != "full-disk":
            if fault in ("sigterm-group", "oom"):
                os.killpg(proc.pid, signal.SIGTERM)
            elif kernel and fault == "sigterm-kernel":
                os.kill(kernel[0], signal.SIGTERM)
            elif kernel and fault == "kill-kernel":
                os.kill(kernel[0], signal.SIGKILL)
            elif kernel and fault == "ddp-kill-worker" and (workers := _children(kernel[0])):
                os.kill(rng.choice(workers), signal.SIGKILL)
        try:
            proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            return ended("failed-to-resume", False, 0.0, False, "the faulted run did not stop in 180 s")
    said = log.read_text()
    if proc.returncode == 0 and fault != "sigterm-kernel":
        return ended("finished-before-fault", True, 0.0, False)
    if "Traceback (most recent call last)" in said:
        return ended("failed-to-resume", False, 0.0, False, f"a traceback, not kitlib's words: {said[-300:]}")
    if fault == "full-disk" and "no space left writing checkpoint" not in said:
        return ended("failed-to-resume", False, 0.0, False, f"no DiskFullError: {said.strip()[-300:]}")
    signalled = fault in ("sigterm-group", "sigterm-kernel", "oom")  # the kernel's training got SIGTERM: it saves
    if signalled and training and not (work / "run.new" / "last").is_dir() and not (work / "run").is_dir():
        return ended("failed-to-resume", False, 0.0, False, f"SIGTERM left no last/: {said.strip()[-300:]}")
    if problem := _corrupt(work / "run.new"):
        return ended("corrupt", False, 0.0, False, problem)
    again = next((line.split("Resume: ", 1)[1] for line in said.splitlines() if "Resume: " in line), None)
    if again is not None:  # the command the run's own message names
        import shlex

        command = [sys.executable, *shlex.split(again)[1:]] if again.startswith("python ") else shlex.split(again)
    code, _, _ = _nb_run(command, _nb_env(root, work, ddp, oom, 0), log.with_suffix(".resume.log"))
    seconds = time.monotonic() - t0
    resumed = log.with_suffix(".resume.log").read_text()
    continued = "continuing the interrupted run" in (work / "executed" / "02_train.ipynb").read_text()
    if code != 0:
        return ended("failed-to-resume", False, seconds, continued, resumed.strip()[-300:])
    problem = _scored(data, work)
    expected, got = _weights(ref.work), _weights(work)
    worst = max(float((expected[k] - got[k]).abs().max()) for k in expected)  # type: ignore[operator]
    same = (work / "submission.csv").read_bytes() == (ref.work / "submission.csv").read_bytes()
    return ended("exact" if worst == 0.0 and same else "mismatched", not problem,
                   seconds, continued, problem or f"max |diff| {worst:.3g}, same submission {same}")  # fmt: skip


def nb_campaign(kills: int, faults: list[str], workers: int) -> None:
    plan = [(i, faults[i % len(faults)]) for i in range(kills)]
    with tempfile.TemporaryDirectory(prefix="kill-campaign-nb-") as tmp:
        root = Path(tmp)
        data = small_demo(root)
        keys = {(f.startswith("ddp-"), NB_OOM_STEPS[i % len(NB_OOM_STEPS)] if f == "oom" else 0) for i, f in plan}
        with ThreadPoolExecutor(workers) as pool:  # the uninterrupted runs, side by side as the trials will run
            runs = pool.map(lambda k: nb_reference(root, data, *k), sorted(keys))
            refs = {_ref_key(*k): run for k, run in zip(sorted(keys), runs, strict=True)}
        shown = ", ".join(f"{k} {r.seconds:.0f} s (02 trains {r.train_seconds:.0f} s)" for k, r in refs.items())
        print(f"uninterrupted notebooks runs: {shown}; budget: twice that + 60 s; {kills} faults", flush=True)
        trials: list[NbTrial] = []
        with ThreadPoolExecutor(workers) as pool:
            for t in pool.map(lambda job: nb_trial(*job, root, data, refs), plan):
                trials.append(t)
                print(f"  trial {len(trials) - 1} ({t.fault}): {t.outcome}, submission {t.submission}, {t.seconds:.0f} "
                      f"s ({t.seconds / t.budget:.2f} of the budget), continued from last/ {t.continued}; {t.detail}",
                      flush=True)  # fmt: skip
    for fault in [*faults, "all"]:
        chosen = [t for t in trials if fault in ("all", t.fault)]
        lost = sum(not t.submission for t in chosen if t.outcome != "finished-before-fault")
        over = sum(t.seconds > t.budget for t in chosen if t.outcome != "finished-before-fault")
        print(
            f"{fault:>18}: {_line(chosen)}; lost submissions {lost}, over the time budget {over}; "  # type: ignore[arg-type]
            f"continued from last/ {sum(t.continued for t in chosen)}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=100, help="faults in all, spread over --faults in turn")
    parser.add_argument("--faults", default="kill,kill-in-write", help=f"comma-separated, of: {', '.join(FAULTS)}")
    parser.add_argument("--workers", type=int, default=2, help="trials at once (each job uses one thread a process)")
    parser.add_argument(
        "--route",
        choices=("fit", "notebooks"),
        default="fit",
        help="fit: the faults above over a "
        "fit(); notebooks: `notebooks run` 00->03 with a fault during 02, then its resume",
    )
    parser.add_argument("--job", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--loader", choices=LOADERS, default="plain", help=argparse.SUPPRESS)
    parser.add_argument("--procs", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--oom-step", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--full-write", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        job(args.job, args.loader, args.procs, args.oom_step, args.full_write)
        return
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    offered = NB_FAULTS if args.route == "notebooks" else FAULTS
    if unknown := sorted(set(faults) - set(offered)):
        parser.error(f"unknown fault(s) {unknown}: choose from {', '.join(offered)}")
    if args.route == "notebooks":
        nb_campaign(args.kills, faults, args.workers)
        return
    plan = [(i, faults[i % len(faults)]) for i in range(args.kills)]
    with tempfile.TemporaryDirectory(prefix="kill-campaign-") as tmp:
        root = Path(tmp)
        reference, seconds = {}, {}
        for loader, procs, oom, _ in {_setup(f, i, random.Random(i)) for i, f in plan if f != "full-disk"} | {
            (LOADERS[i % 2], 1, 0, 0) for i, f in plan if f == "full-disk"
        }:  # the uninterrupted runs the resumed ones must equal, and how long each trains
            key = _reference_key(loader, procs, oom)
            if key in reference:
                continue
            run_dir = root / f"reference-{key}"
            run_dir.mkdir()
            proc = _start(_command(run_dir, loader, procs, oom))
            _wait_for(proc, "started")
            t0 = time.monotonic()
            _wait_for(proc, "done")  # final.pt saved (the interpreter's exit not counted)
            seconds[key] = time.monotonic() - t0
            _, err = proc.communicate()
            assert proc.returncode == 0, err
            reference[key] = run_dir / "final.pt"
        shown = ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items())
        print(f"uninterrupted runs train for {shown} after start-up; {args.kills} faults", flush=True)
        trials: list[Trial] = []
        with ThreadPoolExecutor(args.workers) as pool:
            for t in pool.map(lambda job: trial(*job, root, seconds, reference), plan):
                trials.append(t)  # each trial's line as it ends: a campaign cut short still says what it found
                print(f"  trial {len(trials) - 1} ({t.fault}, {t.loader}): {t.outcome} {t.detail}", flush=True)
    for fault in faults:
        print(f"{fault:>18}: {_line([t for t in trials if t.fault == fault])}")
    print(f"{'all':>18}: {_line(trials)}")
    print(json.dumps({o: sum(t.outcome == o for t in trials) for o in OUTCOMES}))


if __name__ == "__main__":
    main()
