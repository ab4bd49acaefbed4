"""optimizer="adamw8bit": bitsandbytes' 8-bit AdamW (CPU backend here) keeps ~2 bytes of state a parameter where
AdamW keeps 8, trains a small regression as AdamW does, and resumes exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from kitlib import Callback, TrainConfig, fit
from kitlib.engine.optim import build_optimizer

pytest.importorskip("bitsandbytes", reason="the lean extra (pip install 'kitlib[lean]'; the dev extra has it)")


def _model() -> nn.Module:
    torch.manual_seed(0)  # the 256 x 256 weight (97% of the parameters) is above bitsandbytes' 8-bit floor
    return nn.Sequential(nn.Linear(6, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(128, 6, generator=g)
    return TensorDataset(x, x @ torch.randn(6, 1, generator=g) + 0.1 * torch.randn(128, 1, generator=g))


def mse(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.mse_loss(model(batch[0]), batch[1])


def _state_bytes_per_param(optimizer: str) -> float:
    model = _model()
    opt = build_optimizer(model, TrainConfig(optimizer=optimizer))
    mse(model, next(iter(DataLoader(_data(), batch_size=32)))).backward()
    opt.step()  # the state exists after the first step
    held = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if torch.is_tensor(t))
    return held / sum(p.numel() for p in model.parameters())


def test_8bit_adamw_keeps_a_quarter_of_adamws_state() -> None:
    full, lean = _state_bytes_per_param("adamw"), _state_bytes_per_param("adamw8bit")
    assert 8.0 <= full < 8.01, full  # two fp32 moments (+ a step count per tensor)
    # two uint8 moments, an fp32 absmax per 256-element block and a 256-entry code table per tensor; tensors under
    # 4,096 elements (the biases, the 6 x 256 input layer: 3% of the parameters) in fp32. Measured: 2.26
    assert 1.9 < lean < 2.4, lean


def _fit(optimizer: str, run_dir: Path | None = None, **kw: Any) -> Any:
    cfg = TrainConfig(epochs=3, micro_batch_size=16, lr=3e-3, precision="fp32", save_best=False, seed=1,
                      optimizer=optimizer, **kw.pop("cfg", {}))  # fmt: skip
    from kitlib.machine.hardware import fake_profile

    hw = fake_profile("CPU", platform="local", interactive=False)
    loader = DataLoader(_data(), batch_size=16, shuffle=True)
    return fit(_model(), loader, config=cfg, loss_fn=mse, hw=hw, run_dir=run_dir, **kw)


def test_8bit_adamw_lowers_the_loss_as_adamw_does() -> None:
    full, lean = _fit("adamw").history["train_loss"], _fit("adamw8bit").history["train_loss"]
    assert lean.iloc[-1] < 0.3 * lean.iloc[0], list(lean)
    assert abs(lean.iloc[-1] - full.iloc[-1]) < 0.25 * full.iloc[-1], (list(lean), list(full))


class CrashAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_fit_start(self, loop: Any) -> None:
        self.loop = loop

    def on_step_end(self, step: Any) -> None:
        if self.loop.state.step == self.step:
            raise KeyboardInterrupt("the session ended")


def test_8bit_adamw_resumes_exactly(tmp_path: Path) -> None:
    expected = _fit("adamw8bit").model.state_dict()
    save = {"cfg": {"save_last": True, "save_every_steps": 4}}
    with pytest.raises(KeyboardInterrupt):
        _fit("adamw8bit", tmp_path, callbacks=[CrashAt(13)], **save)
    got = _fit("adamw8bit", tmp_path, resume=True, **save).model.state_dict()
    for name, tensor in expected.items():
        assert torch.equal(tensor, got[name]), f"{name} differs after resume"


def _bf16_fit(optimizer: str, model: nn.Module, run_dir: Path | None = None, **kw: Any) -> Any:
    """Pure bf16 training (bf16 weights, bf16 autocast: a CPU with AMX-BF16 as the profile) at an lr whose updates
    are mostly below bf16's resolution (~0.4% of a weight)."""
    from kitlib.machine.hardware import fake_profile

    cfg = TrainConfig(epochs=2, micro_batch_size=16, lr=3e-4, precision="bf16", save_best=False, seed=1,
                      optimizer=optimizer, warmup_ratio=0.0, **kw.pop("cfg", {}))  # fmt: skip
    hw = fake_profile("CPU-AMX", platform="local", interactive=False)
    loader = DataLoader(_data(), batch_size=16, shuffle=True)
    loss = lambda m, b: mse(m, b).float()  # noqa: E731
    return fit(model, loader, config=cfg, loss_fn=loss, hw=hw, run_dir=run_dir, **kw)


