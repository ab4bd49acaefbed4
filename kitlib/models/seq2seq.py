"""An encoder-decoder for text-to-text tasks when no pretrained one is installed: a byte-level BPE tokenizer trained
on the data and a tiny T5 built from a config.

    tok = train_bpe_tokenizer(questions + queries, vocab_size=2000)
    model = tiny_seq2seq(tok, seed=0)            # T5ForConditionalGeneration, ~1.3 M weights
    text = tok.decode(ids, skip_special_tokens=True)   # exactly the text that was encoded (cased, spacing kept)

Why not MiniLM: its WordPiece tokenizer lowercases and splits punctuation, so a generated SQL string literal
('Paris') or an identifier would come back changed, and the query would select nothing. Byte-level BPE decodes to
the very bytes it encoded. Nothing here is pretrained: what the model knows comes from the training rows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedTokenizerFast

SPECIALS = ("<pad>", "</s>", "<unk>")  # T5's: pad (also the decoder's start token), end of sequence, unknown
TINY_T5: dict[str, Any] = {
    "d_model": 128,
    "d_kv": 32,
    "d_ff": 256,
    "num_layers": 2,
    "num_decoder_layers": 2,
    "num_heads": 4,
}


def train_bpe_tokenizer(texts: Iterable[str], *, vocab_size: int = 2000) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer fitted to ``texts`` (~1 s for 3,000 short texts); every encoding ends in </s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # any byte encodes, even a character training lacked
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tokenizer_from_json(_with_eos(tok).to_str())


def _with_eos(tok: Any) -> Any:
    from tokenizers import processors

    eos = tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", eos)])
    return tok


def tokenizer_from_json(text: str) -> PreTrainedTokenizerFast:
    """The tokenizer ``tokenizer.backend_tokenizer.to_str()`` saved (how 02 and 03 rebuild it from features.json)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(text), pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )


def tokenizer_identity(tokenizer: PreTrainedTokenizerFast) -> str:
    return hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()[:12]


def tiny_seq2seq(tokenizer: PreTrainedTokenizerFast, *, seed: int) -> nn.Module:
    """A freshly initialised tiny T5 (``TINY_T5``) for ``tokenizer``'s vocabulary, seeded; the caller's RNG stream
    is left as it was."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    start: dict[str, Any] = {"decoder_start_token_id": pad}  # T5's convention: the decoder starts from <pad>
    config = T5Config(vocab_size=len(tokenizer), pad_token_id=pad, eos_token_id=eos, **start, **TINY_T5)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return T5ForConditionalGeneration(config)
