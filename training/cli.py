"""Subcommands ``data``, ``pretrain`` and ``import-classifier``."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from transdenoiser.argtypes import nonnegative_float, nonnegative_int, positive_float, positive_int
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
    p.add_argument("--noise-sigma", type=nonnegative_float, default=0.0, metavar="SIGMA",
                   help="Gaussian noise augmentation (Cohen et al. 2019): train on x + N(0, SIGMA^2) pixel noise, "
                        "the smoothing noise a classifier meets without a denoiser; the retrain reference "
                        "(default: 0, off)")
    p.add_argument("--out", type=Path, default=Path("runs/classifier"),
                   help="checkpoint directory (default: runs/classifier)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out (default: refuse)")
    p.set_defaults(handler=cmd_pretrain)

    p = subparsers.add_parser("import-classifier", parents=[common],
                              help="wrap your own torchvision state dict as a classifier checkpoint",
                              description="Bring the state dict of a torchvision architecture (a .safetensors file, "
                                          "or a .pt/.pth state dict loaded with weights_only=True), measure it on "
                                          "the dataset's test split and save it as a checkpoint. The input channels "
                                          "come from the file's first convolution (1-channel weights are kept "
                                          "exactly); a 'module.' prefix (DataParallel) and a {'state_dict': ...} "
                                          "or {'model': ...} wrapper are removed, with a note. For any other "
                                          "nn.Module, use the Python API (docs/API.md).")
    add_dataset_args(p)
    p.add_argument("--arch", required=True, help="torchvision architecture name, e.g. resnet18")
    p.add_argument("--weights", type=Path, required=True, help="state dict file (.safetensors, .pt, .pth)")
    p.add_argument("--mean", type=float, nargs="+", default=None,
                   help="per-channel normalisation mean the weights expect (default: ImageNet's; 0.5 for "
                        "1-channel images)")
    p.add_argument("--std", type=float, nargs="+", default=None,
                   help="per-channel normalisation std the weights expect (default: ImageNet's; 0.5 for "
                        "1-channel images)")
    p.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out (default: refuse)")
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
    if list(dataset.classes) != [str(i) for i in range(dataset.num_classes)]:
        print("classes, in the order of the counts below: "
              + ", ".join(f"{i}={name}" for i, name in enumerate(dataset.classes)))
    print(f"{'split':<8} {'size':>7}  {'fingerprint':<16}  class counts")
    for name, row in rows.items():
        print(f"{name:<8} {row['size']:>7}  {row['fingerprint']:<16}  {' '.join(map(str, row['class_counts']))}")
    print("splits are disjoint by construction (seeded per-class partition; see docs/DATA.md)")
    return 0


def cmd_pretrain(args) -> int:
    from training.pretrain import PretrainConfig, pretrain_classifier

    refuse_existing_out(args.out, args.overwrite)
    device = resolve_device(args.device)
    seed_everything(args.seed)
    dataset = load_dataset_from_args(args)
    config = PretrainConfig(architecture=args.arch, epochs=args.epochs, batch_size=args.batch_size,
                            learning_rate=args.lr, noise_sigma=args.noise_sigma)
    model, meta = pretrain_classifier(dataset, config, device, args.seed, track=bar)
    _save_replacing(args.out, model, meta)
    noisy = f", {meta['noisy_test_accuracy']:.4f} under N(0, {args.noise_sigma}^2) noise" if args.noise_sigma else ""
    print(f"classifier {meta['architecture']} on {dataset.name}: test accuracy {meta['test_accuracy']:.4f}{noisy} "
          f"({len(dataset.test)} test images) after {meta['train']['seconds']:.0f} s on {device}")
    print(f"checkpoint: {args.out}")
    warning = chance_level_warning(meta["test_accuracy"], dataset.num_classes, f"the classifier after "
                                   f"{args.epochs} epoch(s)")
    if warning:
        print(warning, file=sys.stderr)
    return 0


WRAPPER_KEYS = ("state_dict", "model_state_dict", "model", "net", "weights")  # checkpoints that wrap a state dict
STRIPPED_PREFIXES = ("module.", "_orig_mod.")  # DataParallel / DistributedDataParallel, torch.compile
MISMATCHES_SHOWN = 4  # keys or shapes listed per kind of mismatch (the message stays one line)
CHANCE_FACTOR = 1.5  # accuracy below CHANCE_FACTOR / num_classes is "at chance level"


def _is_state_dict(value) -> bool:
    import torch

    return isinstance(value, dict) and bool(value) and all(isinstance(v, torch.Tensor) for v in value.values())


def _read_state_dict(path: Path, notes: list[str]) -> dict:
    """The tensors of a user's weights file; wrappers and prefixes are removed, each with a note."""
    import torch

    from training.checkpoint import load_tensors

    if not path.is_file():
        raise UserError(f"--weights {path}: no such file")
    if path.suffix == ".safetensors":
        state = load_tensors(path, None)
    else:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any failure to read is the user's file
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserError(f"--weights {path}: not a state dict loadable with weights_only=True ({reason})") from None
    if isinstance(state, dict) and not _is_state_dict(state):
        wrapped = [key for key in WRAPPER_KEYS if _is_state_dict(state.get(key))]
        if not wrapped:
            kinds = ", ".join(f"{k!r}: {type(v).__name__}" for k, v in list(state.items())[:MISMATCHES_SHOWN])
            raise UserError(f"--weights {path}: expected a state dict (tensor names to tensors) or a dict holding one "
                            f"under {' / '.join(repr(k) for k in WRAPPER_KEYS)}; found {{{kinds}, ...}}")
        others = sorted(str(k) for k in state if k != wrapped[0])
        notes.append(f"read the state dict under {wrapped[0]!r} of {path.name}"
                     + (f" (ignored: {', '.join(others[:MISMATCHES_SHOWN])}{', ...' if len(others) > 4 else ''})"
                        if others else ""))
        state = state[wrapped[0]]
    if not _is_state_dict(state):
        raise UserError(f"--weights {path}: expected a dict of tensor names to tensors (a state_dict)")
    for prefix in STRIPPED_PREFIXES:
        if all(key.startswith(prefix) for key in state):
            notes.append(f"removed the prefix {prefix!r} from every key (saved from a wrapped model)")
            state = {key[len(prefix):]: value for key, value in state.items()}
    return state


