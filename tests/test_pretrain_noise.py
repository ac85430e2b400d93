"""``pretrain --noise-sigma``: Gaussian noise augmentation (Cohen et al. 2019), the retrain reference of issue 66."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from training.pretrain import PretrainConfig, pretrain_classifier
from transdenoiser.errors import UserError


def _first_inputs(dataset, noise_sigma: float, monkeypatch) -> tuple[torch.Tensor, dict]:
    """The first training batch the classifier saw, and the run's metadata."""
    import training.pretrain as pretrain

    seen: list[torch.Tensor] = []
    build = pretrain.build_model

    def build_with_hook(*args, **kwargs):
        model = build(*args, **kwargs)
        model.register_forward_pre_hook(lambda module, inputs: seen.append(inputs[0].detach().clone())
                                        if module.training and not seen else None)
        return model

    monkeypatch.setattr(pretrain, "build_model", build_with_hook)
    _, meta = pretrain_classifier(dataset, PretrainConfig(epochs=1, batch_size=16, noise_sigma=noise_sigma),
                                  torch.device("cpu"), seed=0)
    return seen[0], meta


def test_each_training_image_gets_fresh_noise_of_the_given_sigma(tmp_path, monkeypatch):
    from tests.test_datasets import make_mnist_layout
    from training.datasets import load_dataset

    make_mnist_layout(tmp_path, "MNIST", n_train=60, n_test=20, compress=False)
    dataset = load_dataset("mnist", tmp_path)
    clean, clean_meta = _first_inputs(dataset, 0.0, monkeypatch)
    noisy, noisy_meta = _first_inputs(dataset, 0.5, monkeypatch)
    noise = noisy - clean  # same seed, same batch and shifts: the difference is the added noise alone
    assert noise.std().item() == pytest.approx(0.5, rel=0.1)
    assert abs(noise.mean().item()) < 0.05
    assert noisy.min().item() < -0.5 and noisy.max().item() > 1.5  # unclipped, as the smoothing noise is
    assert clean_meta["noise_augmentation_sigma"] == 0.0 and clean_meta["noisy_test_accuracy"] is None
    assert noisy_meta["noise_augmentation_sigma"] == 0.5
    assert 0.0 <= noisy_meta["noisy_test_accuracy"] <= 1.0


@pytest.mark.parametrize("sigma", [-0.1, float("nan"), float("inf")])
def test_a_bad_noise_sigma_is_refused(sigma):
    with pytest.raises(UserError, match="--noise-sigma"):
        PretrainConfig(noise_sigma=sigma).validate()


def test_the_cli_refuses_a_negative_noise_sigma_in_one_line():
    done = subprocess.run([sys.executable, "-m", "transdenoiser", "pretrain", "--noise-sigma", "-1"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "--noise-sigma" in done.stderr
