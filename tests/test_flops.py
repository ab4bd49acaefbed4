"""FLOPs per token, the peak table and MFU: the formula against torch's FLOP counter, lookups, the CPU probe."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from benchmarks.flop_count import count_flops, mfu, model_flops_per_token
from kitlib.doctor.flops import flops_per_token, measure_cpu_peak
from kitlib.machine.peaks import PEAK_TFLOPS, gpu_key, peak_flops
from kitlib.models.facts import non_embedding_params


def test_flops_per_token_is_6n_plus_attention_and_a_third_without_backward() -> None:
    n, layers, seq, width = 10_000_000, 6, 128, 384
    assert flops_per_token(n, 0, seq, width) == 6 * n
    assert flops_per_token(n, layers, seq, width) == 6 * n + 12 * layers * seq * width
    assert flops_per_token(n, layers, seq, width, training=False) * 3 == flops_per_token(n, layers, seq, width)


def test_non_embedding_params_skip_lookup_tables_and_count_tied_weights_once() -> None:
    model = nn.Sequential(nn.Embedding(100, 8), nn.Linear(8, 4), nn.Linear(4, 100, bias=False))
    assert non_embedding_params(model) == 8 * 4 + 4 + 4 * 100
    tied = nn.Sequential(nn.Embedding(100, 4), nn.Linear(4, 100, bias=False))
    tied[1].weight = tied[0].weight  # an LM head sharing the embedding: a lookup table, not counted
    assert non_embedding_params(tied) == 0


def _tiny_bert() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256
    )
    return BertForSequenceClassification(config)


def test_estimate_matches_torch_flop_counter_on_a_transformer_within_15_percent() -> None:
    torch.manual_seed(0)
    model = _tiny_bert()
    rows, seq = 4, 48
    batch = {
        "input_ids": torch.randint(5, 500, (rows, seq)),
        "attention_mask": torch.ones(rows, seq, dtype=torch.long),
        "labels": torch.tensor([0, 1, 0, 1]),
    }
    counted = count_flops(model, batch)
    estimated = model_flops_per_token(model, seq) * rows * seq
    assert abs(estimated - counted) / counted < 0.15, (estimated, counted)
    assert all(p.grad is None for p in model.parameters())  # the counting pass leaves no gradients behind
    forward = count_flops(model, batch, training=False)
    assert forward / counted == pytest.approx(1 / 3, rel=0.05)  # backward = 2x forward


def test_cpu_attention_is_counted() -> None:
    """torch's counter has no formula for CPU flash attention; count_flops registers one."""

    class Attention(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return nn.functional.scaled_dot_product_attention(x, x, x)

    x = torch.randn(2, 4, 16, 8, requires_grad=True)
    flops = count_flops(Attention(), x, loss_fn=lambda m, b: m(b).sum(), training=False)
    assert flops == 4 * 2 * 4 * 16 * 16 * 8  # QK^T and AV: 2 matmuls x 2 FLOPs x B*H*T*T*d


@pytest.mark.parametrize(
    ("name", "dtype", "tflops"),
    [
        ("Tesla T4", "fp16", 65.0),
        ("Tesla T4", "fp32", 8.1),
        ("Tesla P100-PCIE-16GB", "fp16", 18.7),
        ("Tesla V100-SXM2-16GB", "fp16", 125.0),
        ("NVIDIA A100-SXM4-40GB", "bf16", 312.0),
        ("NVIDIA A100-SXM4-40GB", "tf32", 156.0),
        ("NVIDIA L4", "bf16", 121.0),
        ("NVIDIA H100 80GB HBM3", "bf16", 989.5),
        ("NVIDIA H100 PCIe", "fp32", 51.0),
    ],
)
def test_peak_table_lookup(name: str, dtype: str, tflops: float) -> None:
    assert peak_flops(name, dtype) == pytest.approx(tflops * 1e12)  # type: ignore[arg-type]


def test_peak_table_unknowns_and_immutability() -> None:
    assert gpu_key("NVIDIA L40S") is None  # not an L4
    assert peak_flops("Tesla T4", "bf16") is None  # emulated on sm75: no fast path
    assert peak_flops("Tesla V100-SXM2-16GB", "tf32") is None
    assert peak_flops("CPU", "fp32") is None
    with pytest.raises(TypeError):
        PEAK_TFLOPS["T4"]["fp32"] = 1.0  # type: ignore[index]


def test_mfu() -> None:
    assert mfu(1000.0, 6e9, 65e12) == pytest.approx(1000 * 6e9 / 65e12)
    with pytest.raises(ValueError, match="peak_flops"):
        mfu(1.0, 1.0, 0.0)


def test_cpu_probe_measures_a_plausible_peak() -> None:
    peak = measure_cpu_peak(seconds=0.05, size=256)
    assert 1e8 < peak < 1e13  # 0.1 GFLOP/s .. 10 TFLOP/s: any CPU this runs on
