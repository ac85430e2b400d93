"""Subcommand ``train``: train on the private split with a training method (training/methods): a denoiser arm, the
tuned recipe, or a baseline.

Settings come from, in rising precedence: TrainConfig's defaults, ``--config FILE`` (TOML, keys are
TrainConfig's field names), and the flags given. With ``--resume`` the saved run's settings are the base
and anything given must agree with them.
"""
from __future__ import annotations

import argparse
import builtins
import os
import sys
from pathlib import Path

from training.train_flags import FLAG_FIELDS, config_from_args  # noqa: F401 (FLAG_FIELDS: tests)
from transdenoiser.argtypes import nonnegative_float, nonnegative_int, open_unit_interval, positive_float, positive_int
from transdenoiser.errors import UserError
from transdenoiser.progress import bar, silent
from transdenoiser.runtime import hardware_description, resolve_device, seed_everything

DEFAULT_DATASET = "mnist10k"  # training.cli.add_dataset_args's default
DEFAULT_MIN_STEPS = 200  # --batch-size auto: training.methods.denoiser_config.DEFAULT_MIN_STEPS (no torch here)

# the per-epoch figures computed from the private split or the run itself (losses, times): printed for the trainer,
# stored only in the private training record, never in the released files `bundle` copies
PRIVATE_FIGURES_NOTE = ("note: figures marked PRIVATE below (the training loss, computed from the private split "
                        "without noise, and the epoch times, which tell when training ran) are for you only: they "
                        "are stored in {private} (never released; `transdenoiser bundle` and serve never copy it) "
                        "and in no released file; do not paste them into a model card or log you share")


def size_or_auto(text: str) -> int:
    """``--grad-chunk-size`` / ``--physical-batch-size``: ``auto`` (sized for the device) or an integer >= 0."""
    from training.privacy.clipping import parse_size

    try:
        return parse_size(text, "the value")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def batch_size_or_auto(text: str):
    """``--batch-size``: a positive integer, or ``auto`` (planned for --target-epsilon by training.recipe)."""
    return "auto" if text == "auto" else positive_int(text)


