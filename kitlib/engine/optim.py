"""Optimizer, learning-rate schedule and parameter freezing for fit()."""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from kitlib.config import TrainConfig
from kitlib.errors import SetupError, pip_install


@dataclass(frozen=True)
class Frozen:
    """What ``freeze`` froze: ``str()`` is the one-line notice fit() gives (a warning, as for its other notices)."""

    what: str
    layers: int
    params: int  # parameters frozen (each shared tensor counted once)
    total: int  # parameters in the model (each shared tensor counted once)
    parts: tuple[tuple[str, int], ...]  # (module path, parameters frozen there)
    kept_shared: tuple[str, ...] = ()  # left trainable: the decoder/lm_head uses them too (encoder-decoder models)
    shared_frozen: tuple[str, ...] = ()  # frozen although modules outside the frozen part use them too (tied)

    def __int__(self) -> int:
        return self.params

    def __str__(self) -> str:
        asked = f"freeze={self.what!r}" + (f", freeze_layers={self.layers}" if self.layers else "")
        parts = ", ".join(f"{name or 'the model'} {count:,}" for name, count in self.parts)
        text = f"{asked}: froze {self.params:,} of {self.total:,} parameters ({parts})"
        if self.kept_shared:
            text += f"; kept trainable, shared with the decoder/lm_head: {'; '.join(self.kept_shared)}"
        if self.shared_frozen:
            text += f"; also frozen where they are shared (tied): {'; '.join(self.shared_frozen)}"
        return text


def freeze(model: nn.Module, what: str, layers: int = 0) -> Frozen:
    """Freeze ``what`` ("embeddings", "encoder") and the first ``layers`` blocks in place; returns what it froze."""
    if what not in ("none", "embeddings", "encoder"):
        raise ValueError(f"freeze={what!r}: use 'none', 'embeddings' or 'encoder'")
    targets = [] if what == "none" else [_part(model, what)]
    if layers > 0:
        targets.append(_part(model, "embeddings"))
        base = getattr(model, "base_model", model)
        targets += list(_blocks(base if isinstance(base, nn.Module) else model, layers))[:layers]
    module_names = {id(m): name for name, m in model.named_modules(remove_duplicate=False)}
    uses: dict[int, list[str]] = {}  # every name each parameter tensor has in the model
    for name, param in model.named_parameters(remove_duplicate=False):
        uses.setdefault(id(param), []).append(name)
    keep_shared = what == "encoder" and _encoder_decoder(model)
    frozen, parts, kept, tied = 0, [], [], []
    for target in targets:
        prefix = module_names.get(id(target), "")
        inside = f"{prefix}." if prefix else ""
        count = 0
        for name, param in target.named_parameters():
            outside = [n for n in uses.get(id(param), []) if not n.startswith(inside)]
            shared = f"{inside}{name} (also {', '.join(outside)}; {param.numel():,})"
            if outside and keep_shared and target is targets[0]:
                kept.append(shared)
                continue
            if param.requires_grad:
                param.requires_grad_(False)
                count += param.numel()
                if outside:
                    tied.append(shared)
        frozen += count
        parts.append((prefix, count))
    total = sum({id(p): p.numel() for p in model.parameters()}.values())
    return Frozen(what, layers, frozen, total, tuple(parts), tuple(kept), tuple(tied))


def _encoder_decoder(model: nn.Module) -> bool:
    config = getattr(model, "config", None)
    return bool(getattr(config, "is_encoder_decoder", False)) and callable(getattr(model, "get_encoder", None))


def _part(model: nn.Module, what: str) -> nn.Module:
    if what == "embeddings":
        get = getattr(model, "get_input_embeddings", None)
        target = get() if callable(get) else getattr(model, "embeddings", None) or getattr(model, "embedding", None)
        base = getattr(model, "base_model", None)
        whole = getattr(base, "embeddings", None)  # BERT-style: word + position + type embeddings and their norm
        if isinstance(whole, nn.Module) and isinstance(target, nn.Module) and target in set(whole.modules()):
            target = whole
    elif _encoder_decoder(model):  # T5, BART: the encoder stack, not the decoder that base_model also holds
        target = model.get_encoder()  # type: ignore[operator]
    else:
        base = getattr(model, "base_model", None)
        target = base if isinstance(base, nn.Module) and base is not model else getattr(model, "encoder", None)
    if not isinstance(target, nn.Module):
        raise ValueError(
            f"freeze={what!r}: {type(model).__name__} has no recognisable {what} "
            "(expected a Hugging Face model, or an attribute named 'embedding(s)'/'encoder'); freeze by hand instead"
        )
    return target


