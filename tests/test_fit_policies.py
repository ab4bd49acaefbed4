"""fit()'s safety nets and policies: non-finite steps, the wall-clock budget, early stopping, restored flags,
run artifacts, freezing."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from kitlib import TrainConfig, fit
from kitlib.engine import checkpoint
from kitlib.engine.loop import NonFiniteLossError
from kitlib.progress import figure


def _data(n: int = 64, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True))


def _mse(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.mse_loss(model(batch[0]), batch[1])


def _cfg(**kw: object) -> TrainConfig:
    base: dict[str, object] = {
        "epochs": 3,
        "micro_batch_size": 8,
        "lr": 1e-2,
        "precision": "fp32",
        "log_every_steps": 1,
    }
    return TrainConfig(**{**base, **kw})  # type: ignore[arg-type]


class PoisonAfter(nn.Module):
    """A linear model whose output becomes NaN once ``after`` forward passes have run (a diverging run)."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)
        self.calls, self.after = 0, after

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        out = self.linear(x)
        return out * math.nan if self.calls > self.after else out


def test_nonfinite_steps_are_skipped_counted_and_a_diverged_run_stops_with_best_intact(cpu_hw, tmp_path: Path) -> None:
    model = PoisonAfter(after=8 * 2)  # epoch 1 is clean (8 steps), then every step is NaN
    loader = DataLoader(_data(), batch_size=8)
    cfg = _cfg(epochs=5, max_nonfinite_steps=6, save_best=True)
    with pytest.raises(NonFiniteLossError, match="inf/nan gradients") as err:
        fit(
            model,
            loader,
            eval_loader=DataLoader(_data(16, 1), batch_size=8),
            config=cfg,
            loss_fn=_mse,
            hw=cpu_hw,
            run_dir=tmp_path,
        )
    assert "best checkpoint" in str(err.value) and "Lower lr" in str(err.value)
    best = checkpoint.load(tmp_path / "best")  # written before the run diverged, still loadable and finite
    assert all(torch.isfinite(t).all() for t in best.weights.values())


class InfOnCalls(nn.Module):
    """The toy regression, whose output is inf on the forward calls named (1-based): a bad batch now and then."""

    def __init__(self, *bad: int) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)
        self.calls, self.bad = 0, bad

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.linear(x) * (math.inf if self.calls in self.bad else 1.0)


