"""The optimizer step's device-side ledger (``StepLedger``: the scheduled LR, the skip on inf/nan, the counts; no host
sync), the batch's move to the device and activation checkpointing. The step itself is ``Loop.train_window``."""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, SupportsIndex

import torch
import torch.utils.checkpoint
from torch import nn

from kitlib.engine.checkpoint import unwrap_model
from kitlib.engine.chunked_loss import chunked_lm_loss
from kitlib.engine.objective import Batch, CountFn, hf_loss
from kitlib.machine import distributed

if TYPE_CHECKING:
    from kitlib.machine.amp import Precision


def to_device(device: torch.device, *, omit_full_masks: bool = False) -> Callable[[Batch], Batch]:
    """Move a batch to ``device``. ``omit_full_masks``: a host ``attention_mask`` of all ones is left out, for losses
    calling ``model(**batch)``: a Hugging Face model then skips the mask without reading it back from the device."""
    # Pinned host memory + non_blocking lets the copy overlap the previous step's kernels on CUDA; on CPU it is a no-op.
    non_blocking = device.type == "cuda"

    def move(batch: Batch) -> Batch:
        if isinstance(batch, torch.Tensor):
            return batch.to(device, non_blocking=non_blocking)
        if isinstance(batch, Mapping):  # dicts and Hugging Face BatchEncoding alike
            return {
                k: move(v) for k, v in batch.items() if not (omit_full_masks and k == "attention_mask" and _full(v))
            }
        if isinstance(batch, list | tuple):
            return type(batch)(move(v) for v in batch)
        return batch

    return move


def _full(mask: Any) -> bool:
    """A host tensor of ones (a device one is kept: reading it would be the sync this avoids). Read through numpy:
    host memory, no torch op (a sync counter watching torch ops sees none)."""
    return isinstance(mask, torch.Tensor) and mask.device.type == "cpu" and bool(mask.numpy().all())


MODEL_LOSSES = (hf_loss, chunked_lm_loss)  # kitlib's losses that pass the batch to the model as keyword arguments


def mask_optional(model: nn.Module) -> bool:
    """The model's forward takes ``attention_mask`` with a default (a Hugging Face model's None): leaving a mask of
    ones out means the same there. A user's module that requires one gets it as ever."""
    found = inspect.signature(unwrap_model(model).forward).parameters.get("attention_mask")
    return found is not None and found.default is not inspect.Parameter.empty


