"""The layers are a rule, not a drawing: every import inside kitlib (deferred and TYPE_CHECKING ones too) is read
from the source and checked. A module may import its own layer or a lower one; data/ and engine/ never import each
other; no import cycle exists between modules; and ``import kitlib.<anything>`` never needs the public face."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "kitlib"

# Lowest first. A module's layer is its subpackage, or its own name for top-level modules.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"_version", "_files", "errors", "config", "progress"}),
    frozenset({"machine"}),
    frozenset({"models"}),
    frozenset({"data", "engine"}),  # siblings: neither may import the other
    frozenset({"tasks"}),  # the workloads: their targets, inputs, models and metrics, over data/engine/models
    frozenset({"doctor"}),
    frozenset({"notebook"}),
    frozenset({"cli", "__main__", "__init__"}),
)
SIBLINGS_APART = ("data", "engine")


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _room(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def _level(room: str) -> int:
    for level, rooms in enumerate(LAYERS):
        if room in rooms:
            return level
    raise AssertionError(f"kitlib.{room} is in no layer: add it to LAYERS in {Path(__file__).name}")


def _type_checking_lines(tree: ast.Module) -> set[int]:
    """Lines inside ``if TYPE_CHECKING:`` blocks: imports there never run."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _imports(path: Path, root: Path = ROOT, *, runtime_only: bool = False) -> Iterator[tuple[int, str]]:
    """(line, imported kitlib module) for every import statement, wherever it sits in the file (deferred ones too;
    ``runtime_only`` leaves out the TYPE_CHECKING ones)."""
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _type_checking_lines(tree) if runtime_only else set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "kitlib")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            if base.split(".")[0] != "kitlib":
                continue
            for alias in node.names:  # `from kitlib.engine import checkpoint` imports a module, not a name
                candidate = f"{base}.{alias.name}"
                yield node.lineno, candidate if _exists(candidate, root) else base


def _exists(module: str, root: Path) -> bool:
    path = root.parent.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}
# Cycles are about what runs: a TYPE_CHECKING import only names a type (its layer is still checked above).
EDGES = {name: sorted({m for _, m in _imports(path, runtime_only=True) if m != name}) for name, path in MODULES.items()}


def test_every_module_is_in_a_layer() -> None:
    for name in MODULES:
        _level(_room(name))


def _problems(name: str, path: Path, root: Path = ROOT) -> list[str]:
    room = _room(name)
    problems = []
    for line, target in _imports(path, root):
        other = _room(target)
        if other == room:
            continue
        if _level(other) > _level(room):
            problems.append(f"line {line}: {target} is in a higher layer than {name}")
        elif {room, other} == set(SIBLINGS_APART):
            problems.append(f"line {line}: {name} imports {target}; data/ and engine/ stay independent")
        elif target == "kitlib" and room != "__init__":
            problems.append(f"line {line}: {name} imports the public face; import the module that defines the name")
    return problems


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_go_down_or_sideways_never_up(name: str) -> None:
    problems = _problems(name, MODULES[name])
    assert not problems, "\n".join(problems)


def _cycle(edges: dict[str, list[str]]) -> list[str] | None:
    """One import cycle in ``edges`` (module -> modules it imports at run time), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in edges.get(module, []):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if state.get(target) is None and target in edges and (found := visit(target)):
                return found
        path.pop()
        state[module] = 2
        return None

    return next((c for m in sorted(edges) if m not in state and (c := visit(m))), None)


def test_no_import_cycles() -> None:
    cycle = _cycle(EDGES)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


# Type-only imports too: a TYPE_CHECKING import back into a module that imports this one is the same knot (data and
# behaviour in the wrong room), closed only for the interpreter. Checked room by room: across rooms the layer rule
# above already forbids a way back up, so a cycle can only close inside one room.
TYPED_EDGES = {name: sorted({m for _, m in _imports(path) if m != name}) for name, path in MODULES.items()}
ROOMS = sorted({_room(name) for name in MODULES})


@pytest.mark.parametrize("room", ROOMS)
def test_no_import_cycle_even_through_type_only_imports(room: str) -> None:
    inside = {n: [m for m in e if _room(m) == room] for n, e in TYPED_EDGES.items() if _room(n) == room}
    cycle = _cycle(inside)
    assert cycle is None, "import cycle (type-only imports included): " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_one() -> None:
    assert _cycle({"a": ["b"], "b": ["c"], "c": ["a"], "d": []}) == ["a", "b", "c", "a"]
    assert _cycle({"a": ["b"], "b": [], "c": ["a"]}) is None


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """The rule can fail: an upward import, a data -> engine import and a face import are each reported."""
    fake = tmp_path / "kitlib"
    for folder in ("data", "engine", "notebook"):
        (fake / folder).mkdir(parents=True)
        (fake / folder / "__init__.py").write_text("")
        (fake / folder / "mod.py").write_text("")
    (fake / "__init__.py").write_text("")
    bad = fake / "data" / "bad.py"
    bad.write_text(
        "from kitlib import fit\n"
        "def f():\n    from kitlib.notebook import mod\n    from .. engine.mod import x\n    from . import mod\n"
    )
    problems = _problems("kitlib.data.bad", bad, fake)
    assert [p.split(":")[0] for p in problems] == ["line 1", "line 3", "line 4"], problems


# Where a built-in task's name may be written in kitlib/: its own module, the registry and the parameters' doc (a test
# pins it to the registry). Its demo, which names it too, is the checkout's demos/<module>.py, outside the package.
# Everything else asks the registry (TASKS[name].model_kind, .generates, .demo), so a new task is its module, one
# registry line, its demo and its tests.
TASK_NAMES_MAY_APPEAR = ("notebook/tasks/",)


def test_no_task_name_is_hard_coded_outside_its_module_and_the_registry() -> None:
    from kitlib.notebook.tasks import TASKS

    names = [n for n in TASKS if "-" in n or n in ("seq2seq", "custom")]  # auto/classify/regress: target rules too
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        where = str(path.relative_to(ROOT))
        if where.startswith(TASK_NAMES_MAY_APPEAR) or where == "notebook/params.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                found.append(f"{where}:{node.lineno} {node.value!r}")
    assert not found, "task names outside their module and the registry (ask TASKS instead):\n" + "\n".join(found)


def test_the_package_never_imports_the_checkouts_demos() -> None:
    """kitlib's wheel holds kitlib/ alone: no module imports demos/ (the registry names each task's demo by a string
    that `python -m kitlib demo` resolves in the checkout), so nothing a notebook or a kernel runs needs it."""
    found = [
        f"{name}:{node.lineno}"
        for name, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "demos")
        or (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "demos" for a in node.names))
    ]
    assert not found, f"kitlib imports the checkout's demos: {found}"


def test_every_public_name_resolves_to_the_module_that_defines_it() -> None:
    """``kitlib.X`` is resolved lazily from ``_EXPORTS``: a move of X to another module must move its entry too."""
    import kitlib

    unresolved = [name for name in kitlib.__all__ if not hasattr(kitlib, name)]
    assert not unresolved, f"kitlib._EXPORTS names modules that no longer define: {unresolved}"
