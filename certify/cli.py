"""Subcommands ``certify``, ``predict``, ``certify-merge`` and ``report``: flags in, a :class:`certify.job.CertifyJob`
run by :func:`certify.job.run_job` (the Python API's ``run_certify_job``), tables out."""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from certify.job import DEFAULT_BATCH  # noisy samples per forward pass without --batch-size; imports no torch
from transdenoiser.argtypes import add_deprecated_spelling, open_unit_interval, positive_float, positive_int
from transdenoiser.errors import UserError

# Spelled out so that registering the subcommands imports no torch (tests check them against the library's).
MEMORY_FORMATS = ("auto", "channels_last", "contiguous")  # certify.core.MEMORY_FORMATS
PRECISIONS = ("fp32", "bf16", "fp16")  # certify.numerics.PRECISION_CHOICES
SPLITS = ("public", "private", "test")  # training.datasets.SPLITS
SEQUENTIAL_METHODS = ("one-sided-mixture", "beta-mixture", "union-cp")  # certify.confidence.METHODS
DEFAULT_SEQUENTIAL = "one-sided-mixture"  # certify.confidence.DEFAULT_METHOD
DEFAULT_TOLERANCE = 0.05  # certify.sequential.DEFAULT_TOLERANCE


NEW_TEST_HELP = {
    "certify": "certify images again in a new test, which spends its alpha again (refused without this flag; "
               "docs/CERTIFY.md): an existing --out's images with another --seed or --alpha, or images that another "
               "run certified on this seed with another test (n, mode and radius included; adaptive runs with the "
               "default --sequential are all one test; the ledger of certification tests, docs/FORMATS.md)",
    "predict": "certify the images of an existing --out again with another --seed or --alpha: a new test that "
               "spends its alpha again (refused without this flag; docs/CERTIFY.md)"}


def workers_arg(text: str) -> int | str:
    """``--workers``: ``auto`` or an integer >= 1."""
    return text if text == "auto" else positive_int(text)


CERTIFY_DESCRIPTION = """\
Certify images of a dataset split with randomized smoothing (Cohen et al., 2019): for each image,
select a class with n0 noisy samples, estimate with n fresh samples a one-sided (1 - alpha)
Clopper-Pearson lower bound pA on its probability, and certify the L2 radius sigma * Phi^-1(pA),
or abstain (predict -1) when pA < 1/2. Noise N(0, sigma^2 I) is added to [0,1] pixels, before
the denoiser (if any) and the classifier's own normalisation.

Writes OUT/certify.tsv (Cohen's columns: idx label predict radius correct time; time in
seconds), OUT/summary.json, OUT/report.md and OUT/certified_accuracy.png. An interrupted run
resumes where it stopped when run again with the same --out and settings (other settings are
refused). --shard I/K (or torchrun's RANK/WORLD_SIZE) certifies one share of the images; the
last shard to finish, or 'transdenoiser certify-merge', writes the report of the whole run.
Each image's noise is seeded by (--seed, image index): sharded and whole runs agree row for row.

Adaptive certification (anytime-valid confidence sequences, docs/CERTIFY.md): estimation samples
are drawn in rounds and each image stops as soon as its answer is settled.
  --radius R --n-max N   decide: is the prediction certified at L2 radius R? Stops when a lower bound
                         on pA reaches Phi(R/sigma) (certified: radius R) or an upper bound falls below
                         it (not certified: -1), or after N estimation samples (not certified).
  --adaptive --n-max N   estimate: the largest certifiable radius with at most N estimation samples,
                         stopping once more samples cannot raise it by more than --tolerance.
Rows then add a column 'samples' (noisy samples used, n0 included); the summary adds the mean and
median samples per image and the saving against fixed n = N.
"""

PREDICT_DESCRIPTION = """\
Predict images of a dataset split with the smoothed classifier (Cohen et al.'s PREDICT): the top
class among n noisy samples, or abstain (-1) unless a two-sided binomial test between the two top
counts rejects a tie at level alpha. Writes OUT/predict.tsv (idx label predict correct time),
OUT/summary.json and OUT/report.md. Resume, --shard and merge work as for 'certify'.
"""


