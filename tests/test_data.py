from __future__ import annotations

import dataclasses
import os
import signal
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from kitlib.config import TrainConfig
from kitlib.data.loaders import (
    KitDataLoader,
    PaddingCollator,
    TokenDataset,
    default_num_workers,
    make_eval_loader,
    make_predict_loader,
    make_train_loader,
    restore_order,
)
from kitlib.data.samplers import BucketSampler, RandomBatchSampler, TokenBudgetSampler, round_up
from kitlib.engine.batches import skip_batches
from kitlib.machine.hardware import fake_profile

LENGTHS = np.clip(np.random.default_rng(1).lognormal(3.0, 0.7, 1003).astype(np.int64), 1, 300)


def bucket(**kw: Any) -> BucketSampler:
    return BucketSampler(LENGTHS, 16, **{"seed": 7, "mega_batch_factor": 8, "drop_last": False, **kw})


def budget(**kw: Any) -> TokenBudgetSampler:
    return TokenBudgetSampler(LENGTHS, 1024, **{"seed": 7, "pad_to_multiple_of": 8, **kw})


SAMPLERS = [bucket, budget, lambda **kw: RandomBatchSampler(len(LENGTHS), 16, **{"seed": 7, **kw})]
IDS = ["bucket", "token_budget", "random"]


def flat(batches: list[list[int]]) -> list[int]:
    return [i for b in batches for i in b]


# ----------------------------------------------------------------------------------------------- sampler invariants
@pytest.mark.parametrize("make", SAMPLERS, ids=IDS)
def test_every_index_exactly_once_per_epoch(make: Any) -> None:
    sampler = make()
    for epoch in range(3):
        sampler.set_epoch(epoch)
        assert sorted(flat(list(sampler))) == list(range(len(LENGTHS)))
        assert len(sampler) == len(list(sampler))


@pytest.mark.parametrize("make", SAMPLERS, ids=IDS)
def test_deterministic_for_seed_and_epoch_and_different_across_epochs(make: Any) -> None:
    a, b = make(), make()
    a.set_epoch(3)
    b.set_epoch(3)
    assert list(a) == list(b)  # a fresh object (a resumed process) reproduces the epoch
    b.set_epoch(4)
    assert list(a) != list(b)
    c = make(seed=8)
    c.set_epoch(3)
    assert list(a) != list(c)


def test_bucket_drop_last_gives_full_disjoint_batches_and_groups_lengths() -> None:
    sampler = bucket(drop_last=True)
    batches = list(sampler)
    assert len(batches) == len(LENGTHS) // 16 and all(len(b) == 16 for b in batches)
    assert len(set(flat(batches))) == len(flat(batches))
    # the longest batch comes first (an OOM shows at step 0)
    assert LENGTHS[batches[0]].max() == max(LENGTHS[b].max() for b in batches)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("make", SAMPLERS, ids=IDS)
def test_ddp_ranks_are_disjoint_equal_and_cover_the_single_process_order(make: Any, world: int) -> None:
    single = make()
    single.set_epoch(2)
    ranks = [make(rank=r, world_size=world) for r in range(world)]
    for r in ranks:
        r.set_epoch(2)
    shares = [list(r) for r in ranks]
    assert len({len(s) for s in shares}) == 1  # equal step counts: no rank waits forever in all-reduce
    seen = flat([b for s in shares for b in s])
    assert len(seen) == len(set(seen))  # disjoint
    usable = len(list(single)) // world * world
    assert sorted(seen) == sorted(flat(list(single)[:usable]))  # together: the single-process epoch (cut to W)
    assert len(list(single)) - usable < world


def test_token_budget_is_respected() -> None:
    sampler = budget()
    for batch in sampler:
        padded = len(batch) * round_up(int(LENGTHS[batch].max()), 8)
        assert padded <= 1024 or len(batch) == 1
    capped = budget(max_batch_size=5)
    assert max(len(b) for b in capped) <= 5
    # short rows travel in big batches, long rows in small ones
    sizes = {int(LENGTHS[b].max()): len(b) for b in sampler}
    assert sizes[min(sizes)] > sizes[max(sizes)]


