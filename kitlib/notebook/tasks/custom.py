"""custom: your own ``nn.Module`` (``model_factory``) with kitlib's loaders, fit and inference; it runs your code."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from kitlib.data.tables import texts_to_generate
from kitlib.doctor.memory_plan import KNOWN_MODELS
from kitlib.errors import SetupError, in_setup
from kitlib.notebook.presets import PRESETS
from kitlib.notebook.tasks.base import Context, Prepared, RoughCost, Task
from kitlib.notebook.tasks.text import TextTask
from kitlib.tasks.metrics import import_object

# lazy: torch (+1.0 s): the task is picked and checked without it

if TYPE_CHECKING:
    import pandas as pd
    from torch import nn

    from kitlib.data.tables import TargetSpec
    from kitlib.notebook.presets import Preset
    from kitlib.notebook.tasks.base import Params

T = TypeVar("T")

FROM_SCRATCH_LR = 1e-3  # a module of one's own starts from random weights: the presets' lrs are for pretrained ones
FROM_SCRATCH_EPOCHS = 4  # x the preset's: the demo's BiLSTM scored 0.656 after balanced's 2 epochs


class OwnModel(Task):
    """Shared by custom and custom-seq2seq: 02 builds your module from ``model_factory`` and tries it on two rows."""

    regimes = ("finetune",)  # the module reads tokens and trains whole
    arguments = "(vocab_size, num_labels, pad_id)"  # what the factory is called with, for the errors
    positional = True  # called with the sizes in order (else by keyword)

    def check(self, p: Params) -> None:
        """A model_factory that imports (a wrong name fails in 00, not after 01's tokenizing), and no side columns."""
        if not p.model_factory:
            raise SetupError(
                f"task = {self.name!r} needs your model: set model_factory = 'file.py:function' (a file beside the "
                f"notebook, or its full path) or 'package.module:function' {in_setup('model_factory')}; the function "
                f"gets {self.arguments} and returns an nn.Module"
            )
        if p.numeric or p.categorical:
            raise SetupError(
                f"task = {self.name!r} feeds your model the tokens only (input_ids, attention_mask, labels): remove "
                "numeric and categorical from the parameters, or use task = 'tabular-text'"
            )
        factory(p.model_factory)
        super().check(p)

    def saved_state(self, tokenizer: Any, p: Params) -> dict[str, Any]:
        return {**super().saved_state(tokenizer, p), "model_factory": p.model_factory}

    def sizes(self, ctx: Context) -> dict[str, int]:
        """What the factory is called with, from the saved features."""
        feats = ctx.feats
        return {"vocab_size": feats.vocab_size, "num_labels": feats.spec.num_labels, "pad_id": feats.pad_id}

    def tried(self, model: nn.Module, ctx: Context, loader: Any, spec: str) -> None:
        """Your model on two training rows: its output has what kitlib reads, or a SetupError names the fix."""
        _check_output(model, loader, spec)

    def prepare(self, ctx: Context) -> Prepared:
        spec = ctx.feats.side.state["model_factory"]
        model = build_model(spec, self.sizes(ctx), ctx.seed, positional=self.positional)
        loaders = self.loaders(ctx)
        self.tried(model, ctx, loaders[0], spec)
        return Prepared(*loaders, model)


class CustomTask(OwnModel, TextTask):
    def __init__(self) -> None:
        super().__init__("custom", "auto")

    def target(self, column: pd.Series, p: Params, metric: str) -> TargetSpec:
        if texts_to_generate(column):
            raise SetupError(
                f"task = 'custom' trains your module to predict a class or a number, but target {column.name!r} holds "
                f"{column.nunique()} distinct texts over {len(column)} rows: texts to generate. Fix: set task = "
                "'custom-seq2seq' for your own encoder-decoder (README, 'Your own model'), or task = 'seq2seq'"
            )
        return super().target(column, p, metric)

    def preset(self, preset: Preset, p: Params) -> Preset:
        """Random weights: larger lr, x the registry's epochs (idempotent); best/ and patience guard overfitting."""
        epochs = PRESETS[preset.name].epochs if preset.name in PRESETS else preset.epochs
        if preset.row_limit is None:  # smoke stays a plumbing check
            epochs *= FROM_SCRATCH_EPOCHS
        return dataclasses.replace(
            preset, lr=FROM_SCRATCH_LR, epochs=epochs, freeze="none", freeze_layers=0, patience=preset.patience or 2
        )

    def rough_cost(self, train: pd.DataFrame, p: Params) -> RoughCost | None:
        """Rough tokens through your model's weights (built once, MiniLM's tokenizer; embeddings left out)."""
        from kitlib.models.facts import non_embedding_params

        spec = self.target(train[p.target], p, p.metric)
        vocab = KNOWN_MODELS["minilm"][1]["vocab_size"]  # the tokenizer 01 gives your model: all-MiniLM-L6-v2's
        sizes = {"vocab_size": vocab, "num_labels": spec.num_labels, "pad_id": 0}
        model = build_model(p.model_factory, sizes, p.seed, positional=self.positional)
        return RoughCost(None, non_embedding_params(model))


def build_model(spec: str, sizes: Mapping[str, int], seed: int, *, positional: bool = False) -> nn.Module:
    """The user's module from ``spec`` called with ``sizes`` under ``seed`` (RNG untouched), fp32; else a SetupError."""
    import torch

    from kitlib.models.loading import fp32_master_weights

    build = factory(spec)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = build(*sizes.values()) if positional else build(**sizes)
        except Exception as err:  # the user's code: kitlib names the parameter, the call and the fix
            call = ", ".join(f"{k}={v}" for k, v in sizes.items())
            raise SetupError(
                f"model_factory = {spec!r}: calling it with ({call}) raised {type(err).__name__}: {err}. Fix the "
                "function (it must return an nn.Module for those sizes), then re-run 02"
            ) from err
    if not isinstance(model, torch.nn.Module):
        raise SetupError(
            f"model_factory = {spec!r} returned a {type(model).__name__}, not a torch.nn.Module. Fix: return the "
            "model itself (an nn.Module subclass instance), then re-run 02"
        )
    return fp32_master_weights(model, f"model_factory {spec}")  # it may load a half-precision checkpoint


def _check_output(model: nn.Module, loader: Any, spec: str) -> None:
    """One 2-row forward: an output lacking ``.logits``/``.loss`` fails here with the fix, not inside fit."""
    out = try_on_rows(model, loader, spec, "forward(input_ids, attention_mask, labels)", lambda batch: model(**batch))
    missing = [name for name in ("logits", "loss") if getattr(out, name, None) is None]
    if missing:
        raise SetupError(
            f"model_factory = {spec!r}: the model's forward returned a {type(out).__name__} without "
            f"{' or '.join('.' + m for m in missing)} (given labels, kitlib trains on .loss and predicts from "
            ".logits). Fix: return kitlib.models.heads.HeadOutput(logits, loss) from forward, then re-run 02"
        )


def try_on_rows(model: nn.Module, loader: Any, spec: str, calls: str, run: Callable[[dict[str, Any]], T]) -> T:
    """``run(batch)`` on the loader's first two rows in eval mode, no grad (mode, RNG restored); raises a SetupError."""
    import torch

    batch = loader.collate_fn([loader.dataset[i] for i in range(min(2, len(loader.dataset)))])
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            return run(batch)
    except Exception as err:
        raise SetupError(
            f"model_factory = {spec!r}: the model's {calls} raised {type(err).__name__}: {err}. Fix it for those "
            "keyword arguments, then re-run 02"
        ) from err
    finally:
        model.train(was_training)


def factory(spec: str) -> Any:
    """The function ``spec`` names (``file.py:function`` or ``module:function``); else a SetupError with the fix."""
    found = import_object(spec, "model_factory")
    if not callable(found):
        raise SetupError(f"model_factory = {spec!r} is a {type(found).__name__}: name a function returning the model")
    return found
