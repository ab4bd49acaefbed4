from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

from kitlib.data.cache import Cache
from kitlib.data.featurize import (
    FeatureInputError,
    embed_texts,
    tokenize_texts,
)
from kitlib.data.tables import DataError, infer_target, read_table
from kitlib.tasks.tabular import fit_columns

WORDS = (
    "the",
    "a",
    "movie",
    "film",
    "plot",
    "actor",
    "was",
    "is",
    "good",
    "bad",
    "great",
    "boring",
    "long",
    "short",
    "very",
    "not",
    "really",
    "funny",
    "sad",
)


def corpus(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 30)))) for _ in range(n)]


def train_tokenizer(vocab_size: int) -> Any:
    """A WordPiece tokenizer trained in-test (no hub): BERT-style [CLS] text [SEP]."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(corpus(300), trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials))
    ids = [(t, tok.token_to_id(t)) for t in ("[CLS]", "[SEP]")]
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=ids)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def tiny_bert(vocab_size: int, seed: int = 0) -> BertModel:
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    return BertModel(config).eval()


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return train_tokenizer(vocab_size=120)


@pytest.fixture(scope="module")
def model(tokenizer: Any) -> BertModel:
    return tiny_bert(len(tokenizer))


@pytest.fixture
def cache(tmp_path: Path) -> Cache:
    return Cache(tmp_path / "cache", log=None)


def snapshot(root: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in root.rglob("*")} if root.exists() else {}


# ------------------------------------------------------------------------------------------------------- tokens


def test_tokenize_texts_matches_the_tokenizer_without_padding(tokenizer: Any, cache: Cache) -> None:
    texts = corpus(50)
    tokens = tokenize_texts(texts, tokenizer, max_length=12, batch_size=7, cache=cache)
    expected = tokenizer(texts, truncation=True, max_length=12)["input_ids"]
    assert len(tokens) == 50 and tokens.ids.dtype == np.int32
    assert [list(tokens[i]) for i in range(50)] == expected
    assert list(tokens.lengths) == [len(e) for e in expected] and tokens.n_tokens == sum(map(len, expected))
    assert list(tokens[-1]) == expected[-1]
    with pytest.raises(IndexError):
        tokens[50]


def test_tokenize_texts_cache_keys(tokenizer: Any, cache: Cache) -> None:
    texts = corpus(40)
    first = tokenize_texts(texts, tokenizer, max_length=16, cache=cache)
    again = tokenize_texts(pd.Series(texts, name="text"), tokenizer, max_length=16, batch_size=3, cache=cache)
    assert cache.stats.hits == 1  # same texts, batch_size is not part of the key
    np.testing.assert_array_equal(first.ids, again.ids)
    np.testing.assert_array_equal(first.offsets, again.offsets)
    tokenize_texts(texts, tokenizer, max_length=8, cache=cache)  # parameter
    tokenize_texts(texts, train_tokenizer(vocab_size=80), max_length=16, cache=cache)  # different vocab
    tokenize_texts([*texts[:-1], texts[-1] + " good"], tokenizer, max_length=16, cache=cache)  # one text
    assert (cache.stats.hits, cache.stats.misses) == (1, 4)


def test_tokenizer_call_state_does_not_change_the_key(tokenizer: Any, cache: Cache) -> None:
    texts = corpus(10)
    tokenize_texts(texts, tokenizer, cache=cache)
    tokenizer(texts, truncation=True, max_length=5, padding="max_length")  # rewrites the backend's truncation/padding
    tokenize_texts(texts, tokenizer, cache=cache)
    assert cache.stats.hits == 1


def test_bad_text_column_names_column_and_row_and_leaves_the_cache(
    tokenizer: Any, model: BertModel, cache: Cache
) -> None:
    tokenize_texts(corpus(5), tokenizer, cache=cache)
    before = snapshot(cache.dir)
    bad = pd.Series(["fine", "ok", np.nan, 3], name="review", index=[10, 11, 12, 13])
    with pytest.raises(FeatureInputError, match=r"column 'review': row 2 \(index 12\) is float nan.*fillna"):
        tokenize_texts(bad, tokenizer, cache=cache)
    with pytest.raises(FeatureInputError, match="row 1 is int"):
        embed_texts(["a", 5], tokenizer, model, cache=cache)
    with pytest.raises(FeatureInputError, match="empty"):
        tokenize_texts(pd.Series([], dtype=object, name="text"), tokenizer, cache=cache)
    with pytest.raises(FeatureInputError, match="one string"):
        tokenize_texts("just one", tokenizer, cache=cache)
    assert snapshot(cache.dir) == before


def file_state(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` with its size and mtime (ns): any write, rename or delete changes it."""
    return {p.relative_to(root).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def test_every_bad_input_is_one_data_error_naming_it_and_the_cache_is_untouched(
    tokenizer: Any, tmp_path: Path, cache: Cache
) -> None:
    good = pd.DataFrame({"text": corpus(6), "price": [1.0, 2.0, 3.0, np.nan, 5.0, 6.0], "label": [0, 1] * 3})
    tokenize_texts(good["text"], tokenizer, max_length=16, cache=cache)
    tokenize_texts(good["text"], tokenizer, max_length=8, cache=cache)
    before, stats = file_state(cache.dir), dataclasses.replace(cache.stats)
    assert any(name.endswith("manifest.json") for name in before) and stats.misses == 2

    def csv(name: str, content: str) -> Path:
        path = tmp_path / name
        path.write_text(content)
        return path

    def columns(df: pd.DataFrame, numeric: list[str]) -> None:  # the tabular-text task's numeric columns
        fit_columns(df, numeric=numeric, categorical=[], path=tmp_path / "train.csv")

    def featurise(path: Path, **columns: str) -> None:  # the notebook path: read, check, then featurise (cached)
        df = read_table(path, **columns)
        tokenize_texts(df[columns.get("text", "text")], tokenizer, max_length=16, cache=cache)

    cases: dict[str, tuple[Any, str]] = {
        "missing column (features)": (lambda: columns(good, ["price", "area"]), "'area'"),
        "missing column (file)": (lambda: featurise(csv("a.csv", "id,body\n1,x\n"), text="review"), "'review'"),
        "empty file": (lambda: featurise(csv("empty.csv", "")), "empty.csv"),
        "NaN target (file)": (lambda: featurise(csv("b.csv", "text,label\na,1\nb,\n"), target="label"), "'label'"),
        "NaN target (series)": (lambda: infer_target(pd.Series([1.0, np.nan], name="label")), "'label'"),
        "non-numeric target": (lambda: featurise(csv("c.csv", "text,y\na,1\nb,2\nc,x\n"), target="y"), "'y'"),
        "non-numeric feature": (
            lambda: columns(good.assign(price=["1", "2", "cheap", "4", "5", "6"]), ["price"]),
            "'price'",
        ),
        "non-string text (series)": (
            lambda: tokenize_texts(pd.Series(["ok", 3.5], name="review"), tokenizer, cache=cache),
            "'review'",
        ),
        "non-string text (file)": (lambda: featurise(csv("d.csv", "id,text\n1,5\n2,6\n")), "'text'"),
        "unknown path": (lambda: featurise(tmp_path / "no-such-train.csv"), "no-such-train.csv"),
    }
    for case, (call, named) in cases.items():
        with pytest.raises(DataError) as info:
            call()
        assert named in str(info.value), f"{case}: {info.value}"
        assert file_state(cache.dir) == before, f"{case} changed the cache"
    assert cache.stats == stats  # no lookup, build or store was even attempted
    assert issubclass(FeatureInputError, DataError)


# ------------------------------------------------------------------------------------------------------- embeddings


def reference_embedding(text: str, tokenizer: Any, model: BertModel, max_length: int) -> np.ndarray:
    enc = tokenizer([text], truncation=True, max_length=max_length, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state
    return hidden[0].mean(0).numpy()


def test_the_embedding_bars_rate_is_its_rows_over_its_wall_time(tokenizer: Any, model: BertModel) -> None:
    """01's embedding bar said 789 samples/s for a pass of 10,227 rows in 83 s (a moving average of the last
    batches): its samples/s is the pass's rows over the pass's seconds, its tokens/s the real tokens over the same
    seconds (``kitlib.progress.throughput``), each shown by ``figure``."""
    import time
    from unittest import mock

    from kitlib.data import featurize

    made: list[Any] = []
    real_bar = featurize.progress_bar

    def bar(*args: Any, **kwargs: Any) -> Any:
        made.append(real_bar(*args, **{**kwargs, "interactive": False, "headless_interval_s": 0}))
        return made[-1]

    texts = corpus(24, seed=3)
    slow = model.register_forward_pre_hook(lambda *_: time.sleep(0.1))  # 3 batches: the pass takes >= 0.3 s
    try:
        with mock.patch.object(featurize, "progress_bar", bar):  # embed_texts' own name for it
            begin = time.perf_counter()
            embed_texts(texts, tokenizer, model, batch_size=8, max_length=24, cache=False, progress="embed train")
            wall = time.perf_counter() - begin
    finally:
        slow.remove()
    shown = dict(item.split("=") for item in made[0].postfix.split(", "))
    samples, tokens = float(shown["samples/s"]), float(shown["tokens/s"])
    assert 24 / wall * 0.999 <= samples <= 24 / 0.3 * 1.001, (samples, wall)  # the bar's seconds lie within the call
    real = sum(len(ids) for ids in tokenizer(texts, truncation=True, max_length=24)["input_ids"])
    assert tokens / samples == pytest.approx(real / 24, rel=2e-3)  # the same seconds under both figures


def test_length_sorted_batches_equal_one_at_a_time_in_input_order(tokenizer: Any, model: BertModel) -> None:
    texts = corpus(37, seed=1)
    batched = embed_texts(texts, tokenizer, model, batch_size=8, max_length=24, cache=False)
    single = embed_texts(texts, tokenizer, model, batch_size=1, max_length=24, cache=False)
    reference = np.stack([reference_embedding(t, tokenizer, model, 24) for t in texts])
    assert batched.shape == (37, 32) and batched.dtype == np.float32
    np.testing.assert_allclose(batched, reference, atol=1e-5)
    np.testing.assert_allclose(single, reference, atol=1e-5)
    assert model.training is False


def test_layers_concatenate_the_top_hidden_states_last_first(tokenizer: Any, model: BertModel, cache: Cache) -> None:
    texts = corpus(9, seed=2)
    two = embed_texts(texts, tokenizer, model, batch_size=4, max_length=24, layers=2, cache=cache)
    enc = tokenizer(texts[0:1], truncation=True, max_length=24, return_tensors="pt")
    with torch.inference_mode():
        states = model(**enc, output_hidden_states=True).hidden_states
    np.testing.assert_allclose(two[0], torch.cat([states[-1][0].mean(0), states[-2][0].mean(0)]).numpy(), atol=1e-5)
    one = embed_texts(texts, tokenizer, model, batch_size=4, max_length=24, cache=cache)
    np.testing.assert_allclose(two[:, : one.shape[1]], one, atol=1e-5)
    assert cache.stats.misses == 2  # layers is part of the key
    layers = model.config.num_hidden_layers
    with pytest.raises(FeatureInputError, match=f"layers <= {layers}"):
        embed_texts(texts, tokenizer, model, layers=layers + 1, cache=False)


def test_embed_texts_is_cached_and_keyed_on_model_and_precision(tokenizer: Any, model: BertModel, cache: Cache) -> None:
    texts = corpus(30)
    first = embed_texts(texts, tokenizer, model, batch_size=16, cache=cache)
    again = embed_texts(texts, tokenizer, model, batch_size=4, cache=cache)
    assert cache.stats.hits == 1
    np.testing.assert_array_equal(first, again)
    other = embed_texts(texts, tokenizer, tiny_bert(len(tokenizer), seed=1), cache=cache)  # other weights
    assert not np.allclose(first, other)
    bf16 = embed_texts(
        texts, tokenizer, model, cache=cache, precision=lambda: torch.autocast("cpu", dtype=torch.bfloat16)
    )
    np.testing.assert_allclose(bf16, first, atol=0.1)
    normed = embed_texts(texts, tokenizer, model, normalize=True, cache=cache)
    np.testing.assert_allclose(np.linalg.norm(normed, axis=1), 1.0, rtol=1e-5)
    assert (cache.stats.hits, cache.stats.misses) == (1, 4)
