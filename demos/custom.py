"""The custom-model demo: the reviews competition (demos.reviews) plus ``bilstm.py``, a model of one's own that
00's ``model_factory`` names (``task = "custom"``): a bidirectional LSTM over the tokenizer's ids, max-pooled, with
its own loss (cross-entropy with label smoothing 0.1). It stands for any module a user brings: kitlib tokenizes,
batches by length, trains it with fit (accumulation, precision, checkpoints) and predicts with it.

    paths = make_custom_demo("demo-custom")   # python -m kitlib demo demo-custom --task custom
"""

from __future__ import annotations

import json
from pathlib import Path

from demos import DemoPaths
from demos.reviews import make_demo
from kitlib._files import write_atomic
from kitlib.tasks.scoring import ABOUT_FILE

FACTORY_FILE = "bilstm.py"
PARAMETERS = {"task": "custom", "metric": "accuracy"}  # + model_factory: the full path of the demo's bilstm.py

BILSTM = '''"""A model of one's own for kitlib's task = "custom": build(vocab_size, num_labels, pad_id) -> nn.Module."""

import torch
import torch.nn.functional as F
from torch import nn

from kitlib.models.heads import HeadOutput


class BiLSTMClassifier(nn.Module):
    def __init__(self, vocab_size: int, num_labels: int, pad_id: int, dim: int = 64, hidden: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=pad_id)
        self.lstm = nn.LSTM(dim, hidden, batch_first=True, bidirectional=True)
        self.out = nn.Sequential(nn.Dropout(0.2), nn.Linear(2 * hidden, num_labels))
        self.num_labels = num_labels

    def forward(self, input_ids, attention_mask=None, labels=None):
        hidden, _ = self.lstm(self.embed(input_ids))
        if attention_mask is not None:  # padding never wins the max
            hidden = hidden.masked_fill(attention_mask.unsqueeze(-1) == 0, -1e4)
        logits = self.out(hidden.max(dim=1).values)
        loss = None
        if labels is not None:  # the model's own loss
            if self.num_labels == 1:
                loss = F.mse_loss(logits.squeeze(-1), labels.float())
            else:
                loss = F.cross_entropy(logits, labels, label_smoothing=0.1)
        return HeadOutput(logits, loss)


def build(vocab_size: int, num_labels: int, pad_id: int) -> nn.Module:
    return BiLSTMClassifier(vocab_size, num_labels, pad_id)
'''


def make_custom_demo(dir: str | Path, *, seed: int = 0, test_fraction: float = 0.2, force: bool = False) -> DemoPaths:
    """The reviews demo's files, ``bilstm.py`` and a demo.json naming it by its full path (~1 s)."""
    paths = make_demo(dir, seed=seed, test_fraction=test_fraction, force=force)
    write_atomic(paths.root / FACTORY_FILE, BILSTM)
    about = {"task": "custom", "metric": "accuracy", "parameters": parameters(paths.root)}
    write_atomic(paths.root / ABOUT_FILE, json.dumps(about, indent=1) + "\n")
    return paths


def parameters(root: Path) -> dict[str, str]:
    """00's parameters for the demo in ``root``: a relative model_factory is looked up beside the notebook, so the
    demo names its file by full path."""
    return {**PARAMETERS, "model_factory": f"{(root / FACTORY_FILE).resolve()}:build"}
