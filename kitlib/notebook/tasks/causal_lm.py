"""causal-lm: SFT of a decoder-only LM on prompt -> response pairs, loss on the response only (docs/guide.md)."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from kitlib.data.featurize import tokenize_texts
from kitlib.data.loaders import make_eval_loader, make_predict_loader, make_train_loader
from kitlib.data.packing import FLASH, PackingCollator, packed_attention, packing_supported
from kitlib.errors import SetupError
from kitlib.models.adapters import quantization
from kitlib.models.bpe import tokenizer_from_json, tokenizer_identity, train_bpe_tokenizer
from kitlib.models.causal_lm import tiny_causal_lm
from kitlib.models.facts import non_embedding_params
from kitlib.models.folders import config_of, model_refusals, positions_of
from kitlib.models.loading import from_pretrained, frozen_dtype
from kitlib.notebook.tasks import generation as gen
from kitlib.notebook.tasks.base import Context, Params, Prepared, RoughCost
from kitlib.notebook.tasks.generation import IGNORE, TextGenerationTask, limits_of, model_folder

if TYPE_CHECKING:
    import pandas as pd
    from torch import nn

    from kitlib.config import Batching
    from kitlib.data.tables import TargetSpec
    from kitlib.notebook.handoff import SideInputs
    from kitlib.notebook.presets import Choice, Preset, ResolvedRun

MAX_SEQ_TOKENS = 512  # cap on prompt + response + </s> (the tiny GPT-2's positions); attention costs ~length^2


class CausalLMTask(TextGenerationTask):
    name = "causal-lm"
    num_beams = 1  # 03's decoding: greedy (short answers gain little from beams, which cost ~num_beams x)
    roles = ("prompt", "response")

    def preset(self, preset: Preset, p: Params) -> Preset:
        """Generation's preset with prompts whole up to the cap: a folder's positions (config.json alone), else 512."""
        folder = model_folder(p)
        cap = (positions_of(config_of(folder)) if folder else None) or MAX_SEQ_TOKENS
        return dataclasses.replace(super().preset(preset, p), length_coverage=1.0, max_length_cap=cap)

    def rough_cost(self, train: pd.DataFrame, p: Params) -> RoughCost | None:
        """From scratch: the rows' tokens by the BPE 01 trains through the tiny GPT-2 for it; a folder: default."""
        if model_folder(p) is not None:
            return None
        fit = functools.partial(train_bpe_tokenizer, add_eos=False)
        tokenizer, (prompts, responses) = gen.rough_tokens([train[p.text], train[p.target]], fit)
        model = tiny_causal_lm(tokenizer, seed=p.seed, n_positions=MAX_SEQ_TOKENS)
        return RoughCost(np.minimum(prompts + responses + 1, MAX_SEQ_TOKENS), non_embedding_params(model))

    def load(
        self, run: Choice | ResolvedRun, spec: TargetSpec, train: pd.DataFrame, p: Params, choice: Mapping[str, Any]
    ) -> tuple[Any, Any, str]:
        folder = model_folder(p)
        if folder is not None:  # the config alone: 01 needs the positions and the shape, not gigabytes of weights
            tokenizer, model = _folder_model(folder, weights=False)
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
        self, spec: TargetSpec, train: pd.DataFrame, p: Params, tokenizer: Any, model: Any, cache: Any
    ) -> np.ndarray:
        """Per row: -100 on the prompt, the response's tokens and </s>, -100 padding (at most the cap wide)."""
        cap = _cap(p, model)
        texts = self.prompts([str(v) for v in train[p.text]], tokenizer)
        prompts = tokenize_texts(texts, tokenizer, max_length=cap, cache=cache).lengths
        responses = _encode_responses(_responses(train, p, tokenizer), tokenizer)
        labels, report = response_labels(prompts, responses, cap)
        print(report)
        return labels

    def lengths(self, train: pd.DataFrame, p: Params, tokenizer: Any, lengths: np.ndarray) -> np.ndarray:
        """Each row's whole sequence (prompt + response + </s>): what the length must cover, not the prompt alone."""
        return np.asarray(lengths) + [len(r) for r in _encode_responses(_responses(train, p, tokenizer), tokenizer)]

    def prompts(self, texts: list[str], tokenizer: Any) -> list[str]:
        """Each prompt as at inference: through the chat template up to the assistant's turn, else as written."""
        return [render_prompt(t, tokenizer) for t in texts]

    def tune(self, run: ResolvedRun, lengths: np.ndarray, model: Any) -> ResolvedRun:
        """Batching left to 02's rule: packed rows on a CUDA device, length buckets elsewhere."""
        if run.config.batching == "bucket" and packing_supported():
            print("batching: packed rows on a CUDA device, length buckets elsewhere (02 decides where it trains)")
        return run

    def prepare(self, ctx: Context) -> Prepared:
        feats, hw, split, seed = ctx.feats, ctx.hw, ctx.split, ctx.seed
        cfg, tokens, y, pad = feats.run.config, feats.train_tokens, feats.labels, feats.pad_id

        def subset(idx: np.ndarray) -> SequenceDataset:
            rows = [sequence(tokens[int(i)], y[int(i)]) for i in idx]
            return SequenceDataset([r[0] for r in rows], [r[1] for r in rows], pad_id=pad)

        collate = SequenceCollator(pad)
        test_rows = [np.asarray(feats.test_tokens[i], np.int64) for i in range(len(feats.test_tokens))]
        test = SequenceDataset(test_rows, None, pad_id=pad)
        train = subset(split[0])
        half = frozen_dtype(cfg.precision, cfg.adapter, hw.device_type)  # loaded so: no fp32 copy on the host
        # batching "bucket" is the default: 02's rule trains packed rows on a CUDA device, so both are offered
        offered: tuple[Batching, ...] = (
            ("packed",) if cfg.batching in ("bucket", "packed") and packing_supported() else ()
        )
        attention = packed_attention(hw.device_type) if offered else "sdpa"
        model = _build_model(feats.side, seed, y, adapter=cfg.adapter, frozen_dtype=half, device=hw.device_type,
                             train_rows=split[0], attention=attention)  # fmt: skip
        cut = _cut_rows(feats.train_tokens, y, int(getattr(model, "kitlib_tokenizer").eos_token_id))  # noqa: B009
        packs = PackingCollator(None, pad) if attention == FLASH else collate  # flash varlen: one row a batch

        def loader(batching: Batching) -> Any:
            chosen = dataclasses.replace(cfg, batching=batching)
            together = packs if batching == "packed" else collate
            return make_train_loader(train, chosen, hw, collate=together, lengths=train.lengths, seed=seed)

        return Prepared(
            loader(cfg.batching),
            make_eval_loader(subset(split[1]), cfg, hw, collate=collate),
            make_predict_loader(test, cfg, hw, collate=collate),
            model,
            notes=(f"warning: {cut} of {len(y)} training examples were longer than max_length {y.shape[1]} and "
                   "were cut (01 said which part); raise max_length up to the model's positions",) if cut else (),
            choices={b: loader(b) for b in offered if b != cfg.batching},
        )  # fmt: skip

    def generate_batch(self, model: nn.Module, batch: Mapping[str, torch.Tensor], *, num_beams: int) -> Any:
        return generate(model, prompts_of(batch), num_beams=num_beams)


