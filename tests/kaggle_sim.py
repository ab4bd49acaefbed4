"""A local Kaggle for generated kernels: each kernel runs in its own mount and network namespace, where

- ``/kaggle/input/<kind>/...`` holds its attached sources as read-only bind mounts, in the current layout
  (``competitions/<slug>``, ``datasets/<owner>/<slug>``, ``notebooks/<owner>/<slug>``) or the older one
  (``/kaggle/input/<slug>``), chosen per run;
- ``/kaggle/working`` is the kernel's own output folder (the next kernel's ``kernel_sources`` mount);
- there is no network (a fresh network namespace: loopback only, for the Jupyter kernel's sockets);
- ``KAGGLE_KERNEL_RUN_TYPE=Batch``, as for a pushed kernel, and the notebook is executed top to bottom headless;
- the Python "image" has torch, transformers and the rest, but not kitlib: a fresh copy of a venv whose
  site-packages links every package of this interpreter's except kitlib, so the kernel must install it from the
  attached wheels dataset, as on Kaggle.

Needs root with CAP_SYS_ADMIN (``unshare -m -n``, bind mounts, chroot); ``available()`` says why not otherwise.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Layout = Literal["current", "old"]


def available() -> str | None:
    """None when this machine can run the simulation, else the reason it cannot."""
    if sys.platform != "linux" or shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs Linux with unshare and ip"
    probe = "d=$(mktemp -d) && mount -t tmpfs none $d && umount $d && rmdir $d && ip link set lo up"
    done = subprocess.run(["unshare", "-m", "-n", "bash", "-c", probe], capture_output=True, text=True)
    return None if done.returncode == 0 else f"no mount/network namespaces here: {done.stderr.strip()}"


def make_image(root: Path) -> Path:
    """A venv (with pip) whose packages are this interpreter's, minus kitlib: Kaggle's image before the install."""
    site = Path(sysconfig.get_paths()["purelib"])
    packages = root / "image-site-packages"
    packages.mkdir(parents=True)
    for entry in site.iterdir():
        if "kitlib" not in entry.name.lower():  # the package, its dist-info, its editable finder and .pth
            (packages / entry.name).symlink_to(entry)
    venv = root / "image"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    (Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"]) / "image.pth").write_text(
        f"import site; site.addsitedir({str(packages)!r})\n"  # .pth files there run too (setuptools' shim)
    )
    return venv


def build_wheels(project: Path, out: Path) -> Path:
    """kitlib's wheel, as `python -m kitlib kaggle wheels` builds it (the rest of the image is already there)."""
    out.mkdir(parents=True)
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out)]
    # setuptools builds in the checkout's build/ folder: two test processes building at once collided there
    # ("File exists: build/bdist.linux-x86_64/wheel/kitlib-0.1.0.dist-info"), so one builds at a time
    lock = Path(tempfile.gettempdir()) / f"kitlib-wheel-{hashlib.sha1(str(project).encode()).hexdigest()[:12]}.lock"
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        subprocess.run([*command, str(project)], check=True)
    return out


@dataclass(frozen=True)
class KernelRun:
    working: Path  # /kaggle/working after the run: the kernel's output
    venv: Path  # the kernel's copy of the image, with what the kernel installed
    executed: Path  # the executed notebook (outputs and, on failure, the traceback)
    returncode: int
    log: str


