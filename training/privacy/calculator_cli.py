"""``transdenoiser privacy``: the privacy calculator (epsilon, noise calibration, single Gaussian release).

A thin layer over :mod:`training.privacy.accounting`: parse, validate, call, print. Every number printed names
the analysis that produced it.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import sys

from transdenoiser.argtypes import nonnegative_float, open_unit_interval, positive_float, positive_int
from transdenoiser.errors import UserError

NOISE_UNITS = "noise multiplier = noise std on the summed clipped gradient / clipping norm C"

DESCRIPTION = f"""\
Privacy of T Poisson-subsampled Gaussian steps (DP-SGD; the MMGA guarantee of TransDenoiser with
noise multiplier xi_up), or of one Gaussian release. Three modes:

  epsilon       --sample-rate Q --noise-multiplier Z (--steps T | --epochs E) --delta D
  calibration   --sample-rate Q --target-epsilon E  (--steps T | --epochs E) --delta D
  one release   --single-release --epsilon E --delta D [--sensitivity S]

Epsilons are for add-or-remove-one neighbouring datasets, by three analyses: RDP (moments
accountant) and PLD, both computed by dp-accounting and both upper bounds, and Bu et al.'s
Gaussian-DP central-limit approximation, which can UNDERESTIMATE epsilon and is not a guarantee.
Units: {NOISE_UNITS}."""

EPILOG = """\
examples:
  transdenoiser privacy --sample-rate 0.02 --noise-multiplier 1.0 --steps 5000 --delta 1e-5
  transdenoiser privacy --sample-rate 0.02 --target-epsilon 1.0 --epochs 100 --delta 1e-5 --json
  transdenoiser privacy --single-release --epsilon 0.5 --delta 1e-5 --sensitivity 1.0"""


def sample_rate(text: str) -> float:
    """argparse checker for a Poisson sampling rate q in (0, 1]."""
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must lie in (0, 1], got {value}")
    return value


def register(subparsers, common) -> None:
    """Add ``privacy`` to the ``transdenoiser`` parser."""
    p = subparsers.add_parser("privacy", parents=[common], help="epsilon calculator and noise calibration",
                              description=DESCRIPTION, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_argument_group("what to compute (exactly one)").add_mutually_exclusive_group(required=True)
    mode.add_argument("--noise-multiplier", type=nonnegative_float, metavar="Z",
                      help=f"print epsilon for this noise multiplier, used at every step ({NOISE_UNITS}; "
                           "0 means no privacy)")
    mode.add_argument("--target-epsilon", type=positive_float, metavar="E",
                      help="print the smallest noise multiplier each accountant needs for (E, delta)-DP")
    mode.add_argument("--single-release", action="store_true",
                      help="calibrate one Gaussian release (no subsampling, no composition) for --epsilon: "
                           "the analytic Gaussian mechanism beside the classical bound")

    steps = p.add_argument_group("subsampled steps (epsilon and calibration modes)")
    steps.add_argument("--sample-rate", type=sample_rate, metavar="Q",
                       help="Poisson sampling rate q in (0, 1]: each example joins each step's batch "
                            "independently with probability q (q = expected batch size / dataset size)")
    length = steps.add_mutually_exclusive_group()
    length.add_argument("--steps", type=positive_int, metavar="T", help="number of noisy steps T")
    length.add_argument("--epochs", type=positive_float, metavar="E",
                        help="training length in epochs instead of --steps: T = ceil(E * round(1/q)), as `train` "
                             "counts")

    release = p.add_argument_group("single release")
    release.add_argument("--epsilon", type=positive_float, metavar="E", help="target epsilon of the one release")
    release.add_argument("--sensitivity", type=positive_float, metavar="S", default=None,
                         help="L2 sensitivity of the released quantity (default: 1.0); sigma scales with it")

    p.add_argument("--delta", type=open_unit_interval, required=True, metavar="D",
                   help="target delta in (0, 1); use delta < 1/N for a dataset of N examples")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object instead of a table")
    p.set_defaults(handler=run_privacy)


# ---------------------------------------------------------------------------------------------- handler

def run_privacy(args) -> int:
    from training.privacy import accounting  # lazy: dp-accounting takes ~1.5 s to import

    # dp-accounting logs (absl) when it drops an RDP order whose series did not converge; dropping an order
    # can only raise epsilon, so the warning is noise on a calculator's stdout/stderr.
    logging.getLogger("absl").setLevel(logging.ERROR)
    if args.single_release:
        result = _single_release(args)
        lines = _single_release_lines(result)
    else:
        q, steps, steps_from = _steps(args)
        if args.noise_multiplier is not None:
            result = accounting.epsilon_report(q, args.noise_multiplier, steps, args.delta)
            result.update(noise_multiplier=args.noise_multiplier, steps_from=steps_from)
            lines = _epsilon_lines(result)
        else:
            result = _calibration(args.target_epsilon, q, steps, args.delta)
            result["steps_from"] = steps_from
            lines = _calibration_lines(result)
    if args.json:
        from training.privacy.report import json_safe

        print(json.dumps(json_safe(result), indent=2, allow_nan=False))
    else:
        print("\n".join(lines))
    sys.stdout.flush()
    return 0


def _steps(args) -> tuple[float, int, str]:
    extra = [flag for flag, value in (("--epsilon", args.epsilon), ("--sensitivity", args.sensitivity))
             if value is not None]
    if extra:
        raise UserError(f"{', '.join(extra)} {'applies' if len(extra) == 1 else 'apply'} only with --single-release")
    if args.sample_rate is None:
        raise UserError("--sample-rate is required with --noise-multiplier or --target-epsilon")
    if args.steps is None and args.epochs is None:
        raise UserError("give the training length as --steps T or --epochs E")
    if args.steps is not None:
        return args.sample_rate, args.steps, f"--steps {args.steps}"
    from training.privacy.accounting import steps_for_epochs

    steps = steps_for_epochs(args.epochs, args.sample_rate)
    return (args.sample_rate, steps,
            f"--epochs {args.epochs:g} at q = {args.sample_rate:g}: T = ceil(E * round(1/q)), as `train` counts")


def _calibration(target_epsilon: float, q: float, steps: int, delta: float) -> dict:
    from training.privacy import accounting  # lazy: dp-accounting takes ~1.5 s to import

    multipliers = {name: accounting.noise_multiplier_for_epsilon(target_epsilon, q, steps, delta, name)
                   for name in accounting.ACCOUNTANTS}
    analyses = accounting.ANALYSES
    return {**multipliers, "target_epsilon": target_epsilon, "delta": delta, "sample_rate": q, "steps": steps,
            "calibration_rtol": accounting.CALIBRATION_RTOL,
            "analyses": {"rdp": analyses["rdp"], "pld": analyses["pld"], "gdp": analyses["gdp_epsilon"]}}


def _single_release(args) -> dict:
    from training.privacy import accounting  # lazy: dp-accounting takes ~1.5 s to import

    extra = [flag for flag, value in (("--sample-rate", args.sample_rate), ("--steps", args.steps),
                                      ("--epochs", args.epochs)) if value is not None]
    if extra:
        raise UserError(f"{', '.join(extra)} {'does' if len(extra) == 1 else 'do'} not apply with --single-release "
                        "(one release, no subsampling)")
    if args.epsilon is None:
        raise UserError("--single-release needs --epsilon E")
    sensitivity = 1.0 if args.sensitivity is None else args.sensitivity
    analytic = accounting.analytic_gaussian_sigma(args.epsilon, args.delta, sensitivity)
    classical_valid = args.epsilon <= 1
    classical = accounting.classical_gaussian_sigma(args.epsilon, args.delta, sensitivity) if classical_valid \
        else None
    return {"analytic_sigma": analytic, "classical_sigma": classical, "classical_valid": classical_valid,
            "epsilon": args.epsilon, "delta": args.delta, "sensitivity": sensitivity,
            "analyses": {"analytic_sigma": ANALYTIC_LABEL, "classical_sigma": CLASSICAL_LABEL}}


ANALYTIC_LABEL = ("analytic Gaussian mechanism (Balle & Wang 2018): smallest sigma with "
                  "Phi(S/2s - eps s/S) - e^eps Phi(-S/2s - eps s/S) <= delta; exact, any epsilon")
CLASSICAL_LABEL = "classical sqrt(2 ln(1.25/delta)) S / epsilon (Dwork & Roth): sufficient, only valid for epsilon <= 1"


# ---------------------------------------------------------------------------------------------- printing

def _number(value: float | None) -> str:
    if value is None:
        return "n/a"
    return "inf" if math.isinf(value) else f"{value:.4g}" if value < 1e4 else f"{value:.3e}"


def _steps_text(steps: int, steps_from: str) -> str:
    return f"T = {steps} step{'s' if steps != 1 else ''} ({steps_from})"


def _epsilon_lines(report: dict) -> list[str]:
    analyses = report["analyses"]
    lines = [f"Poisson-subsampled Gaussian: q = {report['sample_rate']:g}, noise multiplier z = "
             f"{report['noise_multiplier']:g}, {_steps_text(report['steps'], report['steps_from'])}, "
             f"delta = {report['delta']:g}",
             f"({NOISE_UNITS}; add-or-remove-one neighbours)",
             "",
             f"{'epsilon':>10}  analysis",
             f"{_number(report['rdp']):>10}  {analyses['rdp']}",
             f"{_number(report['pld']):>10}  {analyses['pld']}",
             f"{_number(report['gdp_epsilon']):>10}  {analyses['gdp_epsilon']} (mu = {_number(report['gdp_mu'])})"]
    if report["noise_multiplier"] == 0:
        lines.append("noise multiplier 0: no noise, no differential privacy (epsilon is infinite)")
    return lines


def _calibration_lines(result: dict) -> list[str]:
    from training.privacy import accounting  # lazy: dp-accounting takes ~1.5 s to import

    analyses = result["analyses"]
    return [f"Noise multiplier for ({result['target_epsilon']:g}, {result['delta']:g})-DP: q = "
            f"{result['sample_rate']:g}, {_steps_text(result['steps'], result['steps_from'])}",
            f"({NOISE_UNITS}; add-or-remove-one neighbours; each rounded up, to within a relative "
            f"{result['calibration_rtol']:g}, so that its own analysis gives epsilon <= target)",
            "",
            f"{'noise multiplier':>16}  analysis",
            *(f"{result[name]:>16.5f}  {analyses[name]}" for name in accounting.ACCOUNTANTS),
            "The GDP multiplier can be too SMALL for the target: train with the RDP or PLD one."]


def _single_release_lines(result: dict) -> list[str]:
    classical = (f"{result['classical_sigma']:>12.5g}" if result["classical_valid"]
                 else f"{'n/a':>12}")
    lines = [f"One Gaussian release: ({result['epsilon']:g}, {result['delta']:g})-DP, L2 sensitivity S = "
             f"{result['sensitivity']:g}",
             "",
             f"{'sigma':>12}  calibration (sigma = std of the Gaussian noise, same units as S)",
             f"{result['analytic_sigma']:>12.5g}  {ANALYTIC_LABEL}",
             f"{classical}  {CLASSICAL_LABEL}"]
    if not result["classical_valid"]:
        lines.append(f"epsilon {result['epsilon']:g} > 1: the classical bound does not apply; use the analytic sigma")
    return lines
