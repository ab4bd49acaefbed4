"""custom: your own ``nn.Module`` on the text's tokens, with kitlib's loaders, fit, checkpoints and inference.

    task = "custom"; model_factory = "bilstm.py:build"      # 00's parameters (a file in data_dir, or module:function)

    def build(vocab_size: int, num_labels: int, pad_id: int) -> nn.Module: ...
        # forward(input_ids, attention_mask, labels=None) -> an object with .logits [batch, num_labels] and, given
        # labels, .loss (your loss: kitlib.models.heads.HeadOutput(logits, loss) will do)

The target is read as for ``auto`` (``num_labels`` is 1 for a number); 03 reads ``.logits`` as for the built-in
models. Weights are initialised under the run's seed (torch.manual_seed), so two runs build the same model.
A factory named ``file.py:function`` is loaded from data_dir (a Kaggle dataset can carry it), else from the
notebook's folder; ``package.module:function`` is imported. Either way it runs your code: name only code you trust.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kitlib.errors import SetupError
from kitlib.notebook.tasks.text import TextTask

if TYPE_CHECKING:
    import numpy as np
    from torch import nn

    from kitlib.machine.hardware import HardwareInfo
    from kitlib.notebook.handoff import Features
    from kitlib.notebook.presets import Preset
    from kitlib.notebook.regimes import Prepared
    from kitlib.notebook.tasks.base import Params

FROM_SCRATCH_LR = 1e-3  # a module of one's own starts from random weights: the presets' lrs are for pretrained ones
FROM_SCRATCH_EPOCHS = 4  # x the preset's: the demo's BiLSTM scored 0.656 after balanced's 2 epochs


class CustomTask(TextTask):
    regimes = ("finetune",)  # the module reads tokens and trains whole

    def __init__(self) -> None:
        super().__init__("custom", "auto")

    def check(self, p: Params) -> None:
        if not p.model_factory:
            raise SetupError(
                "task = 'custom' needs your model: set model_factory = 'file.py:function' (a file in data_dir) or "
                "'package.module:function' in 00_setup's parameters cell; the function gets (vocab_size, num_labels, "
                "pad_id) and returns an nn.Module"
            )
        if p.numeric or p.categorical:
            raise SetupError(
                "task = 'custom' feeds your model the tokens only (input_ids, attention_mask, labels): remove numeric "
                "and categorical from the parameters, or use task = 'tabular-text'"
            )
        factory(p.model_factory, p.data_dir)  # imports now: a wrong name fails in 00, not after 01's tokenizing

    def preset(self, preset: Preset, p: Params) -> Preset:
        """Random weights: a larger lr and more epochs than the presets' pretrained numbers (best/ and patience keep
        the run from overfitting); x the registry's epochs, so applying it twice changes nothing."""
        from kitlib.notebook.presets import PRESETS

        epochs = PRESETS[preset.name].epochs if preset.name in PRESETS else preset.epochs
        if preset.row_limit is None:  # smoke stays a plumbing check
            epochs *= FROM_SCRATCH_EPOCHS
        return dataclasses.replace(
            preset, lr=FROM_SCRATCH_LR, epochs=epochs, freeze="none", freeze_layers=0, patience=preset.patience or 2
        )

    def prepare(
        self,
        feats: Features,
        hw: HardwareInfo,
        split: tuple[np.ndarray, np.ndarray],
        seed: int,
        choice: Mapping[str, Any],
    ) -> Prepared:
        import torch

        from kitlib.notebook.regimes import FINETUNE, Prepared

        state = feats.side.state
        build = factory(state["model_factory"], Path(state["data_dir"]))
        from kitlib.models.loading import fp32_master_weights

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model: nn.Module = build(feats.vocab_size, feats.task.num_labels, feats.pad_id)
        model = fp32_master_weights(model, f"model_factory {state['model_factory']}")  # it may load a half checkpoint
        return Prepared(*FINETUNE.loaders(feats, hw, split, seed), model)

    def saved_state(self, tokenizer: Any, p: Params) -> dict[str, Any]:
        return {"model_factory": p.model_factory, "data_dir": str(p.data_dir)}


def factory(spec: str, data_dir: Path | None) -> Any:
    """The function ``spec`` names: ``file.py:function`` from data_dir (else the working folder), or an importable
    ``module:function``; a SetupError naming the fix otherwise."""
    from kitlib.tasks.metrics import import_object

    where, _, name = spec.partition(":")
    if not where.endswith(".py"):
        found = import_object(spec, "model_factory")
    else:
        candidates = [d / where for d in (data_dir, Path.cwd()) if d is not None]
        path = next((c for c in candidates if c.is_file()), None)
        if path is None:
            raise SetupError(
                f"model_factory = {spec!r}: no {where} in {[str(c.parent) for c in candidates]}. Fix: put the file "
                "in data_dir (or beside the notebooks), or name an importable module:function"
            )
        module_spec = importlib.util.spec_from_file_location(f"kitlib_user_{path.stem}", path)
        if module_spec is None or module_spec.loader is None:
            raise SetupError(f"model_factory = {spec!r}: {path} is not a Python module")
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except Exception as err:
            raise SetupError(f"model_factory = {spec!r}: {path} failed to load: {type(err).__name__}: {err}") from err
        found = getattr(module, name, None)
    if not callable(found):
        raise SetupError(f"model_factory = {spec!r}: {name!r} is not a function of {where}")
    return found
