"""Each parameter is declared once (kitlib.notebook.params.Params): every entry point derives from it, and a
non-default value given through any of them is what the run records."""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from kitlib import cli
from kitlib.errors import SetupError
from kitlib.notebook import params as params_module
from kitlib.notebook import stages
from kitlib.notebook.params import PARAMETERS, TRAINING
from kitlib.notebook.runbook import notebooks_dir
from kitlib.tasks.metrics import METRICS

NOT_PARAMETERS = {"wheels_dir"}  # 00's install cell reads it before kitlib is importable

# A non-default value for every declared parameter, consistent with each other. model_factory needs a custom task,
# so it rides in a second set.
GIVEN: dict[str, Any] = {
    "preset": "smoke", "model": "tiny", "text": "review", "target": "y", "task": "classify", "metric": "macro_f1",
    "objective": "mae", "numeric": ["n1"], "categorical": ["c1"], "id": "row", "seed": 7, "train_file": "tr.csv",
    "test_file": "te.csv", "sample_submission": "ss.csv", "folds": 2, "group_column": "c1",
    "hardware": "2xT4", "rehearse": True, "time_budget": 2.5, "inference_limit": 3.0, "strategy": "fsdp",
    "report_to": "tensorboard", "epochs": 2,
    "micro_batch_size": 4, "grad_accum_steps": 3, "lr": 0.002, "max_length": 24, "full_eval_every": 0,
    "adapter": "lora", "optimizer": "adamw8bit", "gradient_checkpointing": True, "compile": True,
}  # fmt: skip
CUSTOM: dict[str, Any] = {"task": "custom", "preset": "smoke", "text": "review", "target": "y", "id": "row",
                          "train_file": "tr.csv", "test_file": "te.csv", "sample_submission": "ss.csv"}  # fmt: skip


def _competition(folder: Path) -> Path:
    folder.mkdir(parents=True)
    rows = pd.DataFrame({"row": range(60), "review": [f"a {'good' if i % 2 else 'bad'} film" for i in range(60)]})
    rows = rows.assign(n1=range(60), c1=["a", "b", "c"] * 20)
    rows.assign(y=[i % 2 for i in range(60)]).iloc[:50].to_csv(folder / "tr.csv", index=False)
    rows.iloc[50:].to_csv(folder / "te.csv", index=False)
    rows.iloc[50:][["row"]].assign(y=0).to_csv(folder / "ss.csv", index=False)
    (folder / "net.py").write_text(
        "import torch\n\ndef make(vocab_size, num_labels, **_):\n"
        "    return torch.nn.Sequential(torch.nn.EmbeddingBag(vocab_size, 8), torch.nn.Linear(8, num_labels))\n"
    )
    return folder


def _cell(nb_path: Path) -> str:
    nb = json.loads(nb_path.read_text())
    return "".join(next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))["source"])


def test_00s_parameters_cell_holds_every_declared_parameter_with_its_default() -> None:
    assigned = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in ast.parse(_cell(notebooks_dir() / "00_setup.ipynb")).body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
    }
    assert set(assigned) - NOT_PARAMETERS == set(PARAMETERS)
    for name, f in PARAMETERS.items():
        assert assigned[name] == _shown(f.default), name


CELL_HEADER = (
    '# Parameters (papermill-style: tagged "parameters"), the only full set: 01-03 read them from params.json.',
    "# Rendered from kitlib.notebook.params.Params (a test checks it): a KIT_* variable named beside one overrides it.",
    "# Headless: python -m kitlib notebooks run --params FILE sets them too (explicit flags > the file > these "
    "defaults).",
)
WHEELS_DOC = 'where kitlib\'s wheels are when it is not installed (a Kaggle dataset); "" = look in /kaggle/input'
WHEELS_LINE = f'wheels_dir = ""  # {WHEELS_DOC}'


def _shown(default: Any) -> Any:
    return str(default) if isinstance(default, Path) else list(default) if isinstance(default, tuple) else default


def parameters_cell() -> str:
    """00's parameters cell, rendered from the declaration: each name, its default and its doc as the comment."""
    lines = list(CELL_HEADER)
    for name, f in PARAMETERS.items():
        meta, value = f.metadata, _shown(f.default)
        missing = [c for c in meta["choices"] if c not in meta["doc"]]
        comment = meta["doc"] + (f": {' | '.join(meta['choices'])}" if missing else "")
        comment += f" ({meta['env']})" if meta["env"] else ""
        shown = json.dumps(value) if isinstance(value, str) else repr(value)
        lines.append(f"{name} = {shown}  # {comment}")
    return "\n".join([*lines, WHEELS_LINE])


