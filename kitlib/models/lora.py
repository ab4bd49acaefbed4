"""LoRA adapters on a built model: added before training, merged into one plain model for export."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from kitlib.errors import SetupError
from kitlib.models.adapters import LORA_ALPHA, LORA_DROPOUT, LORA_RANK, adapter_keys

# lazy: peft (+5 s): optional; a run without an adapter never loads it


def add_adapter(
    model: nn.Module, adapter: str, *, generating: bool, base_dtype: torch.dtype | None = None, seed: int = 0
) -> nn.Module:
    """``model`` with ``adapter`` ("lora"/"qlora") added (a PeftModel), or unchanged for "none"; says how many train."""
    if adapter == "none":
        return model
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    heads = () if generating else _added_modules(model)
    targets = _linear_layers(model, exclude=heads)
    if not targets:
        raise SetupError(
            f"adapter = {adapter!r}: {type(model).__name__} has no linear layers to adapt. Fix: adapter = 'none'"
        )
    quantized = getattr(model, "hf_quantizer", None) is not None  # 4-bit: transformers refuses any .to(dtype)
    if base_dtype is not None and not quantized:
        model.to(base_dtype)  # the frozen base only: the adapters and heads below are created (or cast) in fp32
    if adapter == "qlora":
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)  # fit enables it itself
    config = LoraConfig(
        r=LORA_RANK, lora_alpha=LORA_ALPHA, lora_dropout=LORA_DROPOUT, target_modules=sorted(targets),
        modules_to_save=list(heads) or None,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        adapted = get_peft_model(model, config)
    for param in adapted.parameters():
        if param.requires_grad and param.dtype != torch.float32:
            param.data = param.data.float()  # a head copied from a bf16 base: trained weights are fp32 masters
    keys = adapter_keys(adapted) or ()
    trained = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    total = sum(p.numel() for p in adapted.parameters())
    print(
        f"{adapter}: {trained / 1e6:.2f} M of {total / 1e6:.1f} M weights train ({trained / total:.2%}): r={LORA_RANK} "
        f"on {', '.join(sorted(targets))}" + (f", and {', '.join(heads)} in full" if heads else "")
        + f"; checkpoints hold these {len(keys)} tensors only"
    )  # fmt: skip
    return adapted


def merge_adapter(model: nn.Module) -> nn.Module:
    """The PeftModel as one plain model (``merge_and_unload``); 4-bit weights dequantised first (reasoned)."""
    if not hasattr(model, "peft_config"):
        raise SetupError(
            f"{type(model).__name__} carries no adapter (adapter = 'none'): its weights are already one model. Fix: "
            "use the checkpoint as it is (best/model.safetensors)"
        )
    four_bit = [p.device.type for p in model.parameters() if type(p).__name__ == "Params4bit"]
    if four_bit and set(four_bit) != {"cuda"}:
        raise SetupError(
            "a qlora model's base weights are 4-bit: merging the adapter dequantises them with bitsandbytes' CUDA "
            f"kernels, and they are on {', '.join(sorted(set(four_bit)))}. Fix: export on the CUDA machine that "
            "trained it, or keep base + adapter (03 loads them)"
        )
    if four_bit:
        from peft.tuners.lora import LoraLayer
        from peft.utils.integrations import dequantize_bnb_weight

        dtype = model.get_input_embeddings().weight.dtype  # type: ignore[operator]
        for name, layer in list(model.named_modules()):
            base: Any = layer.get_base_layer() if isinstance(layer, LoraLayer) else None
            if base is None or type(base.weight).__name__ != "Params4bit":
                continue
            weight = dequantize_bnb_weight(base.weight).float()  # the sum in fp32, rounded once below
            for active in layer.active_adapters:
                weight += layer.get_delta_weight(active).float()
            weight = weight.to(dtype)
            merged = nn.Linear(base.in_features, base.out_features, bias=base.bias is not None, device=weight.device,
                               dtype=dtype)  # fmt: skip
            merged.weight.data = weight
            if base.bias is not None:
                merged.bias.data = base.bias.data.to(dtype)
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, merged)
    plain: nn.Module = model.merge_and_unload()  # type: ignore[operator]
    config = getattr(plain, "config", None)
    if four_bit and config is not None:  # the folder it saves to holds plain weights, not a 4-bit checkpoint
        config.__dict__.pop("quantization_config", None)
        vars(plain).update(hf_quantizer=None, is_loaded_in_4bit=False)
    return plain


def _linear_layers(model: nn.Module, *, exclude: tuple[str, ...]) -> set[str]:
    """The leaf names of ``model``'s linear layers, its output layer and the ``exclude``d modules aside."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    found = set()
    for name, module in model.named_modules():
        inside = any(name == e or name.startswith(f"{e}.") for e in exclude)
        if isinstance(module, nn.Linear | Conv1D) and module is not head and not inside:
            found.add(name.rsplit(".", 1)[-1])
    return found


def _added_modules(model: nn.Module) -> tuple[str, ...]:
    """The modules a classifier adds to its base (heads, a tabular network): new, so trained in full."""
    base = getattr(model, "base_model", None)
    if base is None or base is model:
        return ()
    inside_base = {id(m) for m in base.modules()}
    added: list[str] = []
    for name, module in model.named_modules():
        nested = any(name.startswith(f"{a}.") for a in added)
        holds_base = any(id(m) in inside_base for m in module.modules())
        if name and not nested and not holds_base and any(True for _ in module.parameters()):
            added.append(name)
    return tuple(added)


def describe_size(saved: int, model: nn.Module) -> str:
    """'1.2 MB (the full model: 480.0 MB)': a checkpoint's bytes against the whole model's weights."""
    full = sum(t.nbytes for t in model.state_dict().values())
    return f"{saved / 1e6:.2f} MB (the full model: {full / 1e6:.2f} MB)"
