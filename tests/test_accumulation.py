"""Gradient accumulation equals one big batch: the same parameter update, in fp32, to tight tolerance."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from kitlib import TrainConfig, fit


def _regression_data(n: int = 40) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g)
    y = x @ torch.randn(6, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def _mlp() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))


def _mse(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def _train(model: nn.Module, data: TensorDataset, micro: int, accum: int, hw, **kw) -> nn.Module:
    cfg = TrainConfig(
        epochs=1,
        micro_batch_size=micro,
        grad_accum_steps=accum,
        lr=1e-2,
        warmup_ratio=0.0,
        schedule="constant",
        grad_clip=0.5,
        precision="fp32",
        log_every_steps=1,
        **kw,
    )
    loader = DataLoader(data, batch_size=micro, shuffle=False)
    return fit(model, loader, config=cfg, loss_fn=_mse, hw=hw).model


def test_micro8_x_accum4_equals_batch32_including_short_last_window(cpu_hw) -> None:
    data = _regression_data(40)  # windows of 32 rows, then a short one of 8 rows
    accumulated = _train(_mlp(), data, micro=8, accum=4, hw=cpu_hw)
    big = _train(_mlp(), data, micro=32, accum=1, hw=cpu_hw)
    untouched = _mlp()
    for a, b, u in zip(accumulated.parameters(), big.parameters(), untouched.parameters(), strict=True):
        assert not torch.allclose(a, u)  # training moved the weights
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_wrong_normalisation_would_be_caught(cpu_hw) -> None:
    """The equivalence above is sensitive: dividing by the micro-step count instead of items breaks it
    (AdamW is nearly scale-invariant, so the difference is small, but far outside the tolerance)."""
    data = _regression_data(36)  # last window has one micro-batch of 4 rows: weighting matters
    accumulated = _train(_mlp(), data, micro=8, accum=4, hw=cpu_hw)
    naive = _mlp()
    opt = torch.optim.AdamW(naive.parameters(), lr=1e-2, weight_decay=0.0)
    loader = DataLoader(data, batch_size=8)
    batches = list(loader)
    for start in range(0, len(batches), 4):
        window = batches[start : start + 4]
        for batch in window:
            (_mse(naive, batch) / 4).backward()  # the classic bug: ignores that the last window is short
        torch.nn.utils.clip_grad_norm_(naive.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
    close = [
        torch.allclose(a, b, rtol=1e-5, atol=1e-6)
        for a, b in zip(accumulated.parameters(), naive.parameters(), strict=True)
    ]
    assert not all(close)  # the tolerance used above tells the two apart


class TinyTokenModel(nn.Module):
    """Per-token classifier: a token-weighted loss where micro-batches hold different numbers of real tokens."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.emb = nn.Embedding(20, 8)
        self.out = nn.Linear(8, 5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(ids))


def _token_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    ids, labels = batch
    logits = model(ids)
    return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


def _token_count(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return (batch[1] != -100).sum()


def test_token_weighted_loss_accumulates_like_one_batch(cpu_hw) -> None:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 20, (24, 7), generator=g)
    labels = torch.randint(0, 5, (24, 7), generator=g)
    lengths = torch.randint(1, 8, (24,), generator=g)  # very uneven real-token counts per row
    labels[torch.arange(7)[None, :] >= lengths[:, None]] = -100
    data = TensorDataset(ids, labels)

    def run(micro: int, accum: int) -> nn.Module:
        cfg = TrainConfig(
            epochs=1,
            micro_batch_size=micro,
            grad_accum_steps=accum,
            lr=5e-2,
            warmup_ratio=0.0,
            schedule="constant",
            grad_clip=None,
            precision="fp32",
        )
        loader = DataLoader(data, batch_size=micro)
        return fit(TinyTokenModel(), loader, config=cfg, loss_fn=_token_loss, count_fn=_token_count, hw=cpu_hw).model

    accumulated, big = run(4, 6), run(24, 1)
    for a, b in zip(accumulated.parameters(), big.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
