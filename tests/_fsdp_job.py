"""A tiny causal-LM run under torchrun (or one process): ``python _fsdp_job.py OUT STRATEGY MICRO ACCUM [options]``.

A 2-layer Llama from a config, fixed token rows, 2 epochs; rank 0 writes OUT/result.pt (each logged loss, the
trained weights gathered whole, the run record). Options: ``resume`` (continue OUT/run's last/), ``kill_at=N``
(SIGKILL this process, rank 1, at step N), ``save_every=N``.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM

from kitlib import TrainConfig, fit
from kitlib.engine.events import Callback

ROWS, LENGTH = 64, 16


def model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    return LlamaForCausalLM(config)


def rows() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 128, (ROWS, LENGTH), generator=g)
    return [{"input_ids": r, "attention_mask": torch.ones_like(r), "labels": r.clone()} for r in ids]


class Losses(Callback):
    """Every step's loss (log_every_steps=1), and a SIGKILL of rank 1 at ``kill_at``."""

    def __init__(self, kill_at: int) -> None:
        self.losses: list[float] = []
        self.kill_at = kill_at

    def on_log(self, metrics: dict[str, float]) -> None:
        if "loss" in metrics:
            self.losses.append(metrics["loss"])
            if self.kill_at and metrics["step"] >= self.kill_at and int(os.environ.get("RANK", 0)) == 1:
                os.kill(os.getpid(), signal.SIGKILL)


def main(out: str, strategy: str, micro: int, accum: int, *options: str) -> None:
    torch.set_num_threads(1)
    opts = dict(o.split("=") if "=" in o else (o, "1") for o in options)
    cfg = TrainConfig(epochs=2, micro_batch_size=micro, grad_accum_steps=accum, lr=1e-2, warmup_ratio=0.0,
                      strategy=strategy, log_every_steps=1, full_eval_at_end=False, precision="fp32",  # type: ignore[arg-type]
                      save_last=True, save_every_steps=int(opts.get("save_every", 0)) or None,
                      batching="fixed")  # fmt: skip
    loader = DataLoader(rows(), batch_size=micro, shuffle=False)  # type: ignore[arg-type]
    record = Losses(int(opts.get("kill_at", 0)))
    m = model()
    result = fit(m, loader, config=cfg, eval_loader=DataLoader(rows()[:16], batch_size=4),  # type: ignore[arg-type]
                 run_dir=Path(out) / "run", resume="resume" in opts, callbacks=[record])  # fmt: skip
    if dist.is_initialized():  # the whole weights on rank 0 (a collective under FSDP)
        weights = get_model_state_dict(result.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        weights = {k: v.detach().clone() for k, v in result.model.state_dict().items()}
    if int(os.environ.get("RANK", 0)) == 0:
        saved = {"losses": record.losses, "weights": weights, "history": result.history.to_dict("list"),
                 "timing": result.timing, "stop": result.stop_reason}  # fmt: skip
        torch.save(saved, Path(out) / "result.pt")
    if dist.is_initialized():  # together: no rank tears its gloo pairs down while rank 0 still writes
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:])
