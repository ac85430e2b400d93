"""Classifier architectures: the small CNN for 28x28 images, ResNet-20 for 32x32, and any torchvision model.

Every classifier takes images with pixels in [0, 1] (N, C, H, W) and normalises inside (a ``Normalize`` layer
whose mean/std are buffers saved with the weights), so randomized smoothing can add its noise in pixel space.
"""
from __future__ import annotations

import torch
from torch import nn

from training.model_registry import build_registered, register
from transdenoiser.errors import UserError


class Normalize(nn.Module):
    """(x - mean) / std per channel; mean and std are saved with the weights."""

    def __init__(self, mean: list[float], std: list[float]):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


@register("cnn28")
class SmallCNN(nn.Module):
    """A small CNN for 28x28 grayscale images (about 0.42M parameters)."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, mean=(0.1307,), std=(0.3081,)):
        super().__init__()
        self.normalize = Normalize(list(mean), list(std))
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(inplace=True),
                                  nn.Dropout(0.3), nn.Linear(128, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(self.normalize(x)))


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


@register("resnet20")
class ResNet20(nn.Module):
    """ResNet-20 of He et al. (2016) for 32x32 colour images (about 0.27M parameters)."""

    def __init__(self, in_channels: int = 3, num_classes: int = 10,
                 mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616)):
        super().__init__()
        self.normalize = Normalize(list(mean), list(std))
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        layers, cin = [], 16
        for cout, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(3):
                layers.append(_BasicBlock(cin, cout, stride if i == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes))

    def forward(self, x):
        return self.head(self.layers(self.stem(self.normalize(x))))


class TorchvisionClassifier(nn.Module):
    """Any torchvision classification architecture (``torchvision.models.get_model``) behind a Normalize layer.

    Its weights live under ``net.``: a user's own torchvision state dict is imported with
    ``transdenoiser import-classifier``, which adds that prefix.
    """

    def __init__(self, name: str, num_classes: int = 10, in_channels: int = 3,
                 mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)):
        super().__init__()
        import torchvision

        if name not in torchvision.models.list_models(module=torchvision.models):
            raise UserError(f"torchvision:{name} is not a torchvision classification model")
        if in_channels != 3:
            raise UserError(f"torchvision:{name} takes 3-channel images, the data has {in_channels}")
        self.normalize = Normalize(list(mean), list(std))
        self.net = torchvision.models.get_model(name, weights=None, num_classes=num_classes)

    def forward(self, x):
        return self.net(self.normalize(x))


def default_classifier_for(image_shape: tuple[int, int, int]) -> str:
    channels, height, width = image_shape
    if (height, width) == (28, 28):
        return "cnn28"
    if (height, width) == (32, 32):
        return "resnet20"
    raise UserError(f"no default classifier for images of shape {image_shape}; pass --arch torchvision:NAME")


def build_classifier(architecture: str, **kwargs) -> nn.Module:
    """A registered classifier, or ``torchvision:NAME`` for any torchvision classification model."""
    if architecture.startswith("torchvision:"):
        return TorchvisionClassifier(architecture.split(":", 1)[1], **kwargs)
    return build_registered(architecture, **kwargs)
