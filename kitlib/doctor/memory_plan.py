"""A memory plan before training: bytes of weights, gradients, optimizer states and activations per strategy, from
the model's config alone (meta device), e.g. ``plan_memory("llama-7b", hardware="T4", seq_len=1536).table()``.
The formulas and their measurements: docs/measurements.md, "memory_plan.py"."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kitlib.errors import KitError, SetupError
from kitlib.machine.hardware import ARCH_LIST_WITH_SM60, fake_profile
from kitlib.machine.precision import decide_precision
from kitlib.models.adapters import BITSANDBYTES_MIN_SM, LORA_RANK  # adapters on every linear layer of the blocks

# lazy: torch (+1.0 s), transformers (+0.6 s): plans come from config numbers alone; only the meta-model count
# (kitlib.doctor.meta_count) and the live check build a model, so `import kitlib.doctor.memory_plan` stays at 0.03 s
# for the CLI (python -X importtime).

if TYPE_CHECKING:
    from kitlib.machine.hardware import HardwareInfo

_GB = 1e9  # the table speaks decimal GB, as cards are sold (an "80 GB" H100 holds 79.6 GiB usable)
HEADROOM = 0.10  # fraction of the budget kept free: allocator fragmentation, a longer batch than planned
CUDA_CONTEXT = 0.6e9  # bytes the CUDA context and cuBLAS workspaces take before any tensor (reasoned, not measured)
NF4_BYTES = 0.5 + 0.127 / 8  # bytes per 4-bit weight: 4 bits + double-quantised absmax (QLoRA paper, 0.127 bit)
AMP_ACT_BYTES = 2.5  # bytes per saved element under autocast: half matmul outputs, the norms' fp32 upcasts (reasoned)

# Known shapes for --model without a folder: config class and its arguments (no weights are ever downloaded).
KNOWN_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-7b": (
        "llama",
        {
            "hidden_size": 4096,
            "intermediate_size": 11008,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
            "vocab_size": 32000,
            "max_position_embeddings": 4096,
        },
    ),
    "gpt2": ("gpt2", {}),
    "t5-small": ("t5", {"decoder_start_token_id": 0, "pad_token_id": 0}),
    "minilm": (
        "bert",
        {
            "hidden_size": 384,
            "intermediate_size": 1536,
            "num_hidden_layers": 6,
            "num_attention_heads": 12,
            "vocab_size": 30522,
        },
    ),
}
_ALIASES = {"auto": "minilm", "all-minilm-l6-v2": "minilm"}
# model_type -> the family whose saved-tensor formula applies (what each block keeps for backward)
_FAMILIES = {
    **dict.fromkeys(("llama", "mistral", "qwen2", "qwen3"), "llama"),
    "gpt2": "gpt2",
    **dict.fromkeys(("bert", "roberta", "xlm-roberta", "electra"), "bert"),
    **dict.fromkeys(("t5", "mt5"), "t5"),
}
# The model kinds the plan sizes (kitlib.notebook.tasks.TaskEntry.model_kind): a classifier's encoder, or a
# generating LM; the generating ones train with an LM head over the vocabulary.
MODEL_KINDS = ("encoder", "decoder", "encoder-decoder")
GENERATING = ("decoder", "encoder-decoder")
# bitsandbytes' AdamW8bit state a parameter: two 8-bit moments and an fp32 absmax per 256-element block
ADAMW_8BIT_BYTES = 2 + 2 * 4 / 256


@dataclass(frozen=True)
class Shape:
    """What the formulas read from a config and the meta model (parameter counts are numbers of elements)."""

    family: str
    hidden: int
    intermediate: int
    layers: int  # blocks a token passes (T5: encoder + decoder blocks)
    heads: int
    kv_dim: int  # key/value width (GQA: kv heads x head dim)
    vocab: int
    attention_dropout: float
    eager: bool  # attention implementation that materialises the seq^2 scores even on CUDA
    params: int
    embedding_params: int  # what freeze="embeddings" freezes
    linear_params: int  # weights of the blocks' linear layers: what 4-bit quantises and LoRA adapts
    linear_dims: int  # sum of in + out features of those layers (LoRA adds rank x this)
    head_params: int  # the output layer's weight (a vocab x hidden lm_head, or a classifier)


@dataclass(frozen=True)
class Strategy:
    """One way to train that kitlib runs: bytes per parameter and per activation element, and the TrainConfig
    settings that train it (``settings``)."""

    name: str
    weights: float  # bytes
    grads: float
    optimizer: float
    act_bytes: float  # bytes per saved activation element
    checkpointing: bool
    optimizer_name: str = "adamw"  # TrainConfig.optimizer
    shards: int = 1  # > 1: FSDP over that many GPUs (weights, grads, optimizer divided); 1: whole on each GPU
    adapter: str = "none"
    freeze: str = "none"
    amp: bool = True  # False: precision "fp32" even where the card has a half precision

    @property
    def kind(self) -> tuple[str, str, str]:
        """(optimizer, adapter, freeze): what it trains and how, as TrainConfig names them."""
        return self.optimizer_name, self.adapter, self.freeze

    @property
    def settings(self) -> dict[str, Any]:
        """The TrainConfig fields (``kitlib.notebook.presets.resolve``'s overrides) that train this strategy."""
        chosen = {"optimizer": self.optimizer_name, "adapter": self.adapter, "freeze": self.freeze,
                  "gradient_checkpointing": self.checkpointing}  # fmt: skip
        return chosen if self.amp else {**chosen, "precision": "fp32"}


@dataclass(frozen=True)
class Fit:
    strategy: Strategy
    micro_batch: int
    accum: int
    weights: float  # bytes, at this micro-batch
    grads: float
    optimizer: float
    activations: float
    peak: float
    fits: bool
    why_not: str = ""  # hardware it cannot run on, or "" when it is only too big
    gathered: float = 0.0  # FSDP: unsharded parameters, gradients and reduce-scatter buffers (fsdp_transient)


@dataclass(frozen=True)
class MemoryPlan:
    model: str
    model_kind: str
    hardware: str
    budget: float  # bytes usable after the context and headroom
    capacity: float  # bytes of the device (or RAM)
    seq_len: int
    effective_batch: int
    shape: Shape
    fits: tuple[Fit, ...]
    world: int = 1  # GPUs the plan trains on, one process each

    @property
    def choice(self) -> Fit | None:
        """The first strategy in the table's order (least compromise first) that fits."""
        return next((f for f in self.fits if f.fits), None)

    @property
    def parallel(self) -> str | None:
        """The ``strategy`` parameter's value the choice trains with: "fsdp", "ddp", or None (one device, no fit)."""
        if self.world == 1 or self.choice is None:
            return None
        return "fsdp" if self.choice.strategy.shards > 1 else "ddp"

    def why_parallel(self) -> str:
        """Why DDP or FSDP on several GPUs: the full fine-tune's bytes per GPU replicated and sharded."""
        full = [f for f in self.fits if f.strategy.kind == ("adamw", "none", "none") and f.strategy.amp]
        ddp, fsdp = (min((f for f in full if (f.strategy.shards > 1) == sharded), key=lambda f: f.peak, default=None)
                     for sharded in (False, True))  # fmt: skip
        if self.parallel is None or ddp is None or fsdp is None:
            return ""
        gb, budget = (lambda f: f"~{f.peak / _GB:.1f} GB per GPU"), f"the {self.budget / _GB:.1f} GB budget"
        if ddp.fits:
            return f"ddp: a full fine-tune fits whole on each GPU ({gb(ddp)}); FSDP would only add communication"
        if fsdp.fits:
            return (f"fsdp: a full fine-tune replicated (DDP) needs {gb(ddp)}, over {budget}; sharded over "
                    f"{self.world} GPUs {gb(fsdp)}")  # fmt: skip
        return (f"ddp with {self.choice.strategy.name}: a full fine-tune needs {gb(ddp)} replicated and {gb(fsdp)} "  # type: ignore[union-attr]
                f"even sharded over {self.world} GPUs, over {budget}")  # fmt: skip

    def table(self) -> str:
        head = (
            f"memory plan: {self.model} ({self.shape.params / 1e9:.2f} B parameters, {self.shape.family}-shaped), "
            f"{self.model_kind} model, {self.seq_len} tokens/row, effective batch {self.effective_batch}, "
            f"on {self.hardware} ({self.capacity / _GB:.1f} GB; plans within {self.budget / _GB:.1f} GB: "
            f"{HEADROOM:.0%} kept free for the allocator's fragmentation and longer batches)"
        )
        cols = ("weights", "grads", "optim", "activ", "gather", "peak")
        rows = [f"{'strategy':<52} " + " ".join(f"{c:>7}" for c in cols) + "  batch  fits"]
        for f in self.fits:
            gb = (f.weights, f.grads, f.optimizer, f.activations, f.gathered, f.peak)
            verdict = f.why_not or ("yes" if f.fits else "no")
            cells = " ".join(f"{v / _GB:>7.1f}" for v in gb)
            rows.append(f"{f.strategy.name:<52} {cells}  {f.micro_batch:>2}x{f.accum:<3} {verdict}")
        notes = ["GB (1e9 bytes) per GPU; batch = micro-batch x accumulation per GPU"]
        if self.world > 1:
            notes.append(f"{self.world} GPUs: rows without FSDP are DDP (each GPU holds all); gather = FSDP's "
                         "unsharded root parameters and one block's backward (fsdp_transient)")  # fmt: skip
        return "\n".join(line for line in [head, *rows, *notes, self.why_parallel(), self.line()] if line)

    def line(self) -> str:
        """One line for the picker: what fits, or what to change."""
        best = self.choice
        if best is not None:
            return (
                f"fits: ~{best.peak / _GB:.1f} of {self.capacity / _GB:.0f} GB with {best.strategy.name}, "
                f"micro-batch {best.micro_batch} x accumulation {best.accum}"
                + (f", {self.parallel} on {self.world} GPUs" if self.parallel else "")
            )
        return (
            f"fits nowhere on {self.hardware}: even micro-batch 1 with every strategy needs more than "
            f"{self.budget / _GB:.1f} GB. Fix: a bigger card, a smaller model or fewer tokens per row (seq_len)"
        )


def plan_memory(
    model: Any,
    *,
    hardware: str | HardwareInfo = "T4",
    seq_len: int = 512,
    model_kind: str = "encoder",
    effective_batch: int = 32,
    micro_batch: int | None = None,
    accum: int | None = None,
    chunked_loss: bool | None = None,
    world_size: int | None = None,
) -> MemoryPlan:
    """The plan of training ``model`` (config, config.json, folder or KNOWN_MODELS name) as ``model_kind`` at
    ``seq_len`` tokens on ``hardware`` (a profile name or HardwareInfo); ``micro_batch``/``accum`` fix the split, else
    the largest fitting micro-batch keeps ``effective_batch``; ``world_size`` defaults to the hardware's GPUs."""

    counts = {"seq_len": seq_len, "effective_batch": effective_batch, "micro_batch": micro_batch, "accum": accum}
    if low := [f"{k} = {v}" for k, v in counts.items() if v is not None and v < 1]:
        raise SetupError(f"{', '.join(low)}: each must be >= 1 (rows or tokens). Fix: a positive whole number")
    if model_kind not in MODEL_KINDS:
        raise SetupError(f"model_kind {model_kind!r} is not one of {list(MODEL_KINDS)}")
    try:  # a build with Pascal kernels: the plan is about memory, not about which torch Kaggle's image ships
        hw = fake_profile(hardware, torch_cuda_arch_list=ARCH_LIST_WITH_SM60) if isinstance(hardware, str) else hardware
    except ValueError as err:
        raise SetupError(f"hardware: {err}. Fix: --hardware with one of those names") from None
    hw_name = hardware if isinstance(hardware, str) else hw.device_name
    name, config = model_config(model)
    shape = model_shape(config, model_kind)
    chunked = model_kind in GENERATING if chunked_loss is None else chunked_loss
    world = max(1, hw.num_gpus) if world_size is None else world_size
    capacity = float(hw.primary.memory_bytes if hw.primary is not None else hw.ram_bytes)
    budget = (capacity - (CUDA_CONTEXT if hw.device_type == "cuda" else 0.0)) * (1 - HEADROOM)
    dtype = decide_precision(hw).dtype
    amp = dtype != "fp32"
    per_device = max(1, math.ceil(effective_batch / world))
    sizing = Sizing(shape, seq_len, model_kind, chunked, hw.device_type)
    fits = tuple(
        sizing.fit(s, per_device, micro_batch, accum, budget, _refusal(s, hw, model_kind))
        for s in strategies(shape, amp=amp, bf16=dtype == "bf16", half_base=hw.device_type == "cuda", world=world)
    )
    return MemoryPlan(name, model_kind, hw_name, budget, capacity, seq_len, effective_batch, shape, fits, world)


def strategies(
    shape: Shape, *, amp: bool, bf16: bool = False, half_base: bool = True, world: int = 1
) -> list[Strategy]:
    """The strategies kitlib runs, least compromise first, in bytes per parameter (a frozen part: no gradient or
    state). ``bf16``: pure bf16 weights with Kahan AdamW offered; ``world`` > 1: DDP rows, then FSDP before any strategy
    that changes the optimizer, the weights' precision or what trains."""
    P = shape.params
    trainable = (P - shape.embedding_params) / P  # freeze="embeddings"
    lora = LORA_RANK * shape.linear_dims / P  # adapter parameters per model parameter
    # QLoRA: non-4-bit weights stay fp32 (peft's prepare_model_for_kbit_training), so 4 bytes a saved element, measured
    # on CPU; on a GPU each 4-bit layer also saves its input in the compute dtype (reasoned, not measured).
    nf4 = (NF4_BYTES * shape.linear_params + 4 * (P - shape.linear_params)) / P
    h, i = shape.hidden, shape.intermediate
    qlora_act = 4.0 + (2.0 * (3 * h + i) / (8 * h + 2 * shape.kv_dim + 4 * i) if amp else 0.0)
    cast_cache = 2.0 * (shape.linear_params + shape.head_params) / P  # autocast's half copy of each matmul weight
    act = AMP_ACT_BYTES if amp else 4.0

    def both(name: str, weights: float, grads: float, state: float, act: float, **kind: Any) -> list[Strategy]:
        """The strategy without, then with gradient checkpointing."""
        return [Strategy(name + " + checkpointing" * c, weights, grads, state, act, c, **kind) for c in (False, True)]

    weights = 4 + cast_cache if amp else 4
    full = "fp32 weights + AMP" if amp else "fp32 full fine-tune"
    base = 2.0 if bf16 and half_base else 4.0
    return [
        *both(full, weights, 4, 8, act),
        # FSDP: the policy's half copies are its gathered bytes, no cast cache
        *(both(f"FSDP ({world} shards): {full}", 4, 4, 8, act, shards=world) if world > 1 else []),
        Strategy(f"frozen embeddings + {'AMP' if amp else 'fp32'}", 4, 4 * trainable, 8 * trainable, act, False,
                 freeze="embeddings"),
        # two 8-bit moments and an fp32 absmax per 256-element block
        *both(f"{'fp32 weights + AMP' if amp else 'fp32'} + 8-bit AdamW", weights, 4, ADAMW_8BIT_BYTES, act,
              optimizer_name="adamw8bit"),
        # bf16 moments and a bf16 Kahan compensation (reasoned, not measured)
        *(both("bf16 weights + Kahan AdamW", 2.0, 2.0, 6.0, act, optimizer_name="adamw-kahan") if bf16 else []),
        # full fp32 fine-tuning without AMP: what "does not fit" is measured against
        *([Strategy("fp32 full fine-tune (no AMP)", 4, 4, 8, 4.0, False, amp=False)] if amp else []),
        # least compromise first: adapters on full weights, then on 4-bit weights (fp32 adapters + AdamW)
        *both(f"LoRA r={LORA_RANK}, {'bf16' if base == 2.0 else 'fp32'} base", base + 4 * lora, 4 * lora, 8 * lora,
              2.0 if base == 2.0 else act, adapter="lora"),
        *both("QLoRA (LoRA on 4-bit weights)", nf4 + 4 * lora, 4 * lora, 8 * lora, qlora_act, adapter="qlora"),
    ]  # fmt: skip


def _refusal(s: Strategy, hw: HardwareInfo, model_kind: str) -> str:
    """Why ``s`` cannot run on ``hw`` (QLoRA: bitsandbytes' CUDA kernels), else ""."""
    if s.adapter != "qlora":
        return ""
    if model_kind not in GENERATING:  # 00 refuses it too (kitlib.notebook.params): the 7B-class models generate
        return "causal-lm/seq2seq only"
    if hw.device_type != "cuda" or hw.primary is None:
        return "CUDA only"
    return f"needs sm_60+ ({hw.primary.sm})" if hw.primary.capability < BITSANDBYTES_MIN_SM else ""


@dataclass(frozen=True)
class Sizing:
    """A plan's fixed inputs: ``shape`` trained as ``model_kind`` at ``seq_len`` tokens a row on ``device``
    (``chunked``: a generating model's loss in chunks)."""

    shape: Shape
    seq_len: int
    model_kind: str
    chunked: bool
    device: str

    def fit(
        self, s: Strategy, rows: int, micro_batch: int | None, accum: int | None, budget: float, why_not: str
    ) -> Fit:
        """``s`` at ``micro_batch`` (else the largest, halving from ``rows``, whose step fits ``budget``)."""
        candidates = [micro_batch] if micro_batch is not None else sorted(
            {max(1, rows >> k) for k in range(rows.bit_length() + 1)}, reverse=True)  # fmt: skip
        for m in candidates:
            fit = self.step_peak(s, m, accum if accum is not None else math.ceil(rows / m))
            if fit.peak <= budget:
                return dataclasses.replace(fit, fits=not why_not, why_not=why_not)
        return dataclasses.replace(fit, fits=False, why_not=why_not)

    def step_peak(self, s: Strategy, micro_batch: int, accum: int) -> Fit:
        """The planned peak bytes of one step of ``s`` at ``micro_batch`` rows (docs/measurements.md)."""
        shape, P, N = self.shape, self.shape.params, s.shards
        weights, grads, optimizer = s.weights * P / N, s.grads * P / N, s.optimizer * P / N
        tokens = micro_batch * self.seq_len  # every batching's largest batch; packed: <= this (samplers.packing_layout)
        activations = self.activation_elements(s.checkpointing) * tokens * s.act_bytes
        loss = self.loss_transient(tokens, grads_of_head=s.grads > 0 and N == 1)
        half = 2.0 if s.amp and self.device == "cuda" else 4.0  # FSDP's param_dtype: the policy's half on a GPU
        root, one_block = fsdp_transient(shape, N, half) if N > 1 else (0.0, 0.0)
        head = half * shape.head_params if N > 1 else 0.0  # FSDP: the head's unsharded gradient, else loss_transient's
        held, transient = activations + root, max(loss + head, one_block)
        if s.checkpointing:  # the block recomputed in backward is alive after the loss's transient is gone: the larger
            block = self.saved_per_token()[0] * tokens * s.act_bytes
            held, transient = activations + root - block, max(loss + head, block + one_block)
        if accum > 1:
            peak = weights + optimizer + grads + held + transient
        else:
            peak = weights + optimizer + max(held + transient, grads)
        return Fit(s, micro_batch, accum, weights, grads, optimizer, activations, peak, True, gathered=root + one_block)

    def activation_elements(self, checkpointing: bool) -> float:
        """Elements autograd saves for backward per token (per source token for seq2seq), per block by architecture
        family, measured with saved_tensors_hooks (docs/measurements.md, "memory_plan.py"); checkpointing: h a block."""
        block, rest, blocks = self.saved_per_token()
        if checkpointing:
            return blocks * self.shape.hidden * (2 if self.shape.family == "t5" else 1) + rest + block
        return blocks * block + rest

    def saved_per_token(self) -> tuple[float, float, int]:
        """(elements one block saves, the rest outside the blocks, the blocks) per token (activation_elements)."""
        shape, L = self.shape, self.seq_len
        h, i, n = shape.hidden, shape.intermediate, shape.heads
        scores = shape.eager or shape.family == "t5" or (self.device == "cpu" and shape.attention_dropout > 0)
        attention = 3 * n * L if scores else n
        if shape.family == "llama":
            block = 8 * h + 2 * shape.kv_dim + 4 * i + (n * L if shape.eager else n)
            rest = 3.25 * h
        elif shape.family == "gpt2":
            block, rest = 10 * h + 5 * i + attention, 3 * h
        elif shape.family == "t5":  # per encoder + decoder pair: three attentions (self, causal self, cross)
            block, rest = 32 * h + 6 * i + 3 * attention, 10 * h + 2 * L
        else:
            block, rest = 10 * h + 2 * i + attention, 3 * h
        blocks = shape.layers // 2 if shape.family == "t5" else shape.layers
        if self.model_kind in GENERATING:
            rest += h if self.chunked else shape.vocab  # chunked: the target tokens' hidden states; else log-softmax
        return block, rest, blocks

    def loss_transient(self, tokens: int, *, grads_of_head: bool) -> float:
        """Bytes alive for a moment at the start of backward: the loss's gradients over the logits (the incoming and
        the log-softmax's, 2 V fp32 per token; one chunk's when chunked) and the output layer's weight gradient."""
        head = 4.0 * self.shape.head_params if grads_of_head else 0.0
        if self.model_kind not in GENERATING:
            return head
        from kitlib.engine.chunked_loss import chunk_tokens

        vocab = self.shape.vocab
        rows = min(tokens, chunk_tokens(vocab)) if self.chunked else tokens
        per_token = (4 if self.chunked else 2) * vocab * 4.0  # chunked: its logits, log-softmax and both gradients
        return rows * per_token + head


def fsdp_transient(shape: Shape, world: int, half: float) -> tuple[float, float]:
    """(bytes held, bytes of one block's backward) that FSDP2 adds unsharded, ``half`` bytes a gathered element:
    the root's parameters held from forward to the end of backward; per block the head's gradient, two blocks'
    parameters and one block's fp32 gradients with its reduce-scatter buffers."""
    block, root = shape.linear_params / shape.layers, shape.params - shape.linear_params  # root: all but blocks
    return half * root, half * shape.head_params + (3 * half + 4.0 * (1 + 1 / world)) * block


# ---------------------------------------------------------------------------------------------- config -> shape
def model_config(model: Any) -> tuple[str, Any]:
    """(a name for the table, the transformers config) of a config object, a config.json, a folder or a known
    name. Only the config is read: no weights."""
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(model, PretrainedConfig):
        return type(model).__name__.removesuffix("Config"), model
    text = str(model)
    key = _ALIASES.get(text.lower(), text.lower())
    if key in KNOWN_MODELS:
        kind, kwargs = KNOWN_MODELS[key]
        return key, AutoConfig.for_model(kind, **kwargs)
    path = Path(text)
    file = path if path.is_file() and path.suffix == ".json" else path / "config.json"
    if file.is_file():
        try:  # transformers reads it: an unknown model_type is its ValueError, a broken file its OSError
            name = (path.parent.name or path.name) if file == path else path.name
            return name, AutoConfig.from_pretrained(str(path), local_files_only=True)
        except (ValueError, KeyError, OSError) as err:
            raise SetupError(
                f"model {text!r}: transformers cannot read its config.json ({type(err).__name__}: "
                f"{str(err).splitlines()[0]}). Fix: a model folder of an architecture this transformers ships "
                "(save_pretrained of a built-in model class), or upgrade transformers"
            ) from None
    raise SetupError(
        f"model {text!r} is neither a config.json, a folder holding one, nor a known name ({', '.join(KNOWN_MODELS)}). "
        "Fix: --model path/to/model_folder (its config.json is all the plan reads)"
    )


def model_shape(config: Any, model_kind: str) -> Shape:
    """The Shape of ``config`` trained as ``model_kind``: parameter counts from the model built on the meta device."""
    from kitlib.doctor.meta_count import parameter_counts  # builds the model: torch and transformers

    kind = getattr(config, "model_type", "")
    family = _FAMILIES.get(kind, "llama" if hasattr(config, "num_key_value_heads") else "bert")
    total, embedding, linear, dims, head_params = parameter_counts(config, model_kind)
    hidden, heads = int(_attr(config, "hidden_size", "d_model")), int(_attr(config, "num_attention_heads", "num_heads"))
    head_dim = int(_attr(config, "head_dim", "d_kv", default=hidden // heads))
    kv_heads = int(_attr(config, "num_key_value_heads", default=heads))
    intermediate = int(_attr(config, "intermediate_size", "d_ff", "n_inner", default=4 * hidden))
    layers = int(_attr(config, "num_hidden_layers", "num_layers"))
    if family == "t5":
        layers += int(_attr(config, "num_decoder_layers", default=layers))
    names = ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob", "dropout_rate")
    dropout = max(float(_attr(config, name, default=0.0)) for name in names)
    eager = getattr(config, "_attn_implementation", None) == "eager"
    return Shape(family, hidden, intermediate, layers, heads, kv_heads * head_dim, int(config.vocab_size), dropout,
                 eager, total, embedding, linear, dims, head_params)  # fmt: skip


def _attr(config: Any, *names: str, default: Any = None) -> Any:
    """The first of ``names`` that ``config`` sets (not 0 or None), else ``default``."""
    return next((value for name in names if (value := getattr(config, name, None))), default)


def run_plan(model: Any, model_kind: str, hw: HardwareInfo, run: Any, *, split: bool = True) -> MemoryPlan:
    """The plan of ``run`` (a resolved preset, kitlib.notebook.presets.ResolvedRun) for ``model`` on ``hw``: its
    tokens per row and effective batch, and when ``split`` its micro-batch x accumulation."""
    cfg = run.config
    fixed = {"micro_batch": cfg.micro_batch_size, "accum": cfg.grad_accum_steps} if split else {}
    return plan_memory(model, hardware=hw, seq_len=cfg.max_length or run.preset.max_length_cap, model_kind=model_kind,
                       effective_batch=run.effective_batch_size, **fixed)  # fmt: skip


def run_line(model: Any, model_kind: str, hw: HardwareInfo, run: Any) -> str:
    """The memory line of a resolved preset for ``model`` as ``model_kind``: what the picker and ``python -m kitlib
    presets`` show (the run's own split: one micro-batch x accumulation). A plan that cannot be made says why."""
    try:
        plan = run_plan(model, model_kind, hw, run)
        if run.preset.regime == "head":  # the encoder runs once without gradients; the head trains on cached vectors
            return f"~{4 * plan.shape.params / _GB:.1f} GB of fp32 weights for the encoder's forward pass (head regime)"
        if plan.choice is None:  # that split fits nowhere: what would (a smaller micro-batch, more accumulation)
            free = run_plan(model, model_kind, hw, run, split=False)
            return f"{plan.seq_len} tokens/row: micro-batch {run.config.micro_batch_size} does not fit; {free.line()}"
    except KitError as err:
        return f"no plan: {err}"
    return f"{plan.seq_len} tokens/row: {plan.line()}"


def checkpointing_needed(model: Any, model_kind: str, hw: HardwareInfo, run: Any) -> str:
    """Why ``run`` (a ResolvedRun) must recompute activations in backward: it fits ``hw``'s budget with gradient
    checkpointing and not without; "" when it fits without, fits neither way, or the plan has no such strategy."""
    cfg, plan = run.config, run_plan(model, model_kind, hw, run)
    forced_fp32 = cfg.precision == "fp32" and any(not f.strategy.amp for f in plan.fits)  # fp32 asked on an AMP card
    same = {}
    for f in reversed(plan.fits):  # the first row of each (least compromise) wins
        if (f.strategy.kind, f.strategy.amp) == ((cfg.optimizer, cfg.adapter, cfg.freeze), not forced_fp32):
            same[f.strategy.checkpointing] = f
    without, with_ = same.get(False), same.get(True)
    if without is None or with_ is None or without.fits or not with_.fits:
        return ""
    return (
        f"gradient checkpointing on (the memory plan): {without.strategy.name} at micro-batch {cfg.micro_batch_size} "
        f"x {plan.seq_len} tokens needs ~{without.peak / _GB:.1f} GB, over the {plan.budget / _GB:.1f} GB "
        f"planned on {plan.hardware}; ~{with_.peak / _GB:.1f} GB recomputing activations (~30% more compute; "
        "gradient_checkpointing = False to refuse)"
    )


def planned_parallel(model: Any, model_kind: str, hw: HardwareInfo, run: Any) -> str | None:
    """The ``strategy`` parameter's None ("the plan's") for ``run`` (a resolved preset) on ``hw``: "fsdp" where its
    settings fit the GPUs only sharded, "ddp" where they fit whole or fit neither way, None on one device."""
    cfg, plan = run.config, run_plan(model, model_kind, hw, run, split=False)
    if plan.world == 1:
        return None
    mine = [f for f in plan.fits if f.strategy.kind == (cfg.optimizer, cfg.adapter, cfg.freeze)]
    whole = any(f.fits for f in mine if f.strategy.shards == 1)
    return "fsdp" if not whole and any(f.fits for f in mine if f.strategy.shards > 1) else "ddp"
