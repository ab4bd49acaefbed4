"""How long a sharded (FSDP2 + DCP) save of ``last/`` holds the training thread: synchronous ``dcp.save`` against
``dcp.async_save`` (kitlib.engine.sharded.save; "sync" waits for its write at once), interleaved, on 2 gloo ranks.

    taskset -c 1 env OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 benchmarks/bench_async_dcp.py [ROUNDS]

Each round: a few training steps, a save of weights + AdamW state (sync or async, alternating), then as many steps
again (an async save writes meanwhile), then the writer's wait. Rank 0 prints medians: the save call (the training
thread held), the steps after it, and the save's whole time until last/ is swapped in.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

from kitlib.engine import checkpoint, sharded
from kitlib.machine.distributed import broadcast_object, dist_env

STEPS = 3  # training steps after each save (what an async write overlaps)


def main(rounds: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    env = dist_env()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)  # fmt: skip
    model = sharded.shard(LlamaForCausalLM(config), "fp32")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 4096, (2, 64), generator=torch.Generator().manual_seed(env.rank))

    def steps() -> float:
        start = time.perf_counter()
        for _ in range(STEPS):
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        return time.perf_counter() - start

    out = Path(tempfile.mkdtemp(prefix="bench-async-dcp-")) if env.is_main else Path()
    out = Path(broadcast_object(str(out), env))
    writer, group = checkpoint.BackgroundWriter(), sharded.saves_group()
    rows: dict[str, list[tuple[float, float, float]]] = {"sync": [], "async": []}
    steps()  # AdamW's state exists from here
    for i in range(2 * rounds + 2):  # interleaved; the first pair warms both paths up and is dropped
        kind = "async" if i % 2 else "sync"
        steps()
        dist.barrier()
        start = time.perf_counter()
        sharded.save(out / "last", model, optimizer, env, writer, group=group, state={"round": i}, meta={"round": i})
        if kind == "sync":  # what a synchronous save holds: the whole write
            writer.wait()
        held = time.perf_counter() - start
        after = steps()
        writer.wait()
        dist.barrier()
        if i >= 2:
            rows[kind].append((held, after, time.perf_counter() - start))
    writer.close()
    sharded.release(group)
    if env.is_main:
        size = sum(p.stat().st_size for p in (out / "last").iterdir()) / 1e6
        params = sum(p.numel() for p in model.parameters()) / 1e6
        print(f"torch {torch.__version__}, 2 ranks (gloo), Llama h256 x4 ({params:.1f}M params), last/ {size:.0f} MB, "
              f"{rounds} rounds each, medians")  # fmt: skip
        print("| save | training thread held (s) | next 3 steps (s) | until last/ swapped in (s) |")
        print("| --- | --- | --- | --- |")
        for kind, values in rows.items():
            held, after, whole = (statistics.median(v[j] for v in values) for j in range(3))
            print(f"| {kind} | {held:.3f} | {after:.3f} | {whole:.3f} |")
        sync, asyn = (statistics.median(v[0] for v in rows[k]) for k in ("sync", "async"))
        print(f"held: async / sync = {asyn / sync:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
