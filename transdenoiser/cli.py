"""The ``transdenoiser`` command line: one entry point, one subcommand per job.

Each area registers its own subcommands (``register(subparsers, common)`` in training.cli,
certify.cli, serving.cli, ...). Only the module of the command being run is imported, so
``transdenoiser --help`` and flag errors come back at once (torch is imported by the command
handlers); :data:`COMMANDS` lists every command with its module and one-line help, in --help order
(tests/test_cli_behaviour.py checks it against the modules). A subcommand inherits ``--device`` and
``--seed`` only if it uses them (:data:`COMMON_OPTIONS_USED`). A ``UserError`` anywhere becomes one
line on stderr and exit status 2; a flag error is one line and a pointer to ``--help``.
"""
from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import sys

from transdenoiser.convergence import CONVERGENCE_NOTE, ConvergenceWarnings
from transdenoiser.errors import UserError
from transdenoiser.preflight import check_paths
from transdenoiser.runtime import DEVICE_CHOICES, discard_stdout, keep_freed_memory
from transdenoiser.version import __version__

# Every command: (module whose register() adds it, one-line help), in --help order.
COMMANDS: dict[str, tuple[str, str]] = {
    "data": ("training.cli", "show a dataset's splits, class balance, fingerprints"),
    "pretrain": ("training.cli", "pretrain the classifier on the public split"),
    "import-classifier": ("training.cli", "wrap your own torchvision state dict as a classifier checkpoint"),
    "train": ("training.train_cli", "train with DP on the private split (nodp|sepdp|transdenoiser|recipe|baselines)"),
    "privacy": ("training.privacy.calculator_cli", "epsilon calculator and noise calibration"),
    "certify": ("certify.cli", "certify a dataset split with randomized smoothing"),
    "predict": ("certify.cli", "smoothed predictions (abstain when unsure)"),
    "certify-merge": ("certify.cli", "merge the shards of a certify/predict run"),
    "report": ("certify.cli", "overlay several certify (or attack) runs"),
    "attack": ("certify.attacks.cli", "accuracy of the smoothed and noisy predictions under FGSM/I-FGSM/MIM/PGD"),
    "audit": ("certify.attacks.cli", "attack a certify run's certified examples inside their radius"),
    "serve": ("serving.cli", "serve certified predictions over HTTP (BentoML)"),
    "bundle": ("serving.cli", "write a servable model directory from checkpoints"),
    "demo": ("transdenoiser.demo", "run the main job end to end on the embedded data"),
    "train-head": ("training.head_cli", "private linear head (OPERA, GRPUA, DP-SGD)"),
    "privacy-audit": ("training.audit.cli",
                      "train with canaries and measure an empirical epsilon lower bound beside the claimed epsilon"),
    "baseline-certify": ("training.baselines.cli", "a baseline's own robustness certificate (SecureSGD, StoBatch) "
                                                   "beside randomized smoothing of the same model"),
}
# Modules that add subcommands, in --help order.
SUBCOMMAND_MODULES = tuple(dict.fromkeys(module for module, _ in COMMANDS.values()))

# The common options (--device, --seed) each command reads; a command not listed takes both. A command
# that would ignore one is not offered it (no inert flags); its handler still sees the default value.
COMMON_DEFAULTS = {"device": "auto", "seed": 0}
COMMON_OPTIONS_USED: dict[str, tuple[str, ...]] = {
    "data": (), "privacy": (), "certify-merge": (), "report": (), "import-classifier": ("device",),
    "serve": ("device",), "bundle": (),
}


