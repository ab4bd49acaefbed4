"""FLOPs per token, a CPU's matmul peak and model FLOPs utilisation (MFU, PaLM appendix B): only the matmuls the
model needs count, so padding and recomputation show as lower MFU."""

from __future__ import annotations

import time

import torch
from torch import nn

from kitlib.models.facts import model_facts


def flops_per_token(n_params: int, n_layers: int, seq_len: int, d_model: int, *, training: bool = True) -> float:
    """Model FLOPs per token: 6N + 12*L*T*d trained, 2N + 4*L*T*d forward (N: non-embedding parameters).

    >>> flops_per_token(10_000_000, 6, 128, 384)
    63538944.0"""
    forward = 2.0 * n_params + 4.0 * n_layers * seq_len * d_model
    return 3.0 * forward if training else forward


def model_flops_per_token(model: nn.Module, seq_len: int, *, training: bool = True) -> float:
    """``flops_per_token`` for a Hugging Face model (layers, width from ``model.config``; no attention term without)."""
    facts = model_facts(model)
    return flops_per_token(
        facts["model_non_embedding_params"], facts["model_layers"], seq_len, facts["model_width"], training=training
    )


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float) -> float:
    """Model FLOPs utilisation in [0, 1]: tokens/s x FLOPs per token / peak FLOP/s (pass real, unpadded tokens/s)."""
    if peak_flops <= 0:
        raise ValueError(f"peak_flops must be > 0, got {peak_flops}")
    return tokens_per_s * flops_per_token / peak_flops


def measure_cpu_peak(dtype: torch.dtype = torch.float32, seconds: float = 0.5, size: int = 1024) -> float:
    """Achievable matmul FLOP/s of this CPU with torch's threads: the best of repeated 1024^2 matmuls over ``seconds``
    plus a warm-up. Not cached: keep the result."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    torch.mm(a, b)  # warm-up: thread pool start, page faults on the output
    flop = 2.0 * size**3
    best = 0.0
    deadline = time.perf_counter() + seconds
    while True:
        start = time.perf_counter()
        torch.mm(a, b)
        elapsed = time.perf_counter() - start
        best = max(best, flop / elapsed)
        if start + elapsed >= deadline:
            return best
