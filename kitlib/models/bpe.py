"""A byte-level BPE tokenizer trained on the data for the tiny models: decodes to the very bytes it encoded."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

# lazy: transformers (+0.6 s): only wrapping a tokenizer needs it

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

SPECIALS = ("<pad>", "</s>", "<unk>")  # padding (T5's decoder start token too), end of sequence, unknown
BPE_VOCAB = 2000  # tokens of a BPE trained on the rows (the from-scratch models' vocabulary)


def train_bpe_tokenizer(
    texts: Iterable[str], *, vocab_size: int = BPE_VOCAB, add_eos: bool = True
) -> PreTrainedTokenizerFast:
    """A byte-level BPE fitted to ``texts``; ``add_eos``: encodings end in </s> (else bare, as causal-LM prompts)."""
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
    if add_eos:
        eos = tok.token_to_id("</s>")
        tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", eos)])
    return tokenizer_from_json(tok.to_str())


def tokenizer_from_json(text: str) -> PreTrainedTokenizerFast:
    """The tokenizer ``tokenizer.backend_tokenizer.to_str()`` saved (how 02 and 03 rebuild it from features.json)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(text), pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )


def tokenizer_identity(tokenizer: PreTrainedTokenizerFast) -> str:
    return hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()[:12]
