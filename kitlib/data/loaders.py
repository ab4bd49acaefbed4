"""DataLoader factories with hardware-aware defaults, a dynamic-padding collate and a pre-tokenised dataset."""

from __future__ import annotations

import multiprocessing
import os
import random
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from kitlib._files import nbytes
from kitlib.data.lengths import suggest_max_length
from kitlib.data.packing import PackingCollator
from kitlib.data.samplers import (
    BucketSampler,
    PackingSampler,
    RandomBatchSampler,
    SortedBatchSampler,
    TokenBudgetSampler,
    as_lengths,
    packing_layout,
    round_up,
)
from kitlib.machine.distributed import dist_env
from kitlib.models import IGNORE_INDEX

if TYPE_CHECKING:
    from kitlib.config import TrainConfig
    from kitlib.machine.hardware import HardwareInfo

MAX_WORKERS = 4  # collating 32 pre-tokenised rows costs ~0.3 ms: 4 workers keep any single GPU fed
SHM_HEADROOM = 4  # /dev/shm must hold 4x the batches in flight (torch keeps one segment per tensor, plus fragments)


class TokenDataset(Dataset[Any]):
    """Token id rows stored flat (ids + offsets: forked workers share pages), optional labels; items (ids, label)."""

    def __init__(
        self,
        tokens: Any,
        labels: Sequence[Any] | np.ndarray | None = None,
        *,
        pad_id: int = 0,
        side: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        ids, offsets = getattr(tokens, "ids", None), getattr(tokens, "offsets", None)
        if ids is None or offsets is None:
            seqs = [np.asarray(s, dtype=np.int64).reshape(-1) for s in tokens]
            offsets = np.cumsum([0, *map(len, seqs)])
            ids = np.concatenate([np.zeros(0, dtype=np.int64), *seqs])
        self.ids, self.offsets = np.asarray(ids), np.asarray(offsets, dtype=np.int64)
        self.labels = None if labels is None else np.asarray(labels)
        self.pad_id = pad_id
        if self.labels is not None and len(self.labels) != len(self):
            raise ValueError(f"{len(self.labels)} labels for {len(self)} token rows: they must match one to one")
        # Per-row side inputs: items become mappings the collator stacks by name for ``model(**batch)``
        self.side = dict(side or {})
        for name, array in self.side.items():
            if len(array) != len(self):
                raise ValueError(f"side input {name!r} has {len(array)} rows for {len(self)} token rows")

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> Any:
        row = self.ids[self.offsets[index] : self.offsets[index + 1]]
        if self.side:
            labels = {} if self.labels is None else {"labels": self.labels[index]}
            return {"input_ids": row, **labels, **{k: v[index] for k, v in self.side.items()}}
        return row if self.labels is None else (row, self.labels[index])


class PaddingCollator:
    """Pad a batch to its longest row (or ``fixed_length``) -> input_ids, attention_mask, labels; long rows cut."""

    def __init__(
        self,
        pad_id: int = 0,
        pad_to_multiple_of: int = 8,
        *,
        max_length: int | None = None,
        fixed_length: int | None = None,
    ) -> None:
        self.pad_id, self.pad_to_multiple_of = pad_id, max(1, pad_to_multiple_of)
        self.max_length, self.fixed_length = max_length, fixed_length

    def __call__(self, items: Sequence[Any]) -> dict[str, torch.Tensor]:
        rows: list[np.ndarray] = []
        labels: list[Any] = []
        side: dict[str, list[Any]] = {}
        for item in items:
            if isinstance(item, Mapping):  # fixed-size per-row inputs besides the tokens, stacked as they are
                for name in item.keys() - {"input_ids", "labels", "label"}:
                    side.setdefault(name, []).append(item[name])
                ids, label = item["input_ids"], item.get("labels", item.get("label"))
            else:  # (ids, label), (ids,) or ids
                ids, label = (item[0], item[1] if len(item) > 1 else None) if isinstance(item, tuple) else (item, None)
            row = np.asarray(ids).reshape(-1)
            if self.max_length is not None and len(row) > self.max_length:
                row = np.concatenate([row[: self.max_length - 1], row[-1:]])
            rows.append(row)
            labels.append(label)
        longest = max((len(r) for r in rows), default=0)
        width = self.fixed_length or round_up(max(longest, 1), self.pad_to_multiple_of)
        if self.max_length is not None:
            width = min(width, max(self.max_length, longest))  # never pad past the model's position limit
        input_ids = np.full((len(rows), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, row in enumerate(rows):
            input_ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        batch = {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(mask)}
        if any(label is not None for label in labels):
            arr = np.asarray(labels)
            if arr.ndim == 2 and arr.dtype.kind == "i" and self.fixed_length is None:  # target tokens (seq2seq)
                arr = arr[:, : _scored_width(arr, self.pad_to_multiple_of)]
            batch["labels"] = torch.from_numpy(arr.astype(np.float32 if arr.dtype.kind == "f" else np.int64))
        batch |= {name: torch.from_numpy(np.stack(values)) for name, values in side.items()}
        return batch


def _scored_width(labels: np.ndarray, multiple: int) -> int:
    """Columns up to the batch's last scored label, rounded to ``multiple``: a decoder pays per column."""
    scored = np.flatnonzero((labels != IGNORE_INDEX).any(axis=0))
    return labels.shape[1] if len(scored) == 0 else min(labels.shape[1], round_up(int(scored[-1]) + 1, multiple))


def seed_worker(worker_id: int) -> None:
    """worker_init_fn: seed Python's and numpy's RNGs from torch's per-worker seed (forked workers share numpy's)."""
    del worker_id  # already folded into torch.initial_seed()
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)


def default_num_workers(cfg: TrainConfig, hw: HardwareInfo, *, local_world_size: int | None = None) -> tuple[int, str]:
    """(workers, why) for this machine, sharing its CPUs among ``local_world_size`` training processes."""
    if cfg.num_workers is not None:
        return cfg.num_workers, "set in TrainConfig.num_workers"
    if hw.device_type == "cpu":
        # matmuls use every core; a worker would steal one for ~0.3 ms batches and restart each epoch
        return 0, "training on the CPU: workers would compete with the model for cores"
    method = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    if hw.interactive and method != "fork":
        # spawn/forkserver pickle the dataset; classes defined in a notebook cell can't be re-imported by a worker.
        return 0, f"notebook with the {method!r} start method: notebook-defined datasets can't reach workers"
    ranks = max(1, local_world_size if local_world_size is not None else dist_env().local_world_size)
    # one CPU per training process for itself: Kaggle's 4 vCPUs -> 3; Colab warns above its count (colabtools#3415)
    workers = max(0, min(hw.cpu_count // ranks - 1, MAX_WORKERS))
    shared = f", shared by {ranks} training processes" if ranks > 1 else ""
    return workers, f"{hw.cpu_count} CPUs on {hw.platform}{shared}: one left for each training process"


def _shm_limit_workers(
    workers: int, prefetch: int, hw: HardwareInfo, dataset: Any, collate: Any, first_batch: list[int] | None
) -> tuple[int, str | None]:
    """0 workers when the batches in flight would not fit /dev/shm (Docker's default is 64 MB)."""
    if workers == 0 or hw.shm_bytes is None or hw.shm_bytes >= 2**30 or not first_batch:
        return workers, None
    # one real batch (the longest first): text batches ~0.3 MB fit a 64 MB /dev/shm, image ones often not
    batch_bytes = nbytes(collate([dataset[i] for i in first_batch]))
    need = workers * prefetch * batch_bytes * SHM_HEADROOM
    if need <= hw.shm_bytes:
        return workers, None
    return 0, (
        f"/dev/shm is {hw.shm_bytes / 2**20:.0f} MiB but {workers} workers x {prefetch} prefetched batches of "
        f"{batch_bytes / 2**20:.1f} MiB need ~{need / 2**20:.0f} MiB (with headroom): using num_workers=0 to avoid "
        "'Bus error ... out of shared memory' crashes. Fix: run Docker with --shm-size=2g, or pass "
        "TrainConfig(num_workers=N) to override."
    )


_CRASH_MARKERS = ("exited unexpectedly", "killed by signal", "shared memory", "No space left on device", "Bus error")


class KitDataLoader(DataLoader[Any]):
    """A DataLoader falling back to ``num_workers=0`` (warned once) when workers crash on a first batch (/dev/shm)."""

    workers_reason: str = ""  # why this many workers (the loader's own record of the choice)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return super().__iter__() if self.num_workers == 0 else self._iter_with_fallback()

    def _iter_with_fallback(self) -> Iterator[Any]:
        it = super().__iter__()
        try:
            first = next(it)
        except StopIteration:
            return
        except RuntimeError as err:
            if not any(marker in str(err) for marker in _CRASH_MARKERS):
                raise
            warnings.warn(
                f"kitlib: DataLoader workers crashed on the first batch ({str(err).splitlines()[0]}); continuing "
                "with num_workers=0. Usual cause: a small /dev/shm (Docker's default is 64 MB). Pass "
                "TrainConfig(num_workers=0) to skip the attempt.",
                RuntimeWarning,
                stacklevel=2,
            )
            it._shutdown_workers()  # type: ignore[attr-defined]  # workers > 0: a multiprocessing iterator
            self._iterator = None  # a persistent-workers iterator holding the dead workers
            self.num_workers = 0
            yield from super().__iter__()
            return
        yield first
        yield from it


def _lengths_of(dataset: Any, lengths: Sequence[int] | np.ndarray | None, cfg: TrainConfig) -> np.ndarray | None:
    raw = lengths if lengths is not None else getattr(dataset, "lengths", None)
    if raw is None:
        return None
    arr = as_lengths(raw)
    if len(arr) != len(dataset):
        raise ValueError(f"{len(arr)} lengths for a dataset of {len(dataset)} rows: they must match one to one")
    return np.minimum(arr, cfg.max_length) if cfg.max_length is not None else arr


def _width(cfg: TrainConfig, lengths: np.ndarray | None) -> int:
    """The padded width of a 'fixed' batch, and the row budget behind 'token_budget'."""
    if cfg.max_length is not None:
        return cfg.max_length
    if lengths is None:
        raise ValueError(f"batching={cfg.batching!r} needs TrainConfig(max_length=...) or the rows' lengths")
    return suggest_max_length(lengths)


def _pad_multiple(cfg: TrainConfig, hw: HardwareInfo) -> int:
    # multiples of 8 for tensor cores and fewer compile shapes; on CPU without compile ~10% wasted tokens
    return 8 if hw.device_type == "cuda" or cfg.compile else 1


def _build(
    dataset: Any, batch_sampler: Any, collate: Any, cfg: TrainConfig, hw: HardwareInfo, seed: int, lens: Any
) -> KitDataLoader:
    if collate is None:  # the default: dynamic padding, or every batch at the 'fixed' width
        fixed = _width(cfg, lens) if cfg.batching == "fixed" else None
        collate = PaddingCollator(getattr(dataset, "pad_id", 0), _pad_multiple(cfg, hw), max_length=cfg.max_length,
                                  fixed_length=fixed)  # fmt: skip
    workers, reason = default_num_workers(cfg, hw)
    cuda = hw.device_type == "cuda"
    prefetch = 4 if cuda else 2  # batches per worker in flight; text batches are small, so be generous on GPU
    first = next(iter(batch_sampler), None)
    workers, shm_warning = _shm_limit_workers(workers, prefetch, hw, dataset, collate, first)
    if shm_warning is not None:
        warnings.warn(f"kitlib: {shm_warning}", RuntimeWarning, stacklevel=3)
    kwargs: dict[str, Any] = {}
    if workers > 0:
        kwargs.update(prefetch_factor=prefetch, persistent_workers=cuda)  # keep workers across epochs on GPU
        # tokenizers warns after a fork (transformers#5486); workers only slice pre-tokenised arrays
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    loader = KitDataLoader(
        dataset,
        batch_sampler=batch_sampler,
        collate_fn=collate,
        num_workers=workers,
        pin_memory=cuda,
        worker_init_fn=seed_worker,
        generator=torch.Generator().manual_seed(seed),
        **kwargs,
    )
    loader.workers_reason = reason
    return loader


def make_train_loader(
    dataset: Any,
    cfg: TrainConfig,
    hw: HardwareInfo,
    *,
    collate: Any = None,
    lengths: Sequence[int] | np.ndarray | None = None,
    seed: int | None = None,
) -> KitDataLoader:
    """Shuffled ``cfg.micro_batch_size`` batches grouped by ``cfg.batching``, drop_last, an equal share per DDP rank."""
    seed = cfg.seed if seed is None else seed
    lens = _lengths_of(dataset, lengths, cfg)
    ready = torch.distributed.is_available() and torch.distributed.is_initialized()
    rank, world = (torch.distributed.get_rank(), torch.distributed.get_world_size()) if ready else (0, 1)
    bs, mode = cfg.micro_batch_size, cfg.batching
    if mode in ("bucket", "token_budget", "packed") and lens is None and collate is None:
        warnings.warn(
            f"kitlib: batching={mode!r} needs row lengths (pass lengths= or a dataset with .lengths); using "
            "random batches with dynamic padding instead",
            stacklevel=2,
        )
    multiple = _pad_multiple(cfg, hw)
    sampler: Any
    if lens is None or mode in ("dynamic", "fixed"):
        sampler = RandomBatchSampler(len(dataset), bs, seed=seed, drop_last=True, rank=rank, world_size=world)
    elif mode == "bucket":
        sampler = BucketSampler(lens, bs, seed=seed, drop_last=True, rank=rank, world_size=world)
    elif mode == "token_budget":
        # Same peak tokens as a fixed-padded batch, so a micro-batch size that fits with fixed padding fits here.
        budget = bs * round_up(_width(cfg, lens), multiple)
        sampler = TokenBudgetSampler(
            lens, budget, seed=seed, pad_to_multiple_of=multiple, drop_last=True, rank=rank, world_size=world
        )
    else:  # packed, padding-free: whole examples end to end in rows of the width, as many example tokens as a
        # bucketed batch (packing_layout: as many optimizer steps per epoch)
        if not isinstance(collate, PackingCollator):  # a padding collate would undo the packing
            collate = PackingCollator(_width(cfg, lens), getattr(dataset, "pad_id", 0), multiple)
        tokens, rows = packing_layout(lens, bs, collate.width)  # width None: one row (flash varlen)
        sampler = PackingSampler(lens, tokens, rows, seed=seed, rank=rank, world_size=world)
    return _build(dataset, sampler, collate, cfg, hw, seed, lens)


def make_eval_loader(
    dataset: Any,
    cfg: TrainConfig,
    hw: HardwareInfo,
    *,
    collate: Any = None,
    lengths: Sequence[int] | np.ndarray | None = None,
) -> KitDataLoader:
    """Every row once, ``micro_batch_size * eval_batch_factor`` rows a batch, longest first; see ``restore_order``."""
    lens = _lengths_of(dataset, lengths, cfg)
    bs = cfg.micro_batch_size * cfg.eval_batch_factor
    sampler: Any = (
        SortedBatchSampler(lens, bs) if lens is not None else RandomBatchSampler(len(dataset), bs, shuffle=False)
    )
    return _build(dataset, sampler, collate, cfg, hw, cfg.seed, lens)


make_predict_loader = make_eval_loader  # inference batches: length-sorted; restore_order(loader, predictions)


def restore_order(loader: DataLoader[Any], outputs: Any) -> Any:
    """Outputs concatenated in the loader's yield order -> the same outputs in the dataset's row order."""
    order = getattr(loader.batch_sampler, "order", None)
    if order is None:
        return outputs  # sequential loader: already in row order
    if len(outputs) != len(order):
        raise ValueError(f"{len(outputs)} outputs for a loader of {len(order)} rows: concatenate every batch first")
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    if isinstance(outputs, torch.Tensor):
        return outputs[torch.from_numpy(inverse)]
    return np.asarray(outputs)[inverse]
