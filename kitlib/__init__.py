"""kitlib: fast, painless model training in Kaggle/Colab/Jupyter notebooks. Importing it does no work (no
hardware probe, no torch): public names resolve lazily on first use (PEP 562)."""

from __future__ import annotations

import importlib
from typing import Any

from kitlib._version import __version__

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "detect": "kitlib.machine.hardware",
    "HardwareInfo": "kitlib.machine.hardware",
    "fake_profile": "kitlib.machine.hardware",
    "plan_memory": "kitlib.doctor.memory_plan",
    "MemoryPlan": "kitlib.doctor.memory_plan",
    "decide_precision": "kitlib.machine.precision",
    "Precision": "kitlib.machine.amp",
    "PrecisionPlan": "kitlib.machine.precision",
    "speed_flags": "kitlib.machine.backends",
    "TrainConfig": "kitlib.config",
    "fit": "kitlib.engine.loop",
    "Callback": "kitlib.engine.events",
    "FitResult": "kitlib.engine.loop",
    "SplitEval": "kitlib.engine.evaluation",
    "default_policies": "kitlib.engine.policies",
    "make_train_loader": "kitlib.data.loaders",
    "make_eval_loader": "kitlib.data.loaders",
    "make_predict_loader": "kitlib.data.loaders",
    "restore_order": "kitlib.data.loaders",
    "TokenDataset": "kitlib.data.loaders",
    "PaddingCollator": "kitlib.data.loaders",
    "skip_batches": "kitlib.engine.batches",
    "suggest_max_length": "kitlib.data.lengths",
    "length_report": "kitlib.data.lengths",
    "read_table": "kitlib.data.tables",
    "infer_target": "kitlib.data.tables",
    "DataError": "kitlib.data.tables",
    "load_text_classifier": "kitlib.models.loading",
    "load_text_encoder": "kitlib.models.loading",
    "Cache": "kitlib.data.cache",
    "cached": "kitlib.data.cache",
    "tokenize_texts": "kitlib.data.featurize",
    "embed_texts": "kitlib.data.featurize",
    "numeric_features": "kitlib.data.featurize",
    "categorical_codes": "kitlib.data.featurize",
    "TokenizedTexts": "kitlib.data.featurize",
    "PRESETS": "kitlib.notebook.presets",
    "Preset": "kitlib.notebook.presets",
    "ResolvedRun": "kitlib.notebook.presets",
    "resolve": "kitlib.notebook.presets",
    "estimate_epoch_seconds": "kitlib.notebook.estimate",
    "preset_picker": "kitlib.notebook.widgets",
    "PresetPicker": "kitlib.notebook.widgets",
    "diagnose": "kitlib.doctor.report",
    "score": "kitlib.tasks.scoring",
}

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        raise AttributeError(f"module 'kitlib' has no attribute {name!r}")
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