def register(subparsers, common) -> None:
    from training.choices import ACTIVATIONS, ARMS, DENOISERS, OBJECTIVES, OPTIMIZERS
    from training.cli import add_dataset_args

    p = subparsers.add_parser(
        "train", parents=[common],
        help="train with DP on the private split (nodp|sepdp|transdenoiser|recipe|baselines)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train a denoiser g in front of the frozen classifier h on the private split, minimising "
                    "||g(x + N(0, sigma^2 I)) - x||^2, and save a checkpoint every epoch with a privacy report.\n"
                    "  nodp           input noise only, no privacy claim\n"
                    "  sepdp          DP-SGD: Poisson sampling q=B/N, clipping at C, noise std xi_up*C on the sum\n"
                    "  transdenoiser  Algorithm 1 of the TransDenoiser paper (reports the paper's data-dependent\n"
                    "                 MMGA epsilon AND what the explicitly added noise alone would give)\n"
                    "  recipe         the tuned recipe: sepdp with the batch size planned for --target-epsilon\n"
                    "                 (required), DP-Adam lr 3e-3, no averaging (docs/TRAINING.md)\n"
                    "Noise multipliers (xi_up, xi_low) are std / C of the noise on the SUMMED clipped gradient; "
                    "pixels are in [0, 1]. See docs/PRIVACY.md and docs/TRAINING.md.",
        epilog="example: transdenoiser train --config configs/demo.toml --classifier runs/classifier "
               "--out runs/denoiser")
    p.add_argument("--config", type=Path, default=None, help="TOML file of settings (see configs/); flags override")
    p.add_argument("--classifier", type=Path, default=None,
                   help="frozen classifier checkpoint directory (required unless --resume)")
    p.add_argument("--out", type=Path, default=None,
                   help="checkpoint directory written after every epoch (required unless --plan)")
    p.add_argument("--resume", action="store_true", help="continue the run saved in --out exactly where it stopped")
    add_dataset_args(p)
    g = p.add_argument_group("arm and privacy")
    g.add_argument("--arm", choices=ARMS, default=None, help="training arm (default: transdenoiser)")
    g.add_argument("--sigma", type=positive_float, default=None,
                   help="input noise std, pixels in [0,1]; also the smoothing sigma (default: 0.25)")
    g.add_argument("--clip-norm", type=positive_float, default=None, help="per-example clipping norm C (default: 1)")
    g.add_argument("--xi-up", type=positive_float, default=None,
                   help="noise multiplier xi_up: std / C of the noise on the summed clipped gradient (default: 2)")
    g.add_argument("--xi-low", type=nonnegative_float, default=None,
                   help="transdenoiser arm: line-16 threshold xi_low <= xi_up, in noise-multiplier units "
                        "(default: 0.5)")
    g.add_argument("--target-epsilon", type=positive_float, default=None,
                   help="calibrate xi_up so that epsilon (by --calibration-accountant) <= this at --delta")
    g.add_argument("--calibration-accountant", choices=("rdp", "pld"), default=None,
                   help="accountant for --target-epsilon (default: rdp, the looser: errs toward more noise)")
    g.add_argument("--delta", type=open_unit_interval, default=None, help="delta, must be < 1/N (default: 1e-5)")
    g.add_argument("--train-on", choices=("private", "public"), default=None,
                   help="the split to train on: public needs --arm nodp and spends no privacy; such a denoiser can "
                        "then initialise a private run with --init-from (default: private)")
    g.add_argument("--objective", choices=OBJECTIVES, default=None,
                   help="each example's loss: mse (pixel error), stability (the frozen classifier's cross-entropy "
                        "against its prediction on the clean image), classification (against the private label), "
                        "stability+mse (MSE on the public split first, then stability on the private split); "
                        "the transdenoiser arm takes mse only (default: mse)")
    g.add_argument("--init-from", type=str, default=None,
                   help="start from this denoiser checkpoint, which must have been trained on the public split "
                        "(public initialisation, recorded in the privacy report; refused otherwise)")
    g.add_argument("--merge-uncredited-noise", action=argparse.BooleanOptionalAction, default=None,
                   help="transdenoiser arm: in a step without input-noise credit add xi_up once to the whole clipped "
                        "sum (the sepdp step) instead of to each group (default: on; off reproduces the paper)")
    g.add_argument("--noise-draws", type=positive_int, default=None,
                   help="sepdp: average each example's gradient over K input-noise draws, then clip once (same "
                        "privacy cost; less gradient variance) (default: 1)")
    g.add_argument("--noise", choices=("isotropic", "shaped", "optimized"), default=None,
                   help="sepdp's gradient noise: isotropic (DP-SGD, default); shaped (per-layer clip budgets C_g, "
                        "sum C_g^2 = C^2, and per-layer noise shaped from the public split: the same epsilon as "
                        "isotropic noise at xi_up); optimized (Xiang et al.'s Algorithm 1 as written: its claimed "
                        "epsilon does NOT hold; refused without --i-understand-unsound)")
    g.add_argument("--shape-examples", type=positive_int, default=None,
                   help="--noise shaped: public images per step from which the noise shape is computed (default: 128)")
    g.add_argument("--i-understand-unsound", action="store_const", const=True, default=None,
                   help="allow --noise optimized, whose privacy claim does not hold (for reproducing the paper only)")
    g.add_argument("--reproducible-noise", action="store_const", const=True, default=None,
                   help="draw the DP noise and Poisson batches from --seed (research only: the seed is recorded and "
                        "anyone who has it can subtract the noise, so no epsilon holds; every report says so). "
                        "Default: a secret generator seeded from the OS, its seed never stored")
    g = p.add_argument_group("optimisation")
    g.add_argument("--batch-size", type=batch_size_or_auto, default=None,
                   help="expected batch size B; Poisson rate q = B/N for the DP arms; auto (needs --target-epsilon): "
                        "the largest power of two >= 64 that leaves --min-steps steps, see --plan "
                        "(default: 64; recipe: auto)")
    g.add_argument("--min-steps", type=positive_int, default=None,
                   help=f"--batch-size auto: the fewest steps T to leave (default: {DEFAULT_MIN_STEPS})")
    g.add_argument("--plan", action="store_true",
                   help="print the batch-size plan for --target-epsilon (steps, calibrated xi, xi/B per batch size) "
                        "and exit without training")
    g.add_argument("--epochs", type=positive_int, default=None, help="epochs; T = epochs * round(N/B) (default: 10)")
    g.add_argument("--optimizer", choices=OPTIMIZERS, default=None,
                   help="sgd or adam (DP-Adam: Adam on the privatised gradient) (default: sgd; recipe: adam)")
    g.add_argument("--lr", type=positive_float, default=None, help="learning rate (default: 0.1; recipe: 3e-3)")
    g.add_argument("--momentum", type=nonnegative_float, default=None, help="SGD momentum (default: 0.9)")
    g.add_argument("--ema", type=nonnegative_float, default=None, metavar="DECAY",
                   help="parameter averaging: evaluate and release an exponential moving average of the weights "
                        "with this decay, e.g. 0.999 (post-processing: no privacy cost) (default: 0 = off)")
    g.add_argument("--train-examples", type=nonnegative_int, default=None,
                   help="train on a fixed random subset of this many private examples (default: 0 = all)")
    g.add_argument("--eval-examples", type=nonnegative_int, default=None,
                   help="evaluate on a fixed random subset of this many test examples (default: 0 = all)")
    g = p.add_argument_group("denoiser")
    g.add_argument("--denoiser", choices=DENOISERS, default=None,
                   help="autoencoder (paper's, 37.6k params at 28x28x1), tiny (737 params: S_min computable), "
                        "dncnn (17 layers, 556k params) (default: autoencoder)")
    g.add_argument("--activation", choices=tuple(ACTIVATIONS), default=None,
                   help="hidden activation; relu makes S_min exactly 0 (rescaling symmetry) (default: relu)")
    g.add_argument("--denoiser-width", type=positive_int, default=None,
                   help="width of tiny / dncnn (channels); for autoencoder use denoiser_kwargs.widths in --config")
    g.add_argument("--dncnn-depth", type=positive_int, default=None, help="dncnn depth in layers (default: 17)")
    g.add_argument("--norm", choices=("group", "none"), default=None,
                   help="autoencoder / dncnn normalisation: GroupNorm (per example) or none; BatchNorm is refused by "
                        "the DP arms (it mixes a batch's examples) (default: none for autoencoder, group for dncnn)")
    g.add_argument("--max-smin-dim", type=positive_int, default=None,
                   help="transdenoiser arm: largest parameter count w for which S_min is computed; above, it is "
                        "treated as 0 (full explicit noise) and reported (default: 4096)")
    g = p.add_argument_group("speed and memory (the clipped sums are the same to float rounding)")
    g.add_argument("--clipping", choices=("auto", "ghost", "vmap"), default=None,
                   help="how per-example gradients are clipped: ghost (norms from layer activations and output "
                        "gradients, no per-example copy of the weights), vmap (every per-example gradient), auto "
                        "(the faster on this model and device, timed on a synthetic batch; default)")
    g.add_argument("--grad-chunk-size", type=size_or_auto, default=None, metavar="N|auto",
                   help="vmap: per-example gradients in chunks of at most N examples (0: one call; auto: from the "
                        "free GPU memory, the whole batch when it fits; 32 on CPU) (default: auto)")
    g.add_argument("--physical-batch-size", type=size_or_auto, default=None, metavar="N|auto",
                   help="process each Poisson batch in pieces of at most N examples, for batches larger than memory "
                        "(0: one piece; auto: from the free GPU memory, one piece on CPU) (default: auto)")
    g.add_argument("--compile", action="store_const", const=True, default=None,
                   help="torch.compile vmap's per-example gradient function (the first steps pay for compiling; "
                        "ghost clipping stays eager) (default: off)")
    g.add_argument("--cuda-graphs", choices=("auto", "off"), default=None,
                   help="ghost clipping on CUDA: replay each batch piece's clipped sums as a CUDA graph, the piece "
                        "padded with zero-weight rows to a fixed size (auto: where the model has no batch-statistics "
                        "layer; off: eager) (default: auto)")
    p.add_argument("--json", action="store_true", help="print the final metadata (metrics, privacy report) as JSON")
    p.set_defaults(handler=cmd_train)


