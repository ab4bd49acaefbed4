"""The chunked LM loss (kitlib.engine.chunked_loss): the same loss and gradients as the model's own, without the
batch x length x vocabulary logits; causal-lm and seq2seq train with it."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kitlib.engine.chunked_loss import chunked_lm_loss

IGNORE = -100


def _model(kind: str) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    small: dict[str, dict[str, Any]] = {
        "gpt2": {"n_embd": 32, "n_layer": 2, "n_head": 2, "vocab_size": 97, "n_positions": 64},
        "llama": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                  "num_key_value_heads": 1, "vocab_size": 97},
        "qwen2": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                  "num_key_value_heads": 2, "vocab_size": 97},
        "t5": {"d_model": 32, "d_ff": 64, "d_kv": 16, "num_layers": 2, "num_heads": 2, "vocab_size": 97,
               "decoder_start_token_id": 0, "pad_token_id": 0},
    }  # fmt: skip
    torch.manual_seed(0)
    config = AutoConfig.for_model(kind, **small[kind])
    auto = AutoModelForSeq2SeqLM if kind == "t5" else AutoModelForCausalLM
    model = auto.from_config(config)
    model.eval()  # no dropout: the two losses see the same network
    return model


def _batch(kind: str) -> dict[str, torch.Tensor]:
    """Rows of unequal length: -100 on each row's prompt and on the right padding."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 97, (3, 21), generator=generator)
    mask = torch.ones_like(ids)
    labels = ids.clone()
    for row, (prompt, length) in enumerate([(5, 21), (9, 14), (2, 8)]):
        mask[row, length:] = 0
        labels[row, length:] = IGNORE
        if kind != "t5":
            labels[row, :prompt] = IGNORE
    if kind == "t5":  # targets of their own
        labels = torch.where(labels == IGNORE, labels, torch.randint(3, 97, labels.shape, generator=generator))
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen2", "t5"])
def test_chunked_loss_and_gradients_equal_the_models_own(kind: str) -> None:
    model, batch = _model(kind), _batch(kind)
    own = model(**batch).loss
    own.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    chunked = chunked_lm_loss(model, batch, chunk=7)  # several chunks and a short last one
    chunked.backward()
    torch.testing.assert_close(chunked, own, rtol=1e-5, atol=1e-6)
    for name, grad in expected.items():
        torch.testing.assert_close(dict(model.named_parameters())[name].grad, grad, rtol=1e-4, atol=1e-6, msg=name)
    assert "forward" not in vars(model.get_output_embeddings())  # the head is put back


def test_the_logits_are_never_materialised() -> None:
    from benchmarks.live_bytes import LiveBytes

    model, batch = _model("llama"), _batch("llama")
    logits_bytes = batch["input_ids"].numel() * 97 * 4
    peaks = []
    for loss_fn in (lambda m, b: m(**b).loss, lambda m, b: chunked_lm_loss(m, b, chunk=4)):
        with LiveBytes() as live:
            live.hold(model.parameters())
            loss_fn(model, batch).backward()
        model.zero_grad(set_to_none=True)
        peaks.append(live.peak)
    assert peaks[0] - peaks[1] > logits_bytes  # logits, log-softmax and their gradients gone; 4 x 97 at a time


@pytest.mark.parametrize("task", ["causal-lm", "seq2seq"])
def test_generating_tasks_train_with_the_chunked_loss(task: str) -> None:
    from kitlib.data.tables import TargetSpec
    from kitlib.notebook.tasks import get_task

    assert get_task(task).loss_fn(TargetSpec("sequence", 0)) is chunked_lm_loss
