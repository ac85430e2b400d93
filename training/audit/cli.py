"""Subcommand ``privacy-audit``: a one-run empirical privacy audit of a training configuration.

Exit status: 1 when a lower bound exceeds a claim or the run is inconsistent with the claimed noise (printed
loudly: it means a bug or a false claim); 0 otherwise: PASS, INCONCLUSIVE (a claim beyond the audit's reach,
said in the report) or NO CLAIM; 2 on bad input.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from transdenoiser.argtypes import (
    float_list,
    nonnegative_float,
    nonnegative_int,
    open_unit_interval,
    positive_float,
    positive_int,
)
from transdenoiser.errors import UserError

DEFAULT_CONFIDENCE = 0.95
# the library's defaults (training.privacy.consistency; a test checks they agree), repeated here so that
# building the parser imports neither NumPy nor SciPy
DEFAULT_ALPHA = 0.001
DEFAULT_SIMULATIONS = 1999

# the training methods an audit trains (training/methods; each flag below sets one field of the method's config,
# as for `train`: training/train_flags.py)
AUDITED_ARMS = ("nodp", "sepdp", "transdenoiser", "recipe")


def register(subparsers, common) -> None:
    from training.cli import add_dataset_args

    p = subparsers.add_parser(
        "privacy-audit", parents=[common],
        help="train with canaries and measure an empirical epsilon lower bound beside the claimed epsilon",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train a denoiser (arm nodp, sepdp, transdenoiser or recipe) with m canaries, each included "
                    "with probability 1/2, guess which were included, and report the empirical epsilon LOWER bound at "
                    "the confidence of --confidence "
                    f"(default {DEFAULT_CONFIDENCE:g}) by Steinke, "
                    "Nasr & Jagielski (2023) and by the Gaussian f-DP analysis of Mahloujifar, Melis & Chaudhuri "
                    "(2025), beside every epsilon the run claims; then membership inference (loss threshold and "
                    "calibrated against reference models trained on public data). Before and after training it "
                    "prints the largest bound the audit can attain (every guess right): a claim above it cannot be "
                    "refuted, and the verdict is INCONCLUSIVE. White-box known_others audits of a noised arm are "
                    "also checked against the claimed noise (the bound's simulated distribution under the claimed "
                    f"mechanism, and the excluded canaries' noise; false-alarm rate --consistency-alpha, default "
                    f"{DEFAULT_ALPHA:g}).\n"
                    "  whitebox  gradient canaries C*u_j inserted into the summed clipped gradient before the "
                    "arm's noise\n"
                    "  blackbox  canary images added to the private split; score = reconstruction loss\n"
                    "A lower bound above a claimed epsilon, or a run inconsistent with the claimed noise, is a "
                    "FAILURE (exit status 1). The output directory holds "
                    "a model trained with canaries and scores computed from the private split: it is not a "
                    "release. See docs/AUDIT.md.",
        epilog="example: transdenoiser privacy-audit --classifier runs/classifier --arm sepdp --target-epsilon 8 "
               "--mode whitebox --canaries 1000 --out runs/audit-sepdp")
    p.add_argument("--config", type=Path, default=None, help="TOML file of training settings (see configs/)")
    p.add_argument("--classifier", type=Path, required=True, help="frozen classifier checkpoint directory")
    p.add_argument("--out", type=Path, required=True, help="audit output directory (not a release)")
    add_dataset_args(p)
    g = p.add_argument_group("audit")
    g.add_argument("--mode", choices=("whitebox", "blackbox"), default="whitebox",
                   help="canary kind (default: whitebox)")
    g.add_argument("--canaries", type=positive_int, default=1000, help="number of canaries m (default: 1000)")
    g.add_argument("--audit-seed", type=nonnegative_int, default=0,
                   help="seed of the canaries and their inclusion (not of the training noise) (default: 0)")
    g.add_argument("--whitebox-score", choices=("known_others", "update", "likelihood_ratio"), default="known_others",
                   help="known_others: the update minus the real examples' clipped sum, projected on the canary "
                        "(the DP adversary who knows everyone else); update: the noisy update's projection; "
                        "likelihood_ratio: known_others' per-step projections scored by the per-step likelihood "
                        "ratio of the subsampled Gaussian (stronger at small sample rates) (default: known_others)")
    g.add_argument("--confidence", type=open_unit_interval, default=DEFAULT_CONFIDENCE,
                   help=f"confidence level of the lower bounds, jointly over the guess counts (default: "
                        f"{DEFAULT_CONFIDENCE:g})")
    g.add_argument("--consistency-alpha", type=open_unit_interval, default=DEFAULT_ALPHA,
                   help="false-alarm rate of the check against the claimed noise: a run that added the claimed noise "
                        f"fails it with at most this probability (default: {DEFAULT_ALPHA:g})")
    g.add_argument("--null-simulations", type=positive_int, default=DEFAULT_SIMULATIONS,
                   help="simulated runs of the claimed mechanism for that check, cached on disk under "
                        f"$TRANSDENOISER_CACHE or ~/.cache/transdenoiser (default: {DEFAULT_SIMULATIONS})")
    g.add_argument("--guess-fractions", type=float_list, default=None,
                   help="guess counts r = k+ + k- tried, as fractions of m, comma-separated, Bonferroni-corrected "
                        "(default: 0.02,0.05,0.1,0.2,0.5,1)")
    g.add_argument("--loss-draws", type=positive_int, default=4,
                   help="input-noise draws per reconstruction loss (black-box scores, membership) (default: 4)")
    g.add_argument("--reference-models", type=nonnegative_int, default=1,
                   help="reference denoisers trained on public data for the calibrated membership attack; 0 skips "
                        "it (default: 1)")
    g.add_argument("--no-membership", action="store_true", help="skip membership inference")
    g = p.add_argument_group("training (as for `train`)")
    g.add_argument("--arm", choices=AUDITED_ARMS, default=None,
                   help="training arm (default: transdenoiser); a flag the arm does not use is refused, as by train")
    g.add_argument("--sigma", type=positive_float, default=None)
    g.add_argument("--clip-norm", type=positive_float, default=None)
    g.add_argument("--xi-up", type=positive_float, default=None)
    g.add_argument("--xi-low", type=nonnegative_float, default=None)
    g.add_argument("--target-epsilon", type=positive_float, default=None)
    g.add_argument("--delta", type=open_unit_interval, default=None)
    g.add_argument("--batch-size", type=positive_int, default=None)
    g.add_argument("--epochs", type=positive_int, default=None)
    g.add_argument("--optimizer", choices=("sgd", "adam"), default=None)
    g.add_argument("--lr", type=positive_float, default=None)
    g.add_argument("--denoiser", default=None)
    g.add_argument("--activation", default=None)
    g.add_argument("--denoiser-width", type=positive_int, default=None)
    g.add_argument("--train-examples", type=nonnegative_int, default=None)
    g.add_argument("--eval-examples", type=nonnegative_int, default=None)
    g.add_argument("--max-smin-dim", type=positive_int, default=None)
    g.add_argument("--reproducible-noise", action="store_const", const=True, default=None,
                   help="draw the training noise from --seed (research only; the default is secret noise)")
    p.add_argument("--json", action="store_true", help="print the audit summary as JSON")
    p.set_defaults(handler=cmd_privacy_audit)


def _config(args):
    """The arm's config from ``--config`` and the flags, as ``train`` builds it (training/train_flags.py): a flag the
    arm does not use is refused in one line; a shared ``--config`` file's keys that only other arms read are noted
    on stderr. (method, config)."""
    from training.train_cli import note_unused_settings
    from training.train_flags import method_and_settings

    method, settings, source = method_and_settings(args, arms=AUDITED_ARMS, command="privacy-audit")
    config = method.config_from_settings(settings, source)
    if config.batch_size == "auto" and (config.target_epsilon is None or config.arm == "nodp"):
        raise UserError(f"--config {args.config}: batch_size = \"auto\" is planned for a target epsilon: it needs "
                        "--target-epsilon and a DP arm (sepdp or transdenoiser)")
    note_unused_settings(method, settings, source)
    return method, config


def cmd_privacy_audit(args) -> int:
    import json

    from training.audit.run import privacy_audit
    from training.checkpoint import load_checkpoint
    from training.cli import load_dataset_from_args
    from training.methods.denoiser import training_examples
    from training.privacy.audit import AuditSettings, format_audit, format_power
    from training.privacy.bounds import DEFAULT_GUESS_FRACTIONS
    from training.train_cli import resolve_auto_batch
    from transdenoiser.progress import bar
    from transdenoiser.runtime import hardware_description, resolve_device, seed_everything

    method, arm_config = _config(args)
    settings = AuditSettings(mode=args.mode, num_canaries=args.canaries, audit_seed=args.audit_seed,
                             whitebox_score=args.whitebox_score, beta=1 - args.confidence,
                             guess_fractions=tuple(args.guess_fractions or DEFAULT_GUESS_FRACTIONS),
                             loss_draws=args.loss_draws, membership=not args.no_membership,
                             reference_models=args.reference_models, consistency_alpha=args.consistency_alpha,
                             null_simulations=args.null_simulations)
    settings.validate()
    device = resolve_device(args.device)
    seed_everything(arm_config.seed)
    dataset = load_dataset_from_args(args)
    classifier = load_checkpoint(args.classifier, kind="classifier", map_location=device)
    planned = arm_config.batch_size == "auto"
    if planned:
        # batch_size = "auto" (from --config, or the recipe's): planned as train plans it, on the examples the run
        # trains on (the black-box canaries aside), the plan printed on stderr
        resolve_auto_batch(args, arm_config, training_examples(arm_config, dataset))
    describe = getattr(method, "describe", None)  # the recipe: what it chose, and the arm it trains as
    if describe is not None:
        print(describe(arm_config, planned), file=sys.stderr)
    config = arm_config.train_config()  # the full TrainConfig the audit trains with and records
    print(f"privacy-audit {config.arm} ({settings.mode}, {settings.num_canaries} canaries) on {dataset.name}, "
          f"device {hardware_description(device)}", file=sys.stderr)
    if config.reproducible_noise:
        print("WARNING: --reproducible-noise: the training noise is drawn from --seed", file=sys.stderr)
    from training.privacy.power import audit_power

    target = ([{"name": "target epsilon", "epsilon": config.target_epsilon}]
              if config.target_epsilon is not None and config.arm != "nodp" else [])
    print("before training, " + format_power(audit_power(settings.num_canaries, config.delta, target, settings.beta,
                                                         settings.guess_fractions)), file=sys.stderr)
    result = privacy_audit(config, dataset, classifier, device, settings, args.out, track=bar)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_audit(result))
        print(f"audit output (NOT a release): {args.out}")
    verdict = result["verdict"]
    if verdict["status"] == "FAIL":
        bar_line = "!" * 78
        why = []
        if verdict["violations"]:
            why.append(f"an empirical lower bound exceeds a claimed epsilon ({len(verdict['violations'])} "
                       "violation(s))")
        if verdict.get("inconsistent_with_claimed_noise"):
            why.append("the run is inconsistent with the claimed noise")
        print(f"{bar_line}\nPRIVACY AUDIT FAILED: {'; '.join(why)}. This means a bug in the implementation or a "
              f"false privacy claim.\n{bar_line}", file=sys.stderr)
        return 1
    if verdict["status"] == "INCONCLUSIVE":
        print("privacy audit INCONCLUSIVE: a claimed epsilon lies above the largest bound this audit can attain; "
              "more canaries are needed to test it (see 'audit power' above)", file=sys.stderr)
    return 0


__all__ = ["cmd_privacy_audit", "register"]