def interrupted_message(out: Path, epochs: int) -> str:
    """What an interrupted ``train`` kept in ``out`` (a checkpoint is written after every whole epoch)."""
    import json

    try:
        done = int(json.loads((Path(out) / "metadata.json").read_text())["epochs_done"])
    except (OSError, ValueError, KeyError, TypeError):
        done = 0
    if done == 0:
        return (f"transdenoiser train: interrupted during the first epoch: nothing was saved in {out} (a checkpoint "
                "is written after each whole epoch); run the same command again to start over")
    return (f"transdenoiser train: interrupted: {done} of {epochs} epochs are saved in {out} (the epoch in "
            f"progress is not); resume with: transdenoiser train --out {out} --resume")


def resolve_auto_batch(args, config, num_examples: int, print=builtins.print) -> None:  # noqa: A002
    """``--batch-size auto`` or ``--plan``: plan the batch sizes for the target epsilon (the recipe mode of the
    denoiser methods, training/methods/denoiser.py), print the plan, and set ``config.batch_size`` to the chosen
    one."""
    from training.methods.denoiser import plan_batch

    _, chosen, text = plan_batch(config, num_examples)
    print(text, file=sys.stdout if getattr(args, "plan", False) else sys.stderr)  # privacy-audit has no --plan
    config.batch_size = chosen.batch_size


