"""Cached featurisers (tokens, embeddings); bad input raises one ``FeatureInputError`` first."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np
import numpy.typing as npt

from kitlib.data.cache import Cache, cached
from kitlib.errors import FeatureInputError
from kitlib.machine.hardware import is_interactive
from kitlib.progress import advance, progress_bar

# lazy: torch (+1.0 s), pandas (+0.2 s): only embedding and DataFrame inputs need them

if TYPE_CHECKING:
    pass

R = TypeVar("R")
CacheArg = Cache | None | Literal[False]  # None: a default Cache(); False: compute without caching


@dataclasses.dataclass(frozen=True, eq=False)
class TokenizedTexts:
    """Token ids of n texts: one flat int32 array + n+1 offsets. ``tokens[i]`` is row i's ids (a view, no copy)."""

    ids: npt.NDArray[np.int32]
    offsets: npt.NDArray[np.int64]
    max_length: int | None = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> npt.NDArray[np.int32]:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"row {i} out of range for {n} texts")
        i %= n
        return self.ids[self.offsets[i] : self.offsets[i + 1]]

    @property
    def lengths(self) -> npt.NDArray[np.int64]:
        return np.diff(self.offsets)

    @property
    def n_tokens(self) -> int:
        return int(self.offsets[-1])


def _check_texts(texts: Any, what: str = "texts") -> list[str]:
    """A list of str, or one error naming the column and the first bad row."""
    if isinstance(texts, str):
        raise FeatureInputError(f"{what}: expected a sequence of texts, got one string")
    if hasattr(texts, "columns"):
        raise FeatureInputError(f"{what}: got a DataFrame; pass one column, e.g. df['text']")
    column = f"column {texts.name!r}" if isinstance(getattr(texts, "name", None), str) else what
    labels = list(texts.index) if hasattr(texts, "index") and hasattr(texts, "iloc") else None
    items = list(texts.tolist() if hasattr(texts, "tolist") else texts)
    if not items:
        raise FeatureInputError(f"{column}: no texts (empty input)")
    for i, item in enumerate(items):
        if type(item) is not str:
            where = f"row {i}" + (f" (index {labels[i]!r})" if labels is not None and labels[i] != i else "")
            fill = f"df[{texts.name!r}].fillna('')" if column != what else "''"
            raise FeatureInputError(
                f"{column}: {where} is {type(item).__name__} {item!r}, expected str; "
                f"fill or drop missing texts first (e.g. {fill})"
            )
    return items


def _positive(**values: int | None) -> None:
    for name, value in values.items():
        if value is not None and value < 1:
            raise FeatureInputError(f"{name} must be >= 1, got {value}")


def _through(
    cache: CacheArg,
    fn: Callable[..., R],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    *,
    name: str,
    ignore: Sequence[str] = (),
) -> R:
    if cache is False:
        return fn(*args, **kwargs)
    return cached(fn, *args, cache=cache or None, name=name, ignore=ignore, **kwargs)


def tokenize_texts(
    texts: Sequence[str] | Any,
    tokenizer: Any,
    *,
    max_length: int | None = None,
    batch_size: int = 1000,
    cache: CacheArg = None,
) -> TokenizedTexts:
    """Token ids of each text (special tokens added, truncated to ``max_length``, never padded)."""
    items = _check_texts(texts)
    _positive(max_length=max_length, batch_size=batch_size)
    return _through(
        cache,
        _build_tokens,
        (items, tokenizer),
        {"max_length": max_length, "batch_size": batch_size},
        name="tokens",
        ignore=("batch_size",),
    )


def _build_tokens(texts: list[str], tokenizer: Any, max_length: int | None, batch_size: int) -> TokenizedTexts:
    lengths = np.empty(len(texts), dtype=np.int64)
    parts: list[npt.NDArray[np.int32]] = []
    # Batches of ~1000: the Rust tokenizer parallelises within one; one call would hold all ids (~100 B/token)
    for start in range(0, len(texts), batch_size):
        ids = tokenizer(
            texts[start : start + batch_size],
            add_special_tokens=True,
            truncation=max_length is not None,
            max_length=max_length,
            padding=False,
            return_attention_mask=False,
            return_token_type_ids=False,
        )["input_ids"]
        lengths[start : start + len(ids)] = [len(row) for row in ids]
        count = int(lengths[start : start + len(ids)].sum())
        parts.append(np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=count))
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return TokenizedTexts(np.concatenate(parts), offsets, max_length)


