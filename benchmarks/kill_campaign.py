"""Random SIGKILLs over a checkpointing fit(), each followed by a resume: is every resume exact?

    python benchmarks/kill_campaign.py --kills 100            # ~10 min on 2 cores
    python benchmarks/kill_campaign.py --kills 10 --workers 1 # a quick look

Each trial starts a training job (its own process) with ``resume="auto"`` and ``last/`` every 3 optimizer steps,
written in the background, and SIGKILLs it at a random moment: a third of the kills wait until a checkpoint write
is in progress (its ``.last.tmp-*`` folder exists), the rest at a uniformly random time of the run. Then it checks
what the kill left on disk (a checkpoint that does not load and verify = corrupt), resumes the job to the end
(a non-zero exit = failed to resume) and compares the final weights with an uninterrupted run of the same job,
bit for bit (exact or mismatched). Jobs alternate between a user's plain ``DataLoader(shuffle=True)`` and
kitlib's own ``make_train_loader``; the model has dropout, so the RNG streams must be restored too.

Prints ``kills N, exact R, mismatched M, corrupt C, failed-to-resume F`` and how many kills landed in a write.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

LOADERS = ("plain", "kitlib")


# ------------------------------------------------------------------------------------------------ the job (child)
def job(run_dir: Path, loader_kind: str) -> None:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from kitlib import Callback, TrainConfig, fit
    from kitlib.data.loaders import make_train_loader
    from kitlib.machine.hardware import fake_profile

    torch.set_num_threads(1)
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

    class Started(Callback):
        def on_fit_start(self, loop: object) -> None:
            print("started", flush=True)  # the parent's clock for a random kill starts here (imports done)

    def mse(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return nn.functional.mse_loss(m(batch[0]), batch[1])

    result = fit(model, loader, config=cfg, loss_fn=mse, run_dir=run_dir, resume="auto", hw=hw, callbacks=[Started()])
    torch.save(result.model.state_dict(), run_dir / "final.pt")
    print("done", flush=True)


# --------------------------------------------------------------------------------------------- the campaign (parent)
@dataclass
class Trial:
    loader: str
    outcome: str  # exact | mismatched | corrupt | failed-to-resume | finished-before-kill
    during_write: bool
    detail: str = ""


def _start(run_dir: Path, loader: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "--job", str(run_dir), "--loader", loader],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdout is not None
    for got in proc.stdout:  # kitlib prints its own lines (precision, progress) too
        if line in got:  # tqdm's \r-lines (no newline) may carry it at their end
            return


def _run_to_end(run_dir: Path, loader: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, __file__, "--job", str(run_dir), "--loader", loader], capture_output=True, text=True
    )


def _writing(run_dir: Path) -> bool:
    return any(p.name.startswith((".last.tmp-", ".last.old-")) for p in run_dir.glob(".last.*"))


def _corrupt(run_dir: Path) -> str:
    """'' when what the kill left loads and verifies (or nothing was saved yet), else the problem."""
    from kitlib.engine import checkpoint

    found = checkpoint.latest(run_dir, "last")
    if found is None:
        return ""
    try:
        checkpoint.load(found, verify=True)
    except Exception as err:  # anything that stops a resume is corruption here
        return f"{type(err).__name__}: {err}"
    return ""


def trial(index: int, root: Path, run_seconds: float, reference: dict[str, Path]) -> Trial:
    import torch

    rng = random.Random(index)
    loader = LOADERS[index % len(LOADERS)]
    in_write = index % 3 == 0
    run_dir = root / f"trial-{index:03d}"
    run_dir.mkdir()
    proc = _start(run_dir, loader)
    _wait_for(proc, "started")
    deadline = time.monotonic() + (rng.uniform(0.3, 0.9) * run_seconds if in_write else rng.uniform(0, run_seconds))
    if in_write:  # from a random moment on, kill at the first sight of a write in progress
        time.sleep(max(0.0, deadline - time.monotonic()))
        while proc.poll() is None and not _writing(run_dir):
            time.sleep(0.0005)
    else:
        time.sleep(max(0.0, deadline - time.monotonic()))
    during = _writing(run_dir)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert proc.stderr is not None
    proc.stderr.close()
    if (run_dir / "final.pt").exists():
        return Trial(loader, "finished-before-kill", during)
    problem = _corrupt(run_dir)
    if problem:
        return Trial(loader, "corrupt", during, problem)
    resumed = _run_to_end(run_dir, loader)
    if resumed.returncode != 0:
        return Trial(loader, "failed-to-resume", during, resumed.stderr.strip().splitlines()[-1:][0])
    expected, got = torch.load(reference[loader]), torch.load(run_dir / "final.pt")
    worst = max(float((expected[k] - got[k]).abs().max()) for k in expected)
    return Trial(loader, "exact" if worst == 0.0 else "mismatched", during, f"max |diff| {worst:.3g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2, help="trials at once (each job uses one thread)")
    parser.add_argument("--job", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--loader", choices=LOADERS, default="plain", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        job(args.job, args.loader)
        return
    with tempfile.TemporaryDirectory(prefix="kill-campaign-") as tmp:
        root = Path(tmp)
        reference, seconds = {}, []
        for loader in LOADERS:  # the uninterrupted runs the resumed ones must equal, and how long a run takes
            run_dir = root / f"reference-{loader}"
            run_dir.mkdir()
            proc = _start(run_dir, loader)
            _wait_for(proc, "started")
            t0 = time.monotonic()
            _wait_for(proc, "done")  # final.pt saved (the interpreter's exit not counted)
            seconds.append(time.monotonic() - t0)
            _, err = proc.communicate()
            assert proc.returncode == 0, err
            reference[loader] = run_dir / "final.pt"
        run_seconds = max(seconds)
        print(f"an uninterrupted run trains for {run_seconds:.1f} s after start-up; {args.kills} kills", flush=True)
        trials: list[Trial] = []
        with ThreadPoolExecutor(args.workers) as pool:
            for t in pool.map(lambda i: trial(i, root, run_seconds, reference), range(args.kills)):
                trials.append(t)
                if t.outcome not in ("exact", "finished-before-kill"):
                    print(f"  trial {len(trials) - 1} ({t.loader}): {t.outcome} {t.detail}", flush=True)
    count = {
        o: sum(t.outcome == o for t in trials)
        for o in ("exact", "mismatched", "corrupt", "failed-to-resume", "finished-before-kill")
    }
    kills = len(trials) - count["finished-before-kill"]
    print(
        f"kills {kills}, exact {count['exact']}, mismatched {count['mismatched']}, corrupt {count['corrupt']}, "
        f"failed-to-resume {count['failed-to-resume']}  "
        f"({sum(t.during_write for t in trials)} during a checkpoint write; "
        f"{', '.join(f'{k} {sum(t.loader == k for t in trials)}' for k in LOADERS)} loaders; "
        f"{count['finished-before-kill']} runs finished before their kill came)"
    )
    print(json.dumps(count))


if __name__ == "__main__":
    main()
