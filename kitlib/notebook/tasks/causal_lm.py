"""causal-lm: supervised fine-tuning of a decoder-only LM on prompt -> response pairs.

    task = "causal-lm"; text = "prompt"; target = "response"; metric = "exact_match"   # 00's parameters

- Model: a causal LM folder (``model`` = a local gpt2 or a small Llama, say; AutoModelForCausalLM and its tokenizer),
  else a tiny GPT-2 built from a config (kitlib.models.causal_lm) with a byte-level BPE tokenizer trained on the
  training rows (kitlib.models.bpe, shared with seq2seq). Announced in 01's output.
- One sequence per row: the prompt's tokens (as the tokenizer encodes a text), the response's (no special tokens),
  then </s>. Labels are -100 (ignored by the loss) on the prompt and on padding: the loss is on the response and its
  </s> only. The model shifts labels by one itself, and fit counts the scored tokens the same way
  (kitlib.engine.objective.default_count_fn), so accumulation weights rows by their response tokens.
- Length: the longest prompt + response + </s> of the training rows, capped at MAX_SEQ_TOKENS or the model's
  positions if fewer (01 prints what it covers). A longer row keeps its whole response (up to half the cap when the
  prompt is long too) and the end of its prompt: the tokenizer truncates prompts from the left, so the words next to
  the response survive.
- Batches: kitlib's bucket sampler groups rows of similar length (make_train_loader, the rows' whole lengths),
  padded on the right to the batch's longest; generation re-pads prompts on the left, as a decoder-only LM needs.
- Full evaluation (kitlib.notebook.tasks.generation): greedy generation of every validation response and the
  metric (``exact_match`` by default), scored by fit in the background (generation itself before the callable, on
  the training device). Between full evals: fit's loss pass only.
- Generation keeps within the training responses' lengths and repeats no run of tokens they never repeat (the prompt
  aside: copying a span of it is no loop); a blank output is written as the most common response.
- 03 generates each test prompt's response (``num_beams``: 1 = greedy); several runs vote per row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import Dataset

from kitlib.data.featurize import tokenize_texts
from kitlib.data.loaders import make_eval_loader, make_predict_loader, make_train_loader
from kitlib.data.tables import DataError, TaskSpec
from kitlib.errors import SetupError
from kitlib.models.adapters import quantization
from kitlib.models.bpe import tokenizer_from_json, tokenizer_identity, train_bpe_tokenizer
from kitlib.models.causal_lm import tiny_causal_lm
from kitlib.models.loading import from_pretrained, model_refusals
from kitlib.notebook.regimes import Prepared
from kitlib.notebook.tasks.base import Params, SideInputs
from kitlib.notebook.tasks.generation import (
    IGNORE,
    TextGenerationTask,
    hf_limits,
    limits_of,
    model_folder,
    target_limits,
)

# lazy: transformers (+0.6 s): only loading a pretrained model needs it (python -X importtime).

if TYPE_CHECKING:
    import pandas as pd
    from torch import nn

    from kitlib.machine.hardware import HardwareInfo
    from kitlib.notebook.handoff import Features
    from kitlib.notebook.presets import Preset, ResolvedRun

MAX_SEQ_TOKENS = 512  # cap on prompt + response + </s> (the tiny GPT-2's positions); attention costs ~length^2
FROM_SCRATCH_LR = 1e-3  # a tiny GPT-2 from random weights: the presets' 3e-5 to 1e-4 are for pretrained weights
# x the preset's epochs: nothing is pretrained, every pattern comes from the rows. 5, not seq2seq's 10, to keep
# balanced within ~8 min on a 2-core CPU: on the SFT demo (1,800 training rows) its 10 epochs took 13 s each on idle
# cores, 40-110 s with other jobs on them (8.4 min for the four notebooks); exact match 0.355 after 5, 0.435 after 10
# on validation, still rising (test 0.450 vs 0.185 for the most common response).
FROM_SCRATCH_EPOCHS = 5
FULL_EVAL_EVERY = 5  # epochs between generate-and-score evals; loss-only in between


class CausalLMTask(TextGenerationTask):
    name = "causal-lm"
    target_rule = "classify"  # read_table: the responses as written (a mix of words and numbers is not an error)
    num_beams = 1  # 03's decoding: greedy (short answers gain little from beams, which cost ~num_beams x)

    def __init__(self, name: str = "causal-lm") -> None:
        self.name = name

    # ---------------------------------------------------------------------------------------------------- 00 setup
    def check(self, p: Params) -> None:
        if p.text == p.target:
            raise SetupError(
                f"task = 'causal-lm' needs a prompt column and a response column, but text and target both name "
                f"{p.text!r}. Fix: text = the prompt column, target = the response column in 00_setup's parameters"
            )

    def target(self, column: pd.Series, p: Params, metric: str) -> TaskSpec:
        blank = column.map(lambda v: v is None or (isinstance(v, float) and np.isnan(v)) or str(v).strip() == "")
        if blank.any():
            first = blank.idxmax()
            raise DataError(
                f"target column {column.name!r} holds {column[first]!r} at row {first} ({int(blank.sum())} blank in "
                "all): causal-lm learns to generate the response, so every response must be a non-empty text. Fix: "
                "drop or fill those rows, or check target"
            )
        return TaskSpec("sequence", 0)

    def preset(self, preset: Preset, p: Params) -> Preset:
        """Every prompt whole up to the cap (01 fits the sequence length itself), all weights trained; from scratch
        (no model folder) a tiny GPT-2 needs a far larger lr and more epochs than the presets' pretrained numbers;
        generation is scored every FULL_EVAL_EVERY epochs, the loss in between."""
        changes: dict[str, Any] = {"freeze": "none", "length_coverage": 1.0, "max_length_cap": MAX_SEQ_TOKENS}
        if preset.row_limit is not None:  # smoke: the plumbing, in seconds
            return dataclasses.replace(preset, **changes, full_eval_every=0)
        changes["full_eval_every"] = FULL_EVAL_EVERY
        if model_folder(p) is None:  # applied once (stages.task_preset), so the preset's own epochs are multiplied
            changes |= {"lr": FROM_SCRATCH_LR, "epochs": preset.epochs * FROM_SCRATCH_EPOCHS}
        return dataclasses.replace(preset, **changes)

    # ------------------------------------------------------------------------------------------------- 01 features
    def load(
        self, run: ResolvedRun, spec: TaskSpec, train: pd.DataFrame, p: Params, choice: Mapping[str, Any]
    ) -> tuple[Any, Any, str]:
        folder = model_folder(p)
        if folder is not None:
            tokenizer, model = _folder_model(folder)
            identity = str(folder)
        else:
            tokenizer = train_bpe_tokenizer([*map(str, train[p.text]), *map(str, train[p.target])], add_eos=False)
            model = tiny_causal_lm(tokenizer, seed=p.seed, n_positions=MAX_SEQ_TOKENS)
            identity = f"tiny-gpt2-{tokenizer_identity(tokenizer)}"
            weights = sum(w.numel() for w in model.parameters()) / 1e6
            print(
                f"causal-lm: a tiny GPT-2 built from a config ({weights:.1f} M random weights, {len(tokenizer)}-token "
                "byte-level BPE trained on the training rows): no pretrained causal LM is named. For a pretrained one "
                "set model to its folder"
            )
        tokenizer.truncation_side = "left"  # a prompt over the cap keeps its end: the words next to the response
        return tokenizer, model, identity

    def labels(
        self, spec: TaskSpec, train: pd.DataFrame, p: Params, tokenizer: Any, model: Any, cache: Any
    ) -> np.ndarray:
        """Per row, the sequence's labels: -100 on the prompt, the response's tokens and </s>, -100 padding, as wide
        as the longest sequence (at most MAX_SEQ_TOKENS, or the model's positions when fewer). 02 rebuilds the
        inputs from them and the prompt tokens."""
        cap = min(MAX_SEQ_TOKENS, _positions(model) or MAX_SEQ_TOKENS)
        prompts = tokenize_texts([str(v) for v in train[p.text]], tokenizer, max_length=cap, cache=cache).lengths
        responses = _encode_responses([str(v) for v in train[p.target]], tokenizer)
        labels, report = response_labels(prompts, responses, cap)
        print(report)
        return labels

    # ---------------------------------------------------------------------------------------------------- 02 train
    def prepare(
        self,
        feats: Features,
        hw: HardwareInfo,
        split: tuple[np.ndarray, np.ndarray],
        seed: int,
        choice: Mapping[str, Any],
    ) -> Prepared:
        cfg, tokens, y, pad = feats.run.config, feats.train_tokens, feats.labels, feats.pad_id

        def subset(idx: np.ndarray) -> SequenceDataset:
            rows = [sequence(tokens[int(i)], y[int(i)]) for i in idx]
            return SequenceDataset([r[0] for r in rows], [r[1] for r in rows], pad_id=pad)

        collate = SequenceCollator(pad)
        test_rows = [np.asarray(feats.test_tokens[i], np.int64) for i in range(len(feats.test_tokens))]
        test = SequenceDataset(test_rows, None, pad_id=pad)
        train = subset(split[0])
        return Prepared(
            make_train_loader(train, cfg, hw, collate=collate, lengths=train.lengths, seed=seed),  # bucketed
            make_eval_loader(subset(split[1]), cfg, hw, collate=collate),
            make_predict_loader(test, cfg, hw, collate=collate),
            _build_model(feats.side, seed, y, adapter=feats.run.config.adapter, train_rows=split[0]),
        )

    def generate_batch(self, model: nn.Module, batch: Mapping[str, torch.Tensor], *, num_beams: int) -> Any:
        return generate(model, prompts_of(batch), num_beams=num_beams)


def response_labels(
    prompt_lengths: Sequence[int] | np.ndarray, responses: Sequence[Sequence[int]], cap: int
) -> tuple[np.ndarray, str]:
    """(labels, a line saying what they cover): per row -100 on the prompt's positions, then the response's tokens
    (</s> included), then -100, as wide as the longest prompt + response (at most ``cap``). A row over the cap keeps
    its response whole when it fits in the cap minus its prompt or half the cap, and as much of the end of its
    prompt as fits; a response longer than that is cut (it loses its </s>)."""
    prompt_lengths = np.asarray(prompt_lengths, dtype=np.int64)
    response_lengths = np.array([len(r) for r in responses], dtype=np.int64)
    total = prompt_lengths + response_lengths
    width = int(min(cap, total.max()))
    labels = np.full((len(total), width), IGNORE, dtype=np.int64)
    cut_prompts = cut_responses = 0
    for i, (n_prompt, response) in enumerate(zip(prompt_lengths, responses, strict=True)):
        kept = min(len(response), width - min(int(n_prompt), width // 2))
        start = min(int(n_prompt), width - kept)
        labels[i, start : start + kept] = response[:kept]
        cut_prompts += start < n_prompt
        cut_responses += kept < len(response)
    cuts = [f"{n} {what}" for n, what in ((cut_prompts, "prompts lose their start"), (cut_responses,
            "responses are cut")) if n]  # fmt: skip
    note = f", capped at {cap}: {' and '.join(cuts)}" if cuts else ""
    report = (
        f"sequences: {width} tokens, prompt + response + </s> (the longest{note}; median {int(np.median(total))}); "
        f"responses: up to {int(response_lengths.max())} tokens (median {int(np.median(response_lengths))}), "
        "the only ones the loss counts"
    )
    return labels, report


def sequence(prompt: Sequence[int] | np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, labels) of one row from its prompt tokens and its saved label row: the last prompt tokens the
    label row leaves room for, then the response; labels -100 on that prompt."""
    labels = np.asarray(labels)
    scored = np.flatnonzero(labels != IGNORE)
    room = int(scored[0]) if len(scored) else len(labels)
    prompt = np.asarray(prompt, dtype=np.int64)
    prompt = prompt[max(0, len(prompt) - room) :]
    response = labels[scored]
    return np.concatenate([prompt, response]), np.concatenate([np.full(len(prompt), IGNORE), response])


def _encode_responses(responses: list[str], tokenizer: Any) -> list[list[int]]:
    eos = tokenizer.eos_token_id
    if eos is None:
        raise SetupError(f"the tokenizer ({type(tokenizer).__name__}) has no eos token: a response could never end")
    ids = tokenizer(responses, add_special_tokens=False, return_attention_mask=False)["input_ids"]
    return [[*row, eos] for row in ids]


class SequenceDataset(Dataset[Any]):
    """Rows of input ids with their token labels (or ids alone, for prediction); ``lengths`` for the bucket
    sampler and the length-sorted eval loaders."""

    def __init__(self, ids: list[np.ndarray], labels: list[np.ndarray] | None, *, pad_id: int) -> None:
        self.ids, self.labels, self.pad_id = ids, labels, pad_id

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(row) for row in self.ids], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> Any:
        return (self.ids[index], None if self.labels is None else self.labels[index])