def test_pure_bf16_weights_learn_with_kahan_summed_adamw_as_fp32_weights_do() -> None:
    pytest.importorskip("optimi", reason="the lean extra (pip install 'kitlib[lean]'; the dev extra has it)")
    from kitlib.errors import PrecisionError

    start = {k: v.float() for k, v in _model().to(torch.bfloat16).state_dict().items()}  # where both runs start
    fp32 = _bf16_fit("adamw", _model().to(torch.bfloat16).float())  # fp32 master weights from the same bf16 start
    pure = _bf16_fit("adamw-kahan", _model())  # fp32 weights of the same values: fit casts them to bf16
    assert all(p.dtype == torch.bfloat16 for p in pure.model.parameters())  # trained in bf16, never upcast
    for name, before in start.items():
        moved, expected = (pure.model.state_dict()[name].float() - before), (fp32.model.state_dict()[name] - before)
        # Kahan summation keeps the sum of the updates: each weight moved as far as its fp32 twin did (the
        # bf16 forward makes the gradients differ a little); plain AdamW on bf16 weights loses most of them.
        assert 0.8 < moved.abs().mean() / expected.abs().mean() < 1.25, name
    losses, fp32_losses = list(pure.history["train_loss"]), list(fp32.history["train_loss"])
    assert losses[-1] < losses[0] and abs(losses[-1] - fp32_losses[-1]) < 0.05 * fp32_losses[-1], (losses, fp32_losses)
    with pytest.raises(PrecisionError, match=r"optimizer='adamw-kahan'"):
        _bf16_fit("adamw", _model().to(torch.bfloat16))  # would lose the updates: refused


def test_pure_bf16_with_kahan_summed_adamw_resumes_exactly(tmp_path: Path) -> None:
    pytest.importorskip("optimi", reason="the lean extra (pip install 'kitlib[lean]'; the dev extra has it)")
    expected = _bf16_fit("adamw-kahan", _model().to(torch.bfloat16)).model.state_dict()
    save = {"cfg": {"save_last": True, "save_every_steps": 4}}
    with pytest.raises(KeyboardInterrupt):
        _bf16_fit("adamw-kahan", _model().to(torch.bfloat16), tmp_path, callbacks=[CrashAt(9)], **save)
    got = _bf16_fit("adamw-kahan", _model().to(torch.bfloat16), tmp_path, resume=True, **save).model.state_dict()
    for name, tensor in expected.items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, got[name]), f"{name} differs after resume"


@pytest.mark.parametrize("hardware", ["T4", "CPU"])
def test_kahan_adamw_is_refused_where_the_plan_trains_no_bf16_weights(hardware: str) -> None:
    """On an fp16 card or an fp32 CPU the weights stay fp32 and Kahan summation adds nothing: 00 refuses it, naming
    adamw; a bf16 plan (H100) takes it."""
    from kitlib.errors import SetupError
    from kitlib.machine.hardware import fake_profile
    from kitlib.notebook.presets import resolve

    with pytest.raises(SetupError, match=r"adamw-kahan.*trains in (fp16|fp32).*Fix: optimizer = 'adamw'"):
        resolve("smoke", fake_profile(hardware), overrides={"optimizer": "adamw-kahan"})
    run = resolve("smoke", fake_profile("H100"), overrides={"optimizer": "adamw-kahan"})
    assert (run.config.optimizer, run.config.precision) == ("adamw-kahan", "bf16")