def index_list(text: str) -> list[int]:
    """``0-99,150,200-209``: indices and inclusive ranges."""
    indices: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            if "-" in part:
                low, high = (int(v) for v in part.split("-", 1))
                if low > high:
                    raise argparse.ArgumentTypeError(f"range {part!r} runs backwards")
                indices.extend(range(low, high + 1))
            else:
                indices.append(int(part))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not an index or a range like 0-99") from None
    if not indices:
        raise argparse.ArgumentTypeError("expected indices like 0-99,150")
    if min(indices) < 0:
        raise argparse.ArgumentTypeError(f"indices must be >= 0, got {min(indices)}")
    return indices


def _shard(text: str):
    from certify.units import Shard

    try:
        return Shard.parse(text)
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None


def _add_run_args(p: argparse.ArgumentParser, task: str) -> None:
    from training.cli import add_dataset_args

    models = p.add_argument_group("models")
    models.add_argument("--classifier", type=Path, required=True, metavar="CKPT",
                        help="classifier checkpoint directory")
    models.add_argument("--denoiser", type=Path, default=None, metavar="CKPT",
                        help="denoiser checkpoint directory, put in front of the classifier (default: none)")
    smoothing = p.add_argument_group("smoothing")
    smoothing.add_argument("--sigma", type=positive_float, required=True,
                           help="noise standard deviation, pixels in [0,1] (e.g. 0.25); must be the sigma the "
                                "denoiser was trained at")
    smoothing.add_argument("--allow-sigma-mismatch", action="store_true",
                           help="accept a --sigma other than the denoiser's training sigma (refused otherwise)")
    if task == "certify":
        smoothing.add_argument("--n0", type=positive_int, default=100,
                               help="selection samples per image (default: 100)")
    smoothing.add_argument("--n", type=positive_int, default=100_000,
                           help="estimation samples per image (default: 100000)")
    smoothing.add_argument("--alpha", type=open_unit_interval, default=0.001,
                           help="failure probability of each " + ("certificate" if task == "certify" else "prediction")
                                + " (default: 0.001)")
    add_deprecated_spelling(smoothing, "--batch", "--batch-size", "batch_size", type=positive_int)
    smoothing.add_argument("--batch-size", type=positive_int, default=None,
                           help="noisy samples per forward pass; several images share a pass (default: "
                                f"{DEFAULT_BATCH['cpu']} on CPU, where cache-sized passes are fastest; on CUDA "
                                f"the largest that fits in half the free memory, at most {DEFAULT_BATCH['cuda']})")
    smoothing.add_argument("--workers", type=workers_arg, default="auto",
                           help="threads running forward passes side by side, torch's CPU threads shared out among "
                                "them; counts do not depend on it (default: auto = one per torch thread, at most "
                                "8, on CPU; 1 on GPU)")
    smoothing.add_argument("--memory-format", choices=MEMORY_FORMATS, default="auto",
                           help="auto: channels-last for convolutional models on CPU (faster) and on CUDA with "
                                "--compile; as given otherwise")
    add_numerics_args(smoothing)
    add_sound_noise_arg(smoothing)
    add_dataset_args(p)
    if task == "certify":
        adaptive = p.add_argument_group("adaptive certification (default: off, Cohen's fixed n)")
        mode = adaptive.add_mutually_exclusive_group()
        mode.add_argument("--radius", type=positive_float, default=None, metavar="R",
                          help="decide: is each prediction certified at L2 radius R? (stops as soon as settled)")
        mode.add_argument("--adaptive", action="store_true",
                          help="estimate: the largest certifiable radius within --n-max estimation samples")
        adaptive.add_argument("--n-max", type=positive_int, default=None, metavar="N",
                              help="budget of estimation samples per image with --radius/--adaptive (default: --n)")
        adaptive.add_argument("--tolerance", type=positive_float, default=None,
                              help="--adaptive: stop once more samples cannot raise the radius by more than this "
                                   f"(L2, [0,1] pixels; default: {DEFAULT_TOLERANCE})")
        adaptive.add_argument("--sequential", choices=SEQUENTIAL_METHODS, default=DEFAULT_SEQUENTIAL,
                              help="the sequential test (default: %(default)s: fewest samples, and n_max only "
                                   "truncates it, so a re-run with a larger --n-max extends the same test; union-cp "
                                   "splits alpha by n_max and is valid for one budget only; docs/CERTIFY.md)")
    data = p.add_argument_group("images")
    data.add_argument("--split", choices=SPLITS, default="test", help="which split to use (default: test)")
    data.add_argument("--skip", type=positive_int, default=1, help="use every K-th image (default: 1)")
    data.add_argument("--max-index", type=positive_int, default=None, metavar="M",
                      help="stop before image index M (an index bound, as Cohen et al.'s --max; not a count: with "
                           "--skip 10, --max-index 100 takes images 0, 10, ..., 90) (default: the whole split)")
    add_deprecated_spelling(data, "--max", "--max-index", "max_index", type=positive_int)
    data.add_argument("--indices", type=index_list, default=None, metavar="LIST",
                      help="exactly these image indices, e.g. 0-99,150 (instead of --skip/--max)")
    run = p.add_argument_group("run")
    run.add_argument("--out", type=Path, default=Path(f"runs/{task}"),
                     help=f"run directory (default: runs/{task}); an existing run there is resumed")
    run.add_argument("--new-test", action="store_true", help=NEW_TEST_HELP[task])
    run.add_argument("--threads", type=positive_int, default=None,
                     help="CPU threads for torch (default: torch's choice; on a busy machine 1 can be much faster)")
    run.add_argument("--shard", type=_shard, default=None, metavar="I/K",
                     help="do shard I of K (0 <= I < K) of the images; under torchrun, RANK/WORLD_SIZE by default")