# ------------------------------------------------------------------------------------------------- skip / resume
class IndexDataset(Dataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def collect(loader: DataLoader[Any]) -> list[list[int]]:
    return [list(b) for b in loader]


@pytest.mark.parametrize("make", SAMPLERS, ids=IDS)
def test_skip_batches_yields_exactly_the_remaining_batches(make: Any) -> None:
    full = DataLoader(IndexDataset(len(LENGTHS)), batch_sampler=make(), collate_fn=list)
    full.batch_sampler.set_epoch(5)  # type: ignore[union-attr]
    epoch = collect(full)
    # a "resumed process": fresh sampler, same seed, set_epoch, skip k
    resumed = DataLoader(IndexDataset(len(LENGTHS)), batch_sampler=make(), collate_fn=list)
    resumed.batch_sampler.set_epoch(5)  # type: ignore[union-attr]
    tail = skip_batches(resumed, 7)
    assert len(tail) == len(epoch) - 7
    assert collect(tail) == epoch[7:]
    assert skip_batches(resumed, 0) is resumed
    assert collect(skip_batches(resumed, len(epoch) + 3)) == []


def test_skip_batches_loads_nothing_for_skipped_batches() -> None:
    loaded: list[int] = []

    class Recording(IndexDataset):
        def __getitem__(self, i: int) -> int:
            loaded.append(i)
            return i

    loader = DataLoader(Recording(100), batch_sampler=RandomBatchSampler(100, 10, seed=0), collate_fn=list)
    tail = collect(skip_batches(loader, 8))
    assert sorted(loaded) == sorted(flat(tail)) and len(loaded) == 20


def test_skip_batches_on_a_plain_shuffled_loader_with_a_seeded_generator() -> None:
    gen = torch.Generator().manual_seed(0)
    loader = DataLoader(IndexDataset(50), batch_size=8, shuffle=True, generator=gen, collate_fn=list)
    state = gen.get_state()
    epoch = collect(loader)
    gen.set_state(state)  # a resumed run re-seeds the generator to the epoch's start
    assert collect(skip_batches(loader, 3)) == epoch[3:]


def test_skip_batches_forwards_set_epoch() -> None:
    loader = DataLoader(IndexDataset(len(LENGTHS)), batch_sampler=bucket(), collate_fn=list)
    tail = skip_batches(loader, 2)
    tail.batch_sampler.set_epoch(9)  # type: ignore[union-attr]
    assert loader.batch_sampler.epoch == 9  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------------------------- collate
def test_collate_pads_to_multiple_of_8_with_mask_and_labels() -> None:
    items = [(np.arange(1, 6), 1), (np.arange(1, 12), 0), (np.arange(1, 3), 1)]
    batch = PaddingCollator(pad_id=0)(items)
    assert batch["input_ids"].shape == (3, 16) and batch["input_ids"].dtype == torch.int64
    assert batch["attention_mask"].sum(1).tolist() == [5, 11, 2]
    assert batch["labels"].tolist() == [1, 0, 1] and batch["labels"].dtype == torch.int64
    assert batch["input_ids"][2, 2:].eq(0).all()
    assert (int(batch["attention_mask"].sum()), batch["attention_mask"].numel()) == (18, 48)
    float_labels = PaddingCollator()([(np.arange(3), 0.5)])["labels"]
    assert float_labels.dtype == torch.float32
    assert "labels" not in PaddingCollator()([np.arange(3), np.arange(4)])
    assert PaddingCollator(pad_to_multiple_of=1)([np.arange(3)])["input_ids"].shape == (1, 3)


def test_collate_truncates_keeping_the_last_token_and_fixed_width() -> None:
    row = np.array([101, 5, 6, 7, 8, 9, 102])
    batch = PaddingCollator(max_length=4)([row])
    assert batch["input_ids"].tolist() == [[101, 5, 6, 102]]  # capped at max_length, not rounded up to 8
    fixed = PaddingCollator(fixed_length=32)([np.arange(3)])
    assert fixed["input_ids"].shape == (1, 32)
    mapping = PaddingCollator()([{"input_ids": [1, 2], "labels": 3}])
    assert mapping["labels"].tolist() == [3]


def test_collate_cuts_target_token_labels_to_the_batchs_longest_and_the_loss_is_unchanged() -> None:
    """seq2seq's labels are saved padded with -100 to the data's longest target: a batch carries only the columns up
    to its own longest (rounded up to 8), and a decoder's loss on them is the same as on the full width."""
    from kitlib.models.seq2seq import tiny_seq2seq, train_bpe_tokenizer

    saved = np.full((2, 50), -100)
    saved[0, :5], saved[1, :11] = 7, 9
    batch = PaddingCollator(pad_id=0)([(np.arange(1, 4), saved[0]), (np.arange(1, 6), saved[1])])
    assert batch["labels"].shape == (2, 16) and batch["labels"][:, :11].tolist() == saved[:, :11].tolist()
    assert PaddingCollator(fixed_length=8)([(np.arange(1, 4), saved[0])])["labels"].shape == (1, 50)  # static shapes

    model = tiny_seq2seq(train_bpe_tokenizer(["abc"], vocab_size=1), seed=0).eval()
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        cut = model(**inputs, labels=batch["labels"]).loss
        full = model(**inputs, labels=torch.from_numpy(saved)).loss
    torch.testing.assert_close(cut, full)


# ---------------------------------------------------------------------------------------------------- factories
def token_dataset(n: int = 300, labels: bool = True) -> TokenDataset:
    rng = np.random.default_rng(0)
    rows = [rng.integers(1, 100, size=int(k)) for k in np.clip(rng.lognormal(3, 0.6, n), 2, 200)]
    return TokenDataset(rows, rng.integers(0, 2, size=n) if labels else None)


def test_train_loader_defaults_on_a_cpu_box(cpu_hw: Any) -> None:
    ds = token_dataset()
    cfg = TrainConfig(micro_batch_size=16)
    loader = make_train_loader(ds, cfg, cpu_hw)
    assert isinstance(loader.batch_sampler, BucketSampler) and loader.num_workers == 0 and not loader.pin_memory
    batches = list(loader)
    assert len(batches) == len(ds) // 16  # drop_last
    assert all(b["input_ids"].shape[0] == 16 for b in batches)
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    computed = sum(b["attention_mask"].numel() for b in batches)
    assert real / computed > 0.8  # bucketed: little padding even at this toy size


@pytest.mark.parametrize(
    ("batching", "sampler"),
    [("dynamic", RandomBatchSampler), ("fixed", RandomBatchSampler), ("token_budget", TokenBudgetSampler)],
)
def test_train_loader_batching_modes(cpu_hw: Any, batching: str, sampler: type) -> None:
    cfg = TrainConfig(micro_batch_size=16, batching=batching, max_length=64)  # type: ignore[arg-type]
    loader = make_train_loader(token_dataset(), cfg, cpu_hw)
    assert isinstance(loader.batch_sampler, sampler)
    widths = {b["input_ids"].shape[1] for b in loader}
    assert max(widths) <= 64
    if batching == "fixed":
        assert widths == {64}


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # a 2-core test box building a 4-vCPU loader
def test_gpu_profiles_get_workers_pinning_and_persistence() -> None:
    cfg = TrainConfig()
    kaggle = fake_profile("2xT4", platform="kaggle", interactive=False)
    assert default_num_workers(cfg, kaggle)[0] == 3  # 4 vCPUs, one left for the training process
    assert default_num_workers(cfg, fake_profile("T4", platform="colab", interactive=False))[0] == 1
    assert default_num_workers(cfg, fake_profile("H100", interactive=False))[0] == 4
    assert default_num_workers(cfg, fake_profile("CPU"))[0] == 0
    assert default_num_workers(dataclasses.replace(cfg, num_workers=2), fake_profile("CPU"))[0] == 2
    loader = make_train_loader(token_dataset(), cfg, kaggle)
    assert loader.num_workers == 3 and loader.pin_memory and loader.persistent_workers
    assert loader.prefetch_factor == 4 and "4 CPUs" in loader.workers_reason


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_small_shm_falls_back_to_zero_workers_with_a_warning() -> None:
    hw = dataclasses.replace(fake_profile("2xT4", interactive=False), shm_bytes=256 * 1024)
    with pytest.warns(RuntimeWarning, match="/dev/shm"):
        loader = make_train_loader(token_dataset(), TrainConfig(), hw)
    assert loader.num_workers == 0
    roomy = dataclasses.replace(hw, shm_bytes=64 * 2**20)  # Docker's 64 MB holds text batches easily
    assert make_train_loader(token_dataset(), TrainConfig(), roomy).num_workers == 3


class CrashingInWorker(IndexDataset):
    def __getitem__(self, i: int) -> int:
        if torch.utils.data.get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGBUS)  # what an exhausted /dev/shm does to a worker
        return i


