"""``python -m kitlib``: the command line. Every argparse definition and printed line lives here (the ``kaggle``
command's in the checkout's kaggle/command.py); what imports torch a command imports when it runs, so ``--help``
loads none. A kitlib error prints as one line, exit 2."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import ModuleType
from typing import Any, get_args, get_origin, get_type_hints

from kitlib._version import __version__
from kitlib.config import Requested
from kitlib.data.cache import Cache
from kitlib.doctor.memory_plan import plan_memory, run_line
from kitlib.errors import KitError, PrecisionError, SetupError
from kitlib.machine.hardware import PROFILE_NAMES, detect, fake_profile
from kitlib.machine.precision import decide_precision
from kitlib.notebook import runbook  # runbook.run_notebooks by its module: tests stand a fake in for it
from kitlib.notebook.estimate import estimate_epoch_seconds
from kitlib.notebook.params import (  # the parser's flags derive from the declaration
    ENV,
    PARAMETERS,
    PARAMS_FILE,
    Params,
    check_names,
    check_parameters,
    check_work_dir,
    env_value,
    load_params,
)
from kitlib.notebook.presets import PRESETS, RUN_FILE
from kitlib.notebook.runbook import NOTEBOOKS, notebooks_dir, raised_warnings, strip_outputs
from kitlib.notebook.stages import outcome, resolve_run
from kitlib.notebook.tasks import TASKS
from kitlib.tasks.metrics import METRICS, import_object

# lazy: kitlib (+0.025 s): each command imports its kitlib modules that load torch, transformers or pandas
# (precision, doctor, training, scoring) and the checkout's demos and kernel tool when it runs. What is at the top
# (the parameters' declaration, the presets, the stages 00 and 01 run, the tasks' registry, numpy) imports none.


def _cmd_detect(args: argparse.Namespace) -> int:
    hw = detect()
    print(hw.summary())
    plan = decide_precision(hw, args.precision)  # a PrecisionError: main's one line naming the fix, exit 2
    print(f"precision: {plan.dtype} (tf32={plan.tf32}, grad scaler={plan.use_grad_scaler}) -- {plan.reason}")
    return 0


KERNEL_TOOL = "kitlib_kaggle_kernels"  # kaggle/kernels.py's name in sys.modules
COMMAND_TOOL = "kitlib_kaggle_command"  # kaggle/command.py's: the `kaggle` command's parser and body


def checkout(relative: str) -> Path:
    """A file of the kitlib checkout this kitlib runs from (demos/, kaggle/: not in the wheel); else a SetupError."""
    root = notebooks_dir().parent
    if not (root / "pyproject.toml").is_file() or not (root / relative).is_file():
        raise SetupError(
            f"no {relative} beside this kitlib ({root}): the demos and the Kaggle kernel tool are in kitlib's "
            "checkout, not in its wheel. Fix: run this from a clone of kitlib, installed with bash scripts/install.sh"
        )
    return root / relative


def kernel_tool(name: str = KERNEL_TOOL, relative: str = "kaggle/kernels.py") -> ModuleType:
    """A checkout's tool (kaggle/kernels.py by default), imported from its file once. Not by name: a folder kaggle/
    without __init__.py loses to the kaggle CLI's package, which the tool imports, and one with it would hide it."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, checkout(relative))
        assert spec is not None and spec.loader is not None  # a .py file always has a spec and a loader
        sys.modules[name] = module = importlib.util.module_from_spec(spec)  # its dataclasses look it up there
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]  # a failed import is not cached, as Python's own import does
            raise
    return sys.modules[name]


def _cmd_demo(args: argparse.Namespace) -> int:
    from kitlib.tasks.scoring import ABOUT_FILE

    if args.task not in TASKS:
        raise SetupError(f"--task {args.task!r}: no such task. Fix: one of {list(TASKS)}")
    root = str(checkout("demos/__init__.py").parent.parent)  # the registry names demos.<module>:<function>
    if root not in sys.path:  # a command typed outside the checkout
        sys.path.insert(0, root)
    make = import_object(TASKS[args.task].demo, "demo")
    # DemoDataMissing, or files of the user's in the folder: one line, exit 2
    paths = make(args.dir, seed=args.seed, test_fraction=args.test_fraction, force=args.force)
    for path in (paths.train, paths.test, paths.sample_submission, paths.solution, paths.root / ABOUT_FILE):
        print(path)
    if args.task != "auto":
        run = f"notebooks run --data-dir {args.dir} --work-dir WORK --params {args.dir}/{ABOUT_FILE}"
        print(f"run it: python -m kitlib {run}")
    return 0


