"""Run the numbered notebooks headless, in order, as ``jupyter nbconvert --execute`` does, with papermill's
``injected-parameters`` cell after ``parameters``, and KIT_HEADLESS=1 plus the KIT_* variables in the kernel."""

from __future__ import annotations

import asyncio
import atexit
import copy
import json
import logging
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kitlib.errors import TRACEBACK_ENV, KitError

# lazy: nbformat (+0.1 s), nbclient (+0.2 s), traitlets (+0.03 s): only reading or running notebooks needs them;
# kitlib.engine (+1.0 s): torch, only to name a stopped run's checkpoint. The names and paths here are read by the CLI
# and 00 (python -X importtime).

NOTEBOOKS = ("00_setup.ipynb", "01_features.ipynb", "02_train.ipynb", "03_infer.ipynb")
# the first line warnings.showwarning prints: "file:line: Category: message"
# "path:line: UserWarning: ..." (warnings.warn), or "UserWarning: ..." (kitlib.progress.advise: no kernel file path)
_WARNING = re.compile(r"^(?:\S.*?:\d+: )?(\w*Warning): (.*)$", re.M)
GRACE_S = 30  # seconds a stopped kernel gets to save last/ (one checkpoint write: seconds on a local disk)
EXECUTED_MARK = "kitlib_executed"  # in an executed copy's metadata: the only kind a later run writes over
MAX_EXECUTED_BYTES = 2_000_000  # an executed notebook above 2 MB means progress output was not throttled
# Parameters (and their KIT_* variables) that name folders. A notebook's kernel runs with its working directory set
# to the executed notebook's folder, so a relative path must be made absolute before the kernel sees it.
PATH_PARAMETERS = {"data_dir": "KIT_DATA_DIR", "work_dir": "KIT_WORK_DIR", "model": "KIT_MODEL"}
MODEL_NAMES = ("auto", "tiny")  # model values that are not folders


def absolute_path(name: str, value: str | os.PathLike[str], base: str | os.PathLike[str] | None = None) -> str:
    """``value`` of the path parameter ``name`` made absolute against ``base`` (default: cwd); ``model`` only when it
    names something that exists (else it may be a hub id)."""
    text = os.fspath(value)
    if not text or (name == "model" and text in MODEL_NAMES):
        return text
    path = Path(text).expanduser()
    if path.is_absolute():
        return str(path)
    candidate = Path(base or os.getcwd()) / path
    if name == "model" and not candidate.exists():
        return text
    return str(candidate.resolve())


def absolute_parameters(values: Mapping[str, Any], base: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """A copy of ``values`` whose path parameters are absolute (relative ones are taken against ``base``/cwd)."""
    return {k: absolute_path(k, v, base) if k in PATH_PARAMETERS and v is not None else v for k, v in values.items()}


def absolute_environment(environ: Mapping[str, str], base: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """The KIT_* path variables of ``environ`` made absolute (the others are left out)."""
    return {var: absolute_path(name, environ[var], base) for name, var in PATH_PARAMETERS.items() if environ.get(var)}


def notebooks_dir() -> Path:
    """The repo's notebooks/ folder (kitlib is installed editable from the repo; the notebooks ship beside it)."""
    return Path(__file__).resolve().parents[2] / "notebooks"


def inject_parameters(nb: Any, values: Mapping[str, Any]) -> Any:
    """A copy of ``nb`` with an ``injected-parameters`` cell after the ``parameters`` cell (papermill's convention)."""
    import nbformat

    nb = copy.deepcopy(nb)
    index = next((i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])), None)
    if index is None:
        raise ValueError("notebook has no cell tagged 'parameters': tag the cell holding its defaults")
    source = "# Parameters injected by kitlib.notebook.runbook\n" + "".join(f"{k} = {v!r}\n" for k, v in values.items())
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    nb.cells.insert(index + 1, cell)
    return nb