def _listed(items: list[str]) -> str:
    shown = ", ".join(items[:MISMATCHES_SHOWN])
    return shown + (f", ... ({len(items) - MISMATCHES_SHOWN} more)" if len(items) > MISMATCHES_SHOWN else "")


def describe_mismatch(expected: dict, found: dict) -> str:
    """Which keys are missing or unexpected and which shapes differ, on one line (file = ``found``)."""
    missing = [k for k in expected if k not in found]
    unexpected = [k for k in found if k not in expected]
    shapes = [f"{k}: file {list(found[k].shape)}, model {list(expected[k].shape)}"
              for k in expected if k in found and tuple(found[k].shape) != tuple(expected[k].shape)]
    parts = []
    if shapes:
        parts.append(f"{len(shapes)} shape mismatch(es): {_listed(shapes)}")
    if missing:
        parts.append(f"{len(missing)} missing key(s): {_listed(missing)}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected key(s): {_listed(unexpected)}")
    return "; ".join(parts)


def _first_conv_key(net) -> str | None:
    from torch import nn

    for name, module in net.named_modules():
        if isinstance(module, nn.Conv2d):
            return f"{name}.weight"
    return None


def fit_torchvision_weights(arch: str, state: dict, image_shape: tuple[int, int, int], num_classes: int,
                            mean: list[float] | None, std: list[float] | None, notes: list[str]):
    """A TorchvisionClassifier for ``image_shape`` holding ``state`` (a torchvision state dict): (model, kwargs).

    The number of input channels comes from the file's first convolution. A 1-channel first layer is
    kept exactly: the model is built with 3 input channels, the file's kernel goes to the first and the
    other two get zero weights, and the normalisation is the same on all three, so 1-channel images (which
    the normalisation broadcasts to 3 identical channels) give exactly the 1-channel network's logits.
    """
    import torch

    from training.models import build_model

    channels = image_shape[0]
    for key, values in (("mean", mean), ("std", std)):
        if values is not None and len(values) != channels:
            raise UserError(f"--{key}: {len(values)} values for {channels}-channel images")
    probe = build_model(f"torchvision:{arch}", num_classes=num_classes, in_channels=3)
    first = _first_conv_key(probe.net)
    file_channels = int(state[first].shape[1]) if first in state and state[first].dim() == 4 else 3
    if file_channels != channels:
        raise UserError(f"--weights: the first layer {first} takes {file_channels}-channel images (shape "
                        f"{list(state[first].shape)}), the dataset's images have {channels} channel(s) "
                        f"({'x'.join(map(str, image_shape))})")
    kwargs = {"num_classes": num_classes, "in_channels": 3}
    if channels == 1:
        kwargs["mean"] = list(mean or [0.5]) * 3
        kwargs["std"] = list(std or [0.5]) * 3
        if mean is None or std is None:
            notes.append("1-channel weights without --mean/--std: normalising with mean 0.5, std 0.5")
        kernel = state[first]
        state = dict(state)
        state[first] = torch.cat([kernel, torch.zeros_like(kernel).repeat(1, 2, 1, 1)], dim=1)
        notes.append(f"1-channel first layer {first}: kept exactly (embedded in a 3-channel convolution whose other "
                     "two input channels have zero weight)")
    else:
        if mean is not None:
            kwargs["mean"] = mean
        if std is not None:
            kwargs["std"] = std
    model = build_model(f"torchvision:{arch}", **kwargs)
    expected = model.net.state_dict()
    mismatch = describe_mismatch(expected, state)
    if mismatch:
        head = [k for k in expected if k.endswith(".weight") and expected[k].dim() == 2]
        hint = ""
        if head and head[-1] in state and state[head[-1]].shape[0] != expected[head[-1]].shape[0]:
            hint = (f" (the file's last layer {head[-1]} has {state[head[-1]].shape[0]} outputs, the dataset has "
                    f"{num_classes} classes)")
        raise UserError(f"--weights: does not fit torchvision {arch} with {num_classes} classes{hint}: {mismatch}")
    model.net.load_state_dict(state, strict=True)
    kwargs["in_channels"] = 3
    return model, kwargs