def _blocks(model: nn.Module, layers: int) -> nn.ModuleList:
    """The transformer block stack: the first ModuleList as long as the config's layers, else >= ``layers`` long."""
    config = getattr(model, "config", None)
    count = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
    stacks = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) >= max(layers, 1)]
    exact = [m for m in stacks if len(m) == count]
    if not (exact or stacks):
        raise ValueError(
            f"freeze_layers={layers}: {type(model).__name__} has no stack of >= {layers} blocks (an nn.ModuleList); "
            "lower freeze_layers or freeze by hand"
        )
    return (exact or stacks)[0]


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW without decay on 1-d params: torch's (fused where possible) or bitsandbytes' 8-bit ("adamw8bit")."""
    trained = [p for p in model.parameters() if p.requires_grad]
    if not trained:
        raise ValueError("no trainable parameters: everything is frozen (check TrainConfig.freeze)")
    groups = [{"params": [p for p in trained if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in trained if p.dim() < 2], "weight_decay": 0.0}]  # fmt: skip
    if cfg.optimizer == "adamw8bit":  # bitsandbytes': 2 bytes of state a parameter; fp16 runs sync once a step
        bitsandbytes = _optional("bitsandbytes", "bitsandbytes", cfg, "optimizer='adamw'")
        return bitsandbytes.optim.AdamW8bit(groups, lr=cfg.lr, betas=cfg.betas)
    if cfg.optimizer == "adamw-kahan":  # torch-optimi's: bf16 weights learn as fp32 ones (+2 bytes a parameter)
        optimi = _optional("optimi", "torch-optimi", cfg, "optimizer='adamw' with fp32 weights (model.float())")
        return optimi.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=1e-8, kahan_sum=True)
    devices = {p.device.type for p in trained}
    floating = all(p.is_floating_point() for p in trained)
    fused = len(devices) == 1 and devices <= {"cuda", "cpu", "mps"} and floating
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, fused=fused)


def _optional(module: str, package: str, cfg: TrainConfig, instead: str) -> Any:
    """``module`` imported, or a SetupError naming the pip line for ``package`` and the optimizer to use ``instead``."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise SetupError(
            f"optimizer={cfg.optimizer!r} needs {package} ({error}). Fix: {pip_install(package, 'lean')}, or {instead}"
        ) from error


def cast_for_optimizer(model: nn.Module, cfg: TrainConfig, dtype: str) -> str:
    """adamw-kahan in a bf16 run: cast trainable (and unadapted frozen) fp32 params to bf16; returns fit's line."""
    if cfg.optimizer != "adamw-kahan" or dtype != "bf16":
        return ""
    whole = cfg.adapter == "none" and not any(type(m).__module__.startswith("peft.") for m in model.modules())
    fp32 = [p for p in model.parameters() if p.dtype == torch.float32]
    trained = [p for p in fp32 if p.requires_grad]
    frozen = [p for p in fp32 if not p.requires_grad and whole and type(p) is nn.Parameter]  # not bitsandbytes'
    for param in trained + frozen:
        param.data = param.data.to(torch.bfloat16)
    counts = [(sum(p.numel() for p in part), what) for part, what in ((trained, "trainable"), (frozen, "frozen"))]
    said = [f"{n:,} {what}" for n, what in counts if n]
    if not said:  # the model came in bf16 already
        return ""
    whole_model = " (the whole model in bf16)" if frozen else ""
    return (
        f"optimizer='adamw-kahan': {' and '.join(said)} fp32 weights cast to bf16{whole_model} (Kahan-summed updates)"
    )


def lr_lambda(cfg: TrainConfig, total_steps: int) -> LrMultiplier:
    return LrMultiplier(cfg.schedule, total_steps, round(cfg.warmup_ratio * total_steps), cfg.min_lr_ratio)


class LrMultiplier:
    """Linear warmup from 0, then cosine/linear decay to ``min_ratio`` (or constant); a picklable LambdaLR rule."""

    def __init__(self, schedule: str, total_steps: int, warmup_steps: int, min_ratio: float) -> None:
        self.schedule, self.total, self.warmup, self.min_ratio = schedule, max(1, total_steps), warmup_steps, min_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / (self.warmup + 1)
        if self.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if self.schedule == "cosine" else 1.0 - progress
        return self.min_ratio + (1.0 - self.min_ratio) * shape


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: TrainConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Stepped once per *optimizer* step (not per micro-batch), so accumulation does not stretch the warmup."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg, total_steps))
