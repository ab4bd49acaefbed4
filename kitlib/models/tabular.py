"""Numeric and categorical columns beside the text: a small net whose logits add to the text model's (late fusion)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from kitlib.models.heads import HeadOutput, task_loss

# Adam ignores gradient scale: x10 output makes the fresh MLP learn ~10x faster (text lr under-trains it)
TABULAR_LR_MULTIPLIER = 10.0
MAX_CATEGORY_DIM = 16  # embedding width per categorical column: min(16, (categories + 1) // 2 + 1)


class TabularNet(nn.Module):
    """``numeric``/``categorical`` columns -> [batch, labels] logits; the zero-init last layer adds nothing at first."""

    def __init__(
        self, n_numeric: int, cardinalities: Sequence[int], num_labels: int, *, hidden: int = 64, dropout: float = 0.1
    ) -> None:
        super().__init__()
        if n_numeric < 0 or num_labels < 1 or any(c < 0 for c in cardinalities) or n_numeric + len(cardinalities) == 0:
            raise ValueError(f"TabularNet: need columns and num_labels >= 1; got {n_numeric}, {cardinalities}")
        dims = [min(MAX_CATEGORY_DIM, (c + 1) // 2 + 1) for c in cardinalities]
        # id 0 of each table: a category training never saw (or saw once), learned as "other"
        self.embeddings = nn.ModuleList(nn.Embedding(c + 1, d) for c, d in zip(cardinalities, dims, strict=True))
        width = n_numeric + sum(dims)
        last = nn.Linear(hidden, num_labels)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Dropout(dropout), last)

    def forward(self, numeric: torch.Tensor | None, categorical: torch.Tensor | None) -> torch.Tensor:
        parts = [] if numeric is None else [numeric.float()]
        if categorical is not None:
            parts += [embed(categorical[:, i]) for i, embed in enumerate(self.embeddings)]
        return TABULAR_LR_MULTIPLIER * self.mlp(torch.cat(parts, dim=-1))


class WithTabular(nn.Module):
    """A text model (``model(**text) -> .logits``) plus a ``TabularNet`` on the row's other columns."""

    def __init__(self, text_model: nn.Module, tabular: TabularNet, *, regression: bool) -> None:
        super().__init__()
        self.text_model, self.tabular, self.regression = text_model, tabular, regression
        self.config: Any = getattr(text_model, "config", None)  # FLOPs and freeze_layers read the text model's

    @property
    def base_model(self) -> nn.Module:  # what freeze="encoder" and freeze_layers look for, as in HF models
        return getattr(self.text_model, "base_model", self.text_model)

    def get_input_embeddings(self) -> nn.Module:
        return self.text_model.get_input_embeddings()  # type: ignore[operator]

    def gradient_checkpointing_enable(self, **kwargs: Any) -> None:
        self.text_model.gradient_checkpointing_enable(**kwargs)  # type: ignore[operator]

    def forward(
        self,
        numeric: torch.Tensor | None = None,
        categorical: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **text_inputs: Any,
    ) -> HeadOutput:
        logits = self.text_model(**text_inputs).logits.float() + self.tabular(numeric, categorical)
        return HeadOutput(logits, None if labels is None else task_loss(logits, labels, regression=self.regression))
