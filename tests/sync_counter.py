"""A CPU-side count of the host syncs a CUDA run would make, usable in any test (and the GPU suite's CPU pass).

On CUDA the host waits for the GPU whenever it needs a value only the device has: ``.item()``/``float()``/
``bool(tensor)`` (``aten._local_scalar_dense``, also behind ``if tensor:`` in a model's own code), ``.tolist()``,
``.cpu()``/``.to("cpu")``, and ops whose output size depends on the data (``nonzero``, boolean indexing,
``masked_select``, ``unique``, ``repeat_interleave`` without ``output_size``). A ``TorchDispatchMode`` sees every aten
op, inside transformers' models and losses too, so counting those ops on a CPU run counts the syncs of a GPU run
(a CPU->CPU copy is not counted: only a read back of a device tensor is a sync).
"""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
# ops whose result the host must read (a scalar) or whose output shape is data-dependent (nonzero inside)
SYNCING = {
    aten._local_scalar_dense.default,
    aten.nonzero.default,
    aten.nonzero_static.default,
    aten.masked_select.default,
    aten._unique2.default,
    aten.unique_consecutive.default,
    aten.repeat_interleave.Tensor,
    aten.is_nonzero.default,
    aten.equal.default,
}


def _bool_index(func: Any, args: Any) -> bool:
    """aten.index / index_put with a boolean mask: nonzero inside the CPU kernel, a sync on CUDA."""
    if func not in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default):
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None)


class SyncCounter(TorchDispatchMode):
    """``count``: syncs seen while active and not ``paused``; ``where``: their innermost non-torch frames (file:line
    function), to name the line that syncs."""

    def __init__(self) -> None:
        super().__init__()
        self.count, self.paused = 0, False
        self.where: Counter[str] = Counter()

    @contextmanager
    def paused_reads(self) -> Iterator[None]:
        """The test's own reads (and the elements of one tolist) are not counted."""
        before, self.paused = self.paused, True
        try:
            yield
        finally:
            self.paused = before

    def _seen(self) -> None:
        if self.paused:
            return
        self.count += 1
        frames = [f for f in traceback.extract_stack()[:-3] if "/torch/" not in f.filename and __file__ != f.filename]
        frame = frames[-1] if frames else None
        self.where[f"{frame.filename.rsplit('/', 2)[-1]}:{frame.lineno} {frame.name}" if frame else "?"] += 1

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in SYNCING or _bool_index(func, args):
            self._seen()
        return func(*args, **(kwargs or {}))


@contextmanager
def counting_syncs() -> Iterator[SyncCounter]:
    """The counter, active while open; ``Tensor.tolist`` counts as one sync (the whole tensor read at once)."""
    mode = SyncCounter()
    tolist = torch.Tensor.tolist

    def counted_tolist(self: torch.Tensor) -> Any:
        mode._seen()
        with mode.paused_reads():
            return tolist(self)

    torch.Tensor.tolist = counted_tolist  # type: ignore[method-assign]
    try:
        with mode:
            yield mode
    finally:
        torch.Tensor.tolist = tolist  # type: ignore[method-assign]
