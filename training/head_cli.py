"""Subcommand ``train-head``: a private linear head (OPERA, GRPUA or DP-SGD) saved as a classifier checkpoint."""
from __future__ import annotations

import argparse
from pathlib import Path

from transdenoiser.argtypes import nonnegative_float, open_unit_interval, positive_float, positive_int

DESCRIPTION = """\
Fit a linear classifier head with differential privacy on the PRIVATE split, on features of a frozen classifier
trained on the PUBLIC split (--features penultimate, the default) or on raw pixels (--features pixels). Each
feature vector is normalised to norm <= 1, so the Lipschitz constants of the losses hold. Algorithms (Ding et al.):
opera (output perturbation, analytic Gaussian mechanism, sensitivity of the paper's Lemma 1/2 or of the exact
minimiser), grpua (single-example noisy SGD, analytic Gaussian per step, the paper's Theorem 7 or the RDP
accountant), dpsgd (DP-SGD on the head, RDP accountant). --calibration classical gives the paper's baselines
(OutPert, SgdPert; epsilon <= 1). Neighbouring relation: replace-one (n public). The result is a classifier
checkpoint (frozen extractor + head) that certify, attack and serve take like any other, with its privacy report
in metadata.json and privacy_report.txt. See docs/CONVEX.md."""


def register(subparsers, common) -> None:
    from training.cli import add_dataset_args

    p = subparsers.add_parser("train-head", parents=[common], help="private linear head (OPERA, GRPUA, DP-SGD)",
                              description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_dataset_args(p)
    p.add_argument("--algorithm", choices=("opera", "grpua", "dpsgd"), default="opera", help="(default: opera)")
    p.add_argument("--loss", choices=("logistic", "softmax", "huber-svm"), default="logistic",
                   help="logistic and huber-svm: one-vs-rest, all K columns released together (joint Lipschitz "
                        "sqrt(K)); softmax: multinomial logistic (Lipschitz sqrt(2)) (default: logistic)")
    p.add_argument("--epsilon", type=positive_float, required=True, help="target epsilon (replace-one)")
    p.add_argument("--delta", type=open_unit_interval, default=1e-5, help="delta (default: 1e-5)")
    p.add_argument("--lambda", dest="reg", type=nonnegative_float, default=1e-3,
                   help="L2 regularisation lambda (strong convexity); 0 = the non-strongly convex case "
                        "(default: 1e-3, the paper's)")
    p.add_argument("--classifier", type=Path, default=None,
                   help="classifier checkpoint trained on the public split (needed for --features penultimate)")
    p.add_argument("--features", choices=("penultimate", "pixels"), default="penultimate",
                   help="(default: penultimate)")
    p.add_argument("--calibration", choices=("analytic", "classical"), default="analytic",
                   help="Gaussian calibration: analytic (aGM, the paper's) or classical (baseline, epsilon <= 1)")
    p.add_argument("--opera-sensitivity", choices=("gd", "minimizer"), default="gd",
                   help="gd: gradient descent + Lemma 1/2 (the paper's); minimizer: L-BFGS to a checked gradient "
                        "tolerance + 2L/(n lambda) (default: gd)")
    p.add_argument("--grpua-accountant", choices=("theorem7", "rdp"), default="theorem7",
                   help="what calibrates GRPUA's noise; both epsilons are reported (default: theorem7)")
    p.add_argument("--steps", type=positive_int, default=None,
                   help="OPERA: gradient-descent steps; GRPUA: single-example steps T (default: n^2, the paper's)")
    p.add_argument("--radius", type=positive_float, default=None, help="GRPUA with --lambda 0: ball radius R")
    p.add_argument("--batch-size", type=positive_int, default=256, help="DP-SGD batch size (default: 256)")
    p.add_argument("--epochs", type=positive_float, default=10.0, help="DP-SGD epochs (default: 10)")
    p.add_argument("--lr", type=positive_float, default=1.0, help="DP-SGD learning rate (default: 1.0)")
    p.add_argument("--reproducible-noise", action="store_true",
                   help="draw the DP noise from --seed (research only: anyone with the seed can remove the noise, "
                        "and the report says so); default: a secret CSPRNG seed, never stored")
    p.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")
    p.set_defaults(handler=cmd_train_head)


def cmd_train_head(args) -> int:
    from training.checkpoint import replace_directory, save_checkpoint, write_text
    from training.cli import load_dataset_from_args
    from training.convex.train import HeadConfig, format_head_privacy, train_head
    from transdenoiser.progress import bar
    from transdenoiser.runtime import resolve_device, seed_everything

    device = resolve_device(args.device)
    seed_everything(args.seed)
    config = HeadConfig(algorithm=args.algorithm, loss=args.loss, epsilon=args.epsilon, delta=args.delta,
                        reg=args.reg, features=args.features, calibration=args.calibration,
                        opera_sensitivity=args.opera_sensitivity, grpua_accountant=args.grpua_accountant,
                        steps=args.steps, radius=args.radius, batch_size=args.batch_size, epochs=args.epochs,
                        learning_rate=args.lr, reproducible_noise=args.reproducible_noise)
    config.validate()
    dataset = load_dataset_from_args(args)
    model, meta = train_head(dataset, config, args.classifier, device, args.seed, track=bar)
    report = format_head_privacy(meta["privacy"])

    def write(staging: Path) -> None:  # the head and its report appear together, or not at all
        save_checkpoint(staging, model, meta)
        write_text(staging / "privacy_report.txt", report)

    replace_directory(args.out, write)
    print(f"{meta['privacy']['mechanism']} head ({args.loss}, {args.features} features) on {dataset.name}'s private "
          f"split: test accuracy {meta['test_accuracy']:.4f} ({len(dataset.test)} test images)")
    print(report, end="")
    print(f"checkpoint: {args.out}")
    return 0
