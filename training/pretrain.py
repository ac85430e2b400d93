"""Pre-training of the classifier h on the ``public`` split (the part someone else would have done)."""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from training.classifiers import default_classifier_for
from training.datasets import Dataset
from training.models import build_model
from transdenoiser.errors import UserError
from transdenoiser.progress import Track, silent


@dataclass(frozen=True)
class PretrainConfig:
    architecture: str | None = None  # None: cnn28 for 28x28, resnet20 for 32x32
    epochs: int = 8
    batch_size: int = 128
    learning_rate: float = 2e-3
    weight_decay: float = 5e-4
    max_shift_pixels: int = 2  # random translation augmentation, in pixels
    horizontal_flip: bool | None = None  # None: on for colour images, off for grayscale
    # Gaussian noise augmentation (Cohen et al. 2019, section 4): each training image gets fresh N(0, sigma^2)
    # pixel noise, unclipped as the smoothing noise is; 0 = off. A classifier trained so is what a user who can
    # retrain gets at that sigma without a denoiser (the retrain reference of docs/RESULTS.md).
    noise_sigma: float = 0.0

    def validate(self) -> None:
        if self.epochs < 1:
            raise UserError(f"--epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 1:
            raise UserError(f"--batch-size must be >= 1, got {self.batch_size}")
        if not self.learning_rate > 0:
            raise UserError(f"--lr must be > 0, got {self.learning_rate}")
        if self.max_shift_pixels < 0:
            raise UserError(f"--max-shift must be >= 0, got {self.max_shift_pixels}")
        if not (self.noise_sigma >= 0 and math.isfinite(self.noise_sigma)):
            raise UserError(f"--noise-sigma must be a finite number >= 0, got {self.noise_sigma}")


def _augment(x: torch.Tensor, max_shift: int, flip: bool, generator: torch.Generator) -> torch.Tensor:
    n, _, h, w = x.shape
    if max_shift > 0:
        padded = F.pad(x, (max_shift,) * 4)
        dx = torch.randint(0, 2 * max_shift + 1, (n,), generator=generator)
        dy = torch.randint(0, 2 * max_shift + 1, (n,), generator=generator)
        rows = (dy.view(n, 1) + torch.arange(h).view(1, h)).to(x.device)
        cols = (dx.view(n, 1) + torch.arange(w).view(1, w)).to(x.device)
        idx_n = torch.arange(n, device=x.device).view(n, 1, 1)
        x = padded.permute(0, 2, 3, 1)[idx_n, rows.view(n, h, 1), cols.view(n, 1, w)].permute(0, 3, 1, 2)
    if flip:
        mask = (torch.rand(n, generator=generator) < 0.5).to(x.device)
        x = torch.where(mask.view(n, 1, 1, 1), x.flip(3), x)
    return x.contiguous()


@torch.inference_mode()
def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 1000) -> float:
    """Top-1 accuracy of ``model`` on ``images`` (pixels in [0, 1]), in eval mode."""
    was_training = model.training
    model.eval()
    correct = 0
    for start in range(0, len(images), batch_size):
        logits = model(images[start:start + batch_size])
        correct += (logits.argmax(1) == labels[start:start + batch_size]).sum().item()
    model.train(was_training)
    return correct / max(1, len(images))


def pretrain_classifier(dataset: Dataset, config: PretrainConfig, device: torch.device, seed: int,
                        track: Track = silent) -> tuple[nn.Module, dict]:
    """Train a classifier on the public split; return it (eval mode) and its metadata."""
    config.validate()
    public, test = dataset.public, dataset.test
    if len(public) == 0:
        raise UserError(f"{dataset.name}: the public split is empty")
    channels = dataset.image_shape[0]
    arch = config.architecture or default_classifier_for(dataset.image_shape)
    kwargs = {"in_channels": channels, "num_classes": dataset.num_classes}
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = build_model(arch, **kwargs).to(device)
    x_train, y_train = public.tensors(device)
    x_test, y_test = test.tensors(device)
    mean = x_train.mean(dim=(0, 2, 3)).tolist()
    std = x_train.std(dim=(0, 2, 3)).clamp_min(1e-3).tolist()
    model.normalize.mean.copy_(torch.tensor(mean).view(1, -1, 1, 1))
    model.normalize.std.copy_(torch.tensor(std).view(1, -1, 1, 1))
    kwargs.update(mean=mean, std=std)
    flip = config.horizontal_flip if config.horizontal_flip is not None else channels == 3
    steps_per_epoch = math.ceil(len(public) / config.batch_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=config.learning_rate,
                                                    total_steps=config.epochs * steps_per_epoch)
    history = []
    started = time.perf_counter()
    for epoch in range(config.epochs):
        model.train()
        order = torch.randperm(len(public), generator=generator).to(device)
        total_loss, seen = 0.0, 0
        desc = f"pretrain epoch {epoch + 1}/{config.epochs}"
        if history:
            desc += f" (test accuracy {history[-1]['test_accuracy']:.3f})"
        batches = track(range(0, len(public), config.batch_size), desc=desc, total=steps_per_epoch)
        for start in batches:
            batch = order[start:start + config.batch_size]
            x = _augment(x_train[batch], config.max_shift_pixels, flip, generator)
            if config.noise_sigma > 0:
                x = x + config.noise_sigma * torch.randn(x.shape, generator=generator).to(device)
            loss = F.cross_entropy(model(x), y_train[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            total_loss += loss.item() * len(batch)
            seen += len(batch)
            if hasattr(batches, "set_postfix"):
                batches.set_postfix(loss=f"{total_loss / seen:.4f}", refresh=False)
        history.append({"epoch": epoch + 1, "train_loss": total_loss / len(public),
                        "test_accuracy": accuracy(model, x_test, y_test)})
    seconds = time.perf_counter() - started
    model.eval()
    noisy_accuracy = None
    if config.noise_sigma > 0:  # one fixed noise draw per test image (seeded): accuracy under the noise trained for
        noise = torch.randn(x_test.shape, generator=torch.Generator().manual_seed(seed + 1)).to(device)
        noisy_accuracy = accuracy(model, x_test + config.noise_sigma * noise, y_test)
    metadata = {
        "kind": "classifier",
        "architecture": arch,
        "arch_kwargs": kwargs,
        "input_shape": list(dataset.image_shape),
        "num_classes": dataset.num_classes,
        "class_names": list(dataset.classes),
        "normalization": {"mean": mean, "std": std, "note": "applied inside the model; inputs are [0,1] pixels"},
        "dataset": {"name": dataset.name, "split_seed": dataset.split_seed, "trained_on": "public",
                    "fingerprints": dataset.released_fingerprints(), "source": dataset.source},
        "test_accuracy": history[-1]["test_accuracy"],
        "noise_augmentation_sigma": config.noise_sigma,
        "noisy_test_accuracy": noisy_accuracy,
        "train": {"config": asdict(config) | {"architecture": arch}, "seed": seed, "seconds": seconds,
                  "device": str(device), "history": history},
    }
    return model, metadata