class SequenceCollator:
    """Pad a batch on the right to its longest row: input_ids (pad id), attention_mask, labels (-100). A class, not a
    closure, so spawned workers can pickle it."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, items: Sequence[tuple[np.ndarray, np.ndarray | None]]) -> dict[str, torch.Tensor]:
        width = max(1, max(len(ids) for ids, _ in items))
        ids = np.full((len(items), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(items), width), dtype=np.int64)
        labels = np.full((len(items), width), IGNORE, dtype=np.int64)
        for i, (row, row_labels) in enumerate(items):
            ids[i, : len(row)], mask[i, : len(row)] = row, 1
            if row_labels is not None:
                labels[i, : len(row_labels)] = row_labels
        batch = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
        if any(row_labels is not None for _, row_labels in items):
            batch["labels"] = torch.from_numpy(labels)
        return batch


def prompts_of(batch: Mapping[str, torch.Tensor]) -> list[np.ndarray]:
    """Each row's prompt tokens: its real (unmasked) tokens, without the response when the batch carries labels."""
    ids, mask = batch["input_ids"].cpu().numpy(), batch["attention_mask"].cpu().numpy().astype(bool)
    if "labels" in batch:
        mask &= batch["labels"].cpu().numpy() == IGNORE
    return [row[keep] for row, keep in zip(ids, mask, strict=True)]