def _cmd_score(args: argparse.Namespace) -> int:
    """Any competition: the target and id columns and the metric from the flags, else from a work dir's params.json
    and run.json (--work), else from a demo's demo.json beside the solution, else label / id / accuracy."""
    from kitlib.tasks.scoring import ABOUT_FILE, score

    found: dict[str, Any] = {"target": "label", "id": "id", "metric": "accuracy", "data_dir": None}
    about = Path(args.solution).with_name(ABOUT_FILE)
    if about.is_file():  # a demo: its metric, and the columns its parameters name
        demo = json.loads(about.read_text())
        found |= {k: v for k, v in demo.get("parameters", {}).items() if k in ("target", "id", "metric")}
        found |= {"metric": demo["metric"]} if "metric" in demo else {}
    if args.work_dir:  # the run that wrote the submission: its columns and the metric it trained for
        work = Path(args.work_dir)
        try:
            saved = json.loads((work / PARAMS_FILE).read_text())
            metric = json.loads((work / RUN_FILE).read_text())["metric"]
        except (OSError, ValueError, KeyError) as err:
            raise SetupError(
                f"--work-dir {work}: {err}. Fix: the work_dir 00_setup wrote, or --target/--metric"
            ) from None
        found |= {"target": saved.get("target", "label"), "id": saved.get("id", "id"), "metric": metric}
        found["data_dir"] = saved.get("data_dir") or None
    found |= {k: v for k in ("target", "id", "metric") if (v := getattr(args, k)) is not None}
    value, metric = score(args.solution, args.submission, **found), found["metric"]
    mode = METRICS[metric].mode if metric in METRICS else getattr(import_object(metric, "metric"), "mode", "max")
    better = "lower" if mode == "min" else "higher"
    print(f"{metric}: {value:.4f} ({better} is better; column {found['target']!r})")
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from kitlib.doctor.report import diagnose

    hw = fake_profile(args.hardware, interactive=False) if args.hardware else None
    try:
        report = diagnose(args.run_dir, hw)
    except (FileNotFoundError, ValueError) as err:
        print(f"doctor: {err}", file=sys.stderr)
        return 2
    print(report.to_json() if args.json else report)
    return 0


def _cmd_cache(args: argparse.Namespace) -> int:
    cache = Cache(args.dir, log=None)
    if args.action == "size":
        print(f"{len(cache.list())} entries, {cache.size_bytes() / 1e6:.1f} MB in {cache.dir}")
        return 0
    table = cache.list()
    if args.name is not None:
        table = table[table["name"] == args.name]
    if args.action == "list":
        print(table.drop(columns=["path"]).to_string(index=False) if len(table) else f"(no entries in {cache.dir})")
        return 0
    older = args.older_than_days * 86400 if args.older_than_days is not None else None
    if older is not None:
        table = table[table["created"] < datetime.now(timezone.utc) - timedelta(seconds=older)]
    if not len(table):
        print(f"nothing to clear in {cache.dir}")
        return 0
    what = f"{len(table)} entries ({table['size'].sum() / 1e6:.1f} MB) from {cache.dir}"
    if not args.yes:
        if not sys.stdin.isatty():
            print(f"refusing to delete {what} without --yes", file=sys.stderr)
            return 2
        if input(f"delete {what}? [y/N] ").strip().lower() not in ("y", "yes"):
            return 1
    print(f"deleted {cache.clear(older_than=older, name=args.name)} entries from {cache.dir}")
    return 0


def _cmd_presets(args: argparse.Namespace) -> int:
    """Every preset resolved for this machine (or a fake profile), with reasons; exit 2 when none is usable."""
    hw = fake_profile(args.hardware) if args.hardware else detect()
    p = Params(task=args.task, model=args.model)  # the preset as this task trains it, as 00's picker shows it
    kind = _model_kind(args.task)
    print(hw.summary() if args.hardware is None else f"profile {args.hardware} (fake)")
    resolved, errors = 0, set()
    for name in PRESETS:
        print(f"\n=== {name}")
        try:
            run = resolve_run(p, hw, preset=name)
        except PrecisionError as err:
            print("unusable here: same as above" if str(err) in errors else f"unusable here: {err}")
            errors.add(str(err))
            continue
        resolved += 1
        print(run.summary())
        print(f"memory: {args.model}, {run_line(args.model, kind, hw, run)}")
        if args.rows is not None:
            seconds = estimate_epoch_seconds(run, args.rows, hw)
            print(f"estimate: ~{seconds:.0f} s per epoch for {args.rows} rows (rough, +-2x)")
    return 0 if resolved else 2