def run_kernel(
    folder: Path,
    *,
    sources: Mapping[str, Path],
    outputs: Path,
    image: Path,
    scratch: Path,
    layout: Layout = "current",
    timeout_s: int = 900,
    env: Mapping[str, str] | None = None,
    colab_drive: Path | None = None,
) -> KernelRun:
    """Run the kernel in ``folder`` (kernel-metadata.json + notebook) as Kaggle would run a pushed version.

    ``sources`` maps competition slugs, dataset ids and model ids (with their version) to host folders; kernel
    sources are the earlier kernels' outputs, ``outputs/<slug>``. The kernel's own output goes to
    ``outputs/<its slug>``. ``env``: more variables for the kernel (e.g. KIT_REHEARSE=1), as a user's own runner would
    set them.

    ``colab_drive``: run the notebook as Colab's kernel instead: no /kaggle, no KAGGLE_* variables, a google.colab
    module whose ``drive.mount`` links this folder (holding ``MyDrive/``) at the mount point.
    """
    meta = json.loads((folder / "kernel-metadata.json").read_text())
    slug = meta["id"].split("/")[1]
    working = outputs / slug
    shutil.rmtree(working, ignore_errors=True)
    working.mkdir(parents=True)
    mounts: list[tuple[Path, str]] = []
    if colab_drive is not None:
        meta = {**meta, "competition_sources": [], "dataset_sources": [], "kernel_sources": []}
        working = colab_drive / "MyDrive" / "kitlib-work"
    for comp in meta.get("competition_sources", []):
        mounts.append((sources[comp], f"competitions/{comp}" if layout == "current" else comp))
    for dataset in meta.get("dataset_sources", []):
        mounts.append((sources[dataset], f"datasets/{dataset}" if layout == "current" else dataset.split("/")[1]))
    for model in meta.get("model_sources", []):  # owner/model/framework/variation/version
        mounts.append((sources[model], f"models/{model}" if layout == "current" else model.split("/", 1)[1]))
    for kernel in meta.get("kernel_sources", []):
        earlier = outputs / kernel.split("/")[1]
        mounts.append((earlier, f"notebooks/{kernel}" if layout == "current" else kernel.split("/")[1]))
    venv = scratch / f"venv-{slug}"
    shutil.rmtree(venv, ignore_errors=True)
    shutil.copytree(image, venv, symlinks=True)  # every kernel starts from the same image
    executed = scratch / f"executed-{slug}"
    home = scratch / f"home-{slug}"
    home.mkdir(parents=True, exist_ok=True)
    q = shlex.quote
    lines = [
        "set -euo pipefail",
        "R=$(mktemp -d)",
        'mount -t tmpfs none "$R"',
        'for d in /*; do [ -d "$d" ] || continue; mkdir -p "$R$d"; mount --rbind "$d" "$R$d"; done',
        'mkdir -p "$R/kaggle/working" "$R/kaggle/src"',
        f'mount --bind {q(str(working))} "$R/kaggle/working"' if colab_drive is None else 'rmdir "$R/kaggle/working"',
        f'mount --bind {q(str(folder))} "$R/kaggle/src"',
        'mount -o remount,bind,ro "$R/kaggle/src"',
    ]
    for host, inside in mounts:
        target = f'"$R/kaggle/input/"{q(inside)}'
        lines += [f"mkdir -p {target}", f"mount --bind {q(str(host))} {target}", f"mount -o remount,bind,ro {target}"]
    platform = {"KAGGLE_KERNEL_RUN_TYPE": "Batch", "KAGGLE_URL_BASE": "https://www.kaggle.com"}
    if colab_drive is not None:
        platform = {"COLAB_RELEASE_TAG": "release-colab-sim", "FAKE_DRIVE": str(colab_drive),
                    "PYTHONPATH": str(colab(scratch / "colab"))}  # fmt: skip
        lines.append('mkdir -p "$R/content"')
    environment = {
        "PATH": f"{venv}/bin:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        **platform,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        **(env or {}),
    }
    cwd = "/kaggle/working" if colab_drive is None else "/content"
    run = (
        f"cd {cwd} && python -m nbconvert --to notebook --execute "
        f"--ExecutePreprocessor.timeout={timeout_s} --output-dir {q(str(executed))} /kaggle/src/{q(meta['code_file'])}"
    )
    env = " ".join(f"{k}={q(v)}" for k, v in environment.items())
    lines += ["ip link set lo up", f'exec chroot "$R" env -i {env} bash -c {q(run)}']
    done = subprocess.run(
        ["unshare", "-m", "-n", "--propagation", "private", "bash", "-c", "\n".join(lines)],
        capture_output=True,
        text=True,
        timeout=timeout_s + 120,
    )
    return KernelRun(working, venv, executed / meta["code_file"], done.returncode, done.stdout + done.stderr)


def imports_kitlib(venv: Path) -> bool:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as the kernels run: env -i, no PYTHONPATH
    done = subprocess.run([str(venv / "bin" / "python"), "-c", "import kitlib"], capture_output=True, cwd=venv, env=env)
    return done.returncode == 0


_FAKE_CLOCK = '''"""Written by tests/kaggle_sim.py: kitlib's StopAndSave reads a clock that advances {step_s} s a call
(once when fit starts, once a step), so where 02 stops does not depend on the machine's speed or load."""
import importlib.abc
import importlib.util
import itertools
import sys


class _Clock:
    def __init__(self):
        self.calls = itertools.count()

    def __call__(self):
        return next(self.calls) * {step_s}


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "kitlib.engine.policies":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.StopAndSave.clock = staticmethod(_Clock())

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Hook())
'''


def fake_clock(folder: Path, step_s: float) -> dict[str, str]:
    """The ``env`` for ``run_kernel`` that gives the kernel's StopAndSave a fake clock: each optimizer step takes
    ``step_s`` seconds (a sitecustomize on PYTHONPATH patches the class when kitlib imports it)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_FAKE_CLOCK.format(step_s=float(step_s)))
    return {"PYTHONPATH": str(folder)}


_COLAB = """\"\"\"Written by tests/kaggle_sim.py: Colab's kernel imported google.colab; drive.mount links
$FAKE_DRIVE.\"\"\"
import importlib.machinery
import os
import sys
import types


def _mount(mountpoint, **_):
    os.makedirs(os.path.dirname(mountpoint), exist_ok=True)
    os.symlink(os.environ["FAKE_DRIVE"], mountpoint)


colab = types.ModuleType("google.colab")
colab.__spec__ = importlib.machinery.ModuleSpec("google.colab", None)  # find_spec (accelerate's probe) reads it
colab.drive = types.SimpleNamespace(mount=_mount)
sys.modules["google.colab"] = colab
"""


def colab(folder: Path) -> Path:
    """A folder for PYTHONPATH whose sitecustomize stands in for Colab's google.colab (Drive: ``run_kernel``)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_COLAB)
    return folder
