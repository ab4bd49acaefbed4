"""Run the numbered notebooks headless, in order, with papermill (as Kaggle does), KIT_* variables in the kernel."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kitlib.errors import TRACEBACK_ENV, KitError

# lazy: papermill (+0.5 s), jupyter_client (+0.1 s), nbclient (+0.2 s), nbformat (+0.1 s), kitlib.engine (+1.0 s)

NOTEBOOKS = ("00_setup.ipynb", "01_features.ipynb", "02_train.ipynb", "03_infer.ipynb")
# the first line warnings.showwarning prints: "path:line: UserWarning: ..." or "UserWarning: ..." (kitlib.progress)
_WARNING = re.compile(r"^(?:\S.*?:\d+: )?(\w*Warning): (.*)$", re.M)
GRACE_S = 30  # seconds a stopped kernel gets to save last/ (one checkpoint write: seconds on a local disk)
EXECUTED_MARK = "papermill"  # papermill's metadata: a later run writes over an executed copy only
MAX_EXECUTED_BYTES = 2_000_000  # an executed notebook above 2 MB means progress output was not throttled
# path parameters: the kernel's cwd is the executed copy's folder, so relative paths become absolute (the shell's)
PATH_PARAMETERS = {"data_dir": "KIT_DATA_DIR", "work_dir": "KIT_WORK_DIR", "model": "KIT_MODEL", "metric": "KIT_METRIC"}
FUNCTIONS = ("metric", "model_factory")  # 'file.py:function' (its file is the path) or a name / 'module:function'
MODEL_NAMES = ("auto", "tiny")  # model values that are not folders


def absolute_path(name: str, value: str | os.PathLike[str], base: str | os.PathLike[str] | None = None) -> str:
    """Path parameter ``name``'s ``value`` made absolute against ``base`` (cwd); ``model`` only if it exists."""
    text = os.fspath(value)
    if name in FUNCTIONS:  # every stage loads the same file.py, whatever its cwd; one not here: data_dir's (params)
        return function_file(text, Path(base or os.getcwd()), found_only=True)
    if not text or (name == "model" and text in MODEL_NAMES):
        return text
    path = Path(text).expanduser()
    if path.is_absolute():
        return str(path)
    candidate = Path(base or os.getcwd()) / path
    if name == "model" and not candidate.exists():
        return text
    return str(candidate.resolve())


def function_file(spec: str, *folders: Path, found_only: bool = False) -> str:
    """'file.py:function' with a relative file.py made absolute: the first of ``folders`` holding it, else the first
    folder (``found_only``: else unchanged); a 'module:function' or a name as it is."""
    where, sep, function = spec.rpartition(":")
    path = Path(where).expanduser()
    if not where.endswith(".py") or path.is_absolute():
        return spec
    found = next((folder / path for folder in folders if (folder / path).is_file()), None)
    if found is None and found_only:
        return spec
    return f"{(found or folders[0] / path).resolve()}{sep}{function}"


