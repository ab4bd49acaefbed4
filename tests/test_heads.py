"""The head regime's pieces: tf-idf n-gram bags and the TextHead that sums an MLP on embeddings with them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from kitlib.config import TrainConfig
from kitlib.data.ngrams import NgramVectorizer, hashed_grams
from kitlib.engine.loop import fit
from kitlib.engine.optim import freeze
from kitlib.machine.hardware import fake_profile
from kitlib.models.heads import MeanPoolClassifier, RowDataset, TextHead
from kitlib.models.loading import load_text_classifier, pooling_mode


def test_idf_ranks_rare_grams_above_common_ones_and_rows_have_unit_norm() -> None:
    texts = ["the film was good", "the film was bad", "the plot was thin", "the end"]
    vec = NgramVectorizer.fit(texts, n_buckets=2**12)
    the, good = hashed_grams("the", 2**12)[0], hashed_grams("good", 2**12)[0]
    assert vec.idf[the] == pytest.approx(1.0)  # in every document: smoothed idf's floor
    assert vec.idf[good] > vec.idf[the]
    bags = vec.transform([*texts, "", "unseen words only"])
    norms = np.sqrt((bags.weights.astype(np.float64) ** 2).sum(1))
    np.testing.assert_allclose(norms, [1, 1, 1, 1, 0, 1], rtol=1e-6)  # the empty text is an empty bag, not NaN
    assert bags.ids.shape == bags.weights.shape and bags.weights[4].sum() == 0
    # uni- and bigrams, one entry per distinct gram: "the film was good" has 4 + 3
    assert (bags.weights[0] > 0).sum() == 7


def test_bags_ignore_case_and_word_order_within_counts_and_truncate_to_the_heaviest_grams() -> None:
    vec = NgramVectorizer.fit(["a b c", "a d", "a e"], n_buckets=2**12, max_n=1)
    one, two = vec.transform(["A b C", "c B a"]).ids
    assert sorted(one) == sorted(two)
    long = vec.transform(["a b c d e"], max_grams=2)
    kept = set(long.ids[0][long.weights[0] > 0])
    rare = {hashed_grams(w, 2**12)[0] for w in ("b", "c")}  # idf: b, c, d, e each in 1 doc, a in 3
    assert len(kept) == 2 and hashed_grams("a", 2**12)[0] not in kept and kept <= rare | set(hashed_grams("d e", 2**12))
    with pytest.raises(ValueError, match="n_buckets"):
        NgramVectorizer.fit(["x"], n_buckets=0)


def test_head_starts_as_its_mlp_and_carries_its_standardisation_in_the_state_dict() -> None:
    torch.manual_seed(0)
    x = torch.randn(5, 6) * 3 + 1
    head = TextHead(6, 3, n_buckets=64, mean=x.mean(0), std=x.std(0)).eval()
    ids, weights = torch.randint(0, 64, (5, 4)), torch.rand(5, 4)
    out = head(x, ids, weights).logits
    torch.testing.assert_close(out, head.mlp((x - x.mean(0)) / x.std(0)))  # zero-initialised bag adds nothing
    clone = TextHead(6, 3, n_buckets=64)
    clone.load_state_dict(head.state_dict())
    torch.testing.assert_close(clone.eval()(x, ids, weights).logits, out)
    with pytest.raises(ValueError, match="ngram_ids"):
        head(x)
    assert head(x, ids, weights, labels=torch.tensor([0, 1, 2, 0, 1])).loss is not None


def test_head_learns_a_word_signal_the_embeddings_do_not_carry() -> None:
    """Embeddings are pure noise; the label is whether the text says "great" or "awful". The bag must learn it."""
    rng = np.random.default_rng(0)
    filler = ["plot", "actor", "scene", "music", "story", "film", "ending", "cast"]
    texts, labels = [], []
    for i in range(400):
        words = [*rng.choice(filler, 5), "great" if i % 2 else "awful"]
        rng.shuffle(words)
        texts.append(" ".join(words))
        labels.append(i % 2)
    vec = NgramVectorizer.fit(texts[:300], n_buckets=2**10)
    bags = vec.transform(texts)
    x = torch.randn(400, 8)
    y = torch.tensor(labels)
    data = {"embeddings": x, "ngram_ids": torch.from_numpy(bags.ids), "ngram_weights": torch.from_numpy(bags.weights)}
    train = RowDataset(**{k: v[:300] for k, v in data.items()}, labels=y[:300])
    cfg = TrainConfig(epochs=5, micro_batch_size=32, lr=1e-3, precision="fp32", warmup_ratio=0.0)

    def accuracy(n_buckets: int) -> float:
        torch.manual_seed(0)
        head = TextHead(8, 2, n_buckets=n_buckets, mean=x[:300].mean(0), std=x[:300].std(0))
        fit(head, DataLoader(train, batch_size=32, shuffle=True), config=cfg, hw=fake_profile("CPU"))
        with torch.no_grad():
            pred = head.eval()(**{k: v[300:] for k, v in data.items()}).logits.argmax(-1)
        return float((pred == y[300:]).float().mean())

    assert accuracy(2**10) >= 0.95
    assert accuracy(0) <= 0.7  # the MLP alone only sees noise: chance level on held-out rows


def test_regression_head_fits_a_number_with_mse() -> None:
    head = TextHead(4, 1, regression=True)
    out = head(torch.zeros(3, 4), labels=torch.tensor([1.0, 2.0, 3.0]))
    expected = torch.nn.functional.mse_loss(out.logits.squeeze(-1), torch.tensor([1.0, 2.0, 3.0]))
    assert out.loss is not None and torch.allclose(out.loss, expected)


def test_row_dataset_rejects_ragged_columns() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        RowDataset(a=torch.zeros(3), b=torch.zeros(4))


def test_pooling_mode_follows_the_sentence_transformers_config(tmp_path: Path) -> None:
    assert pooling_mode(tmp_path) == "cls"
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    assert pooling_mode(tmp_path) == "mean"
    with pytest.raises(ValueError, match="pooling='max'"):
        load_text_classifier(2, pooling="max")


def test_mean_pool_classifier_ignores_padding_and_freezes_like_a_hugging_face_model() -> None:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
    model = MeanPoolClassifier(BertModel(cfg, add_pooling_layer=False), 3).eval()
    ids = torch.randint(1, 40, (1, 5))
    short = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    padded_ids = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], 1)
    padded_mask = torch.cat([torch.ones_like(ids), torch.zeros(1, 4, dtype=torch.long)], 1)
    torch.testing.assert_close(model(input_ids=padded_ids, attention_mask=padded_mask).logits, short)
    out = model(input_ids=ids, labels=torch.tensor([2]))
    assert out.loss is not None and torch.isclose(out.loss, torch.nn.functional.cross_entropy(short, torch.tensor([2])))
    assert int(freeze(model, "embeddings", layers=1)) > 0
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith(("encoder.encoder.layer.1.", "classifier.")) for n in trainable)
