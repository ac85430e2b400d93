"""``transdenoiser demo``: the main job end to end on the embedded mnist10k data."""
from __future__ import annotations

from pathlib import Path

from transdenoiser.argtypes import positive_int
from transdenoiser.progress import bar
from transdenoiser.runtime import hardware_description, resolve_device, seed_everything


def register(subparsers, common) -> None:
    p = subparsers.add_parser("demo", parents=[common], help="run the main job end to end on the embedded data",
                              description="Pretrain the classifier on mnist10k's public split and report its "
                                          "accuracy and checkpoint.")
    p.add_argument("--out", type=Path, default=Path("runs/demo"), help="where the demo writes (default: runs/demo)")
    p.add_argument("--pretrain-epochs", type=positive_int, default=8, help="classifier epochs (default: 8)")
    p.set_defaults(handler=cmd_demo)


def cmd_demo(args) -> int:
    from training.checkpoint import save_checkpoint
    from training.datasets import load_dataset
    from training.pretrain import PretrainConfig, pretrain_classifier

    device = resolve_device(args.device)
    seed_everything(args.seed)
    dataset = load_dataset("mnist10k")
    print(f"[1] data: mnist10k public {len(dataset.public)} / private {len(dataset.private)} / "
          f"test {len(dataset.test)} images; device: {hardware_description(device)}")
    classifier_dir = args.out / "classifier"
    model, meta = pretrain_classifier(dataset, PretrainConfig(epochs=args.pretrain_epochs), device, args.seed,
                                      track=bar)
    save_checkpoint(classifier_dir, model, meta)
    print(f"[2] classifier {meta['architecture']}: test accuracy {meta['test_accuracy']:.4f} "
          f"in {meta['train']['seconds']:.0f} s; checkpoint: {classifier_dir}")
    return 0
