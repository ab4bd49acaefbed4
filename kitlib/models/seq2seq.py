"""A tiny T5 built from a config, with a byte-level BPE trained on the data, when no pretrained model is installed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from kitlib.models.bpe import BPE_VOCAB, train_bpe_tokenizer

# lazy: torch (+1.0 s), transformers (+0.6 s): only building needs them

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedTokenizerFast

TINY_T5: dict[str, Any] = {
    "d_model": 128,
    "d_kv": 32,
    "d_ff": 256,
    "num_layers": 2,
    "num_decoder_layers": 2,
    "num_heads": 4,
}


SHORT_TEXT_CHARS = 48  # median characters per source/target at or below which the tokenizer is byte level


def data_tokenizer(texts: list[str]) -> tuple[PreTrainedTokenizerFast, str]:
    """The tokenizer the rows call for, and why: bytes for short texts, BPE for longer ones (decoding stays short)."""
    short, median = short_texts(texts)
    if short:
        why = f"byte level (median text {median:.0f} characters <= {SHORT_TEXT_CHARS}: short texts)"
        return train_bpe_tokenizer(texts, vocab_size=1), why  # 1: no merges, the byte alphabet and the specials
    return train_bpe_tokenizer(texts, vocab_size=BPE_VOCAB), f"byte-level BPE (median text {median:.0f} characters)"


def short_texts(texts: list[str]) -> tuple[bool, float]:
    """Whether ``texts`` are short (tokenized byte by byte) and their median length in characters."""
    median = float(np.median([len(t) for t in texts])) if texts else 0.0
    return median <= SHORT_TEXT_CHARS, median


def tiny_seq2seq(tokenizer: PreTrainedTokenizerFast, *, seed: int) -> nn.Module:
    """A fresh tiny T5 (``TINY_T5``) for ``tokenizer``'s vocabulary, seeded; the caller's RNG untouched."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    start: dict[str, Any] = {"decoder_start_token_id": pad}  # T5's convention: the decoder starts from <pad>
    config = T5Config(vocab_size=len(tokenizer), pad_token_id=pad, eos_token_id=eos, **start, **TINY_T5)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return T5ForConditionalGeneration(config)
