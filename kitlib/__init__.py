"""kitlib: model training in Kaggle/Colab/Jupyter notebooks; importing it does no work (PEP 562 lazy names)."""

from __future__ import annotations

import importlib
from typing import Any

from kitlib._version import __version__

# module -> the public names it defines
_MODULES: dict[str, str] = {
    "kitlib.machine.hardware": "detect HardwareInfo fake_profile",
    "kitlib.doctor.memory_plan": "plan_memory MemoryPlan",
    "kitlib.machine.precision": "decide_precision PrecisionPlan",
    "kitlib.machine.amp": "Precision",
    "kitlib.machine.backends": "speed_flags",
    "kitlib.config": "TrainConfig",
    "kitlib.engine.loop": "fit FitResult",
    "kitlib.engine.events": "Callback",
    "kitlib.engine.evaluation": "SplitEval",
    "kitlib.engine.policies": "default_policies",
    "kitlib.data.loaders": "make_train_loader make_eval_loader make_predict_loader restore_order TokenDataset "
    "PaddingCollator",
    "kitlib.engine.batches": "skip_batches",
    "kitlib.data.lengths": "suggest_max_length length_report",
    "kitlib.data.tables": "read_table infer_target DataError",
    "kitlib.models.loading": "load_text_classifier load_text_encoder",
    "kitlib.data.cache": "Cache cached",
    "kitlib.data.featurize": "tokenize_texts embed_texts TokenizedTexts",
    "kitlib.notebook.presets": "PRESETS Preset ResolvedRun resolve",
    "kitlib.notebook.estimate": "estimate_epoch_seconds",
    "kitlib.notebook.widgets": "preset_picker PresetPicker",
    "kitlib.doctor.report": "diagnose",
    "kitlib.tasks.scoring": "score",
}
_EXPORTS = {name: module for module, names in _MODULES.items() for name in names.split()}

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