def embed_texts(
    texts: Sequence[str] | Any,
    tokenizer: Any,
    model: Any,
    *,
    batch_size: int = 64,
    max_length: int = 256,
    device: Any = None,
    precision: Any = None,
    normalize: bool = False,
    layers: int = 1,
    progress: bool | str = False,
    cache: CacheArg = None,
) -> npt.NDArray[np.float32]:
    """Mean-pooled frozen-encoder states, [n_texts, layers * hidden] float32 in input order (last ``layers`` joined)."""
    items = _check_texts(texts)
    _positive(batch_size=batch_size, max_length=max_length, layers=layers)
    autocast = _autocast_factory(precision)
    return _through(
        cache,
        _build_embeddings,
        (items, tokenizer, model),
        {
            "max_length": max_length,
            "normalize": normalize,
            "layers": layers,
            "precision_tag": _precision_tag(autocast),
            "autocast": autocast,
            "batch_size": batch_size,
            "device": device,
            "progress": progress,
        },
        name="embeddings",
        ignore=("autocast", "batch_size", "device", "progress"),
    )


def _autocast_factory(precision: Any) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    if precision is None:
        return contextlib.nullcontext
    if callable(getattr(precision, "autocast", None)):
        return precision.autocast
    if callable(precision):
        return precision
    raise FeatureInputError(
        f"precision: expected None, an object with .autocast() or a context-manager factory, "
        f"got {type(precision).__name__}"
    )


def _precision_tag(autocast: Callable[[], contextlib.AbstractContextManager[Any]]) -> str:
    """What the autocast context computes in, for the key: fp32 and bf16 embeddings are different entries."""
    ctx = autocast()  # constructing torch.autocast has no effect until entered
    if isinstance(ctx, contextlib.nullcontext):
        return "fp32"
    if all(hasattr(ctx, a) for a in ("device", "fast_dtype", "_enabled")):  # torch.autocast
        return f"autocast:{ctx.device}:{ctx.fast_dtype}" if ctx._enabled else "fp32"  # type: ignore[attr-defined]
    return f"{type(ctx).__module__}.{type(ctx).__qualname__}"


def _build_embeddings(
    texts: list[str],
    tokenizer: Any,
    model: Any,
    max_length: int,
    normalize: bool,
    layers: int,
    precision_tag: str,
    autocast: Callable[[], contextlib.AbstractContextManager[Any]],
    batch_size: int,
    device: Any,
    progress: bool | str,
) -> npt.NDArray[np.float32]:
    import torch

    from kitlib.data.loaders import PaddingCollator
    from kitlib.models.heads import masked_mean

    tokens = _build_tokens(texts, tokenizer, max_length, batch_size=1000)
    lengths = tokens.lengths
    # Longest first: the batch that needs the most memory runs first, so an OOM shows in seconds, not at the end.
    order = np.argsort(-lengths, kind="stable")
    if device is not None:
        model.to(device)
    dev = next(model.parameters()).device
    pad = PaddingCollator(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0, pad_to_multiple_of=1)
    was_training = model.training
    model.eval()
    out: npt.NDArray[np.float32] | None = None
    desc = progress if isinstance(progress, str) else "embed"
    bar = progress_bar(len(texts), desc=desc, interactive=is_interactive(os.environ), disable=not progress)
    try:
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                rows = order[start : start + batch_size]
                batch = pad([tokens[int(i)] for i in rows])  # to the batch's longest row
                ids_t, mask_t = (batch[k].to(dev, non_blocking=True) for k in ("input_ids", "attention_mask"))
                with autocast():
                    more = {"output_hidden_states": True} if layers > 1 else {}
                    output = model(input_ids=ids_t, attention_mask=mask_t, **more)
                pools = [masked_mean(h.float(), mask_t) for h in _top_layers(output, layers)]  # fp32 under autocast
                pooled = torch.cat(
                    [torch.nn.functional.normalize(p, dim=-1) for p in pools] if normalize else pools, -1
                )
                if out is None:
                    out = np.empty((len(texts), pooled.shape[-1]), dtype=np.float32)
                out[rows] = pooled.cpu().numpy()  # .cpu() syncs with the GPU once per batch
                advance(bar, len(rows), int(lengths[rows].sum()))
    finally:
        bar.close()
        model.train(was_training)
    assert out is not None  # texts were checked non-empty
    return out


def _top_layers(output: Any, layers: int) -> list[Any]:
    """The last ``layers`` hidden states of an encoder's output, last first."""
    if layers == 1:
        hidden = getattr(output, "last_hidden_state", None)
        return [output[0] if hidden is None else hidden]
    states = getattr(output, "hidden_states", None)
    if states is None or len(states) - 1 < layers:  # hidden_states[0] is the embedding layer's output
        have = 0 if states is None else len(states) - 1
        raise FeatureInputError(f"layers={layers}: the encoder returned {have} hidden layers; use layers <= {have}")
    return list(states[::-1][:layers])