# ------------------------------------------------------------------------------------------------------ the model
def _folder_model(folder: str, adapter: str = "none") -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with model_refusals(folder):  # a pickled .bin or remote code: kitlib's error naming the fix
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = from_pretrained(AutoModelForCausalLM, folder, **quantization(adapter))  # qlora: 4-bit weights
    if tokenizer.pad_token is None:  # GPT-2 and Llama ship none: pad with </s> (masked, and -100 in the labels)
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer, model


def _positions(model: nn.Module) -> int | None:
    """The most tokens the model has positions for (None: no limit stated)."""
    config = getattr(model, "config", None)
    limit = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
    return int(limit) if limit else None


def _build_model(
    side: SideInputs, seed: int, labels: np.ndarray, adapter: str = "none", train_rows: np.ndarray | None = None
) -> nn.Module:
    """The freshly initialised model 02 trains and 03 restores: the folder's (in 4 bits for ``adapter`` qlora), or
    the tiny GPT-2 for the saved tokenizer; it carries its tokenizer (``kitlib_tokenizer``) and the generation limits
    its training responses set (``labels``: -100 on the prompt, the response and </s>)."""
    if "model_folder" in side.state:
        tokenizer, model = _folder_model(side.state["model_folder"], adapter)
    else:
        tokenizer = tokenizer_from_json(side.state["tokenizer"])
        model = tiny_causal_lm(tokenizer, seed=seed, n_positions=MAX_SEQ_TOKENS)
    model.kitlib_tokenizer = tokenizer  # plain attributes: not weights, not in the checkpoint
    model.kitlib_limits = target_limits(labels, tokenizer, train_rows)  # fallback: 02 baseline's rows
    return model


def generate(model: nn.Module, prompts: list[np.ndarray], *, num_beams: int = 1) -> torch.Tensor:
    """The response tokens generated for each prompt (on the model's device), within the model's limits
    (``kitlib_limits``: the training responses' lengths and repetition): prompts padded on the left, so every row's
    new tokens start at the same column."""
    model = getattr(model, "module", model)
    tokenizer = getattr(model, "kitlib_tokenizer")  # noqa: B009
    limits = limits_of(model)
    limit = _positions(model)
    room = max(1, limit - limits.max_new_tokens) if limit else None
    prompts = [p[-room:] if room and len(p) > room else p for p in prompts]  # keep the end: the words before it
    width = max(1, max(len(p) for p in prompts))
    pad = tokenizer.pad_token_id
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, prompt in enumerate(prompts):
        if len(prompt):
            ids[i, width - len(prompt) :] = torch.as_tensor(prompt, dtype=torch.long)
            mask[i, width - len(prompt) :] = 1
    device = next(model.parameters()).device
    out = model.generate(  # type: ignore[operator]
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        num_beams=num_beams,
        do_sample=False,
        pad_token_id=pad,
        eos_token_id=tokenizer.eos_token_id,
        **hf_limits(limits, start=width),
    )
    return out[:, width:]
