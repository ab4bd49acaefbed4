"""The seeds' workloads all train with fit(): tiny offline models built from configs; each loss falls."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from kitlib import TrainConfig, fit
from kitlib.engine.evaluation import SplitEval

VOCAB, PAD, BOS, EOS = 32, 0, 1, 2


def _copy_task(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sources of random tokens; targets are the sources reversed, then EOS (a learnable 'summary')."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, VOCAB, (n, 6), generator=g)
    tgt = torch.cat([src.flip(1), torch.full((n, 1), EOS)], dim=1)
    return src, tgt


class Seq2SeqData(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int, seed: int) -> None:
        self.src, self.tgt = _copy_task(n, seed)

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.src[i], "attention_mask": torch.ones_like(self.src[i]), "labels": self.tgt[i]}


def _falls(history) -> None:  # type: ignore[no-untyped-def]
    losses = history["train_loss"].tolist()
    assert losses[-1] < 0.8 * losses[0], losses


def _exact_match(predictions: list[list[int]], references: list[list[int]]) -> dict[str, float]:
    """The CPU-bound half of the full eval (in real tasks: executing SQL, ROUGE); runs in the background pool."""
    hits = sum(p[: len(r)] == r for p, r in zip(predictions, references, strict=True))
    return {"exact_match": hits / len(references)}


def test_t5_seq2seq_with_generating_full_eval_every_2_epochs(cpu_hw, tmp_path) -> None:
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    config = T5Config(
        vocab_size=VOCAB,
        d_model=64,
        d_ff=128,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        d_kv=16,
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=PAD,
    )
    model = T5ForConditionalGeneration(config)
    train, valid = Seq2SeqData(256, 0), Seq2SeqData(32, 1)
    calls: list[int] = []

    def generate(m: nn.Module) -> tuple[list[list[int]], list[list[int]]]:
        calls.append(1)
        generated = m.generate(
            input_ids=valid.src, attention_mask=torch.ones_like(valid.src), max_new_tokens=8, do_sample=False
        )
        return [row[1:].tolist() for row in generated], valid.tgt.tolist()  # drop the decoder start token

    full_eval = SplitEval(generate, lambda measured: _exact_match(*measured))  # scored in a background thread

    cfg = TrainConfig(
        epochs=6,
        micro_batch_size=16,
        grad_accum_steps=2,
        lr=3e-3,
        full_eval_every=2,
        monitor="exact_match",
        mode="max",
        precision="fp32",
        warmup_ratio=0.05,
    )
    result = fit(
        model,
        DataLoader(train, batch_size=16, shuffle=True),
        eval_loader=DataLoader(valid, batch_size=32),
        config=cfg,
        full_eval=full_eval,
        hw=cpu_hw,
        run_dir=tmp_path / "t5",
    )
    _falls(result.history)
    assert len(calls) == 3  # epochs 2, 4, 6: the expensive eval is not run every epoch
    scored = result.history.dropna(subset=["exact_match"])
    assert scored["epoch"].tolist() == [2, 4, 6]  # each result joined to its own (1-based) epoch's record
    assert result.best_epoch in (2, 4, 6)
    assert (tmp_path / "t5" / "best" / "model.safetensors").exists()


class BiLSTMSummariser(nn.Module):
    """A custom encoder-decoder with its own loss: as easy to train as a transformer."""

    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32, padding_idx=PAD)
        self.encoder = nn.LSTM(32, hidden, batch_first=True, bidirectional=True)
        self.bridge = nn.Linear(2 * hidden, hidden)
        self.decoder = nn.LSTM(32, hidden, batch_first=True)
        self.attend = nn.Linear(hidden, 2 * hidden)
        self.out = nn.Linear(hidden + 2 * hidden, VOCAB)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        memory, (h, _) = self.encoder(self.embed(src))
        h0 = torch.tanh(self.bridge(torch.cat([h[0], h[1]], dim=-1))).unsqueeze(0)
        dec, _ = self.decoder(self.embed(tgt_in), (h0, torch.zeros_like(h0)))
        weights = torch.softmax(self.attend(dec) @ memory.transpose(1, 2), dim=-1)
        return self.out(torch.cat([dec, weights @ memory], dim=-1))


def _bilstm_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    src, tgt = batch
    tgt_in = torch.cat([torch.full_like(tgt[:, :1], BOS), tgt[:, :-1]], dim=1)  # teacher forcing
    logits = model(src, tgt_in)
    return nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=PAD)


def test_custom_bilstm_encoder_decoder_with_its_own_loss(cpu_hw) -> None:
    torch.manual_seed(0)
    src, tgt = _copy_task(384, 0)
    cfg = TrainConfig(epochs=5, micro_batch_size=32, lr=5e-3, precision="fp32")
    result = fit(
        BiLSTMSummariser(),
        DataLoader(TensorDataset(src, tgt), batch_size=32, shuffle=True),
        config=cfg,
        loss_fn=_bilstm_loss,
        count_fn=lambda b: (b[1] != PAD).sum(),
        hw=cpu_hw,
    )
    _falls(result.history)


def test_gpt2_causal_lm_with_gradient_checkpointing(cpu_hw) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=32, bos_token_id=BOS, eos_token_id=EOS)
    )
    # A learnable language: each row counts upwards modulo the vocabulary from a random start.
    starts = torch.randint(3, VOCAB, (256, 1), generator=torch.Generator().manual_seed(0))
    ids = 3 + (starts - 3 + torch.arange(16)) % (VOCAB - 3)
    data = [{"input_ids": row, "labels": row} for row in ids]
    cfg = TrainConfig(
        epochs=4, micro_batch_size=16, grad_accum_steps=2, lr=3e-3, precision="fp32", gradient_checkpointing=True
    )
    result = fit(model, DataLoader(data, batch_size=16, shuffle=True), config=cfg, hw=cpu_hw)
    # transformers 5 calls it is_activation_checkpointing, 4.x is_gradient_checkpointing
    assert getattr(result.model, "is_activation_checkpointing", None) or result.model.is_gradient_checkpointing
    _falls(result.history)


class PriceRegressor(nn.Module):
    """A transformer text encoder plus numeric features -> log price."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import BertConfig, BertModel

        self.encoder = BertModel(
            BertConfig(
                vocab_size=VOCAB,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                max_position_embeddings=32,
            )
        )
        self.numeric = nn.Sequential(nn.Linear(3, 16), nn.ReLU())
        self.head = nn.Linear(32 + 16, 1)

    def forward(self, input_ids: torch.Tensor, numeric: torch.Tensor) -> torch.Tensor:
        mask = (input_ids != PAD).long()
        hidden = self.encoder(input_ids=input_ids, attention_mask=mask).last_hidden_state
        pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        return self.head(torch.cat([pooled, self.numeric(numeric)], dim=-1)).squeeze(-1)


