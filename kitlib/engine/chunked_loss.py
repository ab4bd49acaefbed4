"""The LM loss in checkpointed chunks, never the full logits, for plain-projection heads (LOSS_CHUNK_MODELS)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn
from torch.distributed.fsdp import FSDPModule

from kitlib.engine.checkpoint import unwrap_model
from kitlib.engine.objective import Batch, hf_loss, is_causal_lm
from kitlib.models import IGNORE_INDEX

# fp32 logits per chunk; backward holds ~4x (64 MB: 330 tokens at 50k vocab; 1,024 tokens held 0.8 GB)
LOSS_CHUNK_BYTES = 64 * 2**20
# model_type -> whether its logits are exactly lm_head(hidden) (checked against the model's own loss in the tests)
LOSS_CHUNK_MODELS = frozenset({"gpt2", "llama", "mistral", "qwen2", "qwen3", "t5", "mt5"})


def chunk_tokens(vocab: int) -> int:
    """Target tokens per chunk for a ``vocab``-wide head: LOSS_CHUNK_BYTES of fp32 logits, at least 64."""
    return max(64, LOSS_CHUNK_BYTES // (4 * vocab))


def chunked_lm_loss(model: nn.Module, batch: Batch, *, chunk: int | None = None) -> torch.Tensor:
    """Mean cross-entropy over scored labels as ``model(**batch).loss``, the head applied ``chunk`` tokens at a time."""
    core = unwrap_model(model)
    # FSDP: the head's weight is a shard outside its forward, so the model's own loss computes it
    if not chunkable(core) or isinstance(core, FSDPModule) or not isinstance(batch, Mapping) or "labels" not in batch:
        return hf_loss(model, batch)
    labels = batch["labels"]
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    if is_causal_lm(core):
        targets = labels[:, 1:]
    else:  # encoder-decoder: the decoder reads the labels shifted right, each position scores its own label
        inputs["decoder_input_ids"] = core.prepare_decoder_input_ids_from_labels(labels=labels)  # type: ignore[operator]
        targets = labels
    with _head_input(core) as captured:
        model(**inputs)  # through the wrapper (DDP's hooks), up to the head
    hidden = captured[0][:, : targets.shape[1]].flatten(0, 1)  # causal: the last position predicts nothing
    targets = targets.flatten()
    head = core.get_output_embeddings()  # type: ignore[operator]
    chunk = chunk or chunk_tokens(head.out_features)
    # Fixed chunks over every position (-100 ignored): boolean indexing would sync per micro-batch
    total = sum(
        torch.utils.checkpoint.checkpoint(
            _chunk_loss, hidden[i : i + chunk], head.weight, head.bias, targets[i : i + chunk], use_reentrant=False
        )
        for i in range(0, len(targets), chunk)
    )
    # nothing scored: 0 / 1, a zero that keeps the graph (and DDP's hooks) whole
    return total / (targets != IGNORE_INDEX).sum().clamp(min=1)


def chunkable(model: nn.Module) -> bool:
    """Whether ``model``'s logits are exactly its output layer applied to its last hidden states."""
    config = getattr(model, "config", None)
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    return getattr(config, "model_type", None) in LOSS_CHUNK_MODELS and isinstance(head, nn.Linear)


def _chunk_loss(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor) -> Any:
    # fp32 logits, as the model's own loss upcasts them: the log-softmax over 50k classes loses digits in half
    logits = F.linear(hidden, weight, bias).float()
    return F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="sum")


@contextlib.contextmanager
def _head_input(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """While open, the output layer records its input and returns a one-element placeholder: no logits computed."""
    head = model.get_output_embeddings()  # type: ignore[operator]
    captured: list[torch.Tensor] = []

    def record(hidden: torch.Tensor) -> torch.Tensor:
        captured.append(hidden)
        return hidden.new_zeros(()).expand(*hidden.shape[:-1], head.out_features)

    head.forward = record
    try:
        yield captured
    finally:
        del head.forward  # the class's forward again
