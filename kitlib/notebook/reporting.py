"""``report_to``: 02's history rows and verdict to TensorBoard or W&B from the main process; "none" adds nothing."""

from __future__ import annotations

import math
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from kitlib.errors import SetupError, in_setup

# lazy: torch (+1.0 s), wandb (+1 s): only a fit that logs needs them (wandb's cost a guess)

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}  # report_to -> the package it needs


def check_report_to(name: str) -> None:
    """A SetupError naming the fix when ``name``'s package is not installed (00 checks, 02 again before training)."""
    if name in PACKAGES and find_spec(PACKAGES[name]) is None:
        raise SetupError(
            f"report_to = {name!r} needs the {PACKAGES[name]} package, which is not installed. Fix: pip install "
            f"{PACKAGES[name]}, or report_to = 'none' {in_setup('report_to')} (--report-to none)"
        )


class Report:
    """Logs each epoch's history row, and metrics a background eval adds to a row already logged."""

    order = 0

    def __init__(self, to: str, run_dir: Path) -> None:
        check_report_to(to)
        self.to, self.run_dir = to, run_dir
        self._sink: Any = None  # the SummaryWriter or the wandb run, once fit started on the main process
        self._logged = 0  # the last epoch whose row is logged: metrics for it come late (a background eval)

    def on_fit_start(self, loop: Any) -> None:
        from kitlib.machine.distributed import dist_env

        if not dist_env().is_main:
            return
        if self.to == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            self._sink = SummaryWriter(str(self.run_dir.parent / "tensorboard" / self.run_dir.name))
        else:
            import wandb

            self._sink = wandb.init(project="kitlib", name=self.run_dir.name, dir=str(self.run_dir.parent))

    def on_epoch_end(self, record: Mapping[str, Any]) -> None:
        self._logged = int(record["epoch"])
        self._write(self._logged, record)

    def on_metrics(self, epoch: int, metrics: Mapping[str, Any], weights: Any) -> None:
        if epoch <= self._logged:
            self._write(epoch, metrics)

    def _write(self, epoch: int, values: Mapping[str, Any]) -> None:
        numbers = {k: float(v) for k, v in values.items() if _number(v) and k != "epoch"}
        if self._sink is None or not numbers:
            return
        if self.to == "wandb":
            self._sink.log(numbers | {"epoch": epoch})
        for name, value in numbers.items() if self.to == "tensorboard" else ():
            self._sink.add_scalar(name, value, epoch)

    def on_fit_end(self, loop: Any) -> None:
        if self._sink is not None and self.to == "tensorboard":
            self._sink.flush()  # a DDP worker's log ends with its process; 02's verdict follows in this one

    def verdict(self, lines: tuple[str, ...]) -> None:
        """02's verdict lines (after fit: the baseline is judged on the finished run), then the log is closed."""
        if self._sink is None:
            return
        tensorboard = self.to == "tensorboard"
        for line in (n for n in lines if n.startswith(("verdict:", "warning:"))):
            self._sink.add_text("verdict", line) if tensorboard else self._sink.summary.update({"verdict": line})
        self._sink.close() if tensorboard else self._sink.finish()
        self._sink = None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
