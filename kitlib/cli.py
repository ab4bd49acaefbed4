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


def build_parser() -> argparse.ArgumentParser:
    from kitlib import __version__

    parser = argparse.ArgumentParser(prog="python -m kitlib", description="kitlib: fast, painless notebook training.")
    parser.add_argument("--version", action="version", version=f"kitlib {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("detect", help="show the platform, hardware and the precision kitlib would use, and why")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "fp16", "bf16"])
    p.set_defaults(func=_cmd_detect)

    # --- further commands register below this line (one block per command) ---

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 0
    result: int = args.func(args)
    return result
