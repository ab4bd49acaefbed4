"""LoRA adapters (``peft``, an optional dependency: ``pip install peft``): the pretrained weights stay frozen,
low-rank matrices beside every linear layer of the blocks train, and checkpoints hold only what trains.

    model = add_adapter(model, "lora", generating=True)   # a PeftModel; checkpoints hold adapter_keys(model) only

- Targets: every linear layer (nn.Linear, GPT-2's Conv1D) of the pretrained model, found by walking it, so any
  architecture transformers ships works (GPT-2 c_attn/c_proj/c_fc, Llama q/k/v/o/gate/up/down_proj, BERT
  query/key/value/dense, T5 q/k/v/o/wi/wo); not the output layer (a causal LM's lm_head, tied to the embeddings).
  All linear layers, not peft's q/v defaults: the QLoRA paper (Dettmers et al. 2023, sec. 4) needed them all to
  match full fine-tuning.
- Classifiers: what the task adds to the pretrained base (the classification head, the tabular network) trains in
  full (peft's ``modules_to_save``); a generating model's head is pretrained and stays frozen.
- ``qlora``: the same adapters on 4-bit NF4 weights (bitsandbytes), CUDA only. Reasoned, not measured (no GPU was
  available when it was written): the load goes through transformers' BitsAndBytesConfig and peft's
  prepare_model_for_kbit_training, their documented QLoRA path.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from typing import TYPE_CHECKING, Any

from kitlib.errors import SetupError

# lazy: torch (+1.0 s), transformers (+0.6 s), peft (+5 s): only a LoRA/quantized run needs them; the checks and names
# here are read by the preset picker and the CLI (python -X importtime).

if TYPE_CHECKING:
    import torch
    from torch import nn

    from kitlib.machine.hardware import HardwareInfo

LORA_RANK = 16  # r: adapter parameters per linear layer = r x (in + out); the memory plan counts the same
LORA_ALPHA = 32  # the update is scaled by alpha / r = 2 (peft's examples and the LoRA paper's usual ratio)
BITSANDBYTES_MIN_SM = (6, 0)  # NF4 kernels need compute capability 6.0+ (bitsandbytes 0.50 installation guide)
LORA_DROPOUT = 0.05  # on the adapter's input only (QLoRA paper: 0.05 for models up to 13B)
# The adapters' least lr: B starts at zero and a rank-16 update needs a larger step than a full fine-tune's (~10x;
# unsloth's notebooks and the QLoRA paper use 2e-4 for 7-13B models, where the presets' 3e-5 to 1e-4 are full-FT's)
LORA_LR = 2e-4
_INSTALL = "pip install peft (a checkout: pip install -e '.[lora]')"


def check_adapter(adapter: str, hw: HardwareInfo, *, regime: str = "finetune") -> str | None:
    """A reason line for the run's summary (None without an adapter); a SetupError naming the fix when ``adapter``
    cannot run here: peft missing, 4-bit weights off CUDA or without bitsandbytes, a regime training no encoder."""
    if adapter == "none":
        return None
    if regime != "finetune":
        raise SetupError(
            f"adapter = {adapter!r} adapts a fine-tuned model, but this preset's regime is {regime!r} (the encoder "
            "runs once, frozen, and only a small head trains). Fix: a fine-tuning preset (smoke, balanced, best), or "
            "adapter = 'none'"
        )
    if importlib.util.find_spec("peft") is None:
        raise SetupError(f"adapter = {adapter!r} needs the peft package, which is not installed. Fix: {_INSTALL}")
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
    """``from_pretrained`` keyword arguments for ``adapter`` on ``device`` ("cuda" or "cpu": the run's device type):
    qlora's 4-bit NF4 weights with double-quantised scales (QLoRA paper's recipe; ~0.51 bytes per weight), else none.

    On CUDA each DDP rank loads onto its own GPU (LOCAL_RANK, as accelerate's and TRL's recipes: the current device
    is still cuda:0 when the task builds the model) and computes in bf16 where the GPU has it natively, else fp16 (a
    T4 emulates bf16, and bitsandbytes' fast 4-bit kernels are fp16 there). On the CPU (a rehearsal, or the DDP
    parent reloading rank 0's adapters without touching CUDA) bitsandbytes' CPU backend computes in fp32."""
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
    """transformers before ~4.5x refuses bitsandbytes' CPU backend (4.46-4.50 crash on a frozenset in the check; later
    ones admit only Intel's IPEX): a kitlib error naming the fix instead. On a CUDA GPU those versions load fine."""
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


def add_adapter(
    model: nn.Module, adapter: str, *, generating: bool, base_dtype: torch.dtype | None = None, seed: int = 0
) -> nn.Module:
    """``model`` with ``adapter`` ("lora" or "qlora") added (a peft PeftModel), or ``model`` itself for "none".

    ``generating``: a causal LM or seq2seq model (its head stays frozen); else a classifier (what it adds to its
    pretrained base trains in full). ``base_dtype``: the frozen weights' dtype (bf16 halves their memory on a bf16
    GPU; the adapters stay fp32 master weights). ``seed``: the adapters' initialisation, the caller's RNG untouched.
    Says in one line how many weights train.
    """
    if adapter == "none":
        return model
    import torch
    from peft import LoraConfig, get_peft_model

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
        from peft import prepare_model_for_kbit_training

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
    """The model ``model`` (a PeftModel from ``add_adapter``) computes, as one plain transformers model: each LoRA
    update folded into its layer's weight (W + B A alpha/r, peft's ``merge_and_unload``), the wrappers gone, a
    classifier's trained head in place. What a user ships when they want one artifact instead of base + adapter.

    4-bit (qlora) weights are dequantised first and the merge kept in the dtype of the model's other weights (its
    embeddings'): peft's own merge rounds the sum back to NF4, where most of an adapter's update is below a 4-bit
    step. CUDA only, as qlora's 4-bit loading (``quantization``); reasoned, not measured (no GPU was available when
    it was written)."""
    from torch import nn

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


def adapter_keys(model: nn.Module) -> tuple[str, ...] | None:
    """The state_dict names a checkpoint of ``model`` holds when it carries an adapter (what trains: the adapters
    and a classifier's head copy; the frozen base is rebuilt from its folder), else None (the whole state_dict)."""
    if not hasattr(model, "peft_config"):  # peft's PeftModel (and only it) has one
        return None
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    return tuple(name for name in model.state_dict() if name in trained)


def _linear_layers(model: nn.Module, *, exclude: tuple[str, ...]) -> set[str]:
    """The leaf names of ``model``'s linear layers, its output layer and the ``exclude``d modules aside."""
    from torch import nn
    from transformers.pytorch_utils import Conv1D

    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    found = set()
    for name, module in model.named_modules():
        inside = any(name == e or name.startswith(f"{e}.") for e in exclude)
        if isinstance(module, nn.Linear | Conv1D) and module is not head and not inside:
            found.add(name.rsplit(".", 1)[-1])
    return found


def _added_modules(model: nn.Module) -> tuple[str, ...]:
    """The modules a classifier adds to its pretrained base (``model.base_model``: the encoder): the heads, a
    tabular network. Their weights are new, so they train in full beside the adapters."""
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