def test_00s_parameters_cell_is_the_declarations_rendering() -> None:
    """Names, defaults and comments: a doc changed in the declaration changes the cell (fails on a cell whose task
    comment lacks custom-seq2seq)."""
    shown = _cell(notebooks_dir() / "00_setup.ipynb")
    assert shown == parameters_cell(), "paste this as 00_setup's parameters cell:\n" + parameters_cell()


def test_every_parameter_that_may_be_none_says_what_none_means() -> None:
    unsaid = [name for name, f in PARAMETERS.items() if f.default is None and "None:" not in f.metadata["doc"]]
    assert not unsaid, f"say what None means in the doc of {unsaid}"


def test_each_command_has_one_flag_per_declared_parameter_with_its_doc() -> None:
    parser = cli.build_parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for command in (commands["notebooks"], commands["kaggle"]._subparsers._group_actions[0].choices["build"]):
        flags = {a.dest: a for a in command._actions}
        for name in cli.flag_names():
            assert name in flags, name
            assert PARAMETERS[name].metadata["doc"].replace("%", "%%") in (flags[name].help or ""), name
    assert set(cli.flag_names()) == set(PARAMETERS) - {"data_dir", "work_dir"}
    assert all(f.metadata["doc"] for f in PARAMETERS.values())  # every parameter says what it does


def test_the_open_parameters_docs_list_every_registered_name() -> None:
    from kitlib.notebook.tasks import TASKS
    from kitlib.tasks.metrics import METRICS

    assert all(name in PARAMETERS["task"].metadata["doc"] for name in TASKS)
    assert all(name in PARAMETERS["metric"].metadata["doc"] for name in METRICS)


def test_an_undeclared_name_is_an_error_listing_the_declared_ones() -> None:
    with pytest.raises(SetupError, match=r"unknown parameter\(s\) \['optimiser'\]: .*'optimizer'"):
        params_module.check_parameters({"optimiser": "adamw8bit"})


def _through_the_cell(values: dict[str, Any], data: Path, work: Path) -> params_module.Params:
    """As papermill/nbconvert run 00: the parameters cell, the injected cell after it, then 00's call."""
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    nb = parameterize_notebook(load_notebook_node(str(notebooks_dir() / "00_setup.ipynb")), values)
    namespace: dict[str, Any] = {}
    for cell in nb["cells"]:
        tags = cell["metadata"].get("tags", [])
        if "parameters" in tags or "injected-parameters" in tags:
            exec("".join(cell["source"]), namespace)
    call = next("".join(c["source"]) for c in nb["cells"] if "stages.from_cell" in "".join(c["source"]))
    exec(call.replace("globals()", "namespace"), {"namespace": namespace, "kitlib": None, "stages": stages})
    return stages.from_cell(namespace)


def _through_flags(values: dict[str, Any], data: Path, work: Path, tmp: Path) -> params_module.Params:
    flags = []
    for name, value in values.items():
        flag = f"--{name.replace('_', '-')}"
        if isinstance(value, bool):
            flags += [flag if value else f"--no-{flag[2:]}"]
        else:
            flags += [flag, ",".join(value) if isinstance(value, list) else str(value)]
    args = cli.build_parser().parse_args(["notebooks", "run", "--data", str(data), "--work", str(work), *flags])
    parsed, _ = cli._parameters(args)
    return stages.params(environ={}, data_dir=data, work_dir=work, **parsed)


def _through_a_params_file(values: dict[str, Any], data: Path, work: Path, tmp: Path) -> params_module.Params:
    (tmp / "given.json").write_text(json.dumps(values))
    args = cli.build_parser().parse_args(
        ["notebooks", "run", "--data", str(data), "--work", str(work), "--params", str(tmp / "given.json")]
    )
    parsed, _ = cli._parameters(args)
    return stages.params(environ={}, data_dir=data, work_dir=work, **parsed)


def _through_kaggle_build(values: dict[str, Any], data: Path, work: Path, tmp: Path) -> params_module.Params:
    (tmp / "given.json").write_text(json.dumps(values))
    out = tmp / "kernels"
    args = ["kaggle", "build", "--username", "me", "--competition", "c", "--out", str(out)]
    assert cli.main([*args, "--wheels-dataset", "me/w", "--params", str(tmp / "given.json")]) == 0
    namespace: dict[str, Any] = {}
    exec(_cell(next(out.glob("00*/*.ipynb"))), namespace)  # the built kernel's own cell, as Kaggle runs it
    namespace |= {"data_dir": str(data), "work_dir": str(work)}  # the mounts, as they are on Kaggle
    return stages.from_cell(namespace)


