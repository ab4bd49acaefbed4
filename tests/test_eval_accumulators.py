"""Issue #30 item 7: the cheap eval's accumulators live on the training device from the start, so a DDP rank that
gets no eval batch (n // world = 0) all-reduces a device tensor (NCCL reduces no CPU tensors)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from kitlib.engine import evaluation
from kitlib.machine.distributed import DistEnv


def test_a_rank_without_eval_batches_all_reduces_tensors_on_the_device(monkeypatch: Any) -> None:
    reduced: list[torch.device] = []

    def all_reduce_sum(value: torch.Tensor, env: DistEnv) -> torch.Tensor:
        reduced.append(value.device)
        return torch.zeros(())

    monkeypatch.setattr(evaluation, "all_reduce_sum", all_reduce_sum)
    device = torch.device("meta")  # stands in for cuda:1: any device but the CPU shows where they were made
    loss = evaluation.evaluate_loss(
        torch.nn.Linear(2, 2), [], loss_fn=lambda m, b: torch.zeros(()), count_fn=lambda b: 1,
        autocast=contextlib.nullcontext, to_device=lambda b: b, env=DistEnv(1, 1, 2, 2), device=device,
    )  # fmt: skip
    assert reduced == [device, device] and loss != loss  # no items on this rank: nan here, the all-reduce decides