def _model_kind(task: str) -> str:
    """The model a task trains, as the memory plan sizes it (the task's registry entry says)."""
    entry = TASKS.get(task)
    if entry is None or not entry.model_kind:
        sized = [name for name, e in TASKS.items() if e.model_kind]
        raise SetupError(f"--task {task!r}: the memory plan sizes the models of {sized}. Fix: one of those")
    return entry.model_kind


def _cmd_plan(args: argparse.Namespace) -> int:
    """The memory plan's table: every strategy's bytes, whether it fits, and the choice; exit 1 when nothing fits."""
    plan = plan_memory(
        args.model,
        hardware=args.hardware,
        seq_len=args.max_length,
        model_kind=_model_kind(args.task),
        effective_batch=args.effective_batch,
        micro_batch=args.micro_batch_size,
        accum=args.grad_accum_steps,
    )
    print(plan.table())
    return 0 if plan.choice is not None else 1


def _cmd_export_merged(args: argparse.Namespace) -> int:
    """03's model with its adapter merged in, as one model folder (kitlib.notebook.training.export_merged)."""
    from kitlib.notebook.training import export_merged

    export_merged(args.work_dir, args.out)
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    """02 of a work dir 00 and 01 prepared, in this process: under a launcher (torchrun, srun) one rank of the job,
    else as the notebook runs it (its own DDP workers where the plan has several GPUs). 03 runs after it unchanged."""
    from kitlib.notebook.training import train

    result = train(load_params(args.work_dir))
    if result.run_dir is not None and int(os.environ.get("RANK", "0")) == 0:
        print(f"{result.summary()}\nrun: {result.run_dir}")
    return 0 if result.stop_reason != "sigterm" else 3  # 3: stopped, last/ saved: the same command continues


