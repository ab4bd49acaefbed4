"""What every text-generating task shares (seq2seq, causal-lm, custom-seq2seq): limits read from the training
targets (length, ``looped``, ``NoLoops``), the generating full eval, 03's tally of blank/looped/cut outputs, the
vote of several runs. A generating task says only how one batch is generated (``generate_batch``)."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from kitlib.models import IGNORE_INDEX
from kitlib.notebook.tasks.base import Task, each_batch
from kitlib.progress import advise
from kitlib.tasks.baseline import most_common

# lazy: torch (+1.0 s), transformers (+0.6 s): only generating needs them (python -X importtime).

if TYPE_CHECKING:
    import pandas as pd
    import torch
    from torch import nn

    from kitlib.data.tables import TargetSpec
    from kitlib.engine.evaluation import SplitEval
    from kitlib.notebook.tasks.base import FullEval, Params
    from kitlib.tasks.metrics import Metric

IGNORE = IGNORE_INDEX  # label positions the loss skips (kitlib.models: Hugging Face's convention)
LOOP_QUANTILE = 99  # the no-repeat run and the copies in a row: what this percent of training targets stay within
MAX_PERIOD = 16  # tokens: the longest run whose copies in a row are counted (a word in bytes, a phrase in BPE)
ROUGH_ROWS = 2_000  # rows 00 fits a from-scratch tokenizer to for the estimate's token counts (BPE: ~0.5 s)


@dataclasses.dataclass(frozen=True)
class Limits:
    """How long and how repetitive a generated text may be, read from the training targets (the same in 02's full
    eval and 03), and the text that stands in for an empty output."""

    min_new_tokens: int  # the shortest training target's tokens, </s> aside: </s> is refused before that
    max_new_tokens: int  # the longest target's tokens, </s> included: a text still going then is cut
    no_repeat_ngram_size: int  # no run of this many generated tokens repeats (99% of training targets never do)
    max_copies: int  # no run of <= MAX_PERIOD tokens follows itself more often in a row (99% of targets stay within)
    fallback: str  # written for an output that decodes to nothing: the most common training target
    cut: int = 0  # training targets cut at the length cap (no </s>): the model never learns their end


@dataclasses.dataclass
class Tally:
    """What 03 reports of a run's outputs."""

    rows: int = 0
    blank: int = 0  # decoded to nothing: replaced by Limits.fallback
    looped: int = 0  # ``looped``: a run of no_repeat_ngram_size tokens twice, or a run more than max_copies in a row
    cut: int = 0  # never produced </s>: stopped at max_new_tokens


def target_limits(label_rows: np.ndarray, tokenizer: Any, train_rows: np.ndarray | None = None) -> Limits:
    """The limits for targets saved as label rows (target tokens and </s>, IGNORE elsewhere), decoded with
    ``tokenizer``; the fallback is the most common target of ``train_rows`` (indices: 02's training split, the rows
    00's baseline reads; default all). Cost: one pass over the targets' tokens per run length tried (a few ms for 10k
    short targets)."""
    eos = tokenizer.eos_token_id
    rows = [[int(t) for t in row if t != IGNORE] for row in np.asarray(label_rows)]
    bodies = [row[:-1] if row and row[-1] == eos else row for row in rows]
    needed = [longest_repeat(body) + 1 for body in bodies]  # the shortest run length each target never repeats
    chosen = range(len(bodies)) if train_rows is None else train_rows
    texts = [str(tokenizer.decode(bodies[i], skip_special_tokens=True)).strip() for i in chosen]
    return Limits(
        min_new_tokens=max(1, min(len(b) for b in bodies)),
        max_new_tokens=max(1, max(len(r) for r in rows)),
        no_repeat_ngram_size=max(2, int(np.percentile(needed, LOOP_QUANTILE, method="higher"))),
        max_copies=max(2, int(np.percentile(copies_in_a_row(bodies), LOOP_QUANTILE, method="higher"))),
        fallback=most_common(texts),
        cut=sum(1 for row in rows if not row or row[-1] != eos),
    )


