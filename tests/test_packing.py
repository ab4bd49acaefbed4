"""Padding-free packing (kitlib.data.packing): what a packed example sees, what the loss counts, which rows go where."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from kitlib.data.packing import PackingCollator
from kitlib.data.samplers import PackingSampler
from kitlib.engine.objective import default_count_fn, real_tokens
from kitlib.models import IGNORE_INDEX
from kitlib.notebook.tasks.causal_lm import SequenceCollator


def _llama(vocab: int = 300) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    model.config.use_cache = False  # as kitlib's causal-LM task trains it: a cache turns the packed mask off
    return model


def _example(n: int, prompt: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.random.default_rng(seed).integers(5, 300, n)
    labels = ids.copy()
    labels[:prompt] = IGNORE_INDEX
    return ids, labels


@pytest.mark.parametrize("width", [None, 64])
def test_a_packed_example_sees_only_itself(width: int | None) -> None:
    """Its logits are the same alone and packed after a neighbour, in one row or in rows of a width."""
    model = _llama()
    a, b, c = _example(20, 5, 0), _example(30, 8, 1), _example(50, 9, 2)
    batch = PackingCollator(width)([b, a, c])
    with torch.no_grad():
        alone = model(input_ids=torch.as_tensor(a[0])[None]).logits[0]
        packed = model(**{k: v for k, v in batch.items() if k != "labels"}).logits[0, 30:50]
    assert torch.allclose(alone, packed, atol=1e-5), (alone - packed).abs().max()
    assert batch["input_ids"].shape[0] == (1 if width is None else 2)  # c does not fit beside b and a in 64


def test_the_packed_loss_is_the_padded_loss_token_weighted() -> None:
    """The mean over the same scored tokens: the loss and fit's token count equal the padded batch's."""
    model = _llama()
    items = [_example(20, 5, 0), _example(33, 8, 1), _example(7, 2, 2)]
    packed, padded = PackingCollator(40, pad_to_multiple_of=8)(items), SequenceCollator(0)(items)
    count = default_count_fn(model)
    assert int(count(packed)) == int(count(padded)) == sum(int((y[1:] != IGNORE_INDEX).sum()) for _, y in items)
    with torch.no_grad():
        assert torch.allclose(model(**packed).loss, model(**padded).loss, atol=1e-5)
    assert int(real_tokens(packed)) == int(real_tokens(padded)) == 60  # the examples' own tokens, one rule (#31)


@pytest.mark.parametrize("width", [None, 64])
def test_tokens_per_s_counts_the_examples_not_the_row_end_padding(width: int | None, cpu_hw) -> None:  # type: ignore[no-untyped-def]
    """fit's run record counts each packed example's tokens once per epoch: the row-end padding (and the rounding to
    a multiple of 8) is computed but not real, as in a padded batch (#31: it was counted, tokens/s ~8% high)."""
    import pickle

    from torch.utils.data import DataLoader

    from kitlib import TrainConfig, fit

    items = [_example(n, 3, n) for n in (20, 33, 7, 41, 12, 50)]
    batch = PackingCollator(width, pad_to_multiple_of=8)(items[:3])
    assert batch["input_ids"].numel() > 60 and real_tokens(pickle.loads(pickle.dumps(batch))) == 60  # via workers
    loader = DataLoader(items, batch_size=3, collate_fn=PackingCollator(width, pad_to_multiple_of=8))
    run = fit(_llama().train(), loader, config=TrainConfig(epochs=2, micro_batch_size=3), hw=cpu_hw).timing["run"]
    assert run["real_tokens"] == 2 * sum(len(ids) for ids, _ in items) < run["computed_tokens"], run


def test_the_sampler_packs_every_example_once_within_the_width() -> None:
    lengths = np.random.default_rng(0).integers(1, 100, 500)
    sampler = PackingSampler(lengths, 128, rows=4, seed=3)
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(500))
    collate = PackingCollator(128)
    items = [(np.zeros(n), None) for n in lengths]
    shapes = [collate([items[i] for i in b])["input_ids"].shape for b in batches]
    assert all(rows <= 4 and width <= 128 for rows, width in shapes)
    assert sum(lengths) / sum(r * w for r, w in shapes) > 0.9  # first-fit decreasing: little padding left
    assert batches == list(PackingSampler(lengths, 128, rows=4, seed=3))  # deterministic for (seed, epoch)
    sampler.set_epoch(1)
    assert list(sampler) != batches


@pytest.mark.parametrize("width", [1536, None])  # rows of max_length (sdpa), or one row (flash varlen)
def test_packing_changes_the_layout_not_the_optimisation(width: int | None, cpu_hw) -> None:  # type: ignore[no-untyped-def]
    """Chat SFT lengths (lognormal, mean ~300, max 1,536), micro-batch 4: a packed epoch takes as many optimizer steps
    as a bucketed one (within 15%; #31: 5x fewer when a batch was 4 full rows), every example once, and no packed
    micro-batch holds more tokens than its rows x width (the memory plan's micro_batch x max_length)."""
    from kitlib.config import TrainConfig
    from kitlib.data.loaders import make_train_loader
    from kitlib.notebook.tasks.causal_lm import SequenceDataset

    lengths = np.clip(np.random.default_rng(0).lognormal(np.log(300) - 0.32, 0.8, 2000), 8, 1536).astype(int)
    assert 250 < lengths.mean() < 350 and lengths.max() == 1536
    data = SequenceDataset([np.full(n, 7) for n in lengths], None, pad_id=0)
    cfg = TrainConfig(micro_batch_size=4, max_length=1536, num_workers=0)
    packed = make_train_loader(data, replace(cfg, batching="packed"), cpu_hw, collate=PackingCollator(width))
    bucketed = make_train_loader(data, replace(cfg, batching="bucket"), cpu_hw)
    assert 0.85 < len(packed) / len(bucketed) < 1.15, (len(packed), len(bucketed))
    assert sorted(i for b in packed.batch_sampler for i in b) == list(range(2000))
    shapes = [batch["input_ids"].shape for batch in packed]
    assert all(rows <= (1 if width is None else 4) and w <= (width or 4 * 1536) for rows, w in shapes)


