"""What every generating task shares; a task says only how one batch is generated (``generate_batch``)."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from kitlib.data.tables import DataError, TargetSpec
from kitlib.errors import SetupError
from kitlib.models import IGNORE_INDEX
from kitlib.notebook.tasks.base import Task
from kitlib.progress import advise
from kitlib.tasks.baseline import most_common

# lazy: torch (+1.0 s), transformers (+0.6 s): only generating needs them

if TYPE_CHECKING:
    import pandas as pd
    import torch
    from torch import nn

    from kitlib.engine.evaluation import SplitEval
    from kitlib.notebook.handoff import SideInputs
    from kitlib.notebook.presets import Preset
    from kitlib.notebook.tasks.base import FullEval, Params, Predictor
    from kitlib.tasks.metrics import Metric

IGNORE = IGNORE_INDEX  # label positions the loss skips (kitlib.models: Hugging Face's convention)
LOOP_QUANTILE = 99  # the no-repeat run and the copies in a row: what this percent of training targets stay within
MAX_PERIOD = 16  # tokens: the longest run whose copies in a row are counted (a word in bytes, a phrase in BPE)
FULL_EVAL_EVERY = 5  # epochs between generate-and-score evals; loss-only in between (the seed user's cadence)
ROUGH_ROWS = 2_000  # rows 00 fits a from-scratch tokenizer to for the estimate's token counts (BPE: ~0.5 s)


@dataclasses.dataclass(frozen=True)
class Limits:
    """How long and repetitive a generated text may be (from the training targets) and the empty-output stand-in."""

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
    """Limits for targets saved as label rows; fallback: the most common target of ``train_rows`` (default all)."""
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
    """Per row of ids, the most times one run of <= MAX_PERIOD tokens repeats in a row (1: none); vectorised."""
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
    """Per row of generated ids, whether it loops by ``NoLoops``'s measure (repeated n-gram, or too many copies)."""
    copies = copies_in_a_row(rows)
    return np.array([repeats(row, limits.no_repeat_ngram_size) for row in rows], dtype=bool) | (
        copies > limits.max_copies
    )


class NoLoops:
    """A transformers logits processor refusing tokens that would loop (by ``looped``), counting from ``start`` on."""

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
    """The tokenizer ``fit`` builds from the first ROUGH_ROWS rows and each column's tokens per row (extrapolated)."""
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


def attach(model: Any, tokenizer: Any, side: SideInputs, labels: np.ndarray, rows: np.ndarray | None) -> Any:
    """``model`` with its tokenizer and output limits: a published run's, else from the training ``rows``' targets."""
    state = side.state  # plain attributes: not weights, not in the checkpoint
    model.kitlib_tokenizer = tokenizer
    model.kitlib_limits = Limits(**state["limits"]) if "limits" in state else target_limits(labels, tokenizer, rows)
    return model


def limits_of(model: nn.Module) -> Limits:
    return getattr(getattr(model, "module", model), "kitlib_limits")  # noqa: B009


def tokenizer_of(model: nn.Module) -> Any:
    return getattr(getattr(model, "module", model), "kitlib_tokenizer")  # noqa: B009


def read_outputs(rows: Any, tokenizer: Any, limits: Limits, tally: Tally | None = None) -> list[str]:
    """Each row's new ids as text (up to </s>), a blank one as ``limits.fallback``; ``tally`` counts issues."""
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
    target_rule = "classify"  # read_table: targets as written (a mix of words and numbers is not a dirty number)
    num_beams = 4  # 03's beam search; the full eval decodes greedily (1 beam: ~4x cheaper, ranks epochs the same)
    roles = ("source", "target")  # what the text and target columns hold, as the errors name them
    # from random weights: the presets' 3e-5 to 1e-4 are for pretrained ones; epochs: x the preset's
    lr_from_scratch, epochs_from_scratch = 1e-3, 5

    def from_scratch(self, p: Params) -> bool:
        """Whether 02 trains a model from random weights (no pretrained folder named)."""
        return model_folder(p) is None

    def preset(self, preset: Preset, p: Params) -> Preset:
        """All weights train, generating every FULL_EVAL_EVERY epochs; from scratch a larger lr and more epochs
        (multiplied once: stages.task_preset applies it once). Smoke stays a plumbing check."""
        changes: dict[str, Any] = {"freeze": "none", "freeze_layers": 0, "full_eval_every": 0}
        if preset.row_limit is None:
            changes["full_eval_every"] = FULL_EVAL_EVERY
            if self.from_scratch(p):
                changes |= {"lr": self.lr_from_scratch, "epochs": preset.epochs * self.epochs_from_scratch}
        return dataclasses.replace(preset, **changes)

    def check(self, p: Params) -> None:
        if p.text == p.target:
            source, target = self.roles
            raise SetupError(
                f"task = {self.name!r} needs a {source} column and a {target} column, but text and target both name "
                f"{p.text!r}. Fix: text = the {source} column, target = the {target} column in 00_setup's parameters"
            )

    def target(self, column: pd.Series, p: Params, metric: str) -> TargetSpec:
        blank = column.isna() | (column.astype(str).str.strip() == "")  # numbers are fine: generated as text
        if blank.any():
            first = blank.idxmax()
            raise DataError(
                f"target column {column.name!r} holds {column[first]!r} at row {first} ({int(blank.sum())} blank in "
                f"all): {self.name} generates it, so every {self.roles[1]} must be a non-empty text. Fix: drop or "
                "fill those rows, or check target"
            )
        return TargetSpec("sequence", 0)

    def generate_batch(self, model: nn.Module, batch: Mapping[str, torch.Tensor], *, num_beams: int) -> Any:
        """New ids per row of one batch within ``limits_of(model)`` ([rows, tokens] or lists); after </s> ignored."""
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
        """Generation and the metric, placed by ``generated_eval``; blanks scored as 03 writes them (the fallback)."""

        def generate(on: nn.Module) -> tuple[list[str], list[str]]:
            batches = list(loader)
            references = [self.reference(on, row) for b in batches for row in b["labels"]]
            return references, [text for b in batches for text in self.texts(on, b, 1, Tally())]

        def score(references: list[str], generated: list[str]) -> dict[str, float]:
            y_true, y_pred = np.array(references, dtype=object), np.array(generated, dtype=object)
            return {metric.name: metric(y_true, y_pred)}

        return generated_eval(generate, score)

    def predictor(self, model: nn.Module, spec: TargetSpec) -> Predictor:
        """Generated text per row; reports and warns on blank, looped or cut rows once every batch is in."""
        tally, beams, decoding = Tally(), self.beams(model), self.decoding(model)

        def gather(batches: list[list[str]]) -> np.ndarray:
            line = report(tally, limits_of(model), decoding)
            print(line)
            if tally.blank or tally.looped or tally.cut:
                advise(
                    f"kitlib: {line}. Such outputs score poorly: train longer (epochs), check that 02's validation "
                    "loss fell, or use a larger model",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return np.array([text for batch in batches for text in batch], dtype=object)

        return lambda batch: self.texts(model, batch, beams, tally), gather, f", {decoding}"

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
    """A generating full eval: generate in the foreground, only ``score`` where ``background_eval`` says."""
    import torch

    from kitlib.engine.evaluation import SplitEval

    def measure(model: nn.Module) -> tuple[list[str], list[str]]:
        with torch.inference_mode():
            return generate(getattr(model, "module", model))

    return SplitEval(measure=measure, score=lambda measured: score(*measured))
