"""Subcommand ``baseline-certify``: a baseline's own robustness certificate beside randomized smoothing of the same
randomised model, per image. SecureSGD (arms securesgd-prt, securesgd-sct): Phan et al.'s PixelDP-style bound of
the Gaussian noise layer; StoBatch (arm stobatch): its Laplace noise layer's bound
(:func:`training.baselines.stobatch.certified_robustness`).

A thin layer: flags -> :class:`certify.baseline_job.BaselineCertifyJob` -> :func:`certify.baseline_job.run_baseline_job`
(the run directory, resume, lock and status code ``certify`` uses) -> text.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from certify.baseline_rows import (  # noqa: F401 - the files' names and columns, as this module has always named them
    COLUMNS,
    KINDS,
    RADII,
    ROWS_FILE,
    SETTINGS_FILE,
    STATUS_FILE,
    STOBATCH_COLUMNS,
)
from transdenoiser.argtypes import nonnegative_int, open_unit_interval, positive_float, positive_int


def register(subparsers, common) -> None:
    from training.cli import add_dataset_args

    p = subparsers.add_parser(
        "baseline-certify", parents=[common],
        help="a baseline's own robustness certificate (SecureSGD, StoBatch) beside randomized smoothing of the "
             "same model",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="For each image of a split: the baseline's own certificate of its randomised model (argmax "
                    "counts over the noise layer's draws, n0 to select the class, n to bound it with "
                    "Clopper-Pearson at --alpha; SecureSGD: Phan et al. 2019's largest attack size whose (epsilon, "
                    "delta) meets Lecuyer et al.'s condition under the HGM calibration; StoBatch: Phan et al. "
                    "2020's Laplace bound, an L1 radius written as L2 = L1 / sqrt(d)), and randomized smoothing "
                    "(Cohen et al.) of the SAME randomised model (input noise --sigma plus the noise layer). Writes "
                    "OUT/baseline_certify.tsv (columns: " + " ".join(COLUMNS) + "; stobatch adds "
                    + " ".join(STOBATCH_COLUMNS) + "), OUT/summary.json and OUT/report.md (one section per "
                    "certificate: certified accuracy by radius, abstentions, hardware, settings; 'transdenoiser "
                    "report OUT --out OUT' renders it again). Radii are L2 in [0,1]-pixel units. "
                    "Each image draws its noise from its own seed and is recorded as it is done "
                    f"(OUT/{ROWS_FILE}), so an interrupted run resumes where it stopped, with the same rows, when "
                    f"run again with the same --out and settings (OUT/{SETTINGS_FILE}; other settings are "
                    f"refused); OUT/{STATUS_FILE} records each session's hardware and wall time. See "
                    "docs/BASELINES.md.",
        epilog="examples: transdenoiser baseline-certify --model runs/ssgd_sct --out runs/bcert_sct --max-images 100\n"
               "          transdenoiser baseline-certify --model runs/stobatch --sigma 0.25 --out runs/bcert_stobatch")
    p.add_argument("--model", type=Path, required=True,
                   help="a checkpoint of arm " + ", ".join(KINDS) + " (read from its metadata)")
    p.add_argument("--classifier", type=Path, default=None,
                   help="the frozen classifier behind a securesgd-prt denoiser (default: the one recorded in it)")
    add_dataset_args(p)
    p.add_argument("--split", choices=("public", "private", "test"), default="test", help="split (default: test)")
    p.add_argument("--skip", type=positive_int, default=1, help="certify every SKIP-th image (default: 1)")
    p.add_argument("--max-images", type=nonnegative_int, default=100, help="at most this many images (0: all; "
                   "default: 100)")
    p.add_argument("--n0", type=positive_int, default=100, help="selection draws per image (default: 100)")
    p.add_argument("--n", type=positive_int, default=1000, help="estimation draws per image (default: 1000)")
    p.add_argument("--alpha", type=open_unit_interval, default=0.001,
                   help="failure probability of each certificate (default: 0.001)")
    p.add_argument("--sigma", type=positive_float, default=None,
                   help="randomized smoothing sigma (default: the model's training sigma; required for stobatch, "
                        "whose training noise is Laplace)")
    p.add_argument("--batch-size", type=positive_int, default=500, help="draws per forward pass (default: 500)")
    p.add_argument("--out", type=Path, required=True,
                   help="output folder; an interrupted run there with the same settings is resumed")
    p.set_defaults(handler=cmd_baseline_certify)


def job_from_args(args):
    """The :class:`certify.baseline_job.BaselineCertifyJob` that the flags describe."""
    from certify.baseline_job import BaselineCertifyJob

    return BaselineCertifyJob(model=args.model, out=args.out, classifier=args.classifier, sigma=args.sigma,
                              dataset=args.dataset, data_root=args.data_root, split_seed=args.split_seed,
                              split=args.split, skip=args.skip, max_images=args.max_images, n0=args.n0, n=args.n,
                              alpha=args.alpha, batch_size=args.batch_size, seed=args.seed, device=args.device)


def _warn(message: str) -> None:
    print(message, file=sys.stderr)


def cmd_baseline_certify(args) -> int:
    from certify.baseline_job import run_baseline_job
    from certify.baseline_rows import format_table
    from transdenoiser.progress import bar

    outcome = run_baseline_job(job_from_args(args), track=bar, warn=_warn)
    if outcome.summary is None:
        resume = shlex.join(["transdenoiser", *args.argv]) if getattr(args, "argv", None) else None
        print(f"transdenoiser baseline-certify: interrupted; {outcome.kept} of {outcome.expected} images are saved in "
              f"{outcome.rows_path} (status: {outcome.status_path})"
              + (f"; resume with: {resume}" if resume else "; run the same command again to resume"), file=sys.stderr)
        return 130
    for line in format_table(outcome.summary):
        print(line)
    print(f"wrote {args.out}/baseline_certify.tsv, summary.json and report.md", file=sys.stderr)
    return 0
