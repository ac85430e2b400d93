"""The ``transdenoiser`` command line: one entry point, one subcommand per job.

Each area registers its own subcommands (``register(subparsers, common)`` in training.cli,
certify.cli, serving.cli, ...). Every subcommand inherits ``--device`` and ``--seed``; a
``UserError`` anywhere becomes one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import importlib
import sys

import transdenoiser
from transdenoiser.errors import UserError
from transdenoiser.runtime import DEVICE_CHOICES, keep_freed_memory

# Modules that add subcommands, in --help order.
SUBCOMMAND_MODULES = ("training.cli", "training.train_cli", "training.privacy_cli", "certify.cli", "certify.attack_cli",
                      "serving.cli", "transdenoiser.demo", "training.head_cli", "training.privacy.audit_cli")


def _device(value: str) -> str:
    if value in DEVICE_CHOICES or value.startswith("cuda:"):
        return value
    raise argparse.ArgumentTypeError(f"expected one of {', '.join(DEVICE_CHOICES)} or cuda:N, got {value!r}")


def common_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("common options")
    group.add_argument("--device", type=_device, default="auto",
                       help="where to compute: auto (CUDA when present), cpu, cuda or cuda:N (default: auto)")
    group.add_argument("--seed", type=int, default=0,
                       help="random seed; same seed, same result, except the DP noise of `train`, which is secret "
                            "unless --reproducible-noise (default: 0)")
    return common


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="transdenoiser",
        description="Certified predictions from a frozen classifier behind a differentially private denoiser.",
        epilog="Run 'transdenoiser COMMAND --help' for each command's options.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {transdenoiser.__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = common_parser()
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(subparsers, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    keep_freed_memory()
    try:
        return int(args.handler(args) or 0)
    except UserError as exc:
        print(f"transdenoiser {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"transdenoiser {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like: not an error of ours
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