def _parameters(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """00's parameters: an explicit flag > ``--params FILE`` (flat, or under "parameters") > 00's defaults; an
    unknown name is an error listing the valid ones. Prints what was set and where; returns (values, the file's folder
    when it holds the data, else None)."""

    values: dict[str, Any] = {}
    local = None
    if args.params:
        path = Path(args.params)
        try:
            given = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise SetupError(f"--params {path}: {err}. Fix: name a JSON file of 00's parameters") from None
        found = given.get("parameters", given) if isinstance(given, dict) else None
        if not isinstance(found, dict):
            raise SetupError(f'--params {path}: holds no object of 00\'s parameters, e.g. {{"preset": "fast"}}')
        try:
            check_names(found)
        except SetupError as err:
            raise SetupError(f"--params {path}: {err}") from None
        values |= found
        local = path.parent if (path.parent / values.get("train_file", "train.csv")).is_file() else None
    flags = {k: v for k in flag_names() if (v := getattr(args, k, None)) is not None}
    values |= flags
    if values:
        origin = {k: "flag" if k in flags else "file" for k in values}
        shown = ", ".join(f"{k}={v!r} ({origin[k]})" for k, v in values.items())
        print(f"parameters: {shown}; the rest: 00_setup's defaults")
    return values, local


def _cmd_notebooks(args: argparse.Namespace) -> int:

    source = Path(args.notebooks) if args.notebooks else notebooks_dir()
    if args.action == "strip":
        print(f"cleared {strip_outputs([source / n for n in NOTEBOOKS])} cell(s) in {source}")
        return 0
    problems: list[str] = []  # every independent mistake at once, each naming its flag
    try:
        values, _ = _parameters(args)
    except SetupError as err:  # the flags are still checked
        values, problems = {k: v for k in flag_names() if (v := getattr(args, k, None)) is not None}, [str(err)]
    problems += [
        f"{ENV[k]}={os.environ[ENV[k]]!r} vs {k}={v!r}: the kernel inherits the variable, which wins in 00. Fix: "
        "unset it"
        for k, v in ((k, str(values[k])) for k in ENV if k in values)
        if os.environ.get(ENV[k]) and str(env_value(k, os.environ[ENV[k]])) != v
    ]
    problems += [f"--{n.replace('_', '-')} DIR is missing" for n in ("data_dir", "work_dir") if not getattr(args, n)]
    if args.data_dir and not Path(args.data_dir).is_dir():
        problems.append(f"--data-dir {args.data_dir} is not a folder")
    checks: list[Callable[[], object]] = [lambda: check_parameters(values)]
    if args.data_dir and args.work_dir:  # before work/executed is created
        checks.append(lambda: check_work_dir(Path(args.work_dir).absolute(), Path(args.data_dir).absolute()))
    for check in checks:
        try:
            check()
        except SetupError as err:
            problems.append(str(err))
    if problems:
        raise SetupError("; ".join(problems))
    values |= {"data_dir": args.data_dir, "work_dir": args.work_dir}
    again = f"python -m kitlib {shlex.join(sys.argv[1:])}" if sys.argv[1:2] == ["notebooks"] else "the same command"
    done = runbook.run_notebooks(Path(args.work_dir) / "executed", parameters=values, source_dir=source, resume=again)
    for one in done:
        print(f"{one.path.name}: {one.seconds:.1f} s, {one.size_bytes / 1e3:.0f} kB executed")
    said = raised_warnings([one.path for one in done])
    print("\nresult:\n  " + "\n  ".join([*outcome(args.work_dir), f"warnings: {len(said) or 'none'}", *said]))
    return 0


def flag_names() -> tuple[str, ...]:
    """00's parameters a command line sets, beside --params FILE (data_dir and work_dir: --data-dir, --work-dir)."""
    return tuple(name for name in PARAMETERS if name not in ("data_dir", "work_dir"))


def _parameter_flags(p: argparse.ArgumentParser) -> None:
    """A flag per declared parameter (kitlib.notebook.params.Params), its help the declaration's; none has a default
    here, so an unset flag never hides --params FILE's value (00's parameters cell holds the defaults)."""
    hints = get_type_hints(Params)
    for name in flag_names():
        f, hint = PARAMETERS[name], hints[name]
        kind = next((t for t in get_args(hint) if t is not type(None)), hint)
        default = "the preset's" if f.default is None else repr(f.default)
        doc = f.metadata["doc"].replace("%", "%%")  # argparse formats help with %
        options: dict[str, Any] = {"help": f"{doc} (default: {default})", "default": None}
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif kind in (int, float):
            options["type"] = kind
        elif f.metadata["choices"]:  # checked by 00's rule (a kitlib error naming the fix), not argparse's
            options["help"] = f"{' | '.join(f.metadata['choices'])}: {options['help']}"
        elif get_origin(hint) is tuple:
            options["help"] += "; comma-separated"
        p.add_argument(f"--{name.replace('_', '-')}", **options)


# Argument types: a bad value stops at parsing (argparse's one line naming the flag, exit 2), before any work.
def _least(least: float, kind: type = int) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or value < least:
            raise argparse.ArgumentTypeError(f"{text!r}: give a {'whole ' if kind is int else ''}number >= {least}")
        return value

    return parse


def _fraction(text: str) -> float:
    value = _least(0.0, float)(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction between 0 and 1 (e.g. 0.2)")
    return float(value)


def _profile(text: str) -> str:
    try:
        fake_profile(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def _folder(text: str) -> str:
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a folder")
    return text


def _kaggle_args(p: argparse.ArgumentParser) -> None:
    try:  # the checkout's kaggle/command.py adds the actions and runs them
        kernel_tool(COMMAND_TOOL, "kaggle/command.py").add_arguments(p)
    except SetupError:  # from a wheel: _cmd_kaggle says the fix
        p.add_argument("rest", nargs=argparse.REMAINDER, help="the action and its flags (kitlib's checkout has them)")


def _cmd_kaggle(args: argparse.Namespace) -> int:
    kernel_tool()  # run from a wheel: the SetupError naming the fix
    return 2


PARAMS_HELP = (
    "a JSON file of 00's parameters (a demo's demo.json, your params.json); an explicit flag > the file > 00's "
    "defaults; an unknown name is an error"
)
HARDWARE = "a hardware profile (kitlib.machine.hardware), one of " + ", ".join(PROFILE_NAMES)
TASK = "one of " + " | ".join(TASKS)
BY_RUN = "(default: the --work-dir run's"
Row = tuple[str, str, dict[str, Any]] | Callable[[argparse.ArgumentParser], None]
# A command: (its help, what runs it, its arguments). An argument row: (its names, the one listed first, then old
# spellings that still parse, unlisted; its help; argparse's options), or a function that adds arguments.
COMMANDS: dict[str, tuple[str, Callable[[argparse.Namespace], int], tuple[Row, ...]]] = {
    "detect": ("show the platform, hardware and the precision kitlib would use, and why", _cmd_detect, (
        ("--precision", "what to ask for (auto: decided)", {"default": "auto", "choices": get_args(Requested)}),
    )),
    "doctor": ("where a run's time went, and ranked changes that would save the most", _cmd_doctor, (
        ("run_dir", "the run_dir given to fit() (holds timing.json and config.json)", {}),
        ("--hardware --profile", f"advise for {HARDWARE} (default: the run's)", {"type": _profile}),
        ("--json", "print the report as one JSON line", {"action": "store_true"}),
    )),
    "cache": ("list, size or clear the feature cache", _cmd_cache, (
        ("action", "list, size or clear the entries", {"choices": ["list", "size", "clear"]}),
        ("--dir", "cache directory (default: $KITLIB_CACHE_DIR, Kaggle working dir, ./)", {}),
        ("--name", "only entries of this feature name, e.g. tokens", {}),
        ("--older-than-days", "clear: only entries older than this", {"type": _least(0.0, float)}),
        ("--yes", "clear without asking (required when not interactive)", {"action": "store_true"}),
    )),
    "demo": ("write the offline demo competition (Rotten Tomatoes reviews, split by movie)", _cmd_demo, (
        ("dir", "folder for train.csv, test.csv, sample_submission.csv, solution.csv", {}),
        ("--seed", "seeds the split and the sampled rows", {"type": _least(0), "default": 0}),
        ("--test-fraction", "share of the rows held out as test.csv", {"type": _fraction, "default": 0.2}),
        ("--force", "overwrite a folder that holds other files", {"action": "store_true"}),
        ("--task", f"the task whose demo competition to write: {TASK}", {"default": "auto"}),
    )),
    "score": ("score a submission against a solution file (any competition, or a demo's)", _cmd_score, (
        ("solution", "the held-out answers: the id and target columns", {}),
        ("submission", "the predictions: the id and target columns (submission.csv)", {}),
        ("--target", f"the scored column {BY_RUN}, a demo's, else label)", {}),
        ("--id", f"the id column {BY_RUN}, else id)", {}),
        ("--metric", f"{' | '.join(METRICS)} | module:function {BY_RUN}, a demo's, else accuracy)", {}),
        ("--work-dir --work", "a work_dir of the notebooks: its params.json and run.json give defaults", {}),
    )),
    "presets": ("show each preset resolved for this (or a named) machine, with the reasons", _cmd_presets, (
        ("--hardware --profile", f"resolve for {HARDWARE} (default: this one)", {"type": _profile}),
        ("--rows", "training rows, for a rough time-per-epoch estimate", {"type": _least(1)}),
        ("--model", "for the memory line: a model folder, config.json or known name", {"default": "auto"}),
        ("--task", f"for the memory line: {TASK}", {"default": "classify"}),
    )),
    "plan": ("memory plan: bytes per training strategy for a model, task and GPU; what fits", _cmd_plan, (
        ("--model", "a config.json, a model folder, or llama-7b, gpt2, t5-small, minilm", {"required": True}),
        ("--hardware", HARDWARE, {"type": _profile, "default": "T4"}),
        ("--max-length --seq-len", "tokens per row (seq2seq: source and target each)",
         {"type": _least(1), "default": 512}),
        ("--task", TASK, {"default": "classify"}),
        ("--effective-batch", "rows per optimizer step to keep", {"type": _least(1), "default": 32}),
        ("--micro-batch-size --micro-batch", "rows per forward (default: the largest that fits)", {"type": _least(1)}),
        ("--grad-accum-steps --accum", "accumulation steps (default: effective batch / micro-batch size)",
         {"type": _least(1)}),
    )),
    "export-merged": ("a LoRA run's model with the adapter merged in, as one model folder", _cmd_export_merged, (
        ("work_dir", "the notebooks' working dir (params.json, run/best/)", {}),
        ("out", "the folder to write (config.json, model.safetensors, the tokenizer's files)", {}),
    )),
    "kaggle": ("Kaggle kernels: build folders, offline wheels, push, status, output", _cmd_kaggle, (_kaggle_args,)),
    "train": ("02's training of a prepared work dir; under torchrun/srun one rank of the job", _cmd_train, (
        ("--work-dir", "the working dir 00 and 01 prepared (params.json)", {"required": True, "type": _folder}),
    )),
    "notebooks": ("run the four notebooks headless in order, or strip their outputs", _cmd_notebooks, (
        ("action", "run them headless, or strip their outputs", {"choices": ["run", "strip"]}),
        ("--data-dir --data", f"00's data_dir: {PARAMETERS['data_dir'].metadata['doc']}", {}),
        ("--work-dir --work", f"00's work_dir: {PARAMETERS['work_dir'].metadata['doc']}, executed/", {}),
        _parameter_flags,
        ("--params", PARAMS_HELP, {}),
        ("--notebooks", "folder of the notebooks (default: the repo's notebooks/)", {"type": _folder}),
    )),
}  # fmt: skip


def add_rows(p: argparse.ArgumentParser, rows: Sequence[Row]) -> None:
    """The arguments of table ``rows`` (COMMANDS' third member; the ``kaggle`` command's actions use it too)."""
    for row in rows:
        if callable(row):
            row(p)
            continue
        (name, *old), text, options = row[0].split(), row[1], row[2]
        dest = p.add_argument(name, help=text, **options).dest
        for spelling in old:
            p.add_argument(spelling, dest=dest, type=options.get("type", str), default=argparse.SUPPRESS,
                           help=argparse.SUPPRESS)  # fmt: skip


class _Parser(argparse.ArgumentParser):
    problems: list[str]  # the independent mistakes of one command line (bad values, missing flags), said together


def _collect(parser: argparse.ArgumentParser, problems: list[str]) -> None:
    """Each argument of ``parser`` (and of its subcommands) notes a bad value in ``problems`` instead of exiting on
    it, and a required flag is checked after parsing (``main``): a missing one is said beside the other mistakes."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _collect(child, problems)
        elif action.type or action.choices:
            kind, allowed, flag = action.type or str, action.choices, "/".join(action.option_strings) or action.dest

            def parse(text: str, kind: Any = kind, allowed: Any = allowed, flag: str = flag) -> Any:
                try:
                    value = kind(text)
                    if allowed is None or value in allowed:
                        return value
                    why = f"invalid choice: {text!r} (choose from {', '.join(allowed)})"
                except argparse.ArgumentTypeError as err:
                    why = str(err)
                except (TypeError, ValueError):  # int or float, as argparse says it
                    why = f"invalid {getattr(kind, '__name__', repr(kind))} value: {text!r}"
                problems.append(f"argument {flag}: {why}")

            listed = None if allowed is None else "{" + ",".join(map(str, allowed)) + "}"  # argparse's own listing
            action.type, action.choices, action.metavar = parse, None, action.metavar or listed
        if action.required and action.option_strings:
            action.required, action.default, action.help = False, _MISSING, f"{action.help} (required)"


_MISSING: Any = object()  # a required flag's value until given (not a str: argparse would parse it as given)


def build_parser() -> _Parser:
    """The CLI's parser, for ``main``: a bad value is collected in ``problems`` (main reports them all), not raised."""
    parser = _Parser(prog="python -m kitlib", description="kitlib: fast, painless notebook training.")
    parser.add_argument("--version", action="version", version=f"kitlib {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command, (about, run, rows) in COMMANDS.items():
        p = sub.add_parser(command, help=about)
        p.set_defaults(func=run, parser=p)  # before the rows: a kaggle action's own parser replaces the command's
        add_rows(p, rows)
    parser.problems = []
    _collect(parser, parser.problems)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    own = getattr(args, "parser", parser)  # the subcommand's parser: its usage lists its flags
    missing = [f"the following arguments are required: {'/'.join(a.option_strings)}" for a in own._actions
               if getattr(args, a.dest, None) is _MISSING]  # fmt: skip
    problems = [*parser.problems, *missing, *([f"unrecognized arguments: {' '.join(unknown)}"] if unknown else [])]
    if problems:  # every independent mistake at once
        own.error("; ".join(problems))
    if not hasattr(args, "func"):
        parser.print_help()
        return 0
    try:
        result: int = args.func(args)
    except KitError as err:  # names the problem and the fix: a traceback would only bury it
        print(f"{args.command}: {err}", file=sys.stderr)
        return 2
    return result