def add_numerics_args(group, default_precision: str | None = "fp32") -> None:
    """``--precision`` and ``--compile``: how the base classifier is run (part of what is certified)."""
    group.add_argument("--precision", choices=PRECISIONS, default=default_precision,
                       help="arithmetic of the forward pass: fp32, or bf16/fp16 autocast (faster on GPUs); the "
                            "certificate is about the classifier as run, and the run records it (default: "
                            + ("fp32" if default_precision else "the certify run's") + ")")
    group.add_argument("--compile", action="store_true", default=None if default_precision is None else False,
                       help="run the denoiser and classifier through torch.compile (pays a compilation of tens of "
                            "seconds first; recorded like --precision)")


def add_sound_noise_arg(group) -> None:
    """``--sound-noise``: exact grid noise, sound in floating point (certify.sound_noise)."""
    group.add_argument("--sound-noise", action="store_true",
                       help="sound smoothing in floating point (Voracek and Hein 2023): images must be on the "
                            "8-bit grid k/255 (others are refused), noise is an exact discretized Gaussian added in "
                            "integers; same radius formula, recorded like --precision (docs/CERTIFY.md)")


def register(subparsers, common) -> None:
    """Add this area's subcommands to the ``transdenoiser`` parser."""
    p = subparsers.add_parser("certify", parents=[common], help="certify a dataset split with randomized smoothing",
                              description=CERTIFY_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_run_args(p, "certify")
    p.set_defaults(handler=cmd_certify)

    p = subparsers.add_parser("predict", parents=[common], help="smoothed predictions (abstain when unsure)",
                              description=PREDICT_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_run_args(p, "predict")
    p.set_defaults(handler=cmd_predict)

    p = subparsers.add_parser("certify-merge", parents=[common], help="merge the shards of a certify/predict run",
                              description="Merge the shards of a certify or predict run (one folder shared by all "
                                          "shards, or one folder per shard) into one TSV and write its summary.json, "
                                          "report.md and figure. Refuses folders of different runs and incomplete "
                                          "runs. The result is the same as one unsharded run (the time column aside).")
    p.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR", help="folders holding the shards")
    p.add_argument("--out", type=Path, default=None, help="where to write the merged run (default: the first RUN_DIR)")
    p.set_defaults(handler=cmd_merge)

    p = subparsers.add_parser("report", parents=[common], help="overlay several certify (or attack) runs",
                              description="One figure and one table over several finished runs: certified accuracy "
                                          "against L2 radius for certify runs (the form of the TransDenoiser paper's "
                                          "Figure 2), labelled by the denoiser's training arm and sigma; folders "
                                          "holding attack.json are overlaid by the attack report. A baseline-certify "
                                          "run folder is given alone: its report.md is rendered again into --out "
                                          "(which may be the run folder itself).")
    p.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR", help="finished run folders")
    p.add_argument("--out", type=Path, required=True, help="folder for report.md, certified_accuracy.png, overlay.json")
    p.set_defaults(handler=cmd_report)


def job_from_args(args, task: str):
    """The :class:`certify.job.CertifyJob` that ``certify``/``predict`` flags describe."""
    from certify.job import CertifyJob

    adaptive = {} if task != "certify" else {
        "n0": args.n0, "radius": args.radius, "adaptive": args.adaptive, "n_max": args.n_max,
        "tolerance": args.tolerance, "sequential": args.sequential}
    return CertifyJob(classifier=args.classifier, denoiser=args.denoiser, sigma=args.sigma, out=args.out, task=task,
                      n=args.n, alpha=args.alpha, dataset=args.dataset, data_root=args.data_root,
                      split_seed=args.split_seed, split=args.split, skip=args.skip, max_index=args.max_index,
                      indices=args.indices, seed=args.seed, batch_size=args.batch_size, workers=args.workers,
                      memory_format=args.memory_format, precision=args.precision, compile=args.compile,
                      noise="sound" if args.sound_noise else "gaussian", device=args.device, shard=args.shard,
                      allow_sigma_mismatch=args.allow_sigma_mismatch, new_test=args.new_test, **adaptive)


def cmd_certify(args) -> int:
    return _run(args, "certify")


def cmd_predict(args) -> int:
    return _run(args, "predict")


def _warn(message: str) -> None:
    print(message, file=sys.stderr)


def _run(args, task: str) -> int:
    job = job_from_args(args, task)
    job.mode  # noqa: B018 - checks the adaptive flags' combinations at once, before torch is imported
    from certify.job import run_job
    from certify.report import format_certified_accuracy_table, format_prediction_summary
    from transdenoiser.progress import bar

    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    outcome = run_job(job, track=bar, warn=_warn)
    if not outcome.complete:
        resume = shlex.join(["transdenoiser", *args.argv]) if getattr(args, "argv", None) else None
        print(f"transdenoiser {task}: interrupted; {outcome.kept} of {outcome.expected} images are saved in "
              f"{outcome.rows_path} (status: {outcome.status_path})"
              + (f"; resume with: {resume}" if resume else "; run the same command again to resume"), file=sys.stderr)
        return 130
    where = f"shard {outcome.shard}" if outcome.shard else "run"
    print(f"{task}: {outcome.done_now} images done now, {outcome.done_before} done before ({where}, "
          f"{outcome.hardware}); rows in {outcome.rows_path}")
    if outcome.summary is None:
        print(f"{task}: waiting for the other shards ({'; '.join(outcome.waiting_for)}); when all are done, "
              f"'transdenoiser certify-merge {args.out}' writes the report (the last shard to finish does it too)")
        return 0
    summary = outcome.summary
    print(format_certified_accuracy_table(summary) if task == "certify" else format_prediction_summary(summary))
    print(f"wrote {args.out}/summary.json and report.md" + (", certified_accuracy.png" if task == "certify" else ""))
    _warn_again_if_worse(summary)
    return 0


def _warn_again_if_worse(summary: dict) -> None:
    """The run's denoiser measured worse than no denoiser in training: warned at the start, and again after the
    figures, where they are read."""
    from transdenoiser.checks import worse_than_classifier, worse_than_classifier_warning

    worse = worse_than_classifier(summary.get("denoiser_metadata"))
    if worse is not None:
        print(worse_than_classifier_warning(worse, "this run's denoiser"), file=sys.stderr)


def cmd_merge(args) -> int:
    from certify.report import finalize_run, format_certified_accuracy_table, format_prediction_summary
    from transdenoiser.lock import RunLock

    with RunLock(args.out or args.run_dirs[0]):  # not while a whole (unsharded) run still writes there
        summary = finalize_run(args.run_dirs, args.out)
    print(format_certified_accuracy_table(summary) if summary["task"] == "certify"
          else format_prediction_summary(summary))
    out = args.out or args.run_dirs[0]
    print(f"merged {len(args.run_dirs)} folder(s) into {out}: {summary['task']}.tsv, summary.json, report.md")
    return 0


def cmd_report(args) -> int:
    from certify.attacks.overlay import overlay_runs

    written = overlay_runs(args.run_dirs, args.out, warn=lambda line: print(line, file=sys.stderr))
    for path in written:
        print(f"wrote {path}")
    return 0
