"""Subcommands ``data``, ``pretrain`` and ``import-classifier``."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from transdenoiser.argtypes import nonnegative_int, positive_float, positive_int
from transdenoiser.errors import UserError
from transdenoiser.progress import bar
from transdenoiser.runtime import resolve_device, seed_everything

DATASET_HELP = ("mnist10k (embedded, default), mnist, fashion-mnist (finds the Debian package dataset-fashion-mnist),"
                " cifar10, imagefolder")


def add_dataset_args(parser: argparse.ArgumentParser) -> None:
    from training.datasets import DATASETS, DEFAULT_SPLIT_SEED

    group = parser.add_argument_group("data")
    group.add_argument("--dataset", choices=DATASETS, default="mnist10k", metavar="NAME", help=DATASET_HELP)
    group.add_argument("--data-root", type=Path, default=None,
                       help="folder in the standard torchvision layout (MNIST/raw, FashionMNIST/raw, "
                            "cifar-10-batches-py) or, for imagefolder, DIR/CLASS/IMAGE")
    group.add_argument("--split-seed", type=nonnegative_int, default=DEFAULT_SPLIT_SEED,
                       help=f"seed of the public/private/test split (default: {DEFAULT_SPLIT_SEED})")


def load_dataset_from_args(args):
    from training.datasets import load_dataset

    return load_dataset(args.dataset, args.data_root, args.split_seed)


def register(subparsers, common) -> None:
    p = subparsers.add_parser("data", parents=[common], help="show a dataset's splits, class balance, fingerprints",
                              description="Load a dataset from disk (never downloaded) and show its three disjoint "
                                          "splits: sizes, class balance and a SHA-256 fingerprint of each.")
    add_dataset_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(handler=cmd_data)

    p = subparsers.add_parser("pretrain", parents=[common], help="pretrain the classifier on the public split",
                              description="Train the classifier h on the public split only, measure its accuracy "
                                          "on the test split, and save a checkpoint (safetensors + JSON metadata).")
    add_dataset_args(p)
    p.add_argument("--arch", default=None, help="cnn28, resnet20 or torchvision:NAME (default: by image size)")
    p.add_argument("--epochs", type=positive_int, default=8, help="training epochs (default: 8)")
    p.add_argument("--batch-size", type=positive_int, default=128, help="batch size (default: 128)")
    p.add_argument("--lr", type=positive_float, default=2e-3,
                   help="peak learning rate, one-cycle AdamW (default: 2e-3)")
    p.add_argument("--out", type=Path, default=Path("runs/classifier"),
                   help="checkpoint directory (default: runs/classifier)")
    p.set_defaults(handler=cmd_pretrain)

    p = subparsers.add_parser("import-classifier", parents=[common],
                              help="wrap your own torchvision state dict as a classifier checkpoint",
                              description="Bring the state dict of a torchvision architecture (a .safetensors file, "
                                          "or a .pt/.pth state dict loaded with weights_only=True), measure it on "
                                          "the dataset's test split and save it as a checkpoint.")
    add_dataset_args(p)
    p.add_argument("--arch", required=True, help="torchvision architecture name, e.g. resnet18")
    p.add_argument("--weights", type=Path, required=True, help="state dict file (.safetensors, .pt, .pth)")
    p.add_argument("--mean", type=float, nargs="+", default=None,
                   help="per-channel normalisation mean the weights expect (default: ImageNet's)")
    p.add_argument("--std", type=float, nargs="+", default=None,
                   help="per-channel normalisation std the weights expect (default: ImageNet's)")
    p.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")
    p.set_defaults(handler=cmd_import_classifier)


def cmd_data(args) -> int:
    dataset = load_dataset_from_args(args)
    rows = {}
    for name in ("public", "private", "test"):
        split = dataset.split(name)
        rows[name] = {"size": len(split), "class_counts": split.class_counts(dataset.num_classes),
                      "fingerprint": split.fingerprint()}
    total = sum(r["size"] for r in rows.values())
    if args.json:
        print(json.dumps({"dataset": dataset.name, "source": dataset.source, "classes": list(dataset.classes),
                          "image_shape": list(dataset.image_shape), "split_seed": dataset.split_seed,
                          "total": total, "splits": rows}, indent=2))
        return 0
    print(f"dataset {dataset.name}  ({dataset.source})")
    print(f"images {'x'.join(map(str, dataset.image_shape))} (C x H x W), {dataset.num_classes} classes, "
          f"split seed {dataset.split_seed}, {total} images in all")
    print(f"{'split':<8} {'size':>7}  {'fingerprint':<16}  class counts")
    for name, row in rows.items():
        print(f"{name:<8} {row['size']:>7}  {row['fingerprint']:<16}  {' '.join(map(str, row['class_counts']))}")
    print("splits are disjoint by construction (seeded per-class partition; see docs/DATA.md)")
    return 0


def cmd_pretrain(args) -> int:
    from training.checkpoint import save_checkpoint
    from training.pretrain import PretrainConfig, pretrain_classifier

    device = resolve_device(args.device)
    seed_everything(args.seed)
    dataset = load_dataset_from_args(args)
    config = PretrainConfig(architecture=args.arch, epochs=args.epochs, batch_size=args.batch_size,
                            learning_rate=args.lr)
    model, meta = pretrain_classifier(dataset, config, device, args.seed, track=bar)
    save_checkpoint(args.out, model, meta)
    print(f"classifier {meta['architecture']} on {dataset.name}: test accuracy {meta['test_accuracy']:.4f} "
          f"({len(dataset.test)} test images) after {meta['train']['seconds']:.0f} s on {device}")
    print(f"checkpoint: {args.out}")
    return 0


def _read_state_dict(path: Path) -> dict:
    import torch

    from training.checkpoint import load_tensors

    if not path.is_file():
        raise UserError(f"--weights {path}: no such file")
    if path.suffix == ".safetensors":
        return load_tensors(path, None)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure to read is the user's file
        raise UserError(f"--weights {path}: not a state dict loadable with weights_only=True ({exc})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"--weights {path}: expected a dict of tensor names to tensors (a state_dict)")
    return state


def cmd_import_classifier(args) -> int:
    from training.checkpoint import save_checkpoint
    from training.models import build_model
    from training.pretrain import accuracy

    device = resolve_device(args.device)
    dataset = load_dataset_from_args(args)
    channels = dataset.image_shape[0]
    kwargs = {"num_classes": dataset.num_classes, "in_channels": channels}
    if args.mean is not None:
        kwargs["mean"] = args.mean
    if args.std is not None:
        kwargs["std"] = args.std
    for key in ("mean", "std"):
        if key in kwargs and len(kwargs[key]) != channels:
            raise UserError(f"--{key}: {len(kwargs[key])} values for {channels}-channel images")
    model = build_model(f"torchvision:{args.arch}", **kwargs)
    state = {f"net.{k}": v for k, v in _read_state_dict(args.weights).items()}
    state.update({f"normalize.{k}": v for k, v in model.normalize.state_dict().items()})
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise UserError(f"--weights {args.weights}: does not fit torchvision {args.arch} with "
                        f"{dataset.num_classes} classes ({str(exc).splitlines()[0]})") from None
    model.to(device).eval()
    x, y = dataset.test.tensors(device)
    acc = accuracy(model, x, y, batch_size=256)
    meta = {"kind": "classifier", "architecture": f"torchvision:{args.arch}", "arch_kwargs": kwargs,
            "input_shape": list(dataset.image_shape), "num_classes": dataset.num_classes,
            "class_names": list(dataset.classes),
            "normalization": {"mean": model.normalize.mean.flatten().tolist(),
                              "std": model.normalize.std.flatten().tolist()},
            "dataset": {"name": dataset.name, "split_seed": dataset.split_seed, "trained_on": "unknown (imported)",
                        "fingerprints": dataset.released_fingerprints(), "source": dataset.source},
            "test_accuracy": acc, "imported_from": str(args.weights)}
    save_checkpoint(args.out, model, meta)
    print(f"imported torchvision {args.arch}: test accuracy {acc:.4f}; checkpoint: {args.out}")
    return 0