class CommandLineParser(argparse.ArgumentParser):
    """No abbreviated flags (``--sig`` is not ``--sigma``); a flag error is one line plus a pointer to --help."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.command_prog = self.prog  # the top-level parser names the command once it is known

    def error(self, message: str):
        self.exit(2, f"{self.command_prog}: error: {message} (see '{self.command_prog} --help')\n")


class _Commands(argparse._SubParsersAction):
    """Adds each command with the common options it uses only (see COMMON_OPTIONS_USED)."""

    def add_parser(self, name, **kwargs):
        parents = kwargs.get("parents") or []
        if any(getattr(parent, "is_common", False) for parent in parents):
            used = COMMON_OPTIONS_USED.get(name, tuple(COMMON_DEFAULTS))
            kwargs["parents"] = [common_parser(used) if getattr(parent, "is_common", False) else parent
                                 for parent in parents]
            parser = super().add_parser(name, **kwargs)
            parser.set_defaults(**{key: value for key, value in COMMON_DEFAULTS.items() if key not in used})
            return parser
        return super().add_parser(name, **kwargs)


def _device(value: str) -> str:
    if value in DEVICE_CHOICES or value.startswith("cuda:"):
        return value
    raise argparse.ArgumentTypeError(f"expected one of {', '.join(DEVICE_CHOICES)} or cuda:N, got {value!r}")


def common_parser(options: tuple[str, ...] = tuple(COMMON_DEFAULTS)) -> argparse.ArgumentParser:
    """The parent parser of the common options; ``options`` picks which (``device``, ``seed``)."""
    common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    common.is_common = True  # type: ignore[attr-defined]
    group = common.add_argument_group("common options")
    if "device" in options:
        group.add_argument("--device", type=_device, default=COMMON_DEFAULTS["device"],
                           help="where to compute: auto (CUDA when present), cpu, cuda or cuda:N (default: auto)")
    if "seed" in options:
        group.add_argument("--seed", type=int, default=COMMON_DEFAULTS["seed"],
                           help="random seed; same seed, same result, except the DP noise of `train`, which is secret "
                                "unless --reproducible-noise (default: 0)")
    return common


def command_in(argv: list[str]) -> str | None:
    """The command named in ``argv`` (its first word that is not an option), if it is one of COMMANDS."""
    for word in argv:
        if word == "--":
            return None
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with ``argv``, only the module of the command it names is imported (the others are listed)."""
    parser = CommandLineParser(
        prog="transdenoiser",
        description="Certified predictions from a frozen classifier behind a differentially private denoiser.",
        epilog="Run 'transdenoiser COMMAND --help' for each command's options. Python API: docs/API.md.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, action=_Commands,
                                       parser_class=CommandLineParser)
    common = common_parser()
    if argv is None:
        modules = SUBCOMMAND_MODULES
    else:
        command = command_in(argv)
        modules = (COMMANDS[command][0],) if command else ()
        if command:
            parser.command_prog = f"transdenoiser {command}"
    for name in modules:
        importlib.import_module(name).register(subparsers, common)
    for name, (_, text) in COMMANDS.items():  # the others: listed in --help, loaded when run
        if name not in subparsers.choices:
            subparsers.add_parser(name, help=text, add_help=False)
    return parser


FILE_SYSTEM_REFUSALS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR,
                                  errno.EISDIR})


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    args.argv = argv  # what was typed, for messages that print the command to run again (resume)
    keep_freed_memory()
    convergence = ConvergenceWarnings()
    absl = logging.getLogger("absl")
    absl.addFilter(convergence)
    try:
        check_paths(args.command, args)  # missing inputs, unwritable --out: before the handler imports torch
        return int(args.handler(args) or 0)
    except UserError as exc:
        print(f"transdenoiser {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like, not an error of ours (before OSError, its base)
        discard_stdout()
        return 0
    except OSError as exc:  # the file system refused a write (permissions, read-only, full disk): one line
        if exc.errno not in FILE_SYSTEM_REFUSALS:
            raise
        where = f": {exc.filename}" if exc.filename else ""
        print(f"transdenoiser {args.command}: error: {exc.strerror}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"transdenoiser {args.command}: interrupted", file=sys.stderr)
        return 130
    finally:
        absl.removeFilter(convergence)
        if convergence.count and os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 speaks
            print(CONVERGENCE_NOTE.format(count=convergence.count), file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
