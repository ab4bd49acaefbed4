"""Kill -9 at a random step, resume, finish: the final weights equal an uninterrupted run (CPU, fp32, same seed)."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

JOBS = Path(__file__).with_name("_jobs.py")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(JOBS), *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The job's final weights run whole: the reference both slow tests below compare with (one run, ~1/3 of each)."""
    full = tmp_path_factory.mktemp("resume") / "full"
    done = _run("resume", str(full), "0", "0")
    assert done.returncode == 0, done.stderr
    return torch.load(full / "final.pt")


@pytest.mark.slow  # over 20 s on 2 cores: CI runs it (.ci/run), the test command does not
def test_kill_at_random_step_then_resume_matches_uninterrupted(
    tmp_path: Path, uninterrupted: dict[str, torch.Tensor]
) -> None:
    # 160 rows / (8 x 2) = 10 steps per epoch, 30 in all; checkpoints every 3 steps; kill mid-epoch somewhere.
    kill_at = random.Random().randint(7, 28)
    killed = _run("resume", str(tmp_path / "cut"), str(kill_at), "0")
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr)
    assert not (tmp_path / "cut" / "final.pt").exists()
    meta = json.loads((tmp_path / "cut" / "last" / "meta.json").read_text())
    assert 0 < meta["step"] <= kill_at, (meta, kill_at)  # a real mid-run resume point
    resumed = _run("resume", str(tmp_path / "cut"), "0", "1")
    assert resumed.returncode == 0, resumed.stderr
    got = torch.load(tmp_path / "cut" / "final.pt")
    for name, tensor in uninterrupted.items():
        assert torch.equal(tensor, got[name]), f"{name} differs after kill at step {kill_at} and resume"


def _epoch_end_job(run_dir: Path, *, crash_after_epoch: int | None, resume: bool | str) -> dict[str, torch.Tensor]:
    """A user's plain DataLoader(shuffle=True) (no generator: it draws its base seed from the global RNG at every
    iter) and dropout; ``crash_after_epoch`` raises right after that epoch's end-of-epoch ``last/`` was saved."""
    from torch.utils.data import DataLoader

    from kitlib import Callback, TrainConfig, fit
    from kitlib.engine.loop import Loop
    from kitlib.machine.hardware import fake_profile

    sys.path.insert(0, str(JOBS.parent))
    import _jobs

    class Crash(Callback):
        def on_next_epoch(self, loop: Loop) -> None:  # runs after kitlib's epoch-end save (policies come first)
            if loop.state.epoch == crash_after_epoch:
                raise KeyboardInterrupt("the session ended")

    cfg = TrainConfig(epochs=3, micro_batch_size=8, lr=1e-2, precision="fp32", save_best=False, save_last=True, seed=3)
    result = fit(
        _jobs.model(),
        DataLoader(_jobs.data(64), batch_size=8, shuffle=True),
        config=cfg,
        loss_fn=_jobs.mse,
        run_dir=run_dir,
        resume=resume,
        hw=fake_profile("CPU", platform="local", interactive=False),
        callbacks=[Crash()],
    )
    return result.model.state_dict()


def test_resume_from_an_epoch_end_checkpoint_with_a_plain_shuffled_loader_is_exact(tmp_path: Path) -> None:
    import pytest

    expected = _epoch_end_job(tmp_path / "full", crash_after_epoch=None, resume=False)
    with pytest.raises(KeyboardInterrupt):
        _epoch_end_job(tmp_path / "cut", crash_after_epoch=1, resume=False)
    assert json.loads((tmp_path / "cut" / "last" / "meta.json").read_text())["epoch"] == 1  # an epoch-end point
    got = _epoch_end_job(tmp_path / "cut", crash_after_epoch=None, resume=True)
    for name, tensor in expected.items():
        assert torch.equal(tensor, got[name]), f"{name} differs after resuming from the epoch-end checkpoint"


@pytest.mark.slow  # over 20 s on 2 cores: CI runs it (.ci/run), the test command does not
def test_sigterm_finishes_the_step_saves_last_and_resumes_exactly(
    tmp_path: Path, uninterrupted: dict[str, torch.Tensor]
) -> None:
    term_at = random.Random().randint(5, 25)
    termed = _run("resume", str(tmp_path / "cut"), "0", "0", str(term_at))
    assert termed.returncode == 0, termed.stderr  # fit returned: its files complete, the kernel alive
    # the signal arrives in step term_at's on_log, which the loop fires after every on_step_end of that step: the
    # SIGTERM policy acts at the end of the next step
    assert f"stop sigterm at step {term_at + 1}" in termed.stdout, termed.stdout
    assert json.loads((tmp_path / "cut" / "last" / "meta.json").read_text())["step"] == term_at + 1
    resumed = _run("resume", str(tmp_path / "cut"), "0", "1")
    assert resumed.returncode == 0, resumed.stderr
    got = torch.load(tmp_path / "cut" / "final.pt")
    for name, tensor in uninterrupted.items():
        assert torch.equal(tensor, got[name]), f"{name} differs after SIGTERM at step {term_at} and resume"


def test_resume_auto_starts_fresh_without_a_checkpoint_and_continues_with_one(tmp_path: Path) -> None:
    import pytest

    expected = _epoch_end_job(tmp_path / "full", crash_after_epoch=None, resume=False)
    with pytest.raises(KeyboardInterrupt):
        _epoch_end_job(tmp_path / "cut", crash_after_epoch=1, resume="auto")  # nothing to resume: fresh
    got = _epoch_end_job(tmp_path / "cut", crash_after_epoch=None, resume="auto")  # last/ exists: continue
    assert all(torch.equal(t, got[n]) for n, t in expected.items())


def test_resume_refuses_a_checkpoint_of_another_config_and_names_the_field(tmp_path: Path) -> None:
    import dataclasses

    import pytest
    from torch.utils.data import DataLoader

    from kitlib import TrainConfig, fit
    from kitlib.errors import CheckpointError
    from kitlib.machine.hardware import fake_profile

    sys.path.insert(0, str(JOBS.parent))
    import _jobs

    cfg = TrainConfig(epochs=1, micro_batch_size=8, lr=1e-2, precision="fp32", save_best=False, save_last=True)
    hw = fake_profile("CPU", platform="local", interactive=False)
    loader = DataLoader(_jobs.data(32), batch_size=8, shuffle=True)
    with pytest.raises(CheckpointError, match=r'holds no complete checkpoint.*resume="auto"'):
        fit(_jobs.model(), loader, config=cfg, loss_fn=_jobs.mse, run_dir=tmp_path, resume=True, hw=hw)
    fit(_jobs.model(), loader, config=cfg, loss_fn=_jobs.mse, run_dir=tmp_path, hw=hw)
    before = (tmp_path / "last" / "model.safetensors").read_bytes()
    other = dataclasses.replace(cfg, lr=2e-2, log_every_steps=1)  # logging may change; the learning rate may not
    with pytest.raises(CheckpointError, match=r"another config \(lr: 0.01 -> 0.02\)"):
        fit(_jobs.model(), loader, config=other, loss_fn=_jobs.mse, run_dir=tmp_path, resume="auto", hw=hw)
    assert (tmp_path / "last" / "model.safetensors").read_bytes() == before
