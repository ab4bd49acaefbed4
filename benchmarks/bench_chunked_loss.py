"""Peak memory of a training step with the model's own LM loss vs kitlib's chunked loss (kitlib.engine.chunked_loss):
a Llama-shaped causal LM with a 50k vocabulary and a small hidden size (so it runs on a CPU), rows of 1,024 tokens,
kitlib's own step (fp32, fused AdamW), live tensor bytes tracked op by op (benchmarks/live_bytes.py).

    nice -n 5 python benchmarks/bench_chunked_loss.py      # ~1 min on 2 busy cores

Two label layouts: every token scored (pre-training style), and SFT style (the first half of each row is the prompt,
-100: never projected by the chunked loss). The plan's figures (kitlib.plan_memory) are printed beside.
"""

from __future__ import annotations

import time

import torch
from live_bytes import step_peak
from transformers import LlamaConfig

from kitlib.doctor.memory_plan import plan_memory
from kitlib.engine.chunked_loss import chunked_lm_loss
from kitlib.engine.objective import hf_loss

VOCAB, TOKENS, ROWS = 50_257, 1024, 2
CONFIG = LlamaConfig(hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=4, vocab_size=VOCAB)  # fmt: skip


def window(prompt: int) -> list[dict[str, torch.Tensor]]:
    ids = torch.randint(4, VOCAB, (ROWS, TOKENS), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[:, :prompt] = -100
    return [{"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}]


def main() -> None:
    from transformers import AutoModelForCausalLM

    fit = {}
    for chunked in (False, True):
        plan = plan_memory(CONFIG, hardware="CPU", seq_len=TOKENS, model_kind="decoder", micro_batch=ROWS, accum=1,
                           chunked_loss=chunked)  # fmt: skip
        fit[chunked] = next(f.peak for f in plan.fits if f.strategy.name == "fp32 full fine-tune")
    print(f"Llama-shaped, hidden 128 x 2 blocks, vocab {VOCAB:,}, {ROWS} rows x {TOKENS} tokens, one step, fp32 AdamW")
    print(f"{'labels':<26} {'model own loss':>15} {'chunked':>10} {'saved':>7}   plan: own / chunked (all scored)")
    for name, prompt in (("every token scored", 0), ("SFT: half is prompt", TOKENS // 2)):
        peaks = []
        for loss_fn in (hf_loss, chunked_lm_loss):
            torch.manual_seed(0)
            start = time.perf_counter()
            peaks.append(step_peak(AutoModelForCausalLM.from_config(CONFIG), window(prompt), loss_fn=loss_fn))
            print(f"  ({loss_fn.__name__}: {time.perf_counter() - start:.0f} s)")
        planned = f"{fit[False] / 1e6:.0f} / {fit[True] / 1e6:.0f} MB" if prompt == 0 else ""
        saved = 1 - peaks[1] / peaks[0]
        print(f"{name:<26} {peaks[0] / 1e6:>12.0f} MB {peaks[1] / 1e6:>7.0f} MB {saved:>6.0%}   {planned}")


if __name__ == "__main__":
    main()
