"""Models, batches and measurements the GPU suite's checks share: every model is built from a config (no download)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from kitlib import Callback

VOCAB = 2000


def cuda() -> bool:
    return torch.cuda.is_available()


def device() -> torch.device:
    return torch.device("cuda" if cuda() else "cpu")


def sync() -> None:
    if cuda():
        torch.cuda.synchronize()


def bert_config(quick: bool, vocab: int = VOCAB) -> Any:
    """MiniLM-L6's shape (kitlib's default model) at full size; a 2-layer one for quick runs."""
    from transformers import BertConfig

    hidden, layers, heads = (64, 2, 2) if quick else (384, 6, 12)
    return BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        max_position_embeddings=512,
        pad_token_id=0,
    )


def minilm_folder(path: Path, dtype: torch.dtype, quick: bool, *, pooling: str = "mean") -> Path:
    """A model folder laid out as all-MiniLM-L6-v2 (the default model): a bare BertModel, its pooler included, with
    sentence-transformers' mean pooling (``pooling="mean"``), or a Hugging Face sequence classifier (``"cls"``),
    saved in ``dtype`` as users' folders often are."""
    from transformers import BertForSequenceClassification, BertModel

    torch.manual_seed(0)
    build: Any = BertModel if pooling == "mean" else BertForSequenceClassification
    build(bert_config(quick)).to(dtype).save_pretrained(path)
    if pooling == "mean":
        (path / "1_Pooling").mkdir(parents=True, exist_ok=True)
        (path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    return path


def bert_classifier(quick: bool) -> nn.Module:
    from transformers import BertForSequenceClassification

    torch.manual_seed(0)
    return BertForSequenceClassification(bert_config(quick))


def llama(quick: bool, *, hidden: int = 512, layers: int = 8) -> nn.Module:
    """A Llama-shaped causal LM (RMSNorm, SwiGLU, rotary, grouped-query attention) from a config."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if quick:
        hidden, layers = 64, 2
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=8000,
        hidden_size=hidden,
        intermediate_size=int(hidden * 8 / 3) // 64 * 64 or 128,
        num_hidden_layers=layers,
        num_attention_heads=max(2, hidden // 64),
        num_key_value_heads=max(1, hidden // 128),
        max_position_embeddings=2048,
    )
    return LlamaForCausalLM(config)


def class_batches(n: int, rows: int, length: int, *, vocab: int = VOCAB, seed: int = 0) -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(seed)
    return [
        {
            "input_ids": torch.randint(5, vocab, (rows, length), generator=g),
            "attention_mask": torch.ones(rows, length, dtype=torch.long),
            "labels": torch.randint(0, 2, (rows,), generator=g),
        }
        for _ in range(n)
    ]


def lm_batches(n: int, rows: int, length: int, *, vocab: int = 8000, seed: int = 0) -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(5, vocab, (rows, length), generator=g)
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
    return out


def row_loader(batches: list[dict[str, Any]]) -> DataLoader[Any]:
    """The same rows through a batch_sampler (what DDP shards): one dict per row, batched as given."""
    rows = [{k: v[i] for k, v in b.items()} for b in batches for i in range(len(b["input_ids"]))]
    return DataLoader(rows, batch_size=len(batches[0]["input_ids"]), shuffle=False)  # type: ignore[arg-type]


def pinned(batches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Batches as kitlib's loaders hand them over on a GPU: in pinned host memory (the copy is then async)."""
    if not cuda():
        return batches
    return [{k: v.pin_memory() for k, v in b.items()} for b in batches]


def loader(batches: list[dict[str, Any]]) -> DataLoader[Any]:
    return DataLoader(batches, batch_size=None, shuffle=False)  # type: ignore[arg-type]  # pre-built batches, yielded as they are


def variable_lengths(n: int, *, low: int, high: int, seed: int = 0) -> list[int]:
    """Lognormal-ish token lengths between low and high, like real text (a long tail)."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.exp(torch.randn(n, generator=g) * 0.6) * (low + high) / 4
    return [int(v) for v in raw.clamp(low, high).round()]


def token_dataset(lengths: list[int], *, vocab: int = VOCAB, seed: int = 0) -> Any:
    from kitlib.data.loaders import TokenDataset

    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(5, vocab, (n,), generator=g).numpy() for n in lengths]
    labels = torch.randint(0, 2, (len(lengths),), generator=g).numpy()
    return TokenDataset(rows, labels, pad_id=0)


class StepClock(Callback):
    """Wall time of the steps after ``warm`` (one device sync at each end), and the loop for the check to read."""

    def __init__(self, warm: int) -> None:
        self.warm, self.steps, self.loop = warm, 0, None
        self.t0: float | None = None
        self.t1: float | None = None
        self.step_seconds: list[float] = []
        self.real_tokens: Any = 0
        self.computed_tokens = 0
        self.shapes: set[tuple[int, ...]] = set()

    def on_fit_start(self, loop: Any) -> None:
        self.loop = loop

    def on_step_end(self, step: Any) -> None:
        self.steps += 1
        self.step_seconds.append(step.seconds)
        self.shapes.update(step.shapes)
        if self.steps == self.warm:
            sync()
            self.t0 = time.perf_counter()
        elif self.steps > self.warm:
            self.real_tokens = self.real_tokens + step.real_tokens
            self.computed_tokens += step.computed_tokens

    def on_fit_end(self, loop: Any) -> None:
        sync()
        self.t1 = time.perf_counter()

    @property
    def measured(self) -> int:
        return max(0, self.steps - self.warm)

    def seconds(self) -> float:
        if self.t0 is None or self.t1 is None:
            raise RuntimeError(f"only {self.steps} steps ran; {self.warm} warm-up steps were asked for")
        return self.t1 - self.t0


def fit_speed(model: nn.Module, batches: list[dict[str, Any]], cfg: Any, *, warm: int) -> dict[str, Any]:
    """tokens/s of kitlib.fit over pre-built batches (tokens = input_ids elements), after ``warm`` steps."""
    from kitlib import fit

    clock = StepClock(warm)
    result = fit(model, loader(batches), config=cfg, callbacks=[clock])
    per_step = cfg.grad_accum_steps * batches[0]["input_ids"].numel()
    seconds = clock.seconds()
    return {
        "tokens_per_s": round(per_step * clock.measured / seconds),
        "step_ms": round(1000 * seconds / max(1, clock.measured), 2),
        "precision": result.precision.dtype,
        "tf32": result.precision.tf32,
        "steps": result.steps,
    }


def bare_speed(model: nn.Module, batches: list[dict[str, Any]], dtype: str, *, warm: int) -> dict[str, Any]:
    """The loop a careful user writes: autocast, fused AdamW, clipping, zero_grad(set_to_none), async copies."""
    dev = device()
    model.to(dev).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype)
    t0 = 0.0
    for i, batch in enumerate(batches):
        if i == warm:
            sync()
            t0 = time.perf_counter()
        batch = {k: v.to(dev, non_blocking=True) for k, v in batch.items()}
        with torch.autocast(dev.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    sync()
    seconds = time.perf_counter() - t0
    measured = len(batches) - warm
    return {
        "tokens_per_s": round(batches[0]["input_ids"].numel() * measured / seconds),
        "step_ms": round(1000 * seconds / measured, 2),
    }


def mfu(model: nn.Module, seq_len: int, tokens_per_s: float, dtype: str) -> float | None:
    """Model FLOPs utilisation against the datasheet peak kitlib knows for this GPU (None: unknown card / CPU)."""
    from flop_count import model_flops_per_token

    from kitlib.machine.peaks import peak_flops

    if not cuda():
        return None
    peak = peak_flops(torch.cuda.get_device_name(), dtype)  # type: ignore[arg-type]
    if peak is None:
        return None
    return round(tokens_per_s * model_flops_per_token(model, seq_len) / peak, 4)


def memory() -> dict[str, Any]:
    if not cuda():
        return {}
    stats = torch.cuda.memory_stats()
    return {
        "peak_allocated_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1),
        "peak_reserved_mib": round(torch.cuda.max_memory_reserved() / 2**20, 1),
        "alloc_retries": int(stats.get("num_alloc_retries", 0)),
        "ooms": int(stats.get("num_ooms", 0)),
    }


def reset_memory() -> None:
    if cuda():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def changed_fraction(before: dict[str, torch.Tensor], model: nn.Module, *, skip: str = "embeddings") -> float:
    """Share of weight elements (outside ``skip``: rows of unseen tokens get no gradient) that changed at all."""
    changed = total = 0
    for name, value in model.state_dict().items():
        if skip in name or name not in before or not value.is_floating_point():
            continue
        changed += int((value.detach().cpu().float() != before[name].float()).sum())
        total += value.numel()
    return changed / max(1, total)