def _tiny_bert_classifier_rows() -> tuple[nn.Module, list[dict[str, torch.Tensor]]]:
    """A 1-layer BERT (embeddings with their LayerNorm, as MiniLM's) under a mean-pool head, and 64 rows whose class
    a mean of the tokens tells (class 1 draws its tokens from the upper half of the vocabulary)."""
    from transformers import BertConfig, BertModel

    from kitlib.models.heads import MeanPoolClassifier

    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32)  # fmt: skip
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(64) % 2
    ids = torch.randint(1, 32, (64, 12), generator=g) + 32 * labels[:, None]
    rows = [
        {"input_ids": i, "attention_mask": torch.ones_like(i), "labels": y} for i, y in zip(ids, labels, strict=True)
    ]
    return MeanPoolClassifier(BertModel(config), num_labels=2), rows


def _kahan_fit(model: nn.Module, rows: list[dict[str, torch.Tensor]], **cfg: Any) -> Any:
    from kitlib.machine.hardware import fake_profile

    config = TrainConfig(epochs=4, micro_batch_size=16, lr=3e-3, precision="bf16", save_best=False, seed=1,
                         optimizer="adamw-kahan", **cfg)  # fmt: skip
    hw = fake_profile("CPU-AMX", platform="local", interactive=False)
    return fit(model, DataLoader(rows, batch_size=16), config=config, hw=hw)


def test_kahan_adamw_casts_a_frozen_part_too_so_a_cpu_norm_never_sees_fp32_beside_bf16() -> None:
    """balanced freezes the input embeddings. adamw-kahan cast only the trainable weights to bf16, so the frozen
    embeddings' fp32 output met the first bf16 LayerNorm, and a CPU's autocast raised "mixed dtype (CPU)" on the
    first step (CUDA's runs norms in fp32). The whole model is bf16 now; the frozen weights keep their values."""
    pytest.importorskip("optimi", reason="the lean extra (pip install 'kitlib[lean]'; the dev extra has it)")
    model, rows = _tiny_bert_classifier_rows()
    frozen = {n: p.detach().to(torch.bfloat16) for n, p in model.named_parameters() if "embeddings" in n}
    result = _kahan_fit(model, rows, freeze="embeddings")  # raised on the first step before
    params = dict(result.model.named_parameters())
    assert {p.dtype for p in params.values()} == {torch.bfloat16}
    assert frozen and all(torch.equal(params[n], v) for n, v in frozen.items())  # frozen: cast, never updated
    losses = list(result.history["train_loss"])
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("adapter", ["lora", "none"])
def test_kahan_adamw_leaves_an_adapters_frozen_base_as_it_is(adapter: str) -> None:
    """With adapters only they are cast: the frozen base keeps the dtype its route chose (fp32 on a CPU), whether
    kitlib built the adapters (adapter="lora") or you did and called fit with adapter left at "none"."""
    pytest.importorskip("optimi", reason="the lean extra (pip install 'kitlib[lean]'; the dev extra has it)")
    peft = pytest.importorskip("peft")
    model, rows = _tiny_bert_classifier_rows()
    model.encoder = peft.get_peft_model(model.encoder, peft.LoraConfig(r=4, target_modules=["query", "value"]))
    result = _kahan_fit(model, rows, adapter=adapter)
    dtypes = {n: p.dtype for n, p in result.model.named_parameters()}
    assert {d for n, d in dtypes.items() if "lora_" in n} == {torch.bfloat16}
    assert {d for n, d in dtypes.items() if "encoder" in n and "lora_" not in n} == {torch.float32}
