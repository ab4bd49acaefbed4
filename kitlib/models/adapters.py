"""LoRA adapters (peft, optional) on the blocks' linear layers; ``qlora`` on 4-bit NF4 weights, CUDA only."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from typing import TYPE_CHECKING, Any

from kitlib.errors import SetupError, pip_install

# lazy: torch (+1.0 s), transformers (+0.6 s): only a 4-bit load needs them

if TYPE_CHECKING:
    from torch import nn

    from kitlib.machine.hardware import HardwareInfo

LORA_RANK = 16  # r: adapter parameters per linear layer = r x (in + out); the memory plan counts the same
LORA_ALPHA = 32  # the update is scaled by alpha / r = 2 (peft's examples and the LoRA paper's usual ratio)
BITSANDBYTES_MIN_SM = (6, 0)  # NF4 kernels need compute capability 6.0+ (bitsandbytes 0.50 installation guide)
LORA_DROPOUT = 0.05  # on the adapter's input only (QLoRA paper: 0.05 for models up to 13B)
# B starts at zero: a rank-16 update needs ~10x full FT's step (unsloth, QLoRA paper: 2e-4 for 7-13B)
LORA_LR = 2e-4


def check_adapter(adapter: str, hw: HardwareInfo, *, regime: str = "finetune") -> str | None:
    """A reason line for the summary (None without an adapter); a SetupError naming the fix when it cannot run here."""
    if adapter == "none":
        return None
    if regime != "finetune":
        raise SetupError(
            f"adapter = {adapter!r} adapts a fine-tuned model, but this preset's regime is {regime!r} (the encoder "
            "runs once, frozen, and only a small head trains). Fix: a fine-tuning preset (smoke, balanced, best), or "
            "adapter = 'none'"
        )
    if importlib.util.find_spec("peft") is None:
        raise SetupError(
            f"adapter = {adapter!r} needs the peft package, which is not installed. Fix: {pip_install('peft', 'lora')}"
        )
    if adapter == "qlora":
        primary = hw.primary
        if hw.device_type != "cuda" or primary is None:
            raise SetupError(
                f"adapter = 'qlora' keeps the weights in 4 bits with bitsandbytes' CUDA kernels, and this run trains "
                f"on {hw.device_type.upper()}. Fix: adapter = 'lora' (the same adapters on full-precision weights), "
                "or plan for a CUDA GPU (hardware = 'T4', say)"
            )
        if primary.capability < BITSANDBYTES_MIN_SM:
            raise SetupError(f"adapter = 'qlora' needs a GPU of sm_60 or newer ({primary.sm}). Fix: adapter = 'lora'")
        return (
            f"adapter qlora: LoRA r={LORA_RANK} on every linear layer of 4-bit NF4 weights (bitsandbytes); only the "
            "adapters (and a classifier's head) train and are checkpointed"
        )
    return (
        f"adapter lora: LoRA r={LORA_RANK} on every linear layer, the pretrained weights frozen (no gradients or AdamW "
        "state for them); only the adapters (and a classifier's head) train and are checkpointed"
    )


def quantization(adapter: str, device: str = "cuda") -> dict[str, Any]:
    """``from_pretrained`` kwargs for ``adapter`` on ``device``: qlora's double-quantised NF4 per rank, else none."""
    if adapter != "qlora":
        return {}

    import torch

    cuda = device == "cuda"
    if importlib.util.find_spec("bitsandbytes") is None or (cuda and not torch.cuda.is_available()):
        missing = "no CUDA GPU" if cuda and importlib.util.find_spec("bitsandbytes") else "no bitsandbytes"
        raise SetupError(
            f"adapter = 'qlora' loads 4-bit weights with bitsandbytes, and this machine has {missing}. Fix: pip "
            "install bitsandbytes (on a CUDA GPU, or rehearse = True on a CPU), or adapter = 'lora'"
        )
    from transformers import BitsAndBytesConfig

    if not cuda:
        _cpu_backend_admitted()
    bf16 = cuda and torch.cuda.is_bf16_supported(including_emulation=False)
    compute = torch.bfloat16 if bf16 else torch.float16 if cuda else torch.float32
    config = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=compute
    )
    where: int | str = int(os.environ.get("LOCAL_RANK", 0)) if cuda else "cpu"
    return {"quantization_config": config, "device_map": {"": where}}


def _cpu_backend_admitted() -> None:
    """A kitlib error naming the fix where transformers refuses bitsandbytes' CPU backend (before ~4.5x)."""
    import transformers.integrations.bitsandbytes as bnb_integration

    check = getattr(bnb_integration, "validate_bnb_backend_availability", None)
    try:
        if check is not None:
            check(raise_exception=True)
    except Exception as error:  # AttributeError (4.46-4.50) or RuntimeError (no IPEX): either way, no CPU 4-bit
        version = importlib.metadata.version("transformers")
        raise SetupError(
            f"4-bit weights on the CPU (a QLoRA rehearsal, or reloading adapters without CUDA) need bitsandbytes' "
            f"CPU backend, which transformers {version} refuses ({type(error).__name__}: {error}). Fix: pip install "
            "-U transformers (kitlib rehearses QLoRA on CPU with the newest), run on a CUDA GPU, or adapter = 'lora'"
        ) from error


def adapter_keys(model: nn.Module) -> tuple[str, ...] | None:
    """State_dict names a checkpoint holds with an adapter (adapters + head; the base is rebuilt), else None (all)."""
    if not hasattr(model, "peft_config"):  # peft's PeftModel (and only it) has one
        return None
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    return tuple(name for name in model.state_dict() if name in trained)