def note_unused_settings(method, settings, source, print=builtins.print) -> None:  # noqa: A002
    """One note line on stderr naming the keys of a shared ``--config`` file that this denoiser arm does not use
    (another arm's settings; :meth:`training.methods.denoiser.DenoiserMethod.unused_settings`)."""
    unused = getattr(method, "unused_settings", None)
    names = unused(settings, source) if unused is not None else []
    if names:
        from training.methods.denoiser_config import unused_note

        print(f"note: --config {source.path}: {unused_note(method.name, names)}", file=sys.stderr)


def _plan_only(args) -> int:
    """``train --plan``: the batch-size plan for this data set and target epsilon; nothing is trained or written."""
    from training.cli import load_dataset_from_args
    from training.methods.denoiser import training_examples

    if args.arm == "stobatch":
        raise UserError("--plan plans Poisson-sampled DP-SGD; the stobatch arm trains on disjoint batches (each "
                        "example once per epoch): leave out --plan and give --batch-size")
    from training.train_flags import method_and_settings

    method, settings, source = method_and_settings(args)
    config = method.config_from_settings(settings, source)
    note_unused_settings(method, settings, source)
    dataset = load_dataset_from_args(args)
    given = config.batch_size
    resolve_auto_batch(args, config, training_examples(config, dataset))
    describe = getattr(method, "describe", None)  # a method over an arm (recipe) says what it chose
    if describe is not None:
        if given != "auto":  # the batch size the run would train with: the one given, not the plan's choice
            config.batch_size = given
        print(describe(config, given == "auto"))
    return 0


def cmd_train(args) -> int:
    if getattr(args, "plan", False):
        return _plan_only(args)
    if args.out is None:
        raise UserError("--out is required: the checkpoint directory to write (only --plan trains nothing)")
    device = resolve_device(args.device)
    group = None
    try:
        if "WORLD_SIZE" in os.environ:  # under torchrun: one process group, rank 0 writes and prints
            from certify.runner import rank_device
            from training.distributed import rank_group_from_environment

            device = rank_device(device)
            group = rank_group_from_environment(device)
        if group is not None and not group.is_writer:
            return _train(args, device, group)
        from transdenoiser.lock import RunLock

        with RunLock(args.out, purpose="train"):  # one writer per run directory
            return _train(args, device, group)
    finally:
        if group is not None:
            from training.distributed import close

            close(group)


def _train(args, device, group) -> int:
    """flags -> the method's settings -> its config -> its training -> text: the denoiser arms and the baselines
    have their own console text (below and training/baselines/train_cli.py), any other registered method the
    generic one (:func:`_train_method`)."""
    from training.train_flags import method_and_settings

    writer = group is None or group.is_writer
    print = builtins.print if writer else _silent  # noqa: A001 -- only rank 0 speaks under torchrun
    saved = None
    if args.resume and args.arm is None:  # the saved run's arm, unless --arm or --config names one
        from training.checkpoint import read_metadata

        try:
            saved = read_metadata(args.out).get("config")
        except UserError:
            saved = None  # no run there: said below, by the method's own resume
    method, _, _ = method_and_settings(args, {"arm": saved.get("arm")} if isinstance(saved, dict) else None)
    name = method.name
    method.check_run(resume=args.resume, distributed="WORLD_SIZE" in os.environ)
    if name in ("securesgd-prt", "securesgd-sct"):  # Phan et al.'s SecureSGD baselines (training/baselines)
        from training.baselines.train_cli import cmd_train_securesgd

        return cmd_train_securesgd(args, method, device, print)
    if name == "stobatch":  # Phan et al.'s StoBatch baseline (training/baselines/stobatch.py)
        from training.baselines.train_cli import cmd_train_stobatch

        return cmd_train_stobatch(args, method, device, print)
    from training.methods.registry import DENOISER_METHODS

    if name in DENOISER_METHODS:  # the denoiser arms and the recipe over sepdp
        return _train_denoiser(args, method, device, group, print)
    return _train_method(args, method, device, print)