@pytest.mark.parametrize("ruled", ["bucket", "packed"])
def test_02_trains_packed_rows_on_a_cuda_device_and_01s_batching_elsewhere(  # type: ignore[no-untyped-def]
    tmp_path, cpu_hw, monkeypatch, ruled
) -> None:
    """The rule that replaced 02's probe (#50, list B3): the probe read packed 3.18x bucketed on an H200 and 0.97-1.10x
    on CPUs, within its 1.25x margin. On this CPU the bucketed loader trains and the run's files say so; with the rule
    saying packed (as on CUDA), 02 trains the packed loader here."""
    import dataclasses
    import json

    from test_causal_lm import _chat_params  # type: ignore[import-not-found]

    from kitlib import TrainConfig
    from kitlib.machine.hardware import fake_profile
    from kitlib.notebook import stages, training

    assert training.ruled_batching(TrainConfig(), fake_profile("T4")).batching == "packed"
    assert training.ruled_batching(TrainConfig(), cpu_hw).batching == "bucket"
    if ruled == "packed":
        monkeypatch.setattr(training, "ruled_batching", lambda cfg, hw: dataclasses.replace(cfg, batching="packed"))
    older = TrainConfig().to_dict() | {"batching_measured": [["packed", 1.0]]}  # an older kitlib's run/config.json
    assert TrainConfig.from_dict(older) == TrainConfig()  # still loads
    # its staged or finished inputs.json compares equal to this kitlib's: continued, not retrained
    assert training._current({"features": "f", "config": older}) == {"features": "f", "config": TrainConfig().to_dict()}
    p = _chat_params(tmp_path)
    stages.setup(p, cpu_hw)
    feats = stages.features(p, hw=cpu_hw, quiet=True)
    assert feats.run.config.batching == "bucket" and "packed" in training.prepare(p, feats, cpu_hw).choices
    training.train(p, feats, hw=cpu_hw)
    assert json.loads((p.run_dir / "timing.json").read_text())["run"]["batching"] == ruled
    assert json.loads((p.run_dir / "config.json").read_text())["config"]["batching"] == ruled


@pytest.mark.parametrize(("device", "installed", "chosen"), [("cuda", True, "flash_attention_2"),
                         ("cuda", False, "sdpa"), ("cpu", True, "sdpa")])  # fmt: skip
def test_packed_rows_use_flash_attns_varlen_kernel_only_where_installed_on_a_gpu(
    device: str, installed: bool, chosen: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one choice (kitlib.data.packing.packed_attention), flash_attn faked present or absent; on a GPU it is
    reasoned, not measured. With flash, a packed batch is one row (its varlen path reads a batch of 1 only)."""
    import importlib.util

    from transformers import PreTrainedModel  # noqa: F401  # loaded before find_spec is faked (its lazy import asks it)

    from kitlib.data import packing

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "flash_attn" and installed
                        else None if name == "flash_attn" else real(name, *a))  # fmt: skip
    assert packing.packed_attention(device) == chosen
    items = [_example(30, 10, 1), _example(20, 5, 2), _example(25, 5, 3)]
    one_row = PackingCollator(None)(items)
    assert one_row["input_ids"].shape == (1, 75) and one_row["position_ids"][0, 30].item() == 0


def test_with_flash_attn_the_model_and_the_packed_loader_follow_the_one_choice(
    tmp_path, cpu_hw, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where packed_attention says flash (faked: no GPU here), 02's model switches to it and packed batches are one
    row; the bucketed loader stays padded rows (flash-attn unpads them itself)."""
    from test_causal_lm import _chat_params  # type: ignore[import-not-found]
    from transformers import PreTrainedModel

    from kitlib.notebook import stages, training
    from kitlib.notebook.tasks import causal_lm

    switched: list[str] = []
    monkeypatch.setattr(causal_lm, "packed_attention", lambda device: "flash_attention_2")
    monkeypatch.setattr(PreTrainedModel, "set_attn_implementation", lambda self, name: switched.append(name),
                        raising=False)  # fmt: skip
    p = _chat_params(tmp_path)
    stages.setup(p, cpu_hw)
    feats = stages.features(p, hw=cpu_hw, quiet=True)
    prepared = training.prepare(p, feats, cpu_hw)
    assert switched == ["flash_attention_2"]
    packed = next(iter(prepared.choices["packed"]))
    assert packed["input_ids"].shape[0] == 1 and "attention_mask" not in packed
    assert "attention_mask" in next(iter(prepared.train))
