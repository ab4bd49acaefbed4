"""HF-like classification heads (``.logits``, ``.loss`` given labels): ``TextHead`` and ``MeanPoolClassifier``."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# Adam ignores gradient scale: the bag's zero-init weights learn 20x faster, with no second parameter group
NGRAM_LR_MULTIPLIER = 20.0


@dataclass
class HeadOutput:
    logits: torch.Tensor
    loss: torch.Tensor | None = None


def masked_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[batch, tokens, dim] -> [batch, dim]: the mean over the tokens the mask keeps (padding contributes nothing)."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)


def task_loss(logits: torch.Tensor, labels: torch.Tensor, *, regression: bool) -> torch.Tensor:
    """MSE on one output for regression, else cross-entropy; in fp32 whatever autocast computed the logits in."""
    if regression:
        return F.mse_loss(logits.squeeze(-1).float(), labels.float())
    return F.cross_entropy(logits.float(), labels)


class TextHead(nn.Module):
    """Standardised ``embeddings`` -> MLP, plus an n-gram bag -> linear; MSE for ``regression``, else cross-entropy."""

    mean: torch.Tensor  # buffers, declared for the type checker
    std: torch.Tensor

    def __init__(
        self,
        dim: int,
        num_labels: int,
        *,
        n_buckets: int = 0,
        hidden: int = 256,
        dropout: float = 0.1,
        regression: bool = False,
        mean: torch.Tensor | None = None,
        std: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        if dim < 1 or num_labels < 1 or n_buckets < 0:
            raise ValueError(f"TextHead: need dim >= 1, num_labels >= 1, n_buckets >= 0; got {dim}, {num_labels}")
        self.regression = regression
        self.register_buffer("mean", torch.zeros(dim) if mean is None else mean.detach().float().clone())
        self.register_buffer("std", torch.ones(dim) if std is None else std.detach().float().clamp(min=1e-6))
        self.mlp = nn.Sequential(
            nn.Dropout(dropout), nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, num_labels)
        )
        self.ngrams = nn.EmbeddingBag(n_buckets, num_labels, mode="sum") if n_buckets else None
        if self.ngrams is not None:
            nn.init.zeros_(self.ngrams.weight)  # starts as the MLP alone; an unseen gram adds nothing

    def forward(
        self,
        embeddings: torch.Tensor,
        ngram_ids: torch.Tensor | None = None,
        ngram_weights: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> HeadOutput:
        logits = self.mlp((embeddings.float() - self.mean) / self.std)
        if self.ngrams is not None:
            if ngram_ids is None or ngram_weights is None:
                raise ValueError("this head was built with n-grams: pass ngram_ids and ngram_weights")
            bag = self.ngrams(ngram_ids, per_sample_weights=ngram_weights.to(self.ngrams.weight.dtype))
            logits = logits + NGRAM_LR_MULTIPLIER * bag
        return HeadOutput(logits, None if labels is None else task_loss(logits, labels, regression=self.regression))


class RowDataset(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Rows of equally long tensors as dict batches (what ``model(**batch)`` takes)."""

    def __init__(self, **columns: torch.Tensor) -> None:
        lengths = {name: len(t) for name, t in columns.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"RowDataset: columns differ in length: {lengths}")
        self.columns = columns

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {name: t[i] for name, t in self.columns.items()}


class MeanPoolClassifier(nn.Module):
    """A sentence-transformers encoder with a new linear head on mean-pooled tokens; MSE for 1 label."""

    def __init__(self, encoder: nn.Module, num_labels: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.encoder, self.num_labels = encoder, num_labels
        _drop_pooler(encoder)
        self.config: Any = getattr(encoder, "config")  # noqa: B009
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(int(self.config.hidden_size), num_labels)

    @property
    def base_model(self) -> nn.Module:  # where freeze="encoder" and freeze_layers look, as for HF models
        return self.encoder

    def get_input_embeddings(self) -> nn.Module:
        return self.encoder.get_input_embeddings()  # type: ignore[operator]

    def gradient_checkpointing_enable(self, **kwargs: Any) -> None:
        self.encoder.gradient_checkpointing_enable(**kwargs)  # type: ignore[operator]

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **encoder_kwargs: Any,
    ) -> HeadOutput:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **encoder_kwargs)[0]
        logits = self.classifier(self.dropout(masked_mean(hidden, attention_mask)))
        regression = self.num_labels == 1
        return HeadOutput(logits, None if labels is None else task_loss(logits, labels, regression=regression))


def _drop_pooler(encoder: nn.Module) -> None:
    """Remove the [CLS] pooler a mean-pooled head never reads (DDP refuses gradient-less weights); else freeze it."""
    pooler = getattr(encoder, "pooler", None)
    if not isinstance(pooler, nn.Module):
        return
    if "add_pooling_layer" in inspect.signature(type(encoder).__init__).parameters:
        encoder.pooler = None  # type: ignore[assignment]  # what add_pooling_layer=False builds
    else:
        pooler.requires_grad_(False)
