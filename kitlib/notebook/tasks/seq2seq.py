"""seq2seq: a source text -> a generated target (a folder's model, else a tiny T5); 03 decodes with beams."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from kitlib.data.featurize import tokenize_texts
from kitlib.data.tables import read_table
from kitlib.models.adapters import quantization
from kitlib.models.bpe import tokenizer_from_json, tokenizer_identity
from kitlib.models.folders import model_refusals
from kitlib.models.seq2seq import data_tokenizer, short_texts, tiny_seq2seq
from kitlib.notebook.tasks import generation as gen
from kitlib.notebook.tasks.base import Context, Params, Prepared, RoughCost
from kitlib.notebook.tasks.generation import IGNORE, TextGenerationTask, model_folder

# lazy: transformers (+0.6 s), pandas (+0.2 s), torch (+1.0 s): only loading and timing need them

if TYPE_CHECKING:
    import pandas as pd
    import torch
    from torch import nn

    from kitlib.data.tables import TargetSpec
    from kitlib.notebook.handoff import SideInputs
    from kitlib.notebook.presets import Choice, Preset, ResolvedRun

MAX_TARGET_TOKENS = 512  # cap on the target (and generated) length: decoding costs ~length^2
# a summary draws on its source's start: a summariser's source is cut at the median length (docs/measurements.md)
SUMMARY_SOURCE_COVERAGE = 0.5
SUMMARY_METRICS = ("rouge_l",)
# short texts from scratch: a budget of optimizer steps, not epochs, so a small table gets as many updates
SHORT_TEXT_BATCH = 16  # rows per optimizer step: per row, batch 16 costs ~1.1x batch 32 on a CPU, for 2x the steps
SHORT_TEXT_STEPS_PER_EPOCH = 6750  # x the preset's epochs (balanced 2, best 4)
# the lr the g2p loss fell at (1e-3 stalled)
SHORT_TEXT_LR = 5e-4
# generating evals per run on a small table's many short epochs (not one every gen.FULL_EVAL_EVERY)
SHORT_TEXT_FULL_EVALS = 10


def summary_source(preset: Preset, p: Params) -> Preset:
    """The preset with a summariser's source cut at SUMMARY_SOURCE_COVERAGE; other sources stay whole."""
    if p.metric not in SUMMARY_METRICS:
        return preset
    return dataclasses.replace(preset, length_coverage=min(preset.length_coverage, SUMMARY_SOURCE_COVERAGE))