def chance_level_warning(accuracy: float, num_classes: int, what: str) -> str | None:
    """A warning line when ``accuracy`` is below CHANCE_FACTOR / num_classes (no better than guessing), else None."""
    if accuracy < CHANCE_FACTOR / num_classes:
        return (f"warning: {what} has test accuracy {accuracy:.3f}, at chance level for {num_classes} classes "
                f"(guessing gives {1 / num_classes:.3f}); smoothing cannot certify a useful classifier out of it "
                "(check the class order, the normalisation and the number of epochs)")
    return None


def refuse_existing_out(out: Path, overwrite: bool) -> None:
    """Stop before any work when ``out`` already holds files and ``--overwrite`` was not given."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise UserError(f"--out {out} already exists and is not empty; pass --overwrite to replace it, or choose "
                        "another --out")


def cmd_import_classifier(args) -> int:
    from training.pretrain import accuracy

    refuse_existing_out(args.out, args.overwrite)
    device = resolve_device(args.device)
    dataset = load_dataset_from_args(args)
    notes: list[str] = []
    state = _read_state_dict(args.weights, notes)
    try:
        model, kwargs = fit_torchvision_weights(args.arch, state, dataset.image_shape, dataset.num_classes,
                                                args.mean, args.std, notes)
    except UserError as exc:
        raise UserError(str(exc).replace("--weights:", f"--weights {args.weights}:", 1)) from None
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    model.to(device).eval()
    x, y = dataset.test.tensors(device)
    acc = accuracy(model, x, y, batch_size=256)
    meta = {"kind": "classifier", "architecture": f"torchvision:{args.arch}", "arch_kwargs": kwargs,
            "input_shape": list(dataset.image_shape), "num_classes": dataset.num_classes,
            "class_names": list(dataset.classes),
            "normalization": {"mean": model.normalize.mean.flatten().tolist()[:dataset.image_shape[0]],
                              "std": model.normalize.std.flatten().tolist()[:dataset.image_shape[0]]},
            "dataset": {"name": dataset.name, "split_seed": dataset.split_seed, "trained_on": "unknown (imported)",
                        "fingerprints": dataset.released_fingerprints(), "source": dataset.source},
            "test_accuracy": acc, "imported_from": str(args.weights)}
    if notes:
        meta["import_notes"] = notes
    _save_replacing(args.out, model, meta)
    print(f"imported torchvision {args.arch}: test accuracy {acc:.4f}; checkpoint: {args.out}")
    warning = chance_level_warning(acc, dataset.num_classes, f"the imported {args.arch}")
    if warning:
        print(warning, file=sys.stderr)
    return 0


def _save_replacing(out: Path, model, meta: dict) -> None:
    """Write the checkpoint to ``out``, replacing what was there (crash-safely) only after the user said so."""
    from training.checkpoint import replace_directory, save_checkpoint

    replace_directory(out, lambda staging: save_checkpoint(staging, model, meta))
