"""Every error kitlib shows a user, each naming what is wrong and the fix; catch ``KitError``. No kitlib imports."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

TRACEBACK_ENV = "KITLIB_TRACEBACK"  # =1: show kitlib errors with their full traceback in notebooks


class KitError(Exception):
    """Base of kitlib's user-facing errors: the message alone is enough to act on (no traceback needed)."""

    def _render_traceback_(self) -> list[str]:
        """What IPython/Jupyter show instead of a traceback: one short paragraph (KITLIB_TRACEBACK=1: the full one)."""
        if os.environ.get(TRACEBACK_ENV) == "1":
            raise NotImplementedError  # IPython falls back to its full traceback
        return [f"\x1b[1;31m{type(self).__name__}\x1b[0m: {self}"]


class PrecisionError(KitError, ValueError):
    """An impossible precision/hardware combination (bf16 on a T4, TF32 before Ampere); names the fix."""


class UnsupportedGPUError(PrecisionError):
    """The installed torch has no kernels for this GPU: every CUDA op would fail."""


class CompileError(KitError, ValueError):
    """torch.compile cannot work on this machine (a GPU too old for Triton); names the fix."""


class DiskFullError(KitError, OSError):
    """A write ran out of space (or quota); names the file, the free space, and says nothing was replaced."""


class SetupError(KitError, ValueError):
    """A parameter cannot work as given (a working dir that is a file, read-only, or the data dir itself)."""


class DataError(KitError, ValueError):
    """Input data that cannot be used as given; names the file/column/row and the fix (FeatureInputError too)."""


class FeatureInputError(DataError):
    """A featuriser's input is unusable (names the column and the fix)."""


class CacheError(KitError, RuntimeError):
    """The feature cache cannot be used as configured."""


class CheckpointError(KitError, RuntimeError):
    """A checkpoint cannot be written or loaded; names the directory, the problem and the fix."""


class DoesNotFitError(KitError, RuntimeError):
    """A training step runs out of device memory even at micro-batch 1; names the memory plan's next strategy."""


class NonFiniteLossError(KitError, RuntimeError):
    """Too many optimizer steps in a row had inf/nan gradients."""


class DistributedError(KitError, RuntimeError):
    """A DDP run that cannot work as set up (CUDA initialised before a fork, parameters without gradients)."""


class MissingDataError(KitError, FileNotFoundError):
    """The data dir given in the parameters does not exist."""


class MissingModelError(KitError, FileNotFoundError):
    """The model folder given in the parameters holds no saved model."""


class RefusedModelError(KitError, ValueError):
    """A model folder whose loading would run its publisher's code (a non-tensor pickle, config.json's Python files)."""


class MissingRunError(KitError, FileNotFoundError):
    """No saved run: 00_setup has not been run in this working dir."""


@contextlib.contextmanager
def damaged_file(path: object, notebook: str) -> Iterator[None]:
    """A half-written or hand-edited file that does not parse: a MissingRunError naming it and the notebook to rerun."""
    try:
        yield
    except KitError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise MissingRunError(
            f"{path} is damaged ({type(err).__name__}: {err}): re-run notebooks/{notebook}.ipynb to write it again"
        ) from err


def in_setup(name: str, env: bool = False) -> str:
    """The shared fix wording: where a user sets parameter ``name`` (``env``: it has a KIT_* variable)."""
    return "in 00_setup's parameters cell" + (f" (KIT_{name.upper()} headless)" if env else "")


def pip_install(package: str, extra: str) -> str:
    """The shared fix wording for a missing optional package: the pip command, and a checkout's extra."""
    return f"pip install {package} (a checkout: pip install -e '.[{extra}]')"
