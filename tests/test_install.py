"""scripts/install.sh settles torch first and never replaces a hosted image's torch.

pip is replaced by a recorder (KITLIB_PIP), so these tests see exactly what the script would ask pip for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

INSTALL = Path(__file__).resolve().parent.parent / "scripts" / "install.sh"
RECORDER = """
import json, sys
log, args = sys.argv[1], sys.argv[2:]
constraints = [open(args[i + 1]).read() for i, a in enumerate(args) if a == "-c"]
with open(log, "a") as f:
    f.write(json.dumps({"args": args, "constraints": constraints}) + "\\n")
"""
KAGGLE = {"KAGGLE_KERNEL_RUN_TYPE": "Interactive", "KAGGLE_URL_BASE": "https://www.kaggle.com"}
COLAB = {"COLAB_RELEASE_TAG": "release-colab_20261101-060000_RC00", "COLAB_GPU": "1"}


def _fake_torch(root: Path, version: str) -> Path:
    """A site folder whose importable torch reports ``version`` (a preinstalled build of another version)."""
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text(f"__version__ = {version!r}\n")
    return root


def _run(tmp_path: Path, env: dict[str, str], python_dir: Path | None = None) -> tuple[int, str, list[dict]]:
    log = tmp_path / "pip.log"
    recorder = tmp_path / "recorder.py"
    recorder.write_text(RECORDER)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KAGGLE_", "COLAB_", "KITLIB_", "PYTHONPATH"))}
    base["PATH"] = f"{python_dir or Path(sys.executable).parent}{os.pathsep}{base['PATH']}"
    proc = subprocess.run(
        ["bash", str(INSTALL)],
        env={**base, "KITLIB_PIP": f"{sys.executable} {recorder} {log}", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc.returncode, proc.stdout + proc.stderr, calls


def _asks_for_torch(calls: list[dict]) -> bool:
    return any(a.split("[")[0].split("=")[0].split("<")[0].split(">")[0] == "torch" for c in calls for a in c["args"])


@pytest.mark.parametrize("platform", [KAGGLE, COLAB], ids=["kaggle", "colab"])
def test_hosted_image_torch_of_another_version_is_kept_and_pinned(platform: dict[str, str], tmp_path: Path) -> None:
    site = _fake_torch(tmp_path / "site", "2.6.0+cu124")
    code, output, calls = _run(tmp_path, {**platform, "PYTHONPATH": str(site)})
    assert code == 0, output
    assert "keeping the installed torch 2.6.0+cu124" in output
    assert not _asks_for_torch(calls), calls
    project = next(c for c in calls if ".[notebook,kaggle,dev]" in c["args"])
    assert project["constraints"] == ["torch==2.6.0+cu124\n"]  # resolving the rest cannot swap torch


def test_importable_torch_is_kept_off_hosted_images_too(tmp_path: Path) -> None:
    site = _fake_torch(tmp_path / "site", "2.9.1")
    code, output, calls = _run(tmp_path, {"PYTHONPATH": str(site)})
    assert code == 0, output
    assert not _asks_for_torch(calls), calls


def test_too_old_torch_is_refused_with_the_fix_not_replaced(tmp_path: Path) -> None:
    site = _fake_torch(tmp_path / "site", "2.1.0+cu118")
    code, output, calls = _run(tmp_path, {**KAGGLE, "PYTHONPATH": str(site)})
    assert code == 2
    assert "needs torch >= 2.4" in output and "KITLIB_TORCH" in output
    assert calls == []


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python with no torch at all: a venv without system site-packages."""
    root = tmp_path_factory.mktemp("bare")
    venv.create(root, with_pip=False, symlinks=True)
    return root / "bin"


def test_bare_machine_installs_the_pinned_torch_first(tmp_path: Path, bare_python: Path) -> None:
    code, output, calls = _run(tmp_path, {}, python_dir=bare_python)
    assert code == 0, output
    assert calls[0]["args"] == ["torch==2.13.0"]
    assert ".[notebook,kaggle,dev]" in calls[1]["args"]


def test_hosted_image_without_torch_is_not_given_a_cpu_build(tmp_path: Path, bare_python: Path) -> None:
    code, output, calls = _run(tmp_path, KAGGLE, python_dir=bare_python)
    assert code == 2
    assert "no importable torch" in output and "KITLIB_TORCH=2.13.0" in output
    assert calls == []


def test_explicit_version_is_the_only_way_to_replace_torch(tmp_path: Path) -> None:
    site = _fake_torch(tmp_path / "site", "2.6.0+cu124")
    code, output, calls = _run(tmp_path, {**KAGGLE, "PYTHONPATH": str(site), "KITLIB_TORCH": "2.13.0"})
    assert code == 0, output
    assert calls[0]["args"] == ["torch==2.13.0"]
