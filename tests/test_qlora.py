"""QLoRA's route (issue #30): a 4-bit NF4 model (bitsandbytes' CPU backend, >= 0.50) takes adapters with the bf16
base dtype 02 passes on bf16 GPUs, each DDP rank loads onto its own GPU, the 4-bit compute dtype is bf16 only where
the GPU has it natively, and rank 0's trained tensors load into the parent's fresh 4-bit model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")
pytestmark = pytest.mark.usefixtures("cpu_4bit")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import transformers as tf

    torch.manual_seed(0)
    config = tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                            num_key_value_heads=2, vocab_size=64)  # fmt: skip
    path = tmp_path_factory.mktemp("llama")
    tf.LlamaForCausalLM(config).save_pretrained(path)
    return path


def _four_bit(folder: Path) -> Any:
    """The folder's model in 4-bit NF4 on the CPU, as the issue's reproduction loads it."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from kitlib.models.loading import from_pretrained

    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                bnb_4bit_compute_dtype=torch.float32)  # fmt: skip
    return from_pretrained(AutoModelForCausalLM, folder, quantization_config=config, device_map={"": "cpu"})


def test_a_4bit_model_takes_qlora_adapters_with_a_bf16_base_dtype(folder: Path) -> None:
    """Item 1: 02 passes base_dtype=bf16 on a bf16 GPU; transformers refuses .to() on a bitsandbytes model."""
    from kitlib.models.lora import add_adapter

    model = add_adapter(_four_bit(folder), "qlora", generating=True, base_dtype=torch.bfloat16)
    four_bit = [n for n, p in model.named_parameters() if type(p).__name__ == "Params4bit"]
    assert len(four_bit) == 2 * 7  # q k v o gate up down in both blocks: still 4-bit
    assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)  # fp32 adapters
    ids = torch.randint(0, 64, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()


def test_rank_0s_qlora_tensors_load_into_a_fresh_4bit_model(folder: Path) -> None:
    """Item 2: what a worker sends (the adapter's tensors) loads into the parent's rebuilt 4-bit model, which then
    computes what rank 0's did; the whole state dict (bitsandbytes' quant-state keys) is not what crosses."""
    from kitlib.engine import checkpoint
    from kitlib.models.lora import add_adapter

    trained = add_adapter(_four_bit(folder), "qlora", generating=True, seed=1)
    for name, p in trained.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p)  # B starts at zero: make the adapters matter
    sent = checkpoint.saved_state(trained)
    assert sent and all("lora_" in k for k in sent) and not any("absmax" in k or "quant" in k for k in sent)
    fresh = add_adapter(_four_bit(folder), "qlora", generating=True, seed=2)
    checkpoint.restore_model(fresh, checkpoint.Snapshot(sent, None, {}))
    ids = torch.randint(0, 64, (2, 8))
    fresh.eval(), trained.eval()  # the adapters' dropout off
    with torch.no_grad():
        assert torch.allclose(fresh(input_ids=ids).logits, trained(input_ids=ids).logits)


def test_4bit_loading_goes_to_each_ranks_own_gpu_and_computes_in_native_bf16_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Items 3 and 4, decided without a GPU: the device map reads LOCAL_RANK (the current device is cuda:0 when the
    task builds the model); the compute dtype is bf16 only where bf16 is native (a T4 emulates it: fp16)."""
    from kitlib.models import adapters

    asked: list[bool] = []

    def bf16(including_emulation: bool = True) -> bool:
        asked.append(including_emulation)
        return including_emulation  # a T4: bf16 only by emulation

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", bf16)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setenv("LOCAL_RANK", "1")
    kwargs = adapters.quantization("qlora", "cuda")
    assert kwargs["device_map"] == {"": 1}
    assert kwargs["quantization_config"].bnb_4bit_compute_dtype == torch.float16 and asked == [False]
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)  # an A100
    assert adapters.quantization("qlora", "cuda")["quantization_config"].bnb_4bit_compute_dtype == torch.bfloat16
    cpu = adapters.quantization("qlora", "cpu")  # a rehearsal, or the DDP parent: never CUDA
    assert cpu["device_map"] == {"": "cpu"} and cpu["quantization_config"].bnb_4bit_compute_dtype == torch.float32