def absolute_parameters(values: Mapping[str, Any], base: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """A copy of ``values`` whose path parameters are absolute (relative ones are taken against ``base``/cwd)."""
    paths = {*PATH_PARAMETERS, *FUNCTIONS}
    return {k: absolute_path(k, v, base) if k in paths and v is not None else v for k, v in values.items()}


def notebooks_dir() -> Path:
    """The repo's notebooks/ folder (kitlib is installed editable from the repo; the notebooks ship beside it)."""
    return Path(__file__).resolve().parents[2] / "notebooks"


class NotebookFailed(KitError, RuntimeError):
    """A notebook stopped at an error; the message names the notebook, the cell and the error."""


class RunStopped(KitError, RuntimeError):
    """The headless run was stopped by a signal; the message says what was saved and how to continue."""


@dataclass(frozen=True)
class Executed:
    path: Path  # the executed copy
    seconds: float
    size_bytes: int


def run_notebooks(
    out_dir: Path,
    *,
    parameters: Mapping[str, Any] | None = None,
    names: Sequence[str] = NOTEBOOKS,
    source_dir: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: int = 3600,
    resume: str = "run the same command again",
) -> list[Executed]:
    """Execute the notebooks in order into ``out_dir``, stopping at the first failure; signals reach the kernel."""
    import papermill
    from jupyter_client.manager import AsyncKernelManager
    from nbclient.exceptions import DeadKernelError

    out_dir = Path(out_dir).resolve()
    source_dir = Path(source_dir or notebooks_dir()).resolve()
    parameters = absolute_parameters(parameters or {})
    kernel_env = {"KIT_HEADLESS": "1", **(env or {})}
    environ = {**os.environ, **kernel_env}  # its KIT_* path variables made absolute
    kernel_env |= {var: absolute_path(name, environ[var]) for name, var in PATH_PARAMETERS.items() if environ.get(var)}
    theirs = [out_dir / n for n in names if (out_dir / n).exists() and not _executed_here(out_dir / n)]
    if theirs:  # before any kernel: an executed copy replaces only an executed copy
        raise NotebookFailed(
            f"{', '.join(map(str, theirs))}: not a notebook this runner executed, and the run would write its "
            f"executed copy there. Fix: move it out of {out_dir}, or pick another work dir"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    stop = _Stop(parameters.get("work_dir"), resume)
    # Unix sockets in this run's folder: bind-and-release TCP ports clashed in CI ("Address already in use")
    sockets = {} if os.name == "nt" else {"transport": "ipc", "ip": tempfile.mkdtemp(prefix="kitlib-kernel-") + "/k"}

    class Kernel(AsyncKernelManager):  # nbclient builds and owns it; the stop handler signals its process
        def __init__(self, **kw: Any) -> None:
            super().__init__(**kw, **sockets)
            stop.kernel = self

        async def start_kernel(self, **kw: Any) -> None:  # type: ignore[override]  # async, as jupyter_client's own
            await super().start_kernel(**kw)
            if stop.signum:  # the signal came before the kernel's process existed
                stop.signal_kernel(signal.SIGTERM)

    results = []
    saved = dict(os.environ)
    os.environ.update(kernel_env)  # the kernel inherits this process's environment
    stop.keep_handlers()  # papermill runs nbclient's synchronous path, which installs no signal handlers of its own
    # papermill and nbclient log noise to stderr before the exception kitlib words
    papermill_log = logging.getLogger("papermill")
    level = papermill_log.level
    papermill_log.setLevel(logging.CRITICAL)
    try:
        for name in names:
            stop.check(name)  # a signal between two notebooks: the next one does not start
            target, start = out_dir / name, time.perf_counter()
            try:
                papermill.execute_notebook(
                    source_dir / name, target, parameters,
                    kernel_name="python3", progress_bar=False, execution_timeout=timeout_s,
                    kernel_manager_class=Kernel, resources={"metadata": {"path": str(out_dir)}},
                )  # fmt: skip
            except Exception as err:
                stop.check(name)  # stopped by a signal: that, not the error the stop caused, is the message
                if os.environ.get(TRACEBACK_ENV) == "1":
                    raise
                if isinstance(err, DeadKernelError):  # killed: the out-of-memory killer, a kill -9
                    raise NotebookFailed(
                        f"{name}: its kernel died (killed: out of host memory, or SIGKILL): "
                        f"{stop.saved()}; the notebooks before it are done. Resume: {resume}"
                    ) from None
                if isinstance(err, papermill.PapermillExecutionError):  # its words: the cell's own error output
                    raise NotebookFailed(
                        f"{name} stopped in cell {err.cell_index + 1}: {err.ename}: {err.evalue}\n(the executed "
                        f"notebook, with the full traceback: {target}; {TRACEBACK_ENV}=1 shows it here)"
                    ) from None
                raise
            stop.check(name)
            size = target.stat().st_size
            if size > MAX_EXECUTED_BYTES:
                raise RuntimeError(f"{target} is {size / 1e6:.1f} MB: some output is not throttled for headless runs")
            results.append(Executed(target, time.perf_counter() - start, size))
    finally:
        stop.restore_handlers()
        papermill_log.setLevel(level)
        os.environ.clear()
        os.environ.update(saved)
        if sockets:
            shutil.rmtree(Path(sockets["ip"]).parent, ignore_errors=True)
    return results


class _Stop:
    """SIGTERM/SIGINT handler: the kernel (own session) gets SIGTERM, SIGKILL GRACE_S later; ``check`` ends the run."""

    def __init__(self, work_dir: Any, resume: str) -> None:
        self.work_dir, self.resume, self.signum = work_dir, resume, 0
        self.kernel: Any = None  # the running notebook's kernel manager
        # zmq logs a traceback when the stopped kernel's sockets close; ``check`` reports the stop instead
        self.zmq_log = logging.getLogger("tornado.general")
        self.zmq_log_was_off = self.zmq_log.disabled

    def keep_handlers(self) -> None:
        """Keep SIGTERM's and SIGINT's handlers and install ``_stop`` (signals reach the main thread only)."""
        main = threading.current_thread() is threading.main_thread()
        self.previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)} if main else {}
        for signum in self.previous:
            signal.signal(signum, self._stop)

    def restore_handlers(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.zmq_log.disabled = self.zmq_log_was_off

    def signal_kernel(self, signum: int) -> None:
        process = getattr(getattr(self.kernel, "provisioner", None), "process", None)
        if process is not None and process.poll() is None:
            os.kill(process.pid, signum)

    def _stop(self, signum: int, frame: Any) -> None:
        if not self.signum:  # a second signal (Ctrl-C twice) changes nothing: the grace timer ends the wait
            self.signum = signum
            self.zmq_log.disabled = self.zmq_log_was_off or os.environ.get(TRACEBACK_ENV) != "1"
            self.signal_kernel(signal.SIGTERM)
            timer = threading.Timer(GRACE_S, self.signal_kernel, (signal.SIGKILL,))
            timer.daemon = True
            timer.start()

    def check(self, name: str) -> None:
        if self.signum:
            raise RunStopped(
                f"stopped by {signal.Signals(self.signum).name} during {name} (the kernel got SIGTERM and up to "
                f"{GRACE_S} s to save): {self.saved()}; the notebooks before it are done. Resume: {self.resume}"
            )

    def saved(self) -> str:
        """What the stopped attempt left to continue from (02's run.new/)."""
        from kitlib.engine.checkpoint import latest

        staged = Path(self.work_dir or ".") / "run.new"
        kept = [str(c) for n in ("last", "best") if (c := latest(staged, n)) is not None]
        return f"{', '.join(kept)} saved" if kept else "no training checkpoint of this attempt"


def raised_warnings(paths: Sequence[Path]) -> list[str]:
    """Every warning the executed notebooks printed (``<notebook>: <Category>: <message>``), each once, in order."""
    found: dict[str, None] = {}
    for path in paths:
        cells = json.loads(path.read_text()).get("cells", [])
        for out in (o for c in cells for o in c.get("outputs", []) if o.get("name") == "stderr"):
            for category, message in _WARNING.findall("".join(out.get("text", ""))):
                found[f"{path.stem}: {category}: {message.strip()}"] = None
    return list(found)


def _executed_here(path: Path) -> bool:
    try:
        meta = json.loads(path.read_text()).get("metadata", {})
        return bool(meta.get(EXECUTED_MARK) or meta.get("kitlib_executed"))  # (the mark before papermill)
    except (OSError, ValueError, AttributeError):
        return False


def strip_outputs(paths: Sequence[Path]) -> int:
    """Clear outputs and execution counts in place (notebooks are committed without outputs); returns cells cleared."""
    import nbformat

    cleared = 0
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code" and (cell.outputs or cell.execution_count):
                cell.outputs, cell.execution_count = [], None
                cleared += 1
        nbformat.write(nb, path)
    return cleared
