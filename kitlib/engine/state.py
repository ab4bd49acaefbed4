"""Where a run is: the loop's position, the step counts and the monitored metric's verdicts (resume state)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kitlib.config import TrainConfig


@dataclass
class RunState:
    """The loop's position and verdicts: what a resumed run needs besides weights, optimizer and the epoch's loss sums.
    ``epoch`` counts the epochs completed (0-based index of the running one); everything shown is 1-based.
    ``step``/``skipped``/``nonfinite_streak`` are exact after ``Loop.settle``; ``judge`` updates ``best*``."""

    epoch: int = 0
    batch_in_epoch: int = 0  # micro-batches of `epoch` already consumed (per rank)
    step: int = 0  # optimizer steps applied
    skipped: int = 0
    nonfinite_streak: int = 0
    best: float | None = None
    best_epoch: int | None = None  # 1-based
    evals_since_best: int = 0
    judged: int = 0  # the last epoch (1-based) whose monitored metric was judged: each epoch is judged once
    verdict: int = 0  # the epoch the latest metrics judged (0: they judged none), for ``is_best``
    history: list[dict[str, Any]] = field(default_factory=list)
    step_evals: list[dict[str, Any]] = field(default_factory=list)  # eval_every_steps: epoch, step, eval_loss

    def judge(self, epoch: int, value: float, cfg: TrainConfig) -> None:
        """Epoch ``epoch``'s monitored ``value`` arrived: a new best, or one more evaluation without improvement. The
        first value of an epoch is its verdict: a background eval that reports the monitor too, after the epoch's
        row did, would count that epoch twice (early stopping a run that improves every epoch)."""
        if epoch <= self.judged:  # metrics arrive in epoch order (Loop.collect)
            return
        self.judged = self.verdict = epoch
        if math.isnan(value) or (
            self.best is not None
            and not (value < self.best - cfg.min_delta if cfg.mode == "min" else value > self.best + cfg.min_delta)
        ):
            self.evals_since_best += 1
            return
        self.best, self.best_epoch, self.evals_since_best = value, epoch, 0

    def is_best(self, epoch: int) -> bool:
        """Whether the metrics of ``epoch`` just judged made it the best (true in ``on_metrics`` right after; not for
        a later value of an epoch judged already, whose weights the model no longer holds)."""
        return self.verdict == epoch and self.best_epoch == epoch and self.evals_since_best == 0