class FailingDataset(IndexDataset):
    def __getitem__(self, i: int) -> int:
        raise ValueError(f"bad row {i}")


def test_worker_crash_falls_back_to_zero_workers_once() -> None:
    loader = KitDataLoader(CrashingInWorker(20), batch_size=5, num_workers=1, collate_fn=list)
    with pytest.warns(RuntimeWarning, match="num_workers=0"):
        assert collect(loader) == [list(range(i, i + 5)) for i in range(0, 20, 5)]
    assert loader.num_workers == 0
    assert len(collect(loader)) == 4  # later epochs: no more workers, no more warnings


def test_dataset_errors_in_workers_are_not_swallowed() -> None:
    loader = KitDataLoader(FailingDataset(10), batch_size=5, num_workers=1, collate_fn=list)
    with pytest.raises(ValueError, match="bad row"):
        collect(loader)


def test_eval_and_predict_loaders_are_sorted_and_restorable(cpu_hw: Any) -> None:
    ds = token_dataset(101, labels=False)
    cfg = TrainConfig(micro_batch_size=8, eval_batch_factor=4)
    evl = make_eval_loader(token_dataset(101), cfg, cpu_hw)
    assert len(evl) == 4 and sum(b["input_ids"].shape[0] for b in evl) == 101  # batch 32, no drop_last
    loader = make_predict_loader(ds, cfg, cpu_hw)
    outputs = torch.cat([b["attention_mask"].sum(1) for b in loader])  # per-row "prediction": its length
    widths = [b["input_ids"].shape[1] for b in loader]
    assert widths == sorted(widths, reverse=True)  # longest first
    restored = restore_order(loader, outputs)
    assert restored.tolist() == ds.lengths.tolist()
    assert restore_order(loader, outputs.numpy()).tolist() == ds.lengths.tolist()


def test_token_dataset_from_flat_arrays_and_errors() -> None:
    class Flat:
        ids = np.array([1, 2, 3, 4, 5, 6], dtype=np.int32)
        offsets = np.array([0, 2, 6])

    ds = TokenDataset(Flat(), [0, 1])
    assert len(ds) == 2 and ds.lengths.tolist() == [2, 4]
    assert ds[1][0].tolist() == [3, 4, 5, 6] and ds[1][1] == 1
    with pytest.raises(ValueError, match="must match"):
        TokenDataset(Flat(), [0, 1, 2])
