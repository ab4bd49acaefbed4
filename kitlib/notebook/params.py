"""The notebooks' parameters, declared once (``Params``): 00 saves them as ``work_dir/params.json``, 01-03 read them
back (``load_params``) after carrying earlier kernels' outputs (``inputs``) forward. KIT_* variables override 00's."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from kitlib._files import explain_disk_full, write_atomic
from kitlib.config import Adapter, Optimizer
from kitlib.errors import MissingDataError, MissingRunError, SetupError, damaged_file
from kitlib.machine.hardware import fake_profile, switch
from kitlib.notebook.presets import DEFAULT_PRESET, PRESETS, RUN_FILE, get_preset
from kitlib.notebook.reporting import check_report_to
from kitlib.notebook.runbook import FUNCTIONS, PATH_PARAMETERS, absolute_parameters, absolute_path, function_file
from kitlib.notebook.tasks import TASKS, get_task, task_entry
from kitlib.tasks.metrics import METRICS
from kitlib.tasks.targets import OBJECTIVES

PARAMS_FILE = "params.json"
RUN_NAME = "run"  # fit()'s run dir under the working dir: config.json, history.csv, timing.json, best/, last/
# What a later stage needs from earlier ones (run.new/: an attempt the next session continues); folders before the
# files that name them, so a copy cut short never leaves a manifest without its files.
HANDOFF = ("features", RUN_NAME, f"{RUN_NAME}.new", "params.json", "run.json", "features.json", "tokenizer")
KAGGLE_INPUT = Path("/kaggle/input")
_KAGGLE_KINDS = ("competitions", "datasets", "notebooks", "models")
_WORK_DIR_FIX = "set work_dir (or KIT_WORK_DIR) to a writable folder of its own, e.g. /kaggle/working on Kaggle"


def declared(
    default: Any,
    doc: str,
    *,
    choices: tuple[str, ...] = (),
    least: int | None = None,
    env: str = "",
    training: bool = False,
    stage: str = "00",
    features: bool = False,
) -> Any:
    """One parameter: every surface (cell, flags, checks, picker, README) derives from these fields. ``training``: a
    picker control and a resolver override (None: the preset's); ``stage``: the notebook that first reads it;
    ``features``: 01's saved features depend on it (``BUILT_FROM``)."""
    meta = dict(doc=doc, choices=choices, least=least, env=env, training=training, stage=stage, features=features)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Params:
    """00's ``parameters`` cell: every notebook parameter, declared once. Environment variables win (headless)."""

    data_dir: Path = declared(Path("/kaggle/input/my-competition"), "train.csv, test.csv, sample_submission.csv",
                              env="KIT_DATA_DIR")  # fmt: skip
    work_dir: Path = declared(Path("/kaggle/working"), "run.json, features.json, the feature cache, run/, "
                              "submission.csv", env="KIT_WORK_DIR")  # fmt: skip
    preset: str = declared(DEFAULT_PRESET, "the speed/accuracy preset", choices=tuple(PRESETS), env="KIT_PRESET")
    model: str = declared("auto", "auto: all-MiniLM-L6-v2 (an error when not installed); tiny (no download); or a "
                          "model folder", env="KIT_MODEL", features=True)  # fmt: skip
    text: str = declared("text", "the text column; seq2seq: the source text, causal-lm: the prompt", stage="01",
                         features=True)  # fmt: skip
    target: str = declared("label", "the target column; seq2seq/causal-lm: the text to generate", stage="01",
                           features=True)  # fmt: skip
    # task and metric are open (module:name of your own): their docs list the registries' names (a test checks)
    task: str = declared("auto", "auto | classify | regress | tabular-text | seq2seq | causal-lm | custom | "
                         "custom-seq2seq | module:name (a Task of your own)", env="KIT_TASK",
                         features=True)  # fmt: skip
    metric: str = declared("auto", "what best/ follows: auto | accuracy | macro_f1 | rmse | mae | smape | rmsle | "
                           "exact_match | rouge_l | file.py:function (beside the notebook, or a full path) | "
                           "module:function", env="KIT_METRIC")  # fmt: skip
    objective: str = declared("auto", "regression loss: auto (what the metric rewards) | mse | mae | log_mse | log_mae",
                              choices=tuple(OBJECTIVES), stage="02", features=True)  # fmt: skip
    numeric: tuple[str, ...] = declared((), "numeric columns beside the text, e.g. ['year', 'runtime']", stage="01",
                                        features=True)  # fmt: skip
    categorical: tuple[str, ...] = declared((), "categorical columns beside the text, e.g. ['genre']", stage="01",
                                            features=True)  # fmt: skip
    model_factory: str = declared("", "task custom/custom-seq2seq: your nn.Module, file.py:function (beside the "
                                  "notebook, or a full path) or module:function", stage="02",
                                  features=True)  # fmt: skip
    id: str = declared("id", "the id column", stage="01", features=True)
    seed: int = declared(42, "seeds the split, the weights' initialisation and the batch order", least=0,
                         features=True)  # fmt: skip
    folds: int = declared(1, "k-fold: k models, each validated on its own 1/k of the rows (classes stratified); 02 "
                          "saves run/oof.csv and judges the verdict out of fold, 03 averages the k models; k x the "
                          "training time. 1: one 10% hold-out", least=1)  # fmt: skip
    group_column: str = declared("", "grouped data: rows sharing this column's value are validated together (one "
                                 "fold, or the hold-out); '' = rows are independent", stage="01",
                                 features=True)  # fmt: skip
    train_file: str = declared("train.csv", "the training rows, in data_dir", stage="01", features=True)
    test_file: str = declared("test.csv", "the rows to predict, in data_dir", stage="01", features=True)
    sample_submission: str = declared("sample_submission.csv", "the submission's layout, in data_dir", stage="03",
                                      features=True)  # fmt: skip
    # A Kaggle chain gives only 02 and 03 the GPU: 00 and 01 plan for it by name.
    hardware: str = declared("", "plan for this accelerator (a kitlib.machine.hardware profile, e.g. 2xT4) instead "
                             "of this machine; '' = this one")  # fmt: skip
    rehearse: bool = declared(False, "rehearse the plan for hardware on this machine's CPU (as many gloo processes "
                              "as it has GPUs) before spending GPU quota", env="KIT_REHEARSE")  # fmt: skip
    # A Kaggle session ends at its limit (12 h, GPU); a code competition reruns the submitted notebook within its own.
    time_budget: float | None = declared(None, "hours 02 may train before it saves a resumable last/ and stops (the "
                                         "next session continues it); None: on Kaggle the session limit less 03's "
                                         "predicted time and a margin, elsewhere no limit", stage="00")  # fmt: skip
    inference_limit: float = declared(9.0, "a code competition's limit on the submitted notebook's rerun, hours: "
                                      "03 predicts its time for the test rows it sees and refuses a run that cannot "
                                      "fit, before any work", stage="03")  # fmt: skip
    strategy: str | None = declared(None, "several GPUs: ddp (each holds the whole model) | fsdp (weights, gradients "
                                    "and optimizer state sharded per block); None: the plan's",
                                    choices=("ddp", "fsdp"), stage="00")  # fmt: skip
    report_to: str = declared("none", "where 02 logs each epoch's history row and the verdict: none | tensorboard "
                              "(event files in work_dir/tensorboard) | wandb (when installed)",
                              choices=("none", "tensorboard", "wandb"), stage="02")  # fmt: skip
    epochs: int | None = declared(None, "passes over the training rows; None: the preset's", least=1, training=True,
                                  stage="02")  # fmt: skip
    micro_batch_size: int | None = declared(None, "rows per forward pass, per GPU; None: the preset's, sized to the "
                                            "accelerator's memory", least=1, training=True)  # fmt: skip
    grad_accum_steps: int | None = declared(None, "micro-batches per optimizer step: effective batch = micro x accum "
                                            "x GPUs; None: the preset's effective batch", least=1,
                                            training=True)  # fmt: skip
    lr: float | None = declared(None, "peak learning rate; None: the preset's", training=True, stage="02")
    max_length: int | None = declared(None, "tokens per row; None: fitted to the data", least=1, training=True,
                                      stage="01")  # fmt: skip
    full_eval_every: int | None = declared(None, "epochs between full evaluations (the metric); 0: only at the end; "
                                           "None: the preset's", least=0, training=True, stage="02")  # fmt: skip
    # checkpoints hold the adapters only; qlora keeps the frozen weights in 4 bits (kitlib.models.adapters)
    adapter: str = declared("none", "none | lora (low-rank adapters, the pretrained weights frozen) | qlora (on 4-bit "
                            "weights)", choices=get_args(Adapter), env="KIT_ADAPTER", training=True)  # fmt: skip
    # 00 reads the next three: the plan refuses adamw-kahan off bf16, sizes the batch with checkpointing and compile
    optimizer: str | None = declared(None, "adamw | adamw8bit (2 bytes of state a parameter, not 8) | adamw-kahan "
                                     "(pure bf16 weights); None: adamw", choices=get_args(Optimizer),
                                     training=True)  # fmt: skip
    gradient_checkpointing: bool | None = declared(None, "recompute activations in backward: ~30% more compute for "
                                                   "~60% less activation memory; None: the plan's (on where the "
                                                   "memory plan needs it)", training=True)  # fmt: skip
    compile: bool | None = declared(None, "torch.compile the model (a GPU; the first steps pay ~30-90 s of "
                                    "compiling); None: off", training=True)  # fmt: skip
    inputs: tuple[Path, ...] = ()  # this kernel's read-only folders of earlier outputs (not saved: kernel-specific)
    fold: int = 0  # the fold 02 trains (or 03 predicts with) now, 0-based: its run_dir (not saved: 02 loops over them)

    def __repr__(self) -> str:
        """The run in a line, the folders, then every other declared parameter set away from its default."""
        model = "yours (model_factory)" if self.model_factory else self.model
        rehearsed = ", rehearsed on this machine's CPU (rehearse)" if self.rehearse else ""
        shown = ("preset", "model", "task", "metric", "data_dir", "work_dir", "rehearse")
        changed = [f"{name} {list(v) if isinstance(v, tuple) else v!r}" for name, f in PARAMETERS.items()
                   if name not in shown and (v := getattr(self, name)) != f.default]  # fmt: skip
        lines = [f"Params: preset {self.preset}, model {model}, task {self.task}, metric {self.metric}{rehearsed}",
                 f"  data {self.data_dir}", f"  work {self.work_dir}"]  # fmt: skip
        lines += [f"  set {', '.join(changed)}"] if changed else []
        lines += [f"  inputs {', '.join(map(str, self.inputs))}"] if self.inputs else []
        return "\n".join(lines)

    def training(self) -> dict[str, Any]:
        """The training parameters set away from their default: the resolver's overrides, the picker's start."""
        return {name: value for name in TRAINING if (value := getattr(self, name)) != PARAMETERS[name].default}

    @property
    def cache_dir(self) -> Path:
        return self.work_dir / "kitlib-cache"  # under the working dir: on Kaggle it becomes the kernel's output

    @property
    def seed_caches(self) -> list[Path]:
        """Earlier kernels' feature caches (read-only; arrays reused, nothing unpickled)."""
        return [folder / "kitlib-cache" for folder in self.inputs if (folder / "kitlib-cache").is_dir()]

    @property
    def run_dir(self) -> Path:
        """run/ (fold 1's with folds, which also holds the out-of-fold verdict), run-fold2/ ... for the others."""
        return self.work_dir / (RUN_NAME if self.fold == 0 else f"{RUN_NAME}-fold{self.fold + 1}")

    def save(self) -> Path:
        """``work_dir/params.json``: what 01-03 read (paths absolute; the kernel's own ``NOT_SAVED`` left out)."""
        values = {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(self).items()}
        values = {k: v for k, v in values.items() if k not in NOT_SAVED}
        return write_atomic(self.work_dir / PARAMS_FILE, json.dumps(values, indent=2) + "\n")


# Derived from the declaration, never typed again.
PARAMETERS: dict[str, dataclasses.Field[Any]] = {f.name: f for f in dataclasses.fields(Params) if f.metadata}
ENV = {name: f.metadata["env"] for name, f in PARAMETERS.items() if f.metadata["env"]}
TRAINING = tuple(name for name, f in PARAMETERS.items() if f.metadata["training"])
BUILT_FROM = tuple(name for name, f in PARAMETERS.items() if f.metadata["features"])
# on/off parameters: their KIT_* variable reads 1/true/yes/on or 0/false/no/off
SWITCHES = tuple(name for name, f in PARAMETERS.items() if isinstance(f.default, bool))
COLUMNS = tuple(name for name, f in PARAMETERS.items() if f.default == ())  # lists of column names: "a, b" is read too
# not saved in params.json: work_dir and the undeclared per-kernel fields (inputs, fold)
NOT_SAVED = ("work_dir", *(f.name for f in dataclasses.fields(Params) if f.name not in PARAMETERS))


def params(environ: Mapping[str, str] | None = None, **values: Any) -> Params:
    """Params from 00's parameters cell, checked; the declared KIT_* variables (``ENV``) override them."""
    check_names(values, allowed={"inputs"})
    env = os.environ if environ is None else environ
    values = absolute_parameters(values) | _from_environment(env, with_work_dir=True)
    values["data_dir"] = kaggle_input(Path(values["data_dir"]))
    if Path(str(values.get("model", ""))).is_absolute():  # a model folder attached as a dataset: either layout
        values["model"] = str(kaggle_input(Path(values["model"])))
    values["work_dir"] = Path(values["work_dir"])
    values["inputs"] = tuple(kaggle_input(Path(absolute_path("inputs", v))) for v in values.get("inputs", ()))
    for name in FUNCTIONS:  # a file not beside the notebook: the competition's (its metric code) or an input's
        if isinstance(values.get(name), str):
            values[name] = function_file(values[name], Path.cwd(), values["data_dir"], *values["inputs"])
    for columns in COLUMNS:
        values[columns] = _columns(values.get(columns, ()))
    p = Params(**values)
    _check_values(p, with_task=True)
    if not p.data_dir.is_dir():
        problem = "is a file, not a folder" if p.data_dir.exists() else "does not exist"
        raise MissingDataError(
            f"data_dir {p.data_dir} {problem}: set it in the parameters cell or KIT_DATA_DIR to the competition's "
            "folder (for the offline demo: python -m kitlib demo DIR)"
        )
    check_work_dir(p.work_dir, p.data_dir)
    return p


def from_cell(namespace: Mapping[str, Any]) -> Params:
    """00's call: ``Params`` from the parameters cell's namespace (papermill's injected cell included), by the
    declared names."""
    return params(**{name: namespace[name] for name in PARAMETERS if name in namespace})


def load_params(
    work_dir: str | os.PathLike[str],
    *,
    inputs: Sequence[str | os.PathLike[str]] = (),
    environ: Mapping[str, str] | None = None,
) -> Params:
    """01-03's parameters: 00's ``params.json``, after carrying ``inputs`` forward. A KIT_* variable contradicting a
    saved value is an error naming both; KIT_DATA_DIR may move the data."""
    env = os.environ if environ is None else environ
    work = Path(_from_environment(env, with_work_dir=True).get("work_dir") or absolute_path("work_dir", work_dir))
    folders = tuple(kaggle_input(Path(absolute_path("inputs", i))) for i in inputs)
    # Everything that can fail is checked before the inputs are copied over what work_dir holds.
    _check_writable(work)
    _check_inputs(folders)
    path = next((f / PARAMS_FILE for f in reversed(folders) if (f / PARAMS_FILE).is_file()), work / PARAMS_FILE)
    if not path.is_file():
        where = f" or in inputs {[str(f) for f in folders]}" if folders else ""
        raise MissingRunError(
            f"no {PARAMS_FILE} in {work}{where}: run notebooks/00_setup.ipynb first with this work_dir (on Kaggle: "
            "attach the previous kernel's output and list its folder in inputs)"
        )
    with damaged_file(path, "00_setup"):
        known = {f.name for f in dataclasses.fields(Params)} - set(NOT_SAVED)
        values = {k: v for k, v in json.loads(path.read_text()).items() if k in known}
    overrides = _from_environment(env, with_work_dir=False)
    if "data_dir" in overrides:
        values["data_dir"] = overrides.pop("data_dir")
    clashes = [
        f"{name}: params.json (00_setup) says {values.get(name)!r}, {ENV[name]} says {value!r}"
        for name, value in overrides.items()
        if str(values.get(name)) != str(value)
    ]
    if clashes:
        raise SetupError(
            f"{'; '.join(clashes)}. 01-03 use what 00_setup saved. Fix: re-run 00_setup with the new value, or unset "
            f"{', '.join(ENV[c.split(':')[0]] for c in clashes)}"
        )
    carry_forward(folders, work)
    _check_same_run(values, work)
    return params(environ={}, **values, work_dir=work, inputs=folders)


def _check_same_run(values: Mapping[str, Any], work: Path) -> None:
    """params.json and run.json (00 writes both) agree on preset, task and metric: a hand-edited one would show one
    run and train another. A damaged run.json is the stage's to name."""
    try:
        run = json.loads((work / RUN_FILE).read_text())
        saved = {"preset": run["preset"]["name"], "task": run["task"], "metric": run["metric"]}
    except (OSError, ValueError, KeyError, TypeError):
        return
    given = {"preset": str(values.get("preset", "")).strip().lower(), "task": values.get("task", "auto")}
    given |= {"metric": values["metric"]} if values.get("metric", "auto") != "auto" else {}
    differ = [f"{k} = {given[k]!r} in {PARAMS_FILE}, {saved[k]!r} in {RUN_FILE}" for k in given if given[k] != saved[k]]
    if differ:
        raise SetupError(
            f"{'; '.join(differ)} ({work}): 01-03 would show one and run the other. Fix: set it in 00_setup's "
            "parameters cell and re-run notebooks/00_setup.ipynb, which writes both (do not edit them by hand)"
        )


def _from_environment(env: Mapping[str, str], *, with_work_dir: bool) -> dict[str, Any]:
    """The KIT_* overrides; a path in one is relative to the shell's PWD (the kernel inherits it), not the kernel's
    cwd."""
    shell_dir = env.get("PWD") if env.get("PWD") and Path(env["PWD"]).is_dir() else None
    found: dict[str, Any] = {
        name: env_value(name, env[var]) for name, var in ENV.items() if env.get(var) and name not in PATH_PARAMETERS
    }
    for name, var in PATH_PARAMETERS.items():
        if env.get(var) and (with_work_dir or name != "work_dir"):
            found[name] = absolute_path(name, env[var], shell_dir)
    return found  # params() finds data_dir in either Kaggle mount layout


# -------------------------------------------------------------------------------------------------------- checks
def check_parameters(values: Mapping[str, Any], *, data_dir: Path | None = None) -> Params:
    """00's checks of ``values`` that need no data (``kaggle build``, before any file is written). ``data_dir``: a
    local copy of the competition, where a ``model_factory = "file.py:function"`` is imported; without one, 00 does."""
    check_names(values)
    get_preset(str(values.get("preset", DEFAULT_PRESET)))
    given = {k: v for k, v in values.items() if k not in ("data_dir", "work_dir")}
    for columns in COLUMNS:
        if isinstance(given.get(columns), str | list):
            given[columns] = _columns(given[columns])
    p = Params(data_dir=data_dir or Path("/kaggle/input"), work_dir=Path("/kaggle/working"), **given)
    metric = p.metric if isinstance(p.metric, str) else ""
    if metric and metric != "auto" and ":" not in metric and metric not in METRICS:
        raise SetupError(
            f"metric = {metric!r} is not one of {['auto', *METRICS]} and is not a 'file.py:function' or "
            "'module:function' of your own"
        )
    factory_file = p.model_factory.rpartition(":")[0].endswith(".py")  # as import_object reads it
    _check_values(p, with_task=data_dir is not None or not factory_file)
    return p


def check_names(values: Mapping[str, Any], *, allowed: set[str] | frozenset[str] = frozenset()) -> None:
    """Every name in ``values`` is a declared parameter (or in ``allowed``): an error lists the valid ones."""
    known = set(PARAMETERS)
    unknown = sorted(set(values) - known - allowed)
    if unknown:
        raise SetupError(f"unknown parameter(s) {unknown}: 00_setup's parameters are {sorted(known)}")


def env_value(name: str, text: str) -> Any:
    """The parameter ``name``'s value as its KIT_* variable ``text`` gives it: a switch's True/False, else the text."""
    if name not in SWITCHES:
        return text
    value = switch(text)
    if value is None:
        raise SetupError(
            f"{ENV[name]}={text!r} is neither on nor off: set it to 1 (or true, yes, on) or 0 (false, no, off)"
        )
    return value


def _columns(given: str | Sequence[str]) -> tuple[str, ...]:
    """A list of column names, or "a, b" (a KIT_* variable or a CLI value)."""
    return tuple(c.strip() for c in given.split(",") if c.strip()) if isinstance(given, str) else tuple(given)


def _check_values(p: Params, *, with_task: bool) -> None:
    """The parameters' own checks, no folder read, every independent mistake in one SetupError; ``with_task``: also
    the task's (it may import a data_dir file)."""
    hints = get_type_hints(Params)
    said = {name: _declared(p, name, hints[name]) for name in PARAMETERS if name not in ("data_dir", "work_dir")}
    problems, bad = list(said.values()), {name for name, problem in said.items() if problem}

    def task() -> None:
        workload = get_task(p.task)  # an unknown task, or a module:name that does not import
        if with_task:
            workload.check(p)  # columns it needs, a model_factory it imports
        _check_adapter(p)

    checks = {("task", "adapter", "model", "text", "target"): task,
              ("report_to",): lambda: check_report_to(p.report_to),
              ("hardware", "rehearse"): lambda: _check_hardware(p)}  # fmt: skip
    for reads, check in checks.items():
        if bad.intersection(reads):  # its values already named by their declaration: nothing sound to check
            continue
        try:
            check()
        except SetupError as err:
            problems.append(str(err))
    if problems := [problem for problem in problems if problem]:
        raise SetupError("; ".join(problems))


def _check_hardware(p: Params) -> None:
    if p.hardware:
        try:
            fake_profile(p.hardware)
        except ValueError as err:
            fix = "or '' (this machine), in the parameters cell (--hardware)"
            raise SetupError(f"hardware = {p.hardware!r}: {err}; {fix}") from None
    if p.rehearse and not p.hardware:
        raise SetupError(
            "rehearse = True rehearses the plan for another accelerator on this machine, but hardware = '' plans for "
            "this one: nothing to rehearse. Fix: set hardware (e.g. '2xT4'), or rehearse = False (unset KIT_REHEARSE)"
        )


def _declared(p: Params, name: str, hint: Any) -> str:
    """What is wrong with ``p``'s parameter ``name`` by its declaration (type, choices, least value), or ""."""
    f, value = PARAMETERS[name], getattr(p, name)
    wanted = "" if value is None and f.default is None else _wanted(value, hint, f)
    preset = " (or None: the preset's value)" if f.default is None else ""
    flag = f"--{name.replace('_', '-')}"
    return wanted and f"{name} = {value!r} is not {wanted}: fix {name} in the parameters cell ({flag}){preset}"


def _wanted(value: Any, hint: Any, f: dataclasses.Field[Any]) -> str:
    """What ``value`` should have been ("" when it is fine), by the declared type, choices and least value."""
    if get_origin(hint) is tuple:  # column names
        ok = not isinstance(value, str) and all(isinstance(c, str) and c for c in value)
        return "" if ok else "a list of column names (strings), e.g. ['price']"
    kind = next((t for t in get_args(hint) if t is not type(None)), hint)  # int | None -> int
    choices, least = f.metadata["choices"], f.metadata["least"]
    if choices:
        return "" if value in choices else f"one of {list(choices)}"
    if kind is bool:
        return "" if isinstance(value, bool) else "True or False"
    if isinstance(value, bool):
        return "a number" if kind in (int, float) else f"a {kind.__name__}"
    if kind is int:
        return "" if isinstance(value, int) and value >= (least or 0) else f"a whole number >= {least or 0}"
    if kind is float:
        # finite: an injected `lr = inf` is a NameError in the kernel (papermill writes float("inf"), we repr)
        return "" if isinstance(value, int | float) and 0 < value < math.inf else "a finite number > 0"
    return "" if isinstance(value, str) and (value or f.default == "") else "a non-empty string"


def _check_adapter(p: Params) -> None:
    entry = task_entry(p.task)
    if p.adapter == "none":
        return
    if not entry.model_kind:  # a model_factory's model, or a Task of one's own
        raise SetupError(
            f"adapter = {p.adapter!r} adapts the pretrained models kitlib builds, and task {p.task!r} builds its own. "
            "Fix: adapter = 'none' (add peft adapters inside your model_factory if you want them)"
        )
    generating = [name for name, e in TASKS.items() if e.generates and e.model_kind]
    if p.adapter == "qlora" and not entry.generates:
        raise SetupError(
            f"adapter = 'qlora' (4-bit weights) is offered for {' and '.join(generating)}, and task is "
            f"{p.task!r}. Fix: adapter = 'lora'"
        )


def check_work_dir(work: Path, data: Path) -> None:
    """A work_dir kitlib may write to (not the data, not read-only), checked before anything is created."""
    if work.resolve() == data.resolve():
        raise SetupError(
            f"work_dir is the data_dir ({work}): kitlib's files would mix with the competition's; {_WORK_DIR_FIX}"
        )
    _check_writable(work)


def _check_writable(work: Path) -> None:
    if work.exists() and not work.is_dir():
        raise SetupError(f"work_dir {work} is a file, not a folder: {_WORK_DIR_FIX}")
    existing = next(d for d in (work, *work.parents) if d.exists())
    if not os.access(existing, os.W_OK) or KAGGLE_INPUT in (work, *work.parents):
        raise SetupError(f"work_dir {work} is not writable ({existing} is read-only): {_WORK_DIR_FIX}")


# ------------------------------------------------------------------------------------------ Kaggle's read-only inputs
def kaggle_input(path: Path) -> Path:
    """``path``, or where Kaggle mounted it: a missing path of either mount layout (``/kaggle/input/<kind>/[<owner>/]
    <slug>``, older ``/kaggle/input/<slug>``) is looked up in the other."""
    if path.exists() or KAGGLE_INPUT not in path.parents:
        return path
    parts = path.relative_to(KAGGLE_INPUT).parts
    if parts[0] in _KAGGLE_KINDS:  # new layout -> old: competitions/<slug>, <kind>/<owner>/<slug>
        slug_at = 1 if parts[0] == "competitions" else 2
        candidates = [KAGGLE_INPUT.joinpath(*parts[slug_at:])] if len(parts) > slug_at else []
    else:  # old layout -> new
        rest = parts[1:]
        candidates = [
            KAGGLE_INPUT / "competitions" / parts[0] / Path(*rest),
            *(p / Path(*rest) for kind in _KAGGLE_KINDS[1:] for p in sorted(KAGGLE_INPUT.glob(f"{kind}/*/{parts[0]}"))),
        ]
    return next((c for c in candidates if c.exists()), path)


def carry_forward(inputs: Sequence[Path], work_dir: Path) -> list[str]:
    """Copy the earlier stages' ``HANDOFF`` files from read-only ``inputs`` into ``work_dir`` (later inputs win; an
    identical copy is kept, a different one kept aside, never deleted). Returns what was copied."""
    _check_inputs(inputs)
    copied = []
    for folder in inputs:
        folds = sorted(d.name for d in folder.glob(f"{RUN_NAME}-fold*"))  # 02's other fold runs, for 03
        for name in (*HANDOFF[:3], *folds, *HANDOFF[3:]):
            source, target = folder / name, work_dir / name
            if source.exists() and not _same(source, target):
                with explain_disk_full(target, "a copy of the earlier stage's"):
                    _replace_with_copy(source, target)
                copied.append(name)
    return copied


def _check_inputs(inputs: Sequence[Path]) -> None:
    for folder in inputs:
        if not folder.is_dir():
            raise MissingRunError(
                f"input {folder} does not exist: attach the earlier kernel's output to this one (kernel_sources) or "
                "fix inputs in the parameters cell"
            )


def _listing(path: Path) -> list[tuple[str, int, int]]:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return [(str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns) for p in files]


def _same(source: Path, target: Path) -> bool:
    if not target.exists() or source.is_dir() != target.is_dir():
        return False
    if source.is_file():
        return source.read_bytes() == target.read_bytes()
    return _listing(source) == _listing(target)  # copytree keeps sizes and mtimes


def _replace_with_copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    incoming = target.with_name(f".{target.name}.incoming")
    shutil.rmtree(incoming, ignore_errors=True)
    if source.is_file():
        shutil.copy2(source, incoming)
    else:
        shutil.copytree(source, incoming)
    if target.exists():
        keep_aside(target)
    incoming.rename(target)


def keep_aside(path: Path) -> Path:
    """Rename ``path`` to the first free ``<name>.prev``, ``<name>.prev-2``, ... beside it (nothing is overwritten)."""
    n = 1
    while (aside := path.with_name(f"{path.name}.prev" + (f"-{n}" if n > 1 else ""))).exists():
        n += 1
    path.rename(aside)
    return aside