class Seq2SeqTask(TextGenerationTask):
    name = "seq2seq"

    epochs_from_scratch = 10  # x the preset's epochs: nothing is pretrained, every pattern comes from the rows

    def preset(self, preset: Preset, p: Params) -> Preset:
        """Generation's preset; short texts from scratch: a steps budget; a summariser's source cut at its median."""
        fitted = super().preset(preset, p)
        if preset.row_limit is not None:  # smoke: the plumbing, in seconds
            return fitted
        short = short_text_steps(preset, p) if self.from_scratch(p) else {}
        return summary_source(dataclasses.replace(fitted, **short), p)

    def rough_cost(self, train: pd.DataFrame, p: Params) -> RoughCost | None:
        """From scratch: the sources' tokens through the model 01 would build; a folder's model: the default."""
        from kitlib.models.facts import non_embedding_params

        if model_folder(p) is not None:
            return None
        texts, targets = train[p.text], train[p.target]
        tokenizer, (sources, _) = gen.rough_tokens([texts, targets], lambda rows: data_tokenizer(rows)[0])
        return RoughCost(sources, non_embedding_params(self.scratch_model(tokenizer, p)))

    def scratch_model(self, tokenizer: Any, p: Params) -> nn.Module:
        """The model 02 trains when no folder is named: a tiny T5 for ``tokenizer``, seeded."""
        return tiny_seq2seq(tokenizer, seed=p.seed)

    def load(
        self, run: Choice | ResolvedRun, spec: TargetSpec, train: pd.DataFrame, p: Params, choice: Mapping[str, Any]
    ) -> tuple[Any, Any, str]:
        folder = model_folder(p)
        if folder is not None:
            return *_pretrained(folder), str(folder)
        tokenizer, how = data_tokenizer([*train[p.text].astype(str), *train[p.target].astype(str)])
        print(
            f"seq2seq: a tiny T5 built from a config (random weights, a {len(tokenizer)}-token {how} tokenizer from "
            "the training rows): no pretrained seq2seq model is installed. For a pretrained one set model to its folder"
        )
        return tokenizer, self.scratch_model(tokenizer, p), f"tiny-t5-{tokenizer_identity(tokenizer)}"

    def labels(
        self, spec: TargetSpec, train: pd.DataFrame, p: Params, tokenizer: Any, model: Any, cache: Any
    ) -> np.ndarray:
        # Targets whole: a cut target teaches never finishing; padding costs decoder work on -100 positions only
        tokens = tokenize_texts(train[p.target].astype(str).tolist(), tokenizer, cache=cache)
        lengths = tokens.lengths
        width = int(min(MAX_TARGET_TOKENS, lengths.max()))
        labels = np.full((len(lengths), width), IGNORE, dtype=np.int64)
        for i in range(len(lengths)):
            row = tokens[i][:width]
            labels[i, : len(row)] = row
        cut = int(np.sum(lengths > width))
        whole = f"{cut} longer ones cut: each a guaranteed miss, 02's verdict counts them" if cut else "every one whole"
        longest = "the cap" if cut else "the longest"
        print(f"targets: {width} tokens, {whole} ({longest}; median {int(np.median(lengths))})")
        return labels

    def prepare(self, ctx: Context) -> Prepared:
        feats = ctx.feats
        model = _build_model(feats.side, ctx.seed, feats.labels, feats.run.config.adapter, ctx.hw.device_type,
                             ctx.split[0])  # fmt: skip
        return Prepared(*self.loaders(ctx), model)

    def generate_batch(self, model: nn.Module, batch: Mapping[str, torch.Tensor], *, num_beams: int) -> Any:
        """Each row's new tokens: the decoder's output after its start token."""
        model = getattr(model, "module", model)
        device = next(model.parameters()).device
        out = model.generate(  # type: ignore[operator]
            input_ids=batch["input_ids"].to(device),
            attention_mask=batch["attention_mask"].to(device),
            num_beams=num_beams,
            **gen.hf_limits(gen.limits_of(model), start=1),
        )
        return out[:, 1:]


def short_text_steps(preset: Preset, p: Params) -> dict[str, Any]:
    """A steps budget (SHORT_TEXT_BATCH, SHORT_TEXT_LR) for short texts from scratch; {} otherwise."""
    rows = _short_text_rows(p)
    if rows is None:
        return {}
    batch = min(preset.target_effective_batch, SHORT_TEXT_BATCH)
    epochs = max(preset.epochs, math.ceil(preset.epochs * SHORT_TEXT_STEPS_PER_EPOCH * batch / rows))
    every = max(gen.FULL_EVAL_EVERY, epochs // SHORT_TEXT_FULL_EVALS)
    return {"target_effective_batch": batch, "epochs": epochs, "lr": SHORT_TEXT_LR, "full_eval_every": every}


def _short_text_rows(p: Params) -> int | None:
    """train.csv's row count when its texts are short (models.seq2seq.short_texts), else None."""
    path = p.data_dir / p.train_file
    if not path.is_file():
        return None
    train = read_table(path, text=p.text, target=p.target, rule=Seq2SeqTask.target_rule)
    short, _ = short_texts([*train[p.text].astype(str), *train[p.target].astype(str)])
    return len(train) if short else None


def _pretrained(folder: Any, **kwargs: Any) -> tuple[Any, Any]:
    """(tokenizer, model) of a pretrained seq2seq model folder, its refusals (pickled weights, remote code) named."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from kitlib.models.loading import from_pretrained

    with model_refusals(folder):
        model = from_pretrained(AutoModelForSeq2SeqLM, folder, **kwargs)  # the weights' refusals before the tokenizer's
        return AutoTokenizer.from_pretrained(folder), model


def _build_model(
    side: SideInputs, seed: int, labels: np.ndarray, adapter: str = "none", device: str = "cuda",
    train_rows: np.ndarray | None = None,
) -> nn.Module:  # fmt: skip
    """The fresh model 02 trains and 03 restores (folder's, qlora 4-bit, or tiny T5) with tokenizer and limits."""
    if "model_folder" in side.state:
        tokenizer, model = _pretrained(side.state["model_folder"], **quantization(adapter, device))  # qlora: 4 bits
    else:
        tokenizer = tokenizer_from_json(side.state["tokenizer"])
        model = tiny_seq2seq(tokenizer, seed=seed)
    return gen.attach(model, tokenizer, side, labels, train_rows)
