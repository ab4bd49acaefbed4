"""kitlib: fast, painless model training in Kaggle/Colab/Jupyter notebooks.

Importing kitlib does no work: no hardware probing, no torch import, no backend flags. Public names are
resolved lazily on first use (PEP 562), so ``import kitlib`` stays cheap in a notebook's first cell.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "detect": "kitlib.hardware",
    "HardwareInfo": "kitlib.hardware",
    "fake_profile": "kitlib.hardware",
    "decide_precision": "kitlib.precision",
    "Precision": "kitlib.precision",
    "PrecisionPlan": "kitlib.precision",
    "speed_flags": "kitlib.backends",
    "TrainConfig": "kitlib.config",
    "fit": "kitlib.train",
    "FitResult": "kitlib.train",
    "make_train_loader": "kitlib.data",
    "make_eval_loader": "kitlib.data",
    "make_predict_loader": "kitlib.data",
    "restore_order": "kitlib.data",
    "TokenDataset": "kitlib.data",
    "PaddingCollator": "kitlib.data",
    "skip_batches": "kitlib.batches",
    "suggest_max_length": "kitlib.lengths",
    "length_report": "kitlib.lengths",
    "read_table": "kitlib.frames",
    "infer_task": "kitlib.frames",
    "DataError": "kitlib.frames",
    "load_text_classifier": "kitlib.models",
    "load_text_encoder": "kitlib.models",
    "Cache": "kitlib.cache",
    "cached": "kitlib.cache",
    "cached_feature": "kitlib.cache",
    "tokenize_texts": "kitlib.features",
    "embed_texts": "kitlib.features",
    "numeric_features": "kitlib.features",
    "categorical_codes": "kitlib.features",
    "TokenizedTexts": "kitlib.features",
    "PRESETS": "kitlib.presets",
    "Preset": "kitlib.presets",
    "ResolvedRun": "kitlib.presets",
    "resolve": "kitlib.presets",
    "estimate_epoch_seconds": "kitlib.presets",
    "preset_picker": "kitlib.widgets",
    "PresetPicker": "kitlib.widgets",
    "diagnose": "kitlib.doctor",
    "make_demo": "kitlib.demo",
    "score": "kitlib.demo",
}

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kitlib' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
