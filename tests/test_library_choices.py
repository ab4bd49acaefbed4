"""Where kitlib keeps its own code beside a well-kept library (docs/architecture.md, "Libraries we compared"), the
behaviour the comparison found equal stays equal, and the case where ours was wrong stays fixed."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

from kitlib.data.ngrams import _TOKEN, NgramVectorizer
from kitlib.errors import SetupError
from kitlib.notebook.params import check_parameters
from kitlib.tasks.metrics import rouge_l

# rouge-score 0.1.2's RougeScorer(["rougeL"]).score(reference, generated).fmeasure for each pair (not a dependency:
# it brings nltk and absl). Accents and non-Latin scripts are dropped by its tokenizer, so they score 0 there too.
ROUGE_SCORE_0_1_2 = [
    ("Café naïve résumé", "cafe naive resume", 0.0),
    ("The cat's 3 toys!", "the cats 3 toys", 0.6666666666666665),
    ("日本語 テキスト", "日本語 テキスト", 0.0),
    ("a a a b", "b a a", 0.5714285714285715),
    ("x-ray, 2024: up 10%", "X ray up 10 percent in 2024", 0.6666666666666666),
    ("", "anything", 0.0),
    ("running runs", "run running", 0.5),  # no stemming: "runs" and "run" differ
]


@pytest.mark.parametrize(("reference", "generated", "expected"), ROUGE_SCORE_0_1_2)
def test_rouge_l_gives_rouge_scores_numbers_on_its_edge_cases(reference: str, generated: str, expected: float) -> None:
    truth, pred = np.array([reference], dtype=object), np.array([generated], dtype=object)
    assert rouge_l(truth, pred) == pytest.approx(expected, abs=1e-12)


def test_ngram_features_are_scikit_learns_tfidf_up_to_the_hash() -> None:
    """Same tokens, 1-2-grams, smoothed idf, sublinear tf and L2 norm as HashingVectorizer + TfidfTransformer: each
    row's weights agree once neither hash puts two grams in one bucket (crc32 here, murmurhash3 there)."""
    text = pytest.importorskip("sklearn.feature_extraction.text")
    murmur = pytest.importorskip("sklearn.utils").murmurhash3_32
    train = ["Not bad at all!", "flat, dull and long", "a great, great film", "not great", "bad bad bad film !"]
    test = ["great film, not flat", "unseen words only", "bad"]
    buckets = 2**20
    grams = {g for t in train + test for w in [_TOKEN.findall(t.lower())] for n in (1, 2)
             for g in (" ".join(w[i : i + n]) for i in range(len(w) - n + 1))}  # fmt: skip
    assert len({zlib.crc32(g.encode()) % buckets for g in grams}) == len(grams)  # no collision in either hash
    assert len({abs(murmur(g, positive=False)) % buckets for g in grams}) == len(grams)

    bags = NgramVectorizer.fit(train, buckets).transform(test)
    hashing = text.HashingVectorizer(
        n_features=buckets, ngram_range=(1, 2), token_pattern=_TOKEN.pattern, alternate_sign=False, norm=None
    )
    tfidf = text.TfidfTransformer(sublinear_tf=True).fit(hashing.transform(train))
    theirs = tfidf.transform(hashing.transform(test)).tocsr()
    for r in range(len(test)):
        ours = bags.weights[r][bags.weights[r] > 0]
        np.testing.assert_allclose(np.sort(ours), np.sort(theirs[r].data), rtol=1e-6)


@pytest.mark.parametrize("lr", [math.inf, math.nan])
def test_a_non_finite_number_is_refused_before_it_is_injected(lr: float) -> None:
    """The runner injects ``lr = inf`` by repr, a NameError in the kernel (papermill writes float('inf')); the
    parameter check refuses it first, naming the parameter."""
    with pytest.raises(SetupError, match=r"lr = .* finite number"):
        check_parameters({"lr": lr})
