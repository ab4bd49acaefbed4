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


def test_ddp_eval_shards_keep_every_batch_where_training_shards_stay_even() -> None:
    """A 1-batch validation set on 2 ranks was cut to 0 batches (training's multiple-of-W rule): no eval_loss, no
    best/. The eval's sums are all-reduced once, so its ranks may take different counts."""
    from kitlib.engine.batches import ShardBatches

    for n in (1, 5):
        batches: Any = [[i] for i in range(n)]
        evals = [ShardBatches(batches, rank, 2, even=False) for rank in (0, 1)]
        assert sorted([*evals[0], *evals[1]]) == batches and [len(e) for e in evals] == [len(list(e)) for e in evals]
        train = [list(ShardBatches(batches, rank, 2)) for rank in (0, 1)]
        assert len(train[0]) == len(train[1]) == n // 2
