"""Training jobs the tests run in separate processes (kill -9 and resume, DDP). Not a test module."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from kitlib import TrainConfig, fit
from kitlib.machine.hardware import fake_profile


def data(n: int = 160) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g)
    y = x @ torch.randn(6, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def model() -> nn.Module:
    torch.manual_seed(1)
    # Dropout consumes the global RNG every step: resume must restore it to replay the run exactly.
    return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))


def mse(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.mse_loss(m(batch[0]), batch[1])


class KillAt:
    def __init__(self, step: int, run_dir: str | None = None) -> None:
        self.step, self.run_dir = step, run_dir

    def on_log(self, metrics: dict[str, float]) -> None:
        if metrics["step"] == self.step:
            # On a loaded machine the background writer can lag several steps behind; the resume test needs some
            # checkpoint to have landed (bounded wait), and later ones may still be in flight when the kill comes.
            deadline = time.monotonic() + 30
            while self.run_dir and not (Path(self.run_dir) / "last" / "meta.json").exists():
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)


class TermAt:
    """Sends this process SIGTERM at a step, as a hosted session does before it ends."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_log(self, metrics: dict[str, float]) -> None:
        if metrics["step"] == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def resume_job(run_dir: str, kill_at: int, resume: bool, term_at: int = 0) -> None:
    cfg = TrainConfig(
        epochs=3,
        micro_batch_size=8,
        grad_accum_steps=2,
        lr=1e-2,
        precision="fp32",
        save_best=False,
        save_every_steps=3,
        log_every_steps=1,
        seed=7,
    )
    loader = DataLoader(data(), batch_size=8, shuffle=True)  # fit seeds each epoch's shuffle
    callbacks: list[object] = [KillAt(kill_at, run_dir)] if kill_at > 0 else []
    callbacks += [TermAt(term_at)] if term_at > 0 else []
    result = fit(
        model(),
        loader,
        config=cfg,
        loss_fn=mse,
        run_dir=run_dir,
        resume=resume,
        hw=fake_profile("CPU", platform="local", interactive=False),
        callbacks=callbacks,
    )
    if result.stop_reason == "completed":
        torch.save(result.model.state_dict(), Path(run_dir) / "final.pt")
    print(f"stop {result.stop_reason} at step {result.steps}", flush=True)


def lora_model() -> nn.Module:
    """A tiny GPT-2 (seeded, as a pretrained folder would give the same weights in every process) with LoRA."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from kitlib.models.lora import add_adapter

    torch.manual_seed(1)
    base = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=2, n_positions=32, vocab_size=64))
    return add_adapter(base, "lora", generating=True, seed=2)


def lora_data(n: int = 64) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (n, 12), generator=g)
    return [{"input_ids": row, "attention_mask": torch.ones_like(row), "labels": row} for row in ids]


def lora_resume_job(run_dir: str, kill_at: int, resume: bool) -> None:
    """LoRA on a causal LM: 64 rows / (4 x 2) = 8 steps per epoch, 16 in all; last/ (the adapter only) every 2."""
    cfg = TrainConfig(epochs=2, micro_batch_size=4, grad_accum_steps=2, lr=1e-2, precision="fp32", save_best=False,
                      save_every_steps=2, log_every_steps=1, seed=7, adapter="lora")  # fmt: skip
    loader = DataLoader(lora_data(), batch_size=4, shuffle=True)  # type: ignore[arg-type]
    callbacks: list[object] = [KillAt(kill_at, run_dir)] if kill_at > 0 else []
    hw = fake_profile("CPU", platform="local", interactive=False)
    result = fit(lora_model(), loader, config=cfg, run_dir=run_dir, resume=resume, hw=hw, callbacks=callbacks)
    if result.stop_reason == "completed":
        torch.save(result.model.state_dict(), Path(run_dir) / "final.pt")


def _ddp_fit(micro: int, accum: int) -> dict[str, torch.Tensor]:
    cfg = TrainConfig(
        epochs=2,
        micro_batch_size=micro,
        grad_accum_steps=accum,
        lr=1e-2,
        precision="fp32",
        save_best=False,
        seed=3,
        grad_clip=1.0,
    )
    loader = DataLoader(data(128), batch_size=micro, shuffle=True)
    m = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))
    torch.manual_seed(1)
    for p in m.parameters():
        nn.init.normal_(p, std=0.3)
    result = fit(m, loader, config=cfg, loss_fn=mse, hw=fake_profile("CPU", platform="local", interactive=False))
    return {k: v.detach().clone() for k, v in result.model.state_dict().items()}


def ddp_job(out: str) -> None:
    from kitlib.machine.distributed import launch

    torch.set_num_threads(1)
    two = launch(_ddp_fit, 8, 2, nprocs=2)  # global batch 8 x 2 accum x 2 ranks = 32
    one = _ddp_fit(8, 4)  # single process, same global batch
    torch.save({"ddp": two, "single": one}, out)


if __name__ == "__main__":
    job = sys.argv[1]
    if job == "resume":
        resume_job(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", int(sys.argv[5]) if len(sys.argv) > 5 else 0)
    elif job == "lora_resume":
        lora_resume_job(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1")
    elif job == "ddp":
        ddp_job(sys.argv[2])