class NotebookFailed(KitError, RuntimeError):
    """A notebook stopped at an error; the message names the notebook, the cell and the error."""


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
    """Execute the notebooks in order, each executed copy saved to ``out_dir``; stop at the first failure.
    SIGTERM/SIGINT goes on to the kernel (which saves ``last/``); after at most GRACE_S a RunStopped names ``resume``.
    A killed kernel raises NotebookFailed. Relative paths are taken against this process's cwd."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, DeadKernelError
    from traitlets.config import Config

    out_dir = Path(out_dir).resolve()
    source_dir = Path(source_dir or notebooks_dir()).resolve()
    parameters = absolute_parameters(parameters or {})
    kernel_env = {"KIT_HEADLESS": "1", **(env or {})}
    kernel_env |= absolute_environment({**os.environ, **kernel_env})
    theirs = [out_dir / n for n in names if (out_dir / n).exists() and not _executed_here(out_dir / n)]
    if theirs:  # before any kernel: an executed copy replaces only an executed copy
        raise NotebookFailed(
            f"{', '.join(map(str, theirs))}: not a notebook this runner executed, and the run would write its "
            f"executed copy there. Fix: move it out of {out_dir}, or pick another work dir"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    saved = dict(os.environ)
    os.environ.update(kernel_env)  # the kernel inherits this process's environment
    stop = _Stop(parameters.get("work_dir"), resume)
    stop.keep_handlers()
    sockets = _kernel_sockets()  # removed in the finally below
    try:
        for name in names:
            stop.listen()  # again: nbclient's end of the last notebook set the default handlers back
            stop.check(name)  # a signal between two notebooks: the next one does not start
            nb = nbformat.read(source_dir / name, as_version=4)
            if parameters:
                nb = inject_parameters(nb, parameters)
            start = time.perf_counter()
            target = out_dir / name
            stop.client = None
            try:
                stop.client = NotebookClient(
                    nb, timeout=timeout_s, kernel_name="python3", resources={"metadata": {"path": str(out_dir)}},
                    config=Config(KernelManager=sockets),
                )  # fmt: skip
                stop.client.async_start_new_kernel = stop.arming(stop.client.async_start_new_kernel)
                stop.client.execute()
            except Exception as err:
                stop.check(name)  # stopped by a signal: that, not the error the stop caused, is the message
                if os.environ.get(TRACEBACK_ENV) == "1" or not isinstance(err, CellExecutionError | DeadKernelError):
                    raise
                if isinstance(err, DeadKernelError):  # killed: the out-of-memory killer, a kill -9
                    raise NotebookFailed(
                        f"{name}: its kernel died (killed: out of host memory, or SIGKILL): "
                        f"{stop.saved()}; the notebooks before it are done. Resume: {resume}"
                    ) from None
                raise NotebookFailed(_failure(nb, name, target, err)) from None
            finally:
                if stop.client is not None:  # left registered when the kernel failed to start
                    atexit.unregister(stop.client._cleanup_kernel)
                nb.metadata[EXECUTED_MARK] = name
                nbformat.write(nb, target)  # the executed copy, also when a cell failed: it shows where
            stop.check(name)
            size = target.stat().st_size
            if size > MAX_EXECUTED_BYTES:
                raise RuntimeError(f"{target} is {size / 1e6:.1f} MB: some output is not throttled for headless runs")
            results.append(Executed(target, time.perf_counter() - start, size))
    finally:
        stop.restore_handlers()
        os.environ.clear()
        os.environ.update(saved)
        if "ip" in sockets:
            shutil.rmtree(Path(sockets["ip"]).parent, ignore_errors=True)
    return results


def _kernel_sockets() -> dict[str, str]:
    """The kernels' transport: unix sockets in a folder of this run's own where the OS has them (TCP ports picked by
    bind-and-release can be taken by a kernel started elsewhere: "Address already in use" in CI); TCP on Windows."""
    if os.name == "nt":
        return {}
    return {"transport": "ipc", "ip": str(Path(tempfile.mkdtemp(prefix="kitlib-kernel-")) / "k")}


class RunStopped(KitError, RuntimeError):
    """The headless run was stopped by a signal; the message says what was saved and how to continue."""


class _Stop:
    """The runner's SIGTERM/SIGINT handler while a kernel runs: the kernel (in a session of its own, so a signal to
    this process group never reaches it) gets SIGTERM once, and SIGKILL if its notebook is still running GRACE_S
    later; ``check`` then ends the run with one message."""

    def __init__(self, work_dir: Any, resume: str) -> None:
        self.work_dir, self.resume, self.signum = work_dir, resume, 0
        self.client: Any = None  # the running notebook's NotebookClient
        # The stopped kernel's sockets close under nbclient's pending reads, and zmq logs that through tornado as an
        # "uncaught exception" with a traceback (once in CI, under load): the stop is ours and ``check`` says it.
        # Silenced from the signal on, back on when the run ends; KITLIB_TRACEBACK=1 keeps it.
        self.zmq_log = logging.getLogger("tornado.general")
        self.zmq_log_was_off = self.zmq_log.disabled

    def keep_handlers(self) -> None:

        main = threading.current_thread() is threading.main_thread()  # signals reach the main thread only
        self.previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)} if main else {}

    def restore_handlers(self) -> None:

        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.zmq_log.disabled = self.zmq_log_was_off

    def listen(self) -> None:
        """This process's SIGTERM/SIGINT go to ``_stop`` (between notebooks; ``arming`` covers a running one)."""

        for signum in self.previous:
            signal.signal(signum, self._stop)

    def arming(self, start: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
        """Wraps nbclient's kernel start: nbclient has just set its own handlers (they shut the kernel down at once,
        and a signal while the kernel starts ended the run in asyncio's CancelledError); ours replace them first."""

        async def started(**kwargs: Any) -> None:
            for signum in self.previous:
                asyncio.get_event_loop().add_signal_handler(signum, self._stop, signum, None)
            await start(**kwargs)
            if self.signum:  # the signal came before the kernel's process existed
                self._kernel(signal.SIGTERM)

        return started

    def _kernel(self, signum: int) -> None:
        process = getattr(getattr(getattr(self.client, "km", None), "provisioner", None), "process", None)
        if process is not None and process.poll() is None:
            os.kill(process.pid, signum)

    def _stop(self, signum: int, frame: Any) -> None:

        if not self.signum:  # a second signal (Ctrl-C twice) changes nothing: the grace timer ends the wait
            self.signum = signum
            self.zmq_log.disabled = self.zmq_log_was_off or os.environ.get(TRACEBACK_ENV) != "1"
            self._kernel(signal.SIGTERM)
            timer = threading.Timer(GRACE_S, self._kernel, (signal.SIGKILL,))
            timer.daemon = True
            timer.start()

    def check(self, name: str) -> None:
        if not self.signum:
            return
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
    """Every warning the executed notebooks at ``paths`` printed (``<notebook>: <Category>: <message>``), each once,
    in order: what a headless user would otherwise find only inside the .ipynb files."""

    found: dict[str, None] = {}
    for path in paths:
        cells = json.loads(path.read_text()).get("cells", [])
        for out in (o for c in cells for o in c.get("outputs", []) if o.get("name") == "stderr"):
            text = "".join(out.get("text", ""))
            for category, message in _WARNING.findall(text):
                found[f"{path.stem}: {category}: {message.strip()}"] = None
    return list(found)


def _executed_here(path: Path) -> bool:

    try:
        return bool(json.loads(path.read_text()).get("metadata", {}).get(EXECUTED_MARK))
    except (OSError, ValueError, AttributeError):
        return False


def _failure(nb: Any, name: str, target: Path, err: Any) -> str:
    """One paragraph: which notebook and cell, the error as kitlib (or Python) worded it, where the rest is. The
    words come from the cell's own error output: the kernel's reply loses them when the error was raised while
    displaying a result (IPython's formatters: the reply then says "NoneType: None")."""
    errors = [
        (i, o) for i, c in enumerate(nb.cells, 1) for o in c.get("outputs", []) if o.get("output_type") == "error"
    ]
    cell, ename, evalue = (f"cell {errors[0][0]}", errors[0][1].ename, errors[0][1].evalue) if errors else (
        "a cell", err.ename, err.evalue)  # fmt: skip
    return (
        f"{name} stopped in {cell}: {ename}: {evalue}\n(the executed notebook, with the full traceback: "
        f"{target}; {TRACEBACK_ENV}=1 shows it here)"
    )


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