ENTRY_POINTS = {
    "cell": lambda v, d, w, t: _through_the_cell(v | {"data_dir": str(d), "work_dir": str(w)}, d, w),
    "flag": _through_flags,
    "params-file": _through_a_params_file,
    "kaggle-build": _through_kaggle_build,
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_non_default_value_of_every_parameter_reaches_the_run_record(entry: str, tmp_path: Path, cpu_hw) -> None:
    """Fails on a main whose 00 cell dropped ``optimizer``: the run trained plain AdamW while the CLI echoed 8-bit."""
    assert set(GIVEN) | set(CUSTOM) | {"model_factory", "data_dir", "work_dir"} == set(PARAMETERS)
    data = _competition(tmp_path / "data")
    for i, values in enumerate((GIVEN, CUSTOM | {"model_factory": str(data / "net.py") + ":make"})):
        work = tmp_path / f"work{i}"
        p = ENTRY_POINTS[entry](values, data, work, tmp_path)
        choice = stages.setup(p, cpu_hw)  # run.json: what 01 resolves, as 01 resolves it
        run = stages.resolve_run(p, cpu_hw, preset=choice.preset, overrides=choice.overrides)
        saved = stages.load_params(work, environ={})  # what 01-03 read back (params.json)
        for name, value in values.items():
            got = getattr(saved, name)
            assert (list(got) if isinstance(got, tuple) else got) == value, (entry, name)
        for name in TRAINING:  # the resolved run that 02 trains by (features.json's config)
            if name in values:
                assert getattr(run.config, name) == values[name], (entry, name)
        assert json.loads((work / "run.json").read_text())["overrides"].get("optimizer") == values.get("optimizer")
        assert run.config.optimizer == values.get("optimizer", "adamw")


STAGES = {"00": "00 setup", "01": "01 features", "02": "02 train", "03": "03 infer"}


def parameters_table() -> str:
    """The README's parameter table, rendered from the declaration (the README holds this text between markers)."""
    rows = ["| parameter | default | allowed | what it does | first read by |", "| --- | --- | --- | --- | --- |"]
    for name, f in PARAMETERS.items():
        meta = f.metadata
        value = str(f.default) if isinstance(f.default, Path) else list(f.default) if f.default == () else f.default
        default = f"`{value!r}`"  # None: the doc says what it means
        allowed = " \\| ".join(f"`{c}`" for c in meta["choices"]) or (
            f">= {meta['least']}" if meta["least"] is not None else ""
        )
        what = (meta["doc"] or "").replace("|", "\\|") + (f" (`{meta['env']}`)" if meta["env"] else "")
        rows.append(f"| `{name}` | {default} | {allowed} | {what} | {STAGES[meta['stage']]} |")
    return "\n".join(rows) + "\n"


def test_the_readmes_parameter_table_is_the_declarations() -> None:
    readme = (notebooks_dir().parent / "README.md").read_text()
    begin, end = "<!-- parameters: begin -->\n", "<!-- parameters: end -->"
    assert begin in readme and end in readme
    shown = readme.split(begin, 1)[1].split(end, 1)[0]
    assert shown == parameters_table(), "paste this table into the README:\n" + parameters_table()


def test_the_tasks_view_of_the_parameters_is_the_declarations() -> None:
    """tasks.base.Params is derived: exactly the parameters the tasks read (``p.<name>`` in notebook/tasks/), each
    with its declared type. (A type-only import of the declaration would close a cycle: params imports the tasks.)"""
    from typing import get_type_hints

    from kitlib.notebook.tasks import base

    sources = Path(base.__file__).parent.glob("*.py")
    nodes = [n for f in sources for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.Attribute)]
    read = {n.attr for n in nodes if isinstance(n.value, ast.Name) and n.value.id == "p"}
    declared = get_type_hints(params_module.Params)
    view = {n: get_type_hints(v.fget)["return"] for n, v in vars(base.Params).items() if isinstance(v, property)}
    assert view == {n: declared[n] for n in sorted(read)}, "tasks.base.Params must list what the tasks read"


def test_the_command_line_has_one_name_per_concept_and_help_on_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """The declaration's names (--data-dir, --hardware, --max-length...; an old spelling parses, unlisted), help on
    every flag, and a mistake said by the subcommand's parser (fails on main: --profile, --seq-len, bare flags)."""
    commands = cli.build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    parsers = [*commands.values(), *commands["kaggle"]._subparsers._group_actions[0].choices.values()]
    listed = {o for p in parsers for a in p._actions if a.help != argparse.SUPPRESS for o in a.option_strings}
    assert not listed & {"--data", "--work", "--profile", "--seq-len", "--micro-batch", "--accum", "--dest"}
    bare = [f"{p.prog} {a.dest}" for p in parsers for a in p._actions if not a.help and a.dest != "help"]
    assert not bare, f"flags without help: {bare}"
    assert all(name in commands["score"].format_help().replace("\n", " ") for name in METRICS)
    with pytest.raises(SystemExit):
        cli.main(["plan", "--model", "gpt2", "--bogus"])
    assert "python -m kitlib plan: error: unrecognized arguments: --bogus" in capsys.readouterr().err
