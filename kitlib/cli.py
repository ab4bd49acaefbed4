"""``python -m kitlib``: one argparse front door. Each command imports its module only when it runs, so
``--help`` is instant (no torch import)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _cmd_detect(args: argparse.Namespace) -> int:
    from kitlib.hardware import detect
    from kitlib.precision import PrecisionError, decide_precision

    hw = detect()
    print(hw.summary())
    try:
        plan = decide_precision(hw, args.precision)
    except PrecisionError as err:
        print(f"precision: unusable -- {err}", file=sys.stderr)
        return 2
    print(f"precision: {plan.dtype} (tf32={plan.tf32}, grad scaler={plan.use_grad_scaler}) -- {plan.reason}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from kitlib.demo import DemoDataMissing, make_demo

    try:
        paths = make_demo(args.dir, seed=args.seed, test_fraction=args.test_fraction)
    except DemoDataMissing as err:
        print(f"demo: {err}", file=sys.stderr)
        return 2
    for path in (paths.train, paths.test, paths.sample_submission, paths.solution):
        print(path)
    return 0


def _cmd_score(args: argparse.Namespace) -> int:
    from kitlib.demo import score
    from kitlib.frames import DataError

    try:
        accuracy = score(args.solution, args.submission)
    except DataError as err:
        print(f"score: {err}", file=sys.stderr)
        return 2
    print(f"accuracy: {accuracy:.4f}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from kitlib import __version__

    parser = argparse.ArgumentParser(prog="python -m kitlib", description="kitlib: fast, painless notebook training.")
    parser.add_argument("--version", action="version", version=f"kitlib {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("detect", help="show the platform, hardware and the precision kitlib would use, and why")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "fp16", "bf16"])
    p.set_defaults(func=_cmd_detect)

    # --- further commands register below this line (one block per command) ---

    def _cmd_cache(args: argparse.Namespace) -> int:
        from kitlib.cache import cache_command

        return cache_command(
            args.action, directory=args.dir, name=args.name, older_than_days=args.older_than_days, yes=args.yes
        )

    p = sub.add_parser("cache", help="list, size or clear the feature cache")
    p.add_argument("action", choices=["list", "size", "clear"])
    p.add_argument("--dir", default=None, help="cache directory (default: $KITLIB_CACHE_DIR, Kaggle working dir, ./)")
    p.add_argument("--name", default=None, help="only entries of this feature name, e.g. tokens")
    p.add_argument("--older-than-days", type=float, default=None, help="clear: only entries older than this")
    p.add_argument("--yes", action="store_true", help="clear without asking (required when not interactive)")
    p.set_defaults(func=_cmd_cache)

    p = sub.add_parser("demo", help="write the offline demo competition (Rotten Tomatoes reviews, split by movie)")
    p.add_argument("dir", help="folder for train.csv, test.csv, sample_submission.csv, solution.csv")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--test-fraction", type=float, default=0.2)
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("score", help="score a submission against the demo's solution.csv (prints the accuracy)")
    p.add_argument("solution")
    p.add_argument("submission")
    p.set_defaults(func=_cmd_score)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 0
    result: int = args.func(args)
    return result