class StepLedger:
    """Each optimizer step's outcome (applied, skipped, skip streak), its scheduled LR and the epoch's item-weighted
    loss sums, on the device: a skipped step does not advance the schedule, and no step waits for the GPU. ``read``
    and the loss reads (``mean``, ``since_mark``, ``state_dict``: one all-reduce under DDP) are the host syncs."""

    def __init__(self, scheduler: torch.optim.lr_scheduler.LambdaLR, total_steps: int, device: torch.device,
                 env: distributed.DistEnv | None = None) -> None:  # fmt: skip
        lrs = [
            [base * rule(step) for rule, base in zip(scheduler.lr_lambdas, scheduler.base_lrs, strict=True)]
            for step in range(total_steps + 1)
        ]
        self.last, self.env = total_steps, env or distributed.DistEnv()
        self.constant = all(row == lrs[0] for row in lrs)  # the groups' floats are every step's LR
        self.marked = (0.0, 0.0)  # the loss sums at the last log (or the epoch's start): a log's loss is the window's
        # The CPU fused kernel reads a tensor lr as a double (bit-identical to a float lr); the CUDA one reads fp32.
        self.table = torch.tensor(lrs, dtype=torch.float64 if device.type == "cpu" else torch.float32).to(device)
        # step's constants: counts * (keep + s * keep_skip) + (add + s * add_skip)
        self._keep, self._keep_skip, self._add, self._add_skip = torch.tensor(
            [[1, 1, 0, 0], [0, 0, 1, 0], [1, 0, 0, 1], [-1, 1, 1, -1]], dtype=torch.float64, device=device
        ).unbind()
        # applied, skipped, current skipped streak, this window applied (1/0); loss sum, items: float64 is exact
        self.counts = torch.zeros(4, dtype=torch.float64, device=device)
        self.sums = torch.zeros(2, dtype=torch.float64, device=device)

    def tally(self, window: list[Batch], count_fn: CountFn) -> tuple[list[Any], Any]:
        """Each micro-batch's item count and the window's total over all ranks, on the device without a host sync:
        counted there, or on the host (shapes) and moved in one non_blocking copy from pinned memory (a pageable copy
        of a Python int, ``torch.as_tensor(n, device=cuda)``, makes the host wait)."""
        counts, device = [count_fn(batch) for batch in window], self.counts.device
        if all(isinstance(c, int | float) for c in counts):
            host = torch.tensor(counts, dtype=torch.float32)
            on = (host.pin_memory() if device.type == "cuda" else host).to(device, non_blocking=True)
        else:
            on = torch.stack([torch.as_tensor(c, dtype=torch.float32, device=device) for c in counts])
        return list(on.unbind()), distributed.all_reduce_sum(on.sum(), self.env)

    def step(self, optimizer: torch.optim.Optimizer, precision: Precision, norm: torch.Tensor,
             losses: list[torch.Tensor], counts: list[Any], items: Any) -> Any:  # fmt: skip
        """The optimizer step at the scheduled LR, skipped where ``norm`` is inf/nan, counted with the window's loss
        (``losses``: each micro-batch's mean over its ``counts``; ``items``: over all ranks); returns applied."""
        found_inf = precision.found_inf(norm)
        with self.scheduled_lr(optimizer):
            precision.apply(optimizer, found_inf)
        # applied += 1-s, skipped += s, streak = (streak+1)*s, window = 1-s (s: 1.0 when skipped): one multiply-add
        skip = found_inf.double()
        self.counts.mul_(torch.addcmul(self._keep, skip, self._keep_skip)).add_(
            torch.addcmul(self._add, skip, self._add_skip)
        )
        applied = skip == 0
        weighted = [loss.float() * count for loss, count in zip(losses, counts, strict=True)]
        loss_sum = weighted[0] if len(weighted) == 1 else torch.stack(weighted).sum()
        # where, not *: a skipped step's loss may be nan
        self.sums.add_(torch.where(applied, torch.stack([loss_sum, items]), 0.0))
        return applied

    @contextlib.contextmanager
    def scheduled_lr(self, optimizer: torch.optim.Optimizer) -> Iterator[None]:
        """Each param group's LR at the applied count, during ``optimizer.step()`` only: between steps the groups keep
        the scheduler's floats (state_dict, get_last_lr) as fit settles it. A constant schedule keeps its floats."""
        if self.constant:
            yield
            return
        lrs: Any = self.table.index_select(0, self.counts[:1].long().clamp_(max=self.last))[0]
        if not getattr(optimizer, "_step_supports_amp_scaling", False):
            lrs = lrs.tolist()  # a host sync: only an optimizer that cannot take its LR as a device tensor
        floats = [group["lr"] for group in optimizer.param_groups]
        for group, lr in zip(optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        try:
            yield
        finally:
            for group, value in zip(optimizer.param_groups, floats, strict=True):
                group["lr"] = value

    def read(self) -> tuple[int, int, int, bool]:
        """(applied, skipped, skipped streak, the last window applied): the host sync."""
        applied, skipped, streak, window = (int(v) for v in self.counts.tolist())
        return applied, skipped, streak, bool(window)

    def _sums(self) -> tuple[float, float]:
        loss, items = self.sums.unbind()
        loss = distributed.all_reduce_sum(loss, self.env)  # the ranks' losses; items: the global count already
        total, count = torch.stack([loss, items]).tolist()  # one read of both
        return total, count

    def mean(self) -> float:
        """The epoch's mean loss so far (nan before any item)."""
        loss, items = self._sums()
        return loss / items if items else math.nan

    def mark(self) -> None:
        self.marked = self._sums()

    def since_mark(self) -> float:
        """The mean loss since the last ``mark`` (or call of this), then marks."""
        (loss, items), (before, before_items) = self._sums(), self.marked
        self.marked = (loss, items)
        return (loss - before) / max(items - before_items, 1e-12)

    def reset(self) -> None:
        """A new epoch: its loss sums start at 0."""
        self.sums.zero_()

    def state_dict(self) -> dict[str, float]:
        """The epoch's loss sums over all ranks (every rank at once); the counts are the loop's ``RunState``."""
        loss, items = self._sums()
        return {"epoch_loss_sum": loss, "epoch_items": items}

    def load_state_dict(self, run: Mapping[str, Any]) -> None:
        """``run``: a saved ``RunState`` with ``state_dict``'s sums (rank 0 holds the ranks' sum, the others none)."""
        loss = float(run.get("epoch_loss_sum", 0.0)) if self.env.is_main else 0.0
        items = float(run.get("epoch_items", 0.0))
        self.counts.copy_(torch.tensor([run["step"], run["skipped"], run["nonfinite_streak"], 0], dtype=torch.float64))
        self.sums.copy_(torch.tensor([loss, items], dtype=torch.float64))


def enable_activation_checkpointing(model: nn.Module, modules: Sequence[str] = ()) -> list[str]:
    """Recompute activations in backward (~30% more compute, far less memory) of ``modules``: submodule names (a
    ModuleList's blocks each) or class names; without names, the Hugging Face models' own switch (a wrapper's inside
    ones), else a ValueError naming the fix. Returns what it enabled."""
    if modules:
        return _checkpoint_named(model, modules)
    # the model, or in a wrapper (a head on a text model) the outermost Hugging Face models inside it
    switches = [m for m in model.modules() if _hf_switch(m)]
    hf = [m for m in switches if not any(m is not o and m in set(o.modules()) for o in switches)]
    if not hf:
        stacks = [name for name, m in model.named_modules() if isinstance(m, nn.ModuleList) and name]
        example = repr(tuple(stacks[:1] or [type(next(iter(model.children()), model)).__name__]))
        raise ValueError(
            f"gradient_checkpointing=True: {type(model).__name__} is not a Hugging Face model and holds none; name the "
            f"blocks to recompute in backward: TrainConfig(gradient_checkpointing=True, checkpoint_modules={example})"
            " (submodule names, a ModuleList's name for each of its blocks, or class names)"
        )
    names = {id(m): name for name, m in model.named_modules()}
    # transformers 5.x renamed gradient_checkpointing_enable (deprecated, removed in v6); 4.x has only the old name.
    # Non-reentrant checkpointing works with DDP, frozen inputs and torch.compile; the reentrant default does not.
    kwargs = {"use_reentrant": False}
    for target in hf:
        if callable(enable := getattr(target, "activation_checkpointing_enable", None)):
            enable(activation_checkpointing_kwargs=kwargs)
        else:
            target.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # type: ignore[operator]
    return [names.get(id(m)) or type(m).__name__ for m in hf]


def _hf_switch(module: nn.Module) -> bool:
    """A Hugging Face model that supports gradient checkpointing (either name of its switch)."""
    names = ("activation_checkpointing_enable", "gradient_checkpointing_enable")
    has = any(callable(getattr(module, name, None)) for name in names)
    return has and getattr(module, "supports_gradient_checkpointing", True) is not False


def _checkpoint_named(model: nn.Module, wanted: Sequence[str]) -> list[str]:
    found: list[str] = []
    for want in wanted:
        hits = [(n, m) for n, m in model.named_modules() if n == want or (type(m).__name__ == want and n)]
        if not hits:
            names = [n for n, _ in model.named_modules() if n and "." not in n]
            classes = sorted({type(m).__name__ for m in model.modules()} - {type(model).__name__})
            raise ValueError(
                f"checkpoint_modules: {type(model).__name__} has no submodule or class named {want!r} (its top-level "
                f"submodules: {names}; classes: {classes})"
            )
        for name, module in hits:
            blocks = list(module.named_children()) if isinstance(module, nn.ModuleList) else [("", module)]
            for child, block in blocks:
                if not getattr(block, "_kitlib_checkpointed", False):
                    _recompute_in_backward(block)
                    found.append(f"{name}.{child}" if child else name)
    return found


def _recompute_in_backward(module: nn.Module) -> None:
    """Route ``module``'s forward through ``torch.utils.checkpoint`` while training: its class becomes a subclass
    (not an instance attribute, so a deep copy runs its own weights), which pickles and copies by its base class
    (``_rebuild_recomputed``). Pinned by tests/test_private_torch_apis.py."""
    base = type(module)

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if not (self.training and torch.is_grad_enabled()):
            return base.forward(self, *args, **kwargs)
        return torch.utils.checkpoint.checkpoint(base.forward, self, *args, use_reentrant=False, **kwargs)

    def __reduce_ex__(self: nn.Module, protocol: SupportsIndex) -> tuple[Any, ...]:
        return _rebuild_recomputed, (base,), self.__getstate__()

    attributes = {"forward": forward, "__reduce_ex__": __reduce_ex__, "_kitlib_checkpointed": True}
    module.__class__ = type(base.__name__, (base,), attributes)


def _rebuild_recomputed(base: type[nn.Module]) -> nn.Module:
    """An empty ``base`` instance recomputed in backward; pickle/deepcopy then set its state (``__setstate__``)."""
    module = base.__new__(base)
    _recompute_in_backward(module)
    return module
