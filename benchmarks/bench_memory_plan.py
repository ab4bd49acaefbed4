"""The memory plan (kitlib.plan_memory) against a measured peak: kitlib's own optimizer step on this CPU in fp32,
its live tensor bytes tracked op by op (benchmarks/live_bytes.py), for four model sizes x each measurable strategy
(MEASURABLE: LoRA and QLoRA, 4-bit through bitsandbytes' CPU backend, included).

    nice -n 5 python benchmarks/bench_memory_plan.py          # ~10-25 min on 2 busy cores

Prints the plan and the measurement side by side, and their ratio; the house rule is within 15% (issue #30).
"""

from __future__ import annotations

import time

from live_bytes import MEASURABLE, planned_and_measured
from transformers import BertConfig, LlamaConfig

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


def main() -> None:
    print(f"{'model':<15} {'task':<10} {'tokens':>10} {'strategy':<37} {'plan MB':>8} {'measured':>8} {'ratio':>6}")
    worst = 0.0
    for label, config, task, seq_len, micro, accum in CASES:
        for strategy in MEASURABLE:
            start = time.perf_counter()
            planned, measured = planned_and_measured(
                config, model_kind=task, seq_len=seq_len, micro_batch=micro, accum=accum, strategy=strategy
            )
            ratio = planned / measured
            worst = max(worst, abs(ratio - 1))
            tokens = f"{micro}x{seq_len}x{accum}"
            print(f"{label:<15} {task:<10} {tokens:>10} {strategy:<37} {planned / 1e6:>8.1f} {measured / 1e6:>8.1f} "
                  f"{ratio:>6.2f}  ({time.perf_counter() - start:.0f} s)")  # fmt: skip
    print(f"worst |plan/measured - 1| = {worst:.1%} (house rule: within 15%)")


if __name__ == "__main__":
    main()