def _train_method(args, method, device, print=builtins.print) -> int:  # noqa: A002
    """A registered method without console text of its own: its config from the flags, training with a progress
    bar and one line per epoch, its checkpoint saved in --out, then its metadata (JSON) or one summary line."""
    import json

    from training.checkpoint import load_checkpoint
    from training.cli import load_dataset_from_args
    from training.methods import Hooks
    from training.train_flags import method_and_settings

    _, settings, source = method_and_settings(args)
    config = method.config_from_settings(settings, source)
    seed_everything(getattr(config, "seed", args.seed))
    dataset = load_dataset_from_args(args)
    classifier = None
    if args.classifier is not None:
        classifier = load_checkpoint(args.classifier, kind="classifier", map_location=device)
    print(f"train {method.name}: on {dataset.name}, device {hardware_description(device)}", file=sys.stderr)

    def on_epoch(row: dict) -> None:
        shown = "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items())
        print(shown, file=sys.stderr, flush=True)

    result = method.train(config, dataset, classifier, device, Hooks(track=bar, on_epoch=on_epoch), out=args.out)
    method.save(config, result, args.out)
    if args.json:
        print(json.dumps(result.metadata, indent=2))
    else:
        print(f"trained {method.name}: checkpoint {args.out}")
    return 0


def _train_denoiser(args, method, device, group, print=builtins.print) -> int:  # noqa: A002
    import json

    from training.checkpoint import load_checkpoint, read_metadata, recover_interrupted_save
    from training.cli import load_dataset_from_args
    from training.methods import Hooks
    from training.methods.denoiser import training_examples
    from training.privacy.report import format_privacy_report
    from training.train_flags import method_and_settings

    writer = group is None or group.is_writer
    base = None
    if args.resume:
        if writer:
            recovered = recover_interrupted_save(args.out)
            if recovered:
                print(f"note: {args.out}: an interrupted save was found: {recovered}", file=sys.stderr)
        if group is not None:
            group.barrier()
        saved = read_metadata(args.out)
        if saved.get("kind") != "denoiser" or "config" not in saved:
            raise UserError(f"--resume: {args.out} does not hold a denoiser training run")
        base = saved["config"]
        classifier_dir = args.classifier or Path(saved["classifier"]["path"])
        saved_data = saved.get("dataset") or {}
        if args.dataset == DEFAULT_DATASET and saved_data.get("name") not in (None, DEFAULT_DATASET):
            args.dataset = saved_data["name"]  # the run's own data set, without repeating --dataset
            args.split_seed = saved_data.get("split_seed", args.split_seed)
            print(f"note: --resume: data set {args.dataset} (split seed {args.split_seed}) as saved in {args.out}",
                  file=sys.stderr)
    else:
        if args.classifier is None:
            raise UserError("--classifier is required (the frozen classifier checkpoint directory)")
        classifier_dir = args.classifier
    _, settings, source = method_and_settings(args, base)
    config = method.config_from_settings(settings, source, base)
    note_unused_settings(method, settings, source, print)
    seed_everything(config.seed)
    dataset = load_dataset_from_args(args)
    classifier = load_checkpoint(classifier_dir, kind="classifier", map_location=device)
    planned = config.batch_size == "auto"
    if planned:
        resolve_auto_batch(args, config, training_examples(config, dataset), print=print)
    describe = getattr(method, "describe", None)  # a method over an arm (recipe): what it chose, and the arm
    if describe is not None:
        print(describe(config, planned), file=sys.stderr)
    config.validate(len(dataset.private) if not config.train_examples
                    else min(config.train_examples, len(dataset.private)))
    print(f"train {config.arm}: {config.denoiser} ({config.activation}) on {dataset.name} {config.train_on} split, "
          f"objective {config.objective}, sigma {config.sigma}, device {hardware_description(device)}",
          file=sys.stderr)
    if group is not None and group.distributed:
        print(f"torchrun: {group.world_size} processes ({group.backend}); each step's Poisson batch is shared out "
              "among them, their clipped sums added by one all-reduce, the noise drawn once; rank 0 writes "
              f"{args.out}", file=sys.stderr)
    if config.reproducible_noise and config.arm != "nodp":
        print(f"WARNING: --reproducible-noise: the DP noise is drawn from seed {config.seed}, which is recorded; "
              "the epsilon does not hold against anyone who has it (every report says so)", file=sys.stderr)
    if config.noise == "optimized":
        print("WARNING: --noise optimized (Xiang et al.'s Algorithm 1 as written): its claimed epsilon does not hold "
              "and no data-independent epsilon exists; do not release this model as private (docs/PRIVACY.md)",
              file=sys.stderr)
    if config.target_epsilon is not None and config.arm != "nodp":
        from dataclasses import fields

        configured = "xi_up" in {f.name for f in fields(config)}  # not a setting of the recipe
        print(f"note: xi_up will be calibrated for target epsilon {config.target_epsilon} "
              f"({config.calibration_accountant} accountant)"
              + (f"; the configured xi_up {config.xi_up:g} is not used" if configured else ""), file=sys.stderr)

    if writer:
        print(PRIVATE_FIGURES_NOTE.format(private=f"{args.out}/private/"), file=sys.stderr)

    def on_epoch(row: dict) -> None:
        print(f"epoch {row['epoch']:>3}  test MSE {row['mse']:.5f}  PSNR {row['psnr']:.2f} dB  classifier acc on "
              f"g(x+noise) {row['accuracy_denoised']:.4f}  |  PRIVATE: train loss {row['train_loss']:.3f}, "
              f"{row['seconds']:.0f} s", file=sys.stderr, flush=True)

    hooks = Hooks(track=bar if writer else silent, on_epoch=on_epoch if writer else None,
                  on_plan=(lambda text: print(text, file=sys.stderr)) if writer else None)
    try:
        result = method.train(config, dataset, classifier, device, hooks, out=args.out, resume=args.resume,
                              group=group)
    except KeyboardInterrupt:
        print(interrupted_message(args.out, config.epochs), file=sys.stderr)
        return 130
    if not writer:
        return 0
    model, meta = result.model, result.metadata
    from transdenoiser.checks import worse_than_classifier, worse_than_classifier_warning

    worse = worse_than_classifier(meta)  # the denoiser hurts: said loudly on stderr, also with --json
    if args.json:
        print(json.dumps(meta, indent=2))
        if worse is not None:
            print(worse_than_classifier_warning(worse, f"denoiser {args.out}"), file=sys.stderr)
        return 0
    base_acc = meta["baselines"]
    last = meta["metrics"][-1]
    print(f"denoiser {meta['architecture']} ({sum(p.numel() for p in model.parameters())} parameters), "
          f"{meta['epochs_done']} epochs")
    print(f"classifier accuracy on test images + N(0, {config.sigma}^2): with denoiser "
          f"{last['accuracy_denoised']:.4f}; without {base_acc['accuracy_noisy_no_denoiser']:.4f}; "
          f"clean {base_acc['accuracy_clean']:.4f}")
    print(f"reconstruction: MSE {last['mse']:.5f}, PSNR {last['psnr']:.2f} dB")
    print(format_privacy_report(meta["privacy"]))
    print(f"checkpoint: {args.out}  (privacy report also in {args.out}/privacy_report.txt)")
    if config.arm != "nodp":
        print(f"private training record (never release it; `transdenoiser bundle`/serve never copy it): "
              f"{args.out}/private/  (losses, batch sizes, per-step noise, S_min, generator state)")
    if worse is not None:
        print(worse_than_classifier_warning(worse, f"denoiser {args.out}"), file=sys.stderr)
    return 0


def _silent(*args, **kwargs) -> None:
    """``print`` on the ranks other than 0 under torchrun."""