def test_isolated_nonfinite_step_is_skipped_and_reported(cpu_hw) -> None:
    model = InfOnCalls(3)
    result = fit(model, DataLoader(_data(), batch_size=8), config=_cfg(epochs=1), loss_fn=_mse, hw=cpu_hw)
    assert result.skipped_steps == 1 and result.steps == 7
    assert result.history["skipped_steps"].iloc[-1] == 1
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_time_budget_stops_in_time_and_leaves_a_resumable_checkpoint(cpu_hw, tmp_path: Path) -> None:
    class Slow(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            import time

            time.sleep(0.05)  # 50 ms per micro-batch: 8 steps per epoch, 0.4 s per epoch
            return self.linear(x)

    cfg = _cfg(epochs=50, time_budget_s=6.0)  # 50 epochs would need ~20 s
    result = fit(Slow(), DataLoader(_data(), batch_size=8), config=cfg, loss_fn=_mse, hw=cpu_hw, run_dir=tmp_path)
    assert result.stop_reason == "time_budget"
    assert result.timing["wall_seconds"] <= 6.0
    last = checkpoint.load(tmp_path / "last")
    assert last.state is not None and last.state["run"]["step"] == result.steps


def test_early_stopping_with_patience(cpu_hw) -> None:
    # lr=0: eval loss never improves after the first epoch, so patience 2 stops after epoch 3 of 10 (1-based).
    cfg = _cfg(epochs=10, lr=1e-12, patience=2, min_delta=1e-3)
    result = fit(
        nn.Linear(4, 1),
        DataLoader(_data(), batch_size=8),
        eval_loader=DataLoader(_data(16, 1), batch_size=8),
        config=cfg,
        loss_fn=_mse,
        hw=cpu_hw,
    )
    assert result.stop_reason == "early_stopping"
    assert len(result.history) == 3 and result.best_epoch == 1
    assert result.history["epoch"].tolist() == [1, 2, 3]


class _Bars:
    """Patches the training progress bar's factory to keep every bar fit makes (headless text bars)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from kitlib.engine import policies
        from kitlib.progress import progress_bar

        self.made: list[object] = []

        def keep(*args: object, **kw: object):  # type: ignore[no-untyped-def]
            bar = progress_bar(*args, **kw)  # type: ignore[arg-type]
            self.made.append(bar)
            return bar

        monkeypatch.setattr(policies, "progress_bar", keep)


def test_an_early_stop_closes_the_progress_bar_full_and_an_error_leaves_it_short(cpu_hw, monkeypatch) -> None:
    """tqdm's notebook widget turns red when closed with n < total: a normal early stop must end at n == total."""
    bars = _Bars(monkeypatch)
    cfg = _cfg(epochs=10, lr=1e-12, patience=2, min_delta=1e-3)
    eval_loader = DataLoader(_data(16, 1), batch_size=8)
    result = fit(nn.Linear(4, 1), DataLoader(_data(), batch_size=8), eval_loader=eval_loader, config=cfg,
                 loss_fn=_mse, hw=cpu_hw)  # fmt: skip
    assert result.stop_reason == "early_stopping"
    (bar,) = bars.made
    assert bar.n == bar.total == result.steps == 3 * 8  # type: ignore[attr-defined]

    with pytest.raises(NonFiniteLossError):
        fit(PoisonAfter(after=8), DataLoader(_data(), batch_size=8), config=_cfg(epochs=5, max_nonfinite_steps=2),
            loss_fn=_mse, hw=cpu_hw)  # fmt: skip
    failed = bars.made[-1]
    assert failed.n < failed.total == 5 * 8  # type: ignore[attr-defined]


def test_the_summary_names_the_stop_the_metric_rounded_and_its_1_based_epoch(cpu_hw) -> None:
    cfg = _cfg(epochs=10, lr=1e-12, patience=2, min_delta=1e-3)
    result = fit(nn.Linear(4, 1), DataLoader(_data(), batch_size=8), eval_loader=DataLoader(_data(16, 1), batch_size=8),
                 config=cfg, loss_fn=_mse, hw=cpu_hw)  # fmt: skip
    best = result.history["eval_loss"].iloc[0]
    assert result.summary() == (
        f"stopped: early stop (patience 2) after 3 of 10 epochs; best eval_loss {figure(best)} at epoch 1; "
        "precision fp32"
    )
    completed = fit(nn.Linear(4, 1), DataLoader(_data(), batch_size=8), config=_cfg(epochs=2), loss_fn=_mse,
                    hw=cpu_hw)  # fmt: skip
    assert completed.summary().startswith("stopped: completed 2 of 2 epochs; best train_loss ")
    assert completed.best_epoch in (1, 2)


def test_a_run_without_token_inputs_reports_no_tokens_per_s(cpu_hw) -> None:
    """Tensor batches (a head on cached vectors) have no attention mask: no token count, so no 0.0 tokens/s."""
    logs: list[dict[str, float]] = []

    class Logs:
        def on_log(self, metrics: dict[str, float]) -> None:
            logs.append(dict(metrics))

    result = fit(nn.Linear(4, 1), DataLoader(_data(), batch_size=8), config=_cfg(epochs=1), loss_fn=_mse, hw=cpu_hw,
                 callbacks=[Logs()])  # fmt: skip
    assert "tokens_per_s" not in result.history.columns and logs and not any("tokens_per_s" in m for m in logs)
    assert result.timing["run"]["real_tokens"] is None

    class Masked(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 16

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"x": torch.ones(4), "attention_mask": torch.ones(3, dtype=torch.long)}

    def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return model(batch["x"]).pow(2).mean()

    counted = fit(nn.Linear(4, 1), DataLoader(Masked(), batch_size=8), config=_cfg(epochs=1), loss_fn=loss,
                  hw=cpu_hw)  # fmt: skip
    assert counted.history["tokens_per_s"].iloc[0] > 0 and counted.timing["run"]["real_tokens"] == 16 * 3


def _flags() -> tuple[object, ...]:
    return (
        torch.backends.cuda.matmul.fp32_precision,
        torch.backends.cudnn.conv.fp32_precision,
        torch.backends.cudnn.benchmark,
        torch.get_float32_matmul_precision(),
    )


def test_backend_flags_are_restored_after_fit_even_on_error(tmp_path: Path) -> None:
    from kitlib.machine.hardware import fake_profile

    before = _flags()
    hw = fake_profile("CPU", platform="local", interactive=False)  # fit sets explicit (non-TF32) flags, then restores
    fit(nn.Linear(4, 1), DataLoader(_data(), batch_size=8), config=_cfg(epochs=1), loss_fn=_mse, hw=hw)
    assert _flags() == before

    def boom(model: nn.Module, batch: object) -> torch.Tensor:
        raise RuntimeError("user loss failed")

    with pytest.raises(RuntimeError, match="user loss failed"):
        fit(nn.Linear(4, 1), DataLoader(_data(), batch_size=8), config=_cfg(epochs=1), loss_fn=boom, hw=hw)
    assert _flags() == before


def test_run_dir_holds_resolved_config_history_and_timing(cpu_hw, tmp_path: Path) -> None:
    cfg = _cfg(epochs=2, save_last=True)
    fit(
        nn.Linear(4, 1),
        DataLoader(_data(), batch_size=8),
        eval_loader=DataLoader(_data(16, 1), batch_size=8),
        config=cfg,
        loss_fn=_mse,
        hw=cpu_hw,
        run_dir=tmp_path,
    )
    resolved = json.loads((tmp_path / "config.json").read_text())
    assert TrainConfig.from_dict(resolved["config"]) == cfg
    assert resolved["precision"]["dtype"] == "fp32" and resolved["precision"]["reason"]
    timing = json.loads((tmp_path / "timing.json").read_text())
    for phase in ("data_wait", "h2d", "forward", "backward", "optimizer", "eval", "checkpoint"):
        assert timing["phases"][phase]["count"] > 0
    assert (
        timing["run"]["steps"] == 16 and timing["run"]["samples"] == 2 * 64 and len(timing["run"]["epoch_gaps_s"]) == 1
    )
    # Phases on the critical path never add up to more than the wall clock (the writer thread runs beside them).
    critical = sum(v["seconds"] for k, v in timing["phases"].items() if k != "checkpoint_write_background")
    assert critical <= timing["wall_seconds"] * 1.01
    history = (tmp_path / "history.csv").read_text().splitlines()
    assert history[0].startswith("epoch,") and len(history) == 3
    assert (tmp_path / "best" / "model.safetensors").exists() and (tmp_path / "last" / "state.pt").exists()


def test_freeze_encoder_trains_only_the_head(cpu_hw) -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = nn.Linear(4, 8)
            self.head = nn.Linear(8, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(torch.relu(self.encoder(x)))

    net = Net()
    encoder_before = net.encoder.weight.detach().clone()
    head_before = net.head.weight.detach().clone()
    fit(net, DataLoader(_data(), batch_size=8), config=_cfg(epochs=1, freeze="encoder"), loss_fn=_mse, hw=cpu_hw)
    assert torch.equal(net.encoder.weight, encoder_before)
    assert not torch.equal(net.head.weight, head_before)


def test_freeze_layers_trains_only_the_blocks_above_and_records_no_backward_below(cpu_hw) -> None:
    from transformers import BertConfig, BertForSequenceClassification

    from kitlib.engine.optim import freeze

    cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=32)
    torch.manual_seed(0)
    model = BertForSequenceClassification(cfg)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    ids = torch.randint(1, 50, (16, 6))
    rows = [
        {"input_ids": i, "attention_mask": torch.ones(6, dtype=torch.long), "labels": torch.tensor(k % 2)}
        for k, i in enumerate(ids)
    ]
    fit(model, DataLoader(rows, batch_size=8), config=_cfg(epochs=1, lr=1e-2, freeze_layers=2), hw=cpu_hw)
    changed = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    frozen = {
        name
        for name in before
        if name.startswith(("bert.embeddings.", "bert.encoder.layer.0.", "bert.encoder.layer.1."))
    }
    assert frozen and not (changed & frozen)
    assert any(n.startswith("bert.encoder.layer.2.") for n in changed) and "classifier.weight" in changed
    # Nothing below block 2 requires grad, so the hidden state entering block 2 has no autograd history.
    seen = []
    model.bert.encoder.layer[2].register_forward_pre_hook(lambda _m, args: seen.append(args[0].requires_grad))
    model(input_ids=ids[:2])
    assert seen == [False]
    with pytest.raises(ValueError, match="freeze_layers=9"):
        freeze(BertForSequenceClassification(cfg), "none", 9)
    with pytest.raises(ValueError, match="freeze_layers must be >= 0"):
        _cfg(freeze_layers=-1)


def test_impossible_precision_fails_before_any_work() -> None:
    from kitlib.machine.hardware import fake_profile
    from kitlib.machine.precision import PrecisionError

    model = nn.Linear(4, 1)
    before = model.weight.detach().clone()
    with pytest.raises(PrecisionError, match="fp16"):
        fit(
            model, DataLoader(_data(), batch_size=8), config=_cfg(precision="bf16"), loss_fn=_mse, hw=fake_profile("T4")
        )
    assert torch.equal(model.weight, before)


@pytest.mark.slow
def test_torch_compile_trains(cpu_hw) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    result = fit(
        model,
        DataLoader(_data(), batch_size=8, drop_last=True),
        config=_cfg(epochs=3, compile=True),
        loss_fn=_mse,
        hw=cpu_hw,
    )
    assert result.history["train_loss"].iloc[-1] < result.history["train_loss"].iloc[0]
    assert not hasattr(result.model, "_orig_mod")  # the plain module comes back, ready to save


def test_a_full_eval_that_reports_eval_loss_replaces_the_loss_only_pass(cpu_hw) -> None:
    passes: list[int] = []

    def full_eval(model: nn.Module) -> dict[str, float]:
        passes.append(1)
        x, y = _data(16, 1).tensors
        return {"eval_loss": float(nn.functional.mse_loss(model(x), y)), "r2": 0.0}

    result = fit(
        nn.Linear(4, 1),
        DataLoader(_data(), batch_size=8),
        eval_loader=DataLoader(_data(16, 1), batch_size=8),
        config=_cfg(epochs=3, full_eval_every=2),
        loss_fn=_mse,
        full_eval=full_eval,
        hw=cpu_hw,
    )
    assert len(passes) == 2  # epochs 2 and 3 (due, then at the end)
    assert result.timing["phases"]["eval"]["count"] == 1  # the loss-only pass ran only in epoch 1
    assert result.history["eval_loss"].notna().all()


def test_freeze_encoder_of_an_encoder_decoder_keeps_the_shared_embedding_and_says_what_it_froze(
    cpu_hw, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import T5Config, T5ForConditionalGeneration

    from kitlib.engine.optim import freeze

    cfg = T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_decoder_layers=2, num_heads=2,
                   decoder_start_token_id=0, pad_token_id=0)  # fmt: skip
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(cfg)
    assert model.lm_head.weight is model.shared.weight is model.encoder.embed_tokens.weight  # tied, as in t5-small
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    ids = torch.randint(1, 64, (16, 6))
    rows = [{"input_ids": i, "attention_mask": torch.ones(6, dtype=torch.long), "labels": i.flip(0)} for i in ids]
    fit(model, DataLoader(rows, batch_size=8), config=_cfg(epochs=1, lr=1e-2, freeze="encoder"), hw=cpu_hw)
    notice = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("fit: freeze="))
    assert re.match(r"fit: freeze='encoder': froze [\d,]+ of [\d,]+ parameters \(encoder ", notice)
    assert "kept trainable, shared with the decoder/lm_head: encoder.embed_tokens.weight" in notice
    assert "lm_head.weight" in notice and "decoder.embed_tokens.weight" in notice
    changed = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    encoder_own = {n for n in before if n.startswith("encoder.") and n != "encoder.embed_tokens.weight"}
    assert encoder_own and not (changed & encoder_own)  # the encoder stack is frozen ...
    assert model.shared.weight.requires_grad and "shared.weight" in changed  # ... the shared embedding is not
    assert any(n.startswith("decoder.") for n in changed)
    frozen = freeze(T5ForConditionalGeneration(cfg), "encoder")
    assert frozen.parts == (("encoder", frozen.params),) and frozen.params == sum(
        p.numel() for n, p in model.named_parameters() if n in encoder_own
    )