def copies_in_a_row(rows: Sequence[Sequence[int]]) -> np.ndarray:
    """Per row of token ids, the most times one run of at most MAX_PERIOD tokens follows itself in a row ("a a a a"
    in word tokens: 4; "ab ab" as "a b _ a b": 2 of "a b _"; 1: nothing repeats in a row). Vectorised over rows:
    MAX_PERIOD x the longest row numpy steps (~10 ms for 10k rows of 100 tokens)."""
    width = max((len(r) for r in rows), default=0)
    ids = np.full((len(rows), width + 1), -1, dtype=np.int64)  # -1 never equals a token; the +1: one always ends
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    most = np.ones(len(rows), dtype=np.int64)
    for period in range(1, min(MAX_PERIOD, width // 2) + 1):
        same = (ids[:, :-period] == ids[:, period:]) & (ids[:, period:] >= 0)  # token i equals token i + period
        run = longest = np.zeros(len(rows), dtype=np.int64)
        for column in same.T:  # a streak of m equal pairs: m + period tokens of period `period`
            run = (run + 1) * column
            longest = np.maximum(longest, run)
        most = np.maximum(most, (longest + period) // period)
    return most


def repeats(ids: Sequence[int], n: int) -> bool:
    """Whether some run of ``n`` tokens occurs twice in ``ids`` (overlapping allowed)."""
    seen: set[tuple[int, ...]] = set()
    for i in range(len(ids) - n + 1):
        run = tuple(ids[i : i + n])
        if run in seen:
            return True
        seen.add(run)
    return False


def longest_repeat(ids: Sequence[int]) -> int:
    """The length of the longest run of tokens that occurs twice in ``ids`` (0: every token differs)."""
    n = 0
    while repeats(ids, n + 1):  # a repeated run of n + 1 holds a repeated run of n: the first miss is the answer
        n += 1
    return n


def looped(rows: Sequence[Sequence[int]], limits: Limits) -> np.ndarray:
    """Per row of generated ids (</s> and after removed), whether it loops by the measure generation guards against
    (``NoLoops``): a run of ``no_repeat_ngram_size`` tokens twice, or a run more than ``max_copies`` times in a row."""
    copies = copies_in_a_row(rows)
    return np.array([repeats(row, limits.no_repeat_ngram_size) for row in rows], dtype=bool) | (
        copies > limits.max_copies
    )


class NoLoops:
    """A logits processor (transformers' protocol) refusing any token that would make a loop by ``looped``'s
    measure, counting only tokens from ``start`` on (a causal LM may copy its prompt). Cost: one device-to-host copy
    of the ids and O(length + MAX_PERIOD^2 x copies) Python per row per step."""

    def __init__(self, limits: Limits, start: int) -> None:
        self.n, self.copies, self.start = limits.no_repeat_ngram_size, limits.max_copies, start

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        n, k = self.n, self.copies
        for row, ids in enumerate(input_ids[:, self.start :].tolist()):
            prefix = ids[len(ids) - n + 1 :] if n > 1 else []
            banned = {ids[i + n - 1] for i in range(len(ids) - n + 1) if ids[i : i + n - 1] == prefix}
            for period in range(1, MAX_PERIOD + 1):  # the tail already holds k copies but one token: refuse that one
                tail = ids[len(ids) - (k + 1) * period + 1 :]
                if len(tail) == (k + 1) * period - 1 and tail[:-period] == tail[period:]:
                    banned.add(tail[-period])
            if banned:
                scores[row, sorted(banned)] = -float("inf")
        return scores


def rough_tokens(columns: Sequence[pd.Series], fit: Callable[[list[str]], Any]) -> tuple[Any, list[np.ndarray]]:
    """The tokenizer ``fit`` builds from the first ROUGH_ROWS rows of ``columns`` (01 fits it to them all), and each
    column's tokens per row as it encodes them: counted on those rows, the rest from their characters at those rows'
    tokens per character (the demos' BPE ran 3.3 characters a token, where 00 assumed 2)."""
    heads = [[str(v) for v in column.iloc[:ROUGH_ROWS]] for column in columns]
    tokenizer = fit([text for head in heads for text in head])
    counts = []
    for column, head in zip(columns, heads, strict=True):
        counted = np.array([len(ids) for ids in tokenizer(head)["input_ids"]], dtype=np.int64)
        chars = column.astype(str).str.len().to_numpy(np.int64)
        per_char = counted.sum() / max(1, chars[: len(head)].sum())
        counts.append(np.concatenate([counted, np.ceil(chars[len(head) :] * per_char).astype(np.int64)]))
    return tokenizer, counts


def hf_limits(limits: Limits, start: int) -> dict[str, Any]:
    """``generate`` keyword arguments of a transformers model for ``limits``; its new tokens start at ``start``."""
    from transformers import LogitsProcessorList

    return {
        "min_new_tokens": limits.min_new_tokens,
        "max_new_tokens": limits.max_new_tokens,
        "logits_processor": LogitsProcessorList([NoLoops(limits, start)]),
    }


def limits_of(model: nn.Module) -> Limits:
    return getattr(getattr(model, "module", model), "kitlib_limits")  # noqa: B009


def tokenizer_of(model: nn.Module) -> Any:
    return getattr(getattr(model, "module", model), "kitlib_tokenizer")  # noqa: B009


def read_outputs(rows: Any, tokenizer: Any, limits: Limits, tally: Tally | None = None) -> list[str]:
    """Each row of new token ids as text (up to its first </s>; special tokens dropped, stripped), a blank one as
    ``limits.fallback``; ``tally`` counts the blank, looped and cut rows."""
    tally = tally if tally is not None else Tally()
    eos = tokenizer.eos_token_id
    texts, bodies = [], []
    for row in rows.tolist() if hasattr(rows, "tolist") else rows:
        ids = [int(t) for t in row]
        ended = eos in ids
        bodies.append(ids[: ids.index(eos)] if ended else ids)
        text = str(tokenizer.decode(bodies[-1], skip_special_tokens=True)).strip()
        tally.rows += 1
        tally.cut += not ended
        if not text:
            tally.blank += 1
            text = limits.fallback
        texts.append(text)
    tally.looped += int(looped(bodies, limits).sum())
    return texts


def report(tally: Tally, limits: Limits, decoding: str) -> str:
    """03's line about a run's outputs."""
    return (
        f"generated {tally.rows} texts ({decoding}): {tally.blank} blank (written as the most common training "
        f"target, {limits.fallback!r}), {tally.looped} looped (a run of {limits.no_repeat_ngram_size} tokens "
        f"twice, or a run more than {limits.max_copies} times in a row: what {LOOP_QUANTILE}% of the training "
        f"targets never do), {tally.cut} cut at "
        f"{limits.max_new_tokens} tokens (the longest training target)"
    )


class TextGenerationTask(Task):
    regimes = ("finetune",)  # every weight trains: the head regime's frozen embeddings cannot generate
    num_beams = 4  # 03's beam search; the full eval decodes greedily (1 beam: ~4x cheaper, ranks epochs the same)

    def generate_batch(self, model: nn.Module, batch: Mapping[str, torch.Tensor], *, num_beams: int) -> Any:
        """The new token ids ``model`` generates for each row of one batch (on the model's device), within
        ``limits_of(model)``: a [rows, tokens] tensor or a list of id lists; what follows a row's </s> is ignored."""
        raise NotImplementedError

    def beams(self, model: nn.Module) -> int:
        """The beams 03 decodes with (what the model's decoding accepts)."""
        return self.num_beams

    def decoding(self, model: nn.Module) -> str:
        """How 03 decodes, in words, for its progress bar and report."""
        beams = self.beams(model)
        return "greedy" if beams == 1 else f"{beams} beams"

    def reference(self, model: nn.Module, labels: torch.Tensor) -> str:
        """One row of labels as the reference text the metric compares with."""
        ids = [int(t) for t in labels if int(t) != IGNORE]
        return str(tokenizer_of(model).decode(ids, skip_special_tokens=True)).strip()

    def texts(self, model: nn.Module, batch: Mapping[str, torch.Tensor], num_beams: int, tally: Tally) -> list[str]:
        """One batch's generated texts, blank ones replaced (``read_outputs``)."""
        rows = self.generate_batch(model, batch, num_beams=num_beams)
        return read_outputs(rows, tokenizer_of(model), limits_of(model), tally)

    def loss_fn(self, spec: TargetSpec) -> Callable[[nn.Module, Mapping[str, torch.Tensor]], torch.Tensor] | None:
        """The LM head and cross-entropy in chunks over the target tokens: no batch x length x vocab logits."""
        from kitlib.engine.chunked_loss import chunked_lm_loss

        return chunked_lm_loss

    def saved_state(self, tokenizer: Any, p: Params) -> dict[str, Any]:
        """What 02 and 03 rebuild the model from: the model folder, or the tokenizer 01 trained on the rows."""
        folder = model_folder(p)
        return {"model_folder": folder} if folder is not None else {"tokenizer": tokenizer.backend_tokenizer.to_str()}

    def evaluate(self, spec: TargetSpec, metric: Metric, loader: Any, device: torch.device) -> FullEval:
        """Generation and the metric, placed where they cost training least (``generated_eval``); fit makes its own
        loss pass beside a split full eval, so this one does not. Blank outputs are scored as 03 writes them (the
        most common training target)."""

        def generate(on: nn.Module) -> tuple[list[str], list[str]]:
            batches = list(loader)
            references = [self.reference(on, row) for b in batches for row in b["labels"]]
            return references, [text for b in batches for text in self.texts(on, b, 1, Tally())]

        def score(references: list[str], generated: list[str]) -> dict[str, float]:
            y_true, y_pred = np.array(references, dtype=object), np.array(generated, dtype=object)
            return {metric.name: metric(y_true, y_pred)}

        return generated_eval(generate, score)

    def predict(
        self,
        model: nn.Module,
        loader: Any,
        *,
        precision: Any,
        device: torch.device,
        spec: TargetSpec,
        interactive: bool = False,
        desc: str = "predict",
    ) -> np.ndarray:
        """The generated text of every test row, in the dataset's row order (the loader is length-sorted); prints how
        many were blank, looped or cut, and warns when any were."""
        from kitlib.data.loaders import restore_order

        tally, beams, decoding = Tally(), self.beams(model), self.decoding(model)

        def batch_texts(batch: Mapping[str, torch.Tensor]) -> list[str]:
            return self.texts(model, batch, beams, tally)

        run = {"precision": precision, "device": device, "interactive": interactive, "desc": f"{desc}, {decoding}"}
        batches = each_batch(model, loader, batch_texts, **run)
        line = report(tally, limits_of(model), decoding)
        print(line)
        if tally.blank or tally.looped or tally.cut:
            advise(
                f"kitlib: {line}. Such outputs score poorly: train longer (epochs), check that 02's validation loss "
                "fell, or use a larger model",
                RuntimeWarning,
                stacklevel=2,
            )
        texts = [text for batch in batches for text in batch]
        return np.asarray(restore_order(loader, np.array(texts, dtype=object)), dtype=object)

    def combine(self, predictions: list[np.ndarray]) -> np.ndarray:
        """Per row, the text most runs generated (ties: the first run's)."""
        voted = [collections.Counter(row).most_common(1)[0][0] for row in zip(*predictions, strict=True)]
        return np.array(voted, dtype=object)

    def submission(self, outputs: np.ndarray, spec: TargetSpec) -> np.ndarray:
        return outputs


def model_folder(p: Params) -> str | None:
    """The pretrained model folder ``model`` names, or None: "auto" and "tiny" build a tiny model from a config."""
    return None if p.model in ("auto", "tiny") else p.model


def generated_eval(
    generate: Callable[[nn.Module], tuple[list[str], list[str]]],
    score: Callable[[list[str], list[str]], dict[str, float]],
) -> SplitEval:
    """A generating full eval: ``generate(model)`` -> (references, texts) in the foreground on the model's device,
    only ``score`` where ``background_eval`` says (a generating thread shares training's cores: 1.45x wall on a CPU)."""
    import torch

    from kitlib.engine.evaluation import SplitEval

    def measure(model: nn.Module) -> tuple[list[str], list[str]]:
        with torch.inference_mode():
            return generate(getattr(model, "module", model))

    return SplitEval(measure=measure, score=lambda measured: score(*measured))
