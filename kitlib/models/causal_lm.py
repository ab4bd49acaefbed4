"""A tiny GPT-2 built from a config, with a byte-level BPE trained on the rows, when no pretrained LM is installed."""

from __future__ import annotations

from typing import Any

import torch  # the one importer, kitlib.notebook.tasks.causal_lm, loads torch and transformers at its top
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

TINY_GPT2: dict[str, Any] = {"n_embd": 128, "n_layer": 4, "n_head": 4, "n_inner": 512}


def tiny_causal_lm(tokenizer: PreTrainedTokenizerFast, *, seed: int, n_positions: int) -> nn.Module:
    """A fresh tiny GPT-2 for ``tokenizer`` and ``n_positions``, seeded (RNG untouched); </s> ends replies."""
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=n_positions, bos_token_id=eos, eos_token_id=eos, pad_token_id=pad,
        **TINY_GPT2,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config)
    model.generation_config.pad_token_id = pad
    return model
