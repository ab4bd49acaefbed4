"""A tiny causal-LM run under torchrun (or one process): ``python _fsdp_job.py OUT STRATEGY MICRO ACCUM [options]``.

A 2-layer Llama from a config, fixed token rows, 2 epochs; rank 0 writes OUT/result.pt (each logged loss, the
trained weights gathered whole, the rows each rank read, the run record). Options: ``resume`` (continue OUT/run's
last/), ``kill_at=N`` (SIGKILL this process, rank 1, at step N), ``term_at=N`` (each node's local rank 0 sends
SIGTERM to its torchrun agent at step N, which forwards it to every rank), ``save_every=N``, ``keep=N`` (rank 0
copies last/, saved at step N, to OUT/last-N: a reference for a resumed run's checkpoint).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM

from kitlib import TrainConfig, fit
from kitlib.engine.events import Callback

ROWS, LENGTH = 96, 16  # 3 optimizer steps an epoch at 32 rows a step


def model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    return LlamaForCausalLM(config)


class Rows(list):  # type: ignore[type-arg]
    """The token rows, noting each index read (``seen``): which rows a (resumed) run consumed."""

    def __init__(self, count: int) -> None:
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, 128, (ROWS, LENGTH), generator=g)[:count]
        super().__init__({"input_ids": r, "attention_mask": torch.ones_like(r), "labels": r.clone()} for r in ids)
        self.seen: list[int] = []

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        self.seen.append(i)
        return super().__getitem__(i)


class Losses(Callback):
    """Every step's loss (log_every_steps=1), a SIGKILL of rank 1 at ``kill_at``, a SIGTERM of the agents at
    ``term_at``."""

    def __init__(self, out: Path, kill_at: int, term_at: int, keep: int) -> None:
        self.losses: list[float] = []
        self.out, self.kill_at, self.term_at, self.keep = out, kill_at, term_at, keep

    def on_fit_start(self, loop) -> None:  # type: ignore[no-untyped-def]
        self.writer = loop.output.writer  # last/ is written in the background: waited for before it is copied

    def on_log(self, metrics: dict[str, float]) -> None:
        if "loss" in metrics:
            self.losses.append(metrics["loss"])
            if self.kill_at and metrics["step"] >= self.kill_at and int(os.environ.get("RANK", 0)) == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            if metrics["step"] == self.keep and int(os.environ.get("RANK", 0)) == 0:  # the others wait in step N+1
                self.writer.wait()
                shutil.copytree(self.out / "run" / "last", self.out / f"last-{self.keep}")
            if metrics["step"] == self.term_at and int(os.environ.get("LOCAL_RANK", 0)) == 0:
                forwarded = terminate_agent()
                while not forwarded:  # the agent's SIGTERM to this rank: fit's handler runs, the stop comes next step
                    time.sleep(0.01)


def terminate_agent() -> list[int]:
    """SIGTERM to this process's torchrun agent (a cluster's stop), which sends SIGTERM on to its ranks; the list
    gains an item once it reached this one."""
    arrived: list[int] = []
    handler = signal.getsignal(signal.SIGTERM)

    def relay(signum: int, frame: object) -> None:
        arrived.append(signum)
        handler(signum, frame)  # type: ignore[operator]

    signal.signal(signal.SIGTERM, relay)
    os.kill(os.getppid(), signal.SIGTERM)
    return arrived


def main(out: str, strategy: str, micro: int, accum: int, *options: str) -> None:
    torch.set_num_threads(1)
    opts = dict(o.split("=") if "=" in o else (o, "1") for o in options)
    cfg = TrainConfig(epochs=2, micro_batch_size=micro, grad_accum_steps=accum, lr=1e-2, warmup_ratio=0.0,
                      strategy=strategy, log_every_steps=1, full_eval_at_end=False, precision="fp32",  # type: ignore[arg-type]
                      save_last=True, save_every_steps=int(opts.get("save_every", 0)) or None,
                      batching="fixed")  # fmt: skip
    data = Rows(ROWS)
    loader = DataLoader(data, batch_size=micro, shuffle=False)  # type: ignore[arg-type]
    record = Losses(Path(out), *(int(opts.get(k, 0)) for k in ("kill_at", "term_at", "keep")))
    m = model()
    result = fit(m, loader, config=cfg, eval_loader=DataLoader(Rows(16), batch_size=4),  # type: ignore[arg-type]
                 run_dir=Path(out) / "run", resume="resume" in opts, callbacks=[record])  # fmt: skip
    seen = [data.seen]
    if dist.is_initialized():  # the whole weights on rank 0 (a collective under FSDP)
        weights = get_model_state_dict(result.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        seen = [[] for _ in range(dist.get_world_size())]
        dist.all_gather_object(seen, data.seen)
    else:
        weights = {k: v.detach().clone() for k, v in result.model.state_dict().items()}
    if int(os.environ.get("RANK", 0)) == 0:
        print(result.summary())
        saved = {"losses": record.losses, "weights": weights, "history": result.history.to_dict("list"),
                 "timing": result.timing, "stop": result.stop_reason, "seen": seen}  # fmt: skip
        torch.save(saved, Path(out) / "result.pt")
    if dist.is_initialized():  # together: no rank tears its gloo pairs down while rank 0 still writes
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:])