def response_labels(
    prompt_lengths: Sequence[int] | np.ndarray, responses: Sequence[Sequence[int]], cap: int
) -> tuple[np.ndarray, str]:
    """(labels, note): -100 on the prompt, the response + </s>, -100 padding, at most ``cap`` wide (long ones cut)."""
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
    """(input_ids, labels) of one row: the last prompt tokens the label row leaves room for, then the response."""
    labels = np.asarray(labels)
    scored = np.flatnonzero(labels != IGNORE)
    room = int(scored[0]) if len(scored) else len(labels)
    prompt = np.asarray(prompt, dtype=np.int64)
    prompt = prompt[max(0, len(prompt) - room) :]
    response = labels[scored]
    return np.concatenate([prompt, response]), np.concatenate([np.full(len(prompt), IGNORE), response])


def conversation(text: str) -> list[dict[str, Any]]:
    """A prompt cell as chat turns: the JSON turns read from a JSONL ``messages`` list, else one user turn."""
    if text.startswith("[{"):
        try:
            turns = json.loads(text)
        except ValueError:
            turns = None
        if isinstance(turns, list) and all(isinstance(t, dict) and "role" in t for t in turns):
            return turns
    return [{"role": "user", "content": text}]


def render_prompt(text: str, tokenizer: Any) -> str:
    turns = conversation(text)
    if not getattr(tokenizer, "chat_template", None):
        return text if turns[0].get("content") == text else "\n\n".join(str(t["content"]) for t in turns)
    rendered = str(tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True))
    bos = tokenizer.bos_token  # the tokenizer adds its BOS itself: a template that writes it too would double it
    adds_bos = bos is not None and tokenizer("")["input_ids"][:1] == [tokenizer.bos_token_id]
    return rendered[len(bos) :] if adds_bos and rendered.startswith(bos) else rendered


def _responses(train: pd.DataFrame, p: Params, tokenizer: Any) -> list[str]:
    """Each reply as the chat template writes the assistant's turn, up to its end-of-turn."""
    replies = [str(v) for v in train[p.target]]
    if not getattr(tokenizer, "chat_template", None):
        return replies
    out = []
    for prompt, reply in zip(train[p.text], replies, strict=True):
        turns = conversation(str(prompt))
        before = str(tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True))
        full = str(tokenizer.apply_chat_template([*turns, {"role": "assistant", "content": reply}], tokenize=False))
        if not full.startswith(before):
            raise SetupError(
                "the tokenizer's chat template writes the conversation differently once the reply is added, so the "
                "prompt's tokens are not a prefix of the example. Fix: set model to a folder whose chat_template "
                "renders add_generation_prompt as the start of the assistant's turn"
            )
        out.append(full[len(before) :].split(tokenizer.eos_token)[0])
    return out


