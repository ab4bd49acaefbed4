"""Model FLOPs per token (PaLM appendix B: only the matmuls the model needs count, so padding and recomputation show as
lower MFU) and a CPU's matmul peak."""

from __future__ import annotations

import time

import torch


def flops_per_token(n_params: int, n_layers: int, seq_len: int, d_model: int, *, training: bool = True) -> float:
    """Model FLOPs per token: 6N + 12*L*T*d trained, 2N + 4*L*T*d forward (N: non-embedding parameters).

    >>> flops_per_token(10_000_000, 6, 128, 384)
    63538944.0"""
    forward = 2.0 * n_params + 4.0 * n_layers * seq_len * d_model
    return 3.0 * forward if training else forward


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
