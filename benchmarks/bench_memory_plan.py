"""The memory plan (kitlib.plan_memory) against a measured peak: kitlib's own optimizer step on this CPU in fp32,
its live tensor bytes tracked op by op (benchmarks/live_bytes.py), for four model sizes x each measurable strategy
(MEASURABLE: LoRA and QLoRA, 4-bit through bitsandbytes' CPU backend, included); then the sharded rows: FSDP2
(``fully_shard`` per decoder layer, then the root) over 2 CPU processes with gloo, each rank's peak measured.

    nice -n 5 python benchmarks/bench_memory_plan.py            # ~10-25 min on 2 busy cores
    nice -n 5 python benchmarks/bench_memory_plan.py --sharded  # the FSDP rows only, ~2-4 min

Prints the plan and the measurement side by side, and their ratio; the house rule is within 15% (issue #30).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

import torch
from live_bytes import MEASURABLE, LiveBytes, planned_and_measured
from transformers import BertConfig, LlamaConfig

from kitlib.doctor.memory_plan import plan_memory

CASES = [  # (label, config, task, seq_len, micro-batch, accumulation)
    ("Llama h128 x2", LlamaConfig(hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=4, vocab_size=8000), "decoder", 256, 2, 1),
    ("Llama h256 x4", LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
                                  num_key_value_heads=8, vocab_size=8000), "decoder", 256, 2, 2),
    ("Llama h384 x6", LlamaConfig(hidden_size=384, intermediate_size=1024, num_hidden_layers=6,
                                  num_attention_heads=6, num_key_value_heads=6, vocab_size=16000),
     "decoder", 512, 1, 2),
    ("BERT h384 x6", BertConfig(hidden_size=384, intermediate_size=1536, num_hidden_layers=6, num_attention_heads=12,
                                vocab_size=30522), "encoder", 128, 8, 1),
]  # fmt: skip
WORLD = 2  # CPU processes of the sharded rows (gloo)
SHARDED = [(label, seq_len, micro, accum, ckpt) for label, _, task, seq_len, micro, accum in CASES[:3]
           if task == "decoder" for ckpt in (False, True)]  # fmt: skip


class ShardedLiveBytes(LiveBytes):
    """LiveBytes for FSDP2: a DTensor counts as its local shard, and the bytes are summed over the live storages
    after every op, since FSDP2 allocates and frees its all-gather outputs by resizing one storage in place
    (``untyped_storage().resize_``, outside any op) and then hands it to the all-gather as an ``out`` argument."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: dict[int, Any] = {}  # StorageImpl address (stable across resizes) -> weakref of the storage

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.hold([out, args, kwargs])
        return out

    def hold(self, tensors: Any) -> None:
        from torch.distributed.tensor import DTensor
        from torch.utils import _pytree as pytree

        for t in pytree.tree_leaves(list(tensors)):
            t = t._local_tensor if isinstance(t, DTensor) else t
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                if storage._cdata not in self.storages:
                    self.storages[storage._cdata] = weakref.ref(storage)
                    weakref.finalize(storage, self.storages.pop, storage._cdata, None)
        self.current = sum(s.nbytes() for ref in list(self.storages.values()) if (s := ref()) is not None)
        self.peak = max(self.peak, self.current)


def _rank(rank: int, port: int, folder: str) -> None:
    """One rank of the sharded rows: each case's model sharded per decoder layer then the root, one AdamW step to
    create the states, then the measured step (fp32, micro-batches of its own random tokens, fused AdamW, gradients
    set to None)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaForCausalLM

    from kitlib.engine.step import enable_activation_checkpointing

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    configs = {label: config for label, config, *_ in CASES}
    peaks = []
    for label, seq_len, micro, accum, ckpt in SHARDED:
        config = configs[label]
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
        if ckpt:
            enable_activation_checkpointing(model)
        for block in model.model.layers:
            fully_shard(block)
        fully_shard(model)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        generator = torch.Generator().manual_seed(rank)
        window = [torch.randint(4, config.vocab_size, (micro, seq_len), generator=generator) for _ in range(accum)]
        _step(model, optimizer, window)  # creates the AdamW states
        with ShardedLiveBytes() as live:
            live.hold([*model.parameters(), *model.buffers(), optimizer.state_dict()["state"], window])
            _step(model, optimizer, window)
        peaks.append(live.peak)
    Path(folder, f"{rank}.json").write_text(json.dumps(peaks))
    dist.destroy_process_group()


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, window: list[torch.Tensor]) -> None:
    for ids in window:  # FSDP2 reduce-scatters after each micro-batch's backward (its default)
        (model(input_ids=ids, labels=ids).loss / len(window)).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def sharded_rows() -> list[tuple[str, float, list[int]]]:
    """(the row's label, the plan's FSDP peak per rank, each rank's measured peak) for SHARDED, the ranks spawned."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_rank, args=(port, folder), nprocs=WORLD)
        measured = [json.loads(Path(folder, f"{r}.json").read_text()) for r in range(WORLD)]
    configs = {label: config for label, config, *_ in CASES}
    rows = []
    for i, (label, seq_len, micro, accum, ckpt) in enumerate(SHARDED):
        plan = plan_memory(configs[label], hardware="CPU", world_size=WORLD, seq_len=seq_len, model_kind="decoder",
                           micro_batch=micro, accum=accum, chunked_loss=False)  # fmt: skip
        name = f"FSDP ({WORLD} shards): fp32 full fine-tune" + (" + checkpointing" if ckpt else "")
        fit = next(f for f in plan.fits if f.strategy.name == name)
        rows.append((f"{label} {micro}x{seq_len}x{accum} {name}", fit.peak, [m[i] for m in measured]))
    return rows


def main() -> None:
    worst = 0.0
    if "--sharded" not in sys.argv:
        print(f"{'model':<15} {'task':<10} {'tokens':>10} {'strategy':<37} {'plan MB':>8} {'measured':>8} {'ratio':>6}")
        for label, config, task, seq_len, micro, accum in CASES:
            for strategy in MEASURABLE:
                start = time.perf_counter()
                planned, measured = planned_and_measured(
                    config, model_kind=task, seq_len=seq_len, micro_batch=micro, accum=accum, strategy=strategy
                )
                ratio = planned / measured
                worst = max(worst, abs(ratio - 1))
                tokens = f"{micro}x{seq_len}x{accum}"
                print(f"{label:<15} {task:<10} {tokens:>10} {strategy:<37} {planned / 1e6:>8.1f} "
                      f"{measured / 1e6:>8.1f} {ratio:>6.2f}  ({time.perf_counter() - start:.0f} s)")  # fmt: skip
    print(f"\n{'sharded row (per rank, gloo)':<76} {'plan MB':>8} {'rank 0':>8} {'rank 1':>8} {'ratio':>6}")
    for label, planned, peaks in sharded_rows():
        ratio = planned / max(peaks)
        worst = max(worst, abs(ratio - 1))
        print(f"{label:<76} {planned / 1e6:>8.1f} {peaks[0] / 1e6:>8.1f} {peaks[1] / 1e6:>8.1f} {ratio:>6.2f}")
    print(f"worst |plan/measured - 1| = {worst:.1%} (house rule: within 15%)")


if __name__ == "__main__":
    main()