def _chat_eos(tokenizer: Any) -> None:
    """Make the template's end-of-turn token (<|eot_id|>, <|im_end|>) the tokenizer's eos: where replies end."""
    if not getattr(tokenizer, "chat_template", None):
        return
    probe = "kitlib-probe-reply"
    text = str(tokenizer.apply_chat_template([{"role": "user", "content": "q"}, {"role": "assistant",
                                              "content": probe}], tokenize=False))  # fmt: skip
    after = text[text.rindex(probe) + len(probe) :]
    found = sorted((after.index(t), t) for t in tokenizer.all_special_tokens if t and t in after)
    if found:
        tokenizer.eos_token = found[0][1]


def _cut_rows(prompts: Any, labels: np.ndarray, end: int) -> int:
    """Rows whose prompt lost its start, or whose response lost its end (``end``, </s>, not last), to the width."""
    cut = 0
    for i, row in enumerate(labels):
        scored = np.flatnonzero(row != IGNORE)
        cut += bool(len(scored)) and (len(prompts[i]) > scored[0] or row[scored[-1]] != end)
    return cut


def _encode_responses(responses: list[str], tokenizer: Any) -> list[list[int]]:
    eos = tokenizer.eos_token_id
    if eos is None:
        raise SetupError(f"the tokenizer ({type(tokenizer).__name__}) has no eos token: a response could never end")
    ids = tokenizer(responses, add_special_tokens=False, return_attention_mask=False)["input_ids"]
    return [[*row, eos] for row in ids]


class SequenceDataset(Dataset[Any]):
    """Rows of input ids with token labels (or ids alone); ``lengths`` for the length-aware samplers."""

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
    """Right-pad a batch to its longest row (pad id, mask, labels -100); a class so spawned workers can pickle it."""

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


def _folder_model(
    folder: str,
    adapter: str = "none",
    device: str = "cuda",
    *,
    frozen_dtype: torch.dtype | None = None,
    weights: bool = True,
) -> tuple[Any, Any]:
    """The folder's tokenizer and model (fp32 or ``frozen_dtype``); ``weights=False``: on the meta device."""
    with model_refusals(folder):  # a pickled .bin or remote code: kitlib's error naming the fix
        tokenizer = AutoTokenizer.from_pretrained(folder)
        _chat_eos(tokenizer)
        if weights:  # qlora: 4-bit weights
            model = from_pretrained(
                AutoModelForCausalLM, folder, frozen_dtype=frozen_dtype, **quantization(adapter, device)
            )
        else:
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    if tokenizer.pad_token is None:  # GPT-2 and Llama ship none: pad with </s> (masked, and -100 in the labels)
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer, model


def _cap(p: Params, model: nn.Module) -> int:
    """Most tokens a sequence may have: max_length within the model's positions, else the positions."""
    positions = _positions(model) or MAX_SEQ_TOKENS
    return min(p.max_length, positions) if p.max_length else positions


def _positions(model: nn.Module) -> int | None:
    """The most tokens the model has positions for (None: no limit stated)."""
    config = getattr(model, "config", None)
    return None if config is None else positions_of(config.to_dict())


def _build_model(
    side: SideInputs,
    seed: int,
    labels: np.ndarray,
    adapter: str = "none",
    frozen_dtype: torch.dtype | None = None,
    device: str = "cuda",
    train_rows: np.ndarray | None = None,
    attention: str = "sdpa",
) -> nn.Module:
    """The fresh model 02 trains and 03 restores (folder's, qlora 4-bit, or tiny GPT-2) with tokenizer and limits."""
    if "model_folder" in side.state:
        tokenizer, model = _folder_model(side.state["model_folder"], adapter, device, frozen_dtype=frozen_dtype)
    else:
        tokenizer = tokenizer_from_json(side.state["tokenizer"])
        model = tiny_causal_lm(tokenizer, seed=seed, n_positions=MAX_SEQ_TOKENS)
    if attention != "sdpa":  # transformers' default where torch has SDPA
        model.set_attn_implementation(attention)
    # No cache: it turns off transformers' packed-row mask (rows would attend across); generate() asks for one
    model.config.use_cache = False
    return gen.attach(model, tokenizer, side, labels, train_rows)


def generate(model: nn.Module, prompts: list[np.ndarray], *, num_beams: int = 1) -> torch.Tensor:
    """Response tokens per prompt within the model's limits; prompts left-padded so new tokens share a column."""
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
        use_cache=True,
        pad_token_id=pad,
        eos_token_id=tokenizer.eos_token_id,
        **gen.hf_limits(limits, start=width),
    )
    return out[:, width:]