class Block(nn.Module):
    """A residual MLP block that counts its forward passes (recomputation runs it again)."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(4, 16), nn.GELU(), nn.Linear(16, 4))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x + self.mlp(x)


class Blocks(nn.Module):
    """A plain stack of blocks (no Hugging Face switch): its blocks are named by checkpoint_modules."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class WrappedBert(nn.Module):
    """A wrapper module holding a Hugging Face model as a submodule."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import BertConfig, BertModel

        cfg = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip
        self.text = BertModel(cfg, add_pooling_layer=False)
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.text(input_ids=x).last_hidden_state.mean(1))


def _loss_and_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.train()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("kind", ["plain", "wrapper"])
def test_gradient_checkpointing_for_plain_modules_and_wrappers_gives_the_same_loss_and_gradients(kind: str) -> None:
    import copy

    from kitlib.engine.step import enable_activation_checkpointing

    torch.manual_seed(0)
    if kind == "plain":
        model: nn.Module = Blocks()
        x, names = torch.randn(8, 4), ("blocks",)
    else:
        model, x, names = WrappedBert(), torch.randint(1, 40, (8, 5)), ()
    y = torch.randn(8, 1)
    twin = copy.deepcopy(model)
    assert enable_activation_checkpointing(twin, names) == (["blocks.0", "blocks.1", "blocks.2"] if names else ["text"])
    loss, grads = _loss_and_grads(model, x, y)
    loss_ckpt, grads_ckpt = _loss_and_grads(twin, x, y)
    torch.testing.assert_close(loss_ckpt, loss)
    assert len(grads_ckpt) == len(grads) == len(list(model.parameters()))
    for g_ckpt, g in zip(grads_ckpt, grads, strict=True):
        torch.testing.assert_close(g_ckpt, g)
    if kind == "plain":  # recomputed in backward: block 1 ran twice (once without the checkpoint wrapper)
        assert (model.blocks[1].calls, twin.blocks[1].calls) == (1, 2)
        assert set(twin.state_dict()) == set(model.state_dict())  # checkpoints keep their names
    else:
        # transformers 5 calls it is_activation_checkpointing, 4.x is_gradient_checkpointing
        assert getattr(twin.text, "is_activation_checkpointing", None) or twin.text.is_gradient_checkpointing


def test_gradient_checkpointing_through_fit_and_the_error_naming_the_fix(cpu_hw) -> None:
    model = Blocks()
    loader = DataLoader(_data(), batch_size=8)
    with pytest.raises(ValueError, match=r"checkpoint_modules=\('blocks',\)"):
        fit(model, loader, config=_cfg(epochs=1, gradient_checkpointing=True), loss_fn=_mse, hw=cpu_hw)
    with pytest.raises(ValueError, match="no submodule or class named 'block'"):
        fit(model, loader, config=_cfg(epochs=1, gradient_checkpointing=True, checkpoint_modules=("block",)),
            loss_fn=_mse, hw=cpu_hw)  # fmt: skip
    with pytest.raises(ValueError, match="needs gradient_checkpointing=True"):
        _cfg(checkpoint_modules=("blocks",))
    by_class = _cfg(epochs=1, gradient_checkpointing=True, checkpoint_modules=("Block",))
    assert TrainConfig.from_dict(json.loads(json.dumps(by_class.to_dict()))) == by_class  # a saved config reads back
    result = fit(model, loader, config=by_class, loss_fn=_mse, hw=cpu_hw)
    assert result.steps == 8 and model.blocks[1].calls == 2 * 8  # every step recomputed block 1 in backward


def test_eval_every_steps_records_loss_only_evals_between_epochs_without_changing_the_run(
    cpu_hw, tmp_path: Path
) -> None:
    class Logs:
        def __init__(self) -> None:
            self.evals: list[dict[str, float]] = []

        def on_log(self, metrics: dict[str, float]) -> None:
            if "eval_loss" in metrics:
                self.evals.append(dict(metrics))

    def run(cfg: TrainConfig, run_dir: Path | None = None, logs: object = ()) -> tuple[nn.Module, object]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.3), nn.Linear(16, 1))  # dropout: draws from the RNG
        result = fit(model, DataLoader(_data(), batch_size=8, shuffle=True), config=cfg, loss_fn=_mse, hw=cpu_hw,
                     eval_loader=DataLoader(_data(32, seed=1), batch_size=8), run_dir=run_dir,
                     callbacks=[logs] if logs else [])  # fmt: skip
        return model, result

    logs = Logs()
    model, result = run(_cfg(epochs=2, eval_every_steps=3), tmp_path, logs)
    assert [(e["epoch"], e["step"]) for e in result.step_evals] == [(1, 3), (1, 6), (2, 9), (2, 12), (2, 15)]
    assert all(math.isfinite(e["eval_loss"]) for e in result.step_evals)
    assert logs.evals == [{"step": e["step"], "eval_loss": e["eval_loss"]} for e in result.step_evals]
    assert len(result.history) == 2 and "eval_loss" in result.history  # the epoch rows are as before
    assert (tmp_path / "step_evals.csv").read_text().splitlines()[0] == "epoch,step,eval_loss"
    assert result.timing["phases"]["eval"]["count"] == 5 + 2
    plain, _ = run(_cfg(epochs=2))
    for a, b in zip(model.parameters(), plain.parameters(), strict=True):  # the same training run
        assert torch.equal(a, b)
    assert TrainConfig(eval_every_steps=5).resume_differences(TrainConfig().to_dict()) == []
    with pytest.raises(ValueError, match="eval_every_steps=3 needs an eval_loader"):
        fit(nn.Linear(4, 1), DataLoader(_data(), batch_size=8), config=_cfg(eval_every_steps=3), loss_fn=_mse,
            hw=cpu_hw)  # fmt: skip
    with pytest.raises(ValueError, match="eval_every_steps must be >= 1"):
        _cfg(eval_every_steps=0)


def test_a_deep_copy_of_a_checkpointed_block_runs_its_own_weights() -> None:
    """A background eval's CPU copy (or an EMA) of a model with checkpoint_modules must not call the original."""
    import copy

    from kitlib.engine.step import enable_activation_checkpointing

    model = nn.Sequential(Block(), Block()).train()
    enable_activation_checkpointing(model, ("0",))
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    x = torch.randn(3, 4)
    assert not torch.allclose(twin(x), model(x))
    assert list(twin.state_dict()) == list(model.state_dict())  # names unchanged


def test_a_train_config_names_every_bad_field_and_needs_an_lr() -> None:
    # lr=None passed the table's None guard and failed later in the optimizer; only the first problem was said
    from kitlib.config import TrainConfig

    with pytest.raises(ValueError, match=r"lr must be > 0, got None"):
        TrainConfig(lr=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"epochs must be >= 1, got 0; lr must be > 0, got 0"):
        TrainConfig(lr=0, epochs=0)
