"""Imports sit at the top of a module, where a reader sees what it depends on. An import inside a function is kept
only when it loads a package the module declares lazy, with its measured cost, in a module-level comment:

    # lazy: torch (+1.5 s), pandas (+0.7 s): `import kitlib.notebook.stages` stays at 0.2 s

Read from the source: a function-level import passes when the third-party package it names, or one that the kitlib
module it names imports at its top (directly or through other kitlib modules), is declared in that comment and is
not already loaded by the module's own top-level imports (a declared ``kitlib.x`` covers the kitlib modules under
it: the CLI keeps each command's modules lazy for ``--help``). TYPE_CHECKING imports and optional imports (inside a
``try`` that catches ImportError) are free. Checked for every kitlib module.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "kitlib"
NOT_YET: tuple[str, ...] = ()
DECLARED = re.compile(r"([A-Za-z_][\w.]*) \(\+?[\d.]+ ?m?s\)")  # a name, then its cost: "torch (+1.5 s)"


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _is_optional(node: ast.AST) -> bool:
    """A ``try`` that catches ImportError: what it imports is optional, so it cannot sit unguarded at the top."""
    return isinstance(node, ast.Try) and any(
        h.type is not None and re.search(r"\b(ImportError|ModuleNotFoundError)\b", ast.unparse(h.type))
        for h in node.handlers
    )


def _targets(node: ast.Import | ast.ImportFrom, package: str, root: Path) -> list[str]:
    """The modules an import statement names (a kitlib ``from a import b`` names a.b when b is a module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
    if base.split(".")[0] != "kitlib":
        return [base]
    out = []
    for alias in node.names:
        candidate = root.parent.joinpath(*f"{base}.{alias.name}".split("."))
        is_module = candidate.with_suffix(".py").is_file() or (candidate / "__init__.py").is_file()
        out.append(f"{base}.{alias.name}" if is_module else base)
    return list(dict.fromkeys(out))  # `from m import a, b` names m once


class Module:
    def __init__(self, path: Path, root: Path) -> None:
        self.path, self.root = path, root
        self.name = _module_name(path, root)
        self.package = self.name if path.name == "__init__.py" else self.name.rpartition(".")[0]
        self.source = path.read_text()
        self.tree = ast.parse(self.source, filename=str(path))
        self.top: list[str] = []  # modules imported when this module is imported
        self.deferred: list[tuple[int, list[str]]] = []  # (line, modules) for imports inside functions
        self._walk(self.tree, in_function=False)

    def _walk(self, node: ast.AST, *, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                continue
            if isinstance(child, ast.Try) and _is_optional(child) and in_function:
                for handler in child.handlers:  # the try's own body is optional; what handles its failure is not
                    self._walk(handler, in_function=True)
                for block in (child.orelse, child.finalbody):
                    for statement in block:
                        self._walk(ast.Module(body=[statement], type_ignores=[]), in_function=True)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                if isinstance(child, ast.ImportFrom) and child.module == "__future__":
                    continue
                targets = _targets(child, self.package, self.root)
                if in_function:
                    self.deferred.append((child.lineno, targets))
                else:
                    self.top.extend(targets)
            function = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            self._walk(child, in_function=in_function or function)

    def declared(self) -> set[str]:
        """Names in the module's ``# lazy:`` comment block, each with its measured cost."""
        names: set[str] = set()
        block = False
        for line in self.source.splitlines():
            if line.startswith("# lazy:"):
                block = True
            elif not line.startswith("#"):
                block = False
            if block:
                names.update(DECLARED.findall(line))
        return names


def _third_party(module: str) -> str | None:
    top = module.split(".")[0]
    return None if top in sys.stdlib_module_names or top == "kitlib" else top


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def checker(root: Path) -> tuple[dict[str, Module], Callable[[str], list[str]]]:
    modules = {m.name: m for m in (Module(p, root) for p in sorted(root.rglob("*.py")))}

    @cache
    def loads(name: str) -> frozenset[str]:
        """Third-party packages, stdlib modules and kitlib modules that ``import <name>`` runs (top-level imports)."""
        seen: set[str] = set()
        todo = [name, *_parents(name)]
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            module = modules.get(current)
            if module is None:
                continue
            for target in module.top:
                todo.extend([target, *_parents(target)] if target.startswith("kitlib") else [target])
        return frozenset({p for s in seen if (p := _third_party(s))} | {s for s in seen if not _third_party(s)})

    def problems(name: str) -> list[str]:
        module = modules[name]
        declared = module.declared()
        already = loads(name)
        out = []
        for line, targets in module.deferred:
            for target in targets:
                third = _third_party(target)
                # what importing it runs (packages, stdlib and kitlib modules) that this module's imports have not run
                cost = {third} if third else set(loads(target)) if target.startswith("kitlib") else {target}
                new = cost - already
                if not any(n == d or n.startswith(f"{d}.") for n in new for d in declared):
                    why = f"it loads {sorted(new)}, not declared" if new else "it loads nothing the module lacks"
                    fix = "move it to the top, or declare the package in a `# lazy: pkg (+cost)` comment"
                    out.append(f"{module.path.name}:{line}: import of {target} inside a function ({why}): {fix}")
        return out

    return modules, problems


MODULES, PROBLEMS = checker(ROOT)


@pytest.mark.parametrize("name", sorted(n for n in MODULES if not n.startswith(NOT_YET)))
def test_imports_are_at_the_top_unless_declared_lazy(name: str) -> None:
    problems = PROBLEMS(name)
    assert not problems, "\n".join(problems)


def test_the_checker_sees_a_hidden_import(tmp_path: Path) -> None:
    """The rule can fail: a stdlib or light kitlib import inside a function is reported, and so are an undeclared
    or already-loaded package and an ImportError fallback; a declared package (also reached through a kitlib module),
    a declared stdlib module and an optional import are not."""
    fake = tmp_path / "kitlib"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "light.py").write_text("import json\n")
    (fake / "heavy.py").write_text("import torch\n")
    (fake / "mod.py").write_text(
        "import numpy\n"
        "# lazy: torch (+1.5 s), zipfile (+2 ms): the module stays at 0.1 s\n"
        "def f():\n"
        "    import json\n"  # 4: stdlib, free at the top
        "    from kitlib import light\n"  # 5: loads nothing new
        "    import torch\n"  # 6: declared
        "    from kitlib.heavy import x\n"  # 7: loads torch
        "    import pandas\n"  # 8: not declared
        "    import numpy\n"  # 9: already loaded
        "    try:\n        import peft\n"  # 11: optional
        "    except ImportError:\n        import csv\n"  # 13: the fallback is not optional
        "    if TYPE_CHECKING:\n        import sqlite3\n"
        "    import zipfile\n"  # 16: a declared stdlib module
    )
    (fake / "cli.py").write_text(
        "# lazy: kitlib.light (+0.01 s)\ndef g():\n    from kitlib import light\n    from kitlib import mod\n"
    )
    _, problems = checker(fake)
    assert [p.split(":")[1] for p in problems("kitlib.mod")] == ["4", "5", "8", "9", "13"], problems("kitlib.mod")
    assert [p.split(":")[1] for p in problems("kitlib.cli")] == ["4"], problems("kitlib.cli")  # mod: not declared


def test_the_light_modules_import_without_torch() -> None:
    """The split the rule leans on: the CLI's parser, 00/01's stages and the parameters import without torch,
    transformers or pandas (each loads them only in what runs); 02/03's module imports torch at its top."""
    heavy = ("torch", "transformers", "pandas")
    code = "import sys, {}; print(sorted(m for m in {} if m in sys.modules))"
    light = "kitlib.cli, kitlib.notebook.stages, kitlib.notebook.params, kitlib.notebook.widgets"
    run = [sys.executable, "-c", code.format(light, heavy)]
    assert subprocess.run(run, capture_output=True, text=True, check=True, timeout=120).stdout.strip() == "[]"
    run = [sys.executable, "-c", code.format("kitlib.notebook.training", heavy)]
    assert "torch" in subprocess.run(run, capture_output=True, text=True, check=True, timeout=120).stdout
