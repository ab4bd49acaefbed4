"""Padding-free packing (kitlib.data.packing): what a packed example sees, what the loss counts, which rows go where."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kitlib.data.packing import PackingCollator
from kitlib.data.samplers import PackingSampler
from kitlib.engine.objective import default_count_fn, real_tokens
from kitlib.models import IGNORE_INDEX
from kitlib.notebook.tasks.causal_lm import SequenceCollator


def _llama(vocab: int = 300) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    model.config.use_cache = False  # as kitlib's causal-LM task trains it: a cache turns the packed mask off
    return model


def _example(n: int, prompt: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.random.default_rng(seed).integers(5, 300, n)
    labels = ids.copy()
    labels[:prompt] = IGNORE_INDEX
    return ids, labels


@pytest.mark.parametrize("width", [None, 64])
def test_a_packed_example_sees_only_itself(width: int | None) -> None:
    """Its logits are the same alone and packed after a neighbour, in one row or in rows of a width."""
    model = _llama()
    a, b, c = _example(20, 5, 0), _example(30, 8, 1), _example(50, 9, 2)
    batch = PackingCollator(width)([b, a, c])
    with torch.no_grad():
        alone = model(input_ids=torch.as_tensor(a[0])[None]).logits[0]
        packed = model(**{k: v for k, v in batch.items() if k != "labels"}).logits[0, 30:50]
    assert torch.allclose(alone, packed, atol=1e-5), (alone - packed).abs().max()
    assert batch["input_ids"].shape[0] == (1 if width is None else 2)  # c does not fit beside b and a in 64


def test_the_packed_loss_is_the_padded_loss_token_weighted() -> None:
    """The mean over the same scored tokens: the loss and fit's token count equal the padded batch's."""
    model = _llama()
    items = [_example(20, 5, 0), _example(33, 8, 1), _example(7, 2, 2)]
    packed, padded = PackingCollator(40, pad_to_multiple_of=8)(items), SequenceCollator(0)(items)
    count = default_count_fn(model)
    assert int(count(packed)) == int(count(padded)) == sum(int((y[1:] != IGNORE_INDEX).sum()) for _, y in items)
    with torch.no_grad():
        assert torch.allclose(model(**packed).loss, model(**padded).loss, atol=1e-5)
    assert int(real_tokens(packed)) == packed["input_ids"].numel()  # no attention mask: fit counts every token


def test_the_sampler_packs_every_example_once_within_the_width() -> None:
    lengths = np.random.default_rng(0).integers(1, 100, 500)
    sampler = PackingSampler(lengths, 128, rows=4, seed=3)
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(500))
    collate = PackingCollator(128)
    items = [(np.zeros(n), None) for n in lengths]
    shapes = [collate([items[i] for i in b])["input_ids"].shape for b in batches]
    assert all(rows <= 4 and width <= 128 for rows, width in shapes)
    assert sum(lengths) / sum(r * w for r, w in shapes) > 0.9  # first-fit decreasing: little padding left
    assert batches == list(PackingSampler(lengths, 128, rows=4, seed=3))  # deterministic for (seed, epoch)
    sampler.set_epoch(1)
    assert list(sampler) != batches
