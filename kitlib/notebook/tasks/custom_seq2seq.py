"""custom-seq2seq: your own encoder-decoder (``model_factory``) with seq2seq's pipeline (docs/guide.md)."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kitlib.errors import SetupError
from kitlib.models.bpe import tokenizer_from_json, tokenizer_identity
from kitlib.models.seq2seq import data_tokenizer
from kitlib.notebook.tasks.custom import OwnModel, build_model, try_on_rows
from kitlib.notebook.tasks.generation import NoLoops, limits_of, target_limits
from kitlib.notebook.tasks.seq2seq import Seq2SeqTask

# lazy: torch (+1.0 s): the task is picked and checked without it

if TYPE_CHECKING:
    import pandas as pd
    import torch
    from torch import nn

    from kitlib.data.tables import TargetSpec
    from kitlib.notebook.presets import Choice, Preset, ResolvedRun
    from kitlib.notebook.tasks.base import Context, Params

ARGUMENTS = "(vocab_size, pad_id, eos_id) by keyword"  # what the factory is called with, for the errors
OPTIONS = ("num_beams", "min_new_tokens", "no_repeat_ngram_size", "max_copies", "logits_processor")
FROM_SCRATCH_BATCH = 16  # rows per step at most: a decoder from scratch needs updates (balanced: 360 steps, not 180)


class CustomSeq2SeqTask(OwnModel, Seq2SeqTask):
    name, arguments, positional = "custom-seq2seq", ARGUMENTS, False
    lr_from_scratch, epochs_from_scratch = 3e-3, 5  # random weights always (docs/measurements.md; balanced: 10)

    def from_scratch(self, p: Params) -> bool:
        return True

    def preset(self, preset: Preset, p: Params) -> Preset:
        """seq2seq's from-scratch preset with at most FROM_SCRATCH_BATCH rows a step (smoke: its lr only)."""
        fitted = super().preset(preset, p)
        if preset.row_limit is not None:
            return dataclasses.replace(fitted, lr=self.lr_from_scratch)
        return dataclasses.replace(
            fitted, target_effective_batch=min(fitted.target_effective_batch, FROM_SCRATCH_BATCH)
        )

    def scratch_model(self, tokenizer: Any, p: Params) -> nn.Module:
        """Your model, as 02 builds it for ``tokenizer``."""
        return build_model(p.model_factory, _sizes(tokenizer), p.seed)

    def load(
        self, run: Choice | ResolvedRun, spec: TargetSpec, train: pd.DataFrame, p: Params, choice: Mapping[str, Any]
    ) -> tuple[Any, Any, str]:
        """The tokenizer only (02 builds your model): bytes for short texts, else a BPE trained on the rows."""
        tokenizer, how = data_tokenizer([*train[p.text].astype(str), *train[p.target].astype(str)])
        print(f"{self.name}: your model ({p.model_factory}) on a {len(tokenizer)}-token {how} tokenizer")
        return tokenizer, None, f"custom-{tokenizer_identity(tokenizer)}"

    def saved_state(self, tokenizer: Any, p: Params) -> dict[str, Any]:
        return {"tokenizer": tokenizer.backend_tokenizer.to_str(), "model_factory": p.model_factory}

    def sizes(self, ctx: Context) -> dict[str, int]:
        return _sizes(tokenizer_from_json(ctx.feats.side.state["tokenizer"]))

    def tried(self, model: nn.Module, ctx: Context, loader: Any, spec: str) -> None:
        tokenizer = tokenizer_from_json(ctx.feats.side.state["tokenizer"])
        # plain attributes: not weights, not in the checkpoint
        setattr(model, "kitlib_tokenizer", tokenizer)  # noqa: B010
        setattr(model, "kitlib_limits", target_limits(ctx.feats.labels, tokenizer, ctx.split[0]))  # noqa: B010
        _check_model(model, loader, spec)

    def generate_batch(self, model: nn.Module, batch: Mapping[str, torch.Tensor], *, num_beams: int) -> Any:
        model = getattr(model, "module", model)
        limits = limits_of(model)
        wanted = {"num_beams": num_beams, **dataclasses.asdict(limits), "logits_processor": NoLoops(limits, start=0)}
        device = next(model.parameters()).device
        return model.generate(  # type: ignore[operator]
            input_ids=batch["input_ids"].to(device),
            attention_mask=batch["attention_mask"].to(device),
            max_new_tokens=limits.max_new_tokens,
            **{name: wanted[name] for name in OPTIONS if name in _options(model)},
        )

    def beams(self, model: nn.Module) -> int:
        return self.num_beams if "num_beams" in _options(getattr(model, "module", model)) else 1

    def decoding(self, model: nn.Module) -> str:
        if "num_beams" in _options(getattr(model, "module", model)):
            return super().decoding(model)
        return "your model's own decoding: its generate takes no num_beams"


def _sizes(tokenizer: Any) -> dict[str, int]:
    """What your factory is called with (ARGUMENTS)."""
    return {"vocab_size": len(tokenizer), "pad_id": tokenizer.pad_token_id, "eos_id": tokenizer.eos_token_id}


def _options(model: nn.Module) -> set[str]:
    """The OPTIONS the model's generate names as parameters (a **kwargs catch-all does not count: it may drop them)."""
    parameters = inspect.signature(getattr(model, "generate")).parameters  # noqa: B009
    return {name for name in OPTIONS if name in parameters}


def _check_model(model: nn.Module, loader: Any, spec: str) -> None:
    """A 2-row forward with labels and a 2-token generate: a model lacking ``.loss``/``generate`` fails here."""
    import torch

    if not callable(getattr(model, "generate", None)):
        raise SetupError(
            f"model_factory = {spec!r}: the model has no generate method. Fix: give it generate(input_ids, "
            "attention_mask, max_new_tokens, ...) returning the new token ids [rows, tokens], then re-run 02"
        )

    def run(batch: dict[str, Any]) -> tuple[Any, Any, int]:
        out = model(**batch)
        generated = model.generate(  # type: ignore[operator]
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=2
        )
        return out, generated, len(batch["input_ids"])

    calls = "forward(input_ids, attention_mask, labels) or generate(input_ids, attention_mask, max_new_tokens)"
    out, generated, rows = try_on_rows(model, loader, spec, calls, run)
    if getattr(out, "loss", None) is None:
        raise SetupError(
            f"model_factory = {spec!r}: the model's forward returned a {type(out).__name__} without .loss (given "
            "labels, kitlib trains on it). Fix: return an object with .loss (kitlib.models.heads.HeadOutput(logits, "
            "loss) will do), then re-run 02"
        )
    if not isinstance(generated, torch.Tensor) or generated.ndim != 2 or len(generated) != rows:
        shape = tuple(generated.shape) if isinstance(generated, torch.Tensor) else type(generated).__name__
        raise SetupError(
            f"model_factory = {spec!r}: generate returned {shape} for {rows} rows. Fix: return a LongTensor "
            "[rows, new tokens] of token ids, then re-run 02"
        )