def smape(pred: torch.Tensor, target: torch.Tensor) -> float:
    return float((2 * (pred - target).abs() / (pred.abs() + target.abs()).clamp_min(1e-8)).mean() * 100)


def test_text_plus_numeric_price_regression_with_smape(cpu_hw) -> None:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, VOCAB, (512, 12), generator=g)
    numeric = torch.randn(512, 3, generator=g)
    log_price = 2.0 + 0.05 * ids[:, :3].float().sum(1) / 3 + 0.5 * numeric[:, 0]
    data = TensorDataset(ids, numeric, log_price)

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return nn.functional.l1_loss(model(batch[0], batch[1]), batch[2])  # L1 on log price ~ relative error

    def full_eval(model: nn.Module) -> dict[str, float]:
        return {"smape": smape(model(ids[:128], numeric[:128]).exp(), log_price[:128].exp())}

    cfg = TrainConfig(
        epochs=5,
        micro_batch_size=32,
        lr=3e-3,
        precision="fp32",
        full_eval_every=1,
        monitor="smape",
        mode="min",
        background_eval="off",
    )
    result = fit(
        PriceRegressor(),
        DataLoader(data, batch_size=32, shuffle=True),
        config=cfg,
        loss_fn=loss_fn,
        full_eval=full_eval,
        hw=cpu_hw,
    )
    _falls(result.history)
    assert result.history["smape"].iloc[-1] < result.history["smape"].iloc[0]
