"""Attacks and threat models: budgets, pixel range, strength, repeatability, targeted mode, bad input."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from certify.attacks.gradient import ATTACKS, FGSM, IFGSM, MIM, NORMS, PGD, build_attack, perturbation_norms
from certify.attacks.threats import ClassifierThreat, PipelineThreat, SmoothedThreat, build_threat
from transdenoiser.errors import UserError

NUM_IMAGES = 64
STRONG_EPS = {"l2": 3.0, "linf": 0.3}  # budgets at which an undefended MNIST CNN must collapse
MODERATE_EPS = {"l2": 1.5, "linf": 0.1}
STEPS = 5


@pytest.fixture(scope="module")
def test_batch(mnist10k):
    from certify.attacks.evaluate import evenly_spaced

    split = mnist10k.test
    return split.subset(evenly_spaced(len(split), NUM_IMAGES)).tensors()


def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(images).argmax(dim=1) == labels).float().mean())


@pytest.fixture(scope="module")
def attacked(classifier, test_batch):
    """Adversarial batches by (attack, norm, eps), computed once each (seed 0)."""
    cache: dict[tuple[str, str, float], torch.Tensor] = {}
    images, labels = test_batch

    def get(name: str, norm: str, eps: float) -> torch.Tensor:
        key = (name, norm, eps)
        if key not in cache:
            attack = build_attack(name, ClassifierThreat(classifier), norm, eps, steps=STEPS)
            attack.strict_budget = True  # a projection past the budget raises instead of returning the clean image
            cache[key] = attack(images, labels, torch.Generator().manual_seed(0))
        return cache[key]

    return get


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("name", list(ATTACKS))
def test_every_attack_respects_budget_and_breaks_undefended_model(name, norm, classifier, test_batch, attacked):
    images, labels = test_batch
    before = {k: v.clone() for k, v in classifier.state_dict().items()}
    eps = STRONG_EPS[norm]
    adversarial = attacked(name, norm, eps)
    assert adversarial.shape == images.shape and adversarial.dtype == images.dtype
    assert float(adversarial.min()) >= 0.0 and float(adversarial.max()) <= 1.0
    norms = perturbation_norms(adversarial - images, norm)
    assert float(norms.max()) <= eps, f"{name}/{norm}: perturbation {float(norms.max())} exceeds eps {eps}"
    assert float(norms.mean()) > 0.25 * eps  # it did move
    clean = accuracy(classifier, images, labels)
    attacked_accuracy = accuracy(classifier, adversarial, labels)
    assert clean > 0.9
    assert attacked_accuracy < 0.5 * clean, f"{name}/{norm}: {attacked_accuracy:.3f} vs clean {clean:.3f}"
    # frozen model: no parameter gradients, no parameter changes, eval mode kept
    assert all(p.grad is None for p in classifier.parameters())
    assert all(torch.equal(before[k], v) for k, v in classifier.state_dict().items())
    assert not classifier.training


@pytest.mark.parametrize("norm", NORMS)
def test_pgd_at_least_as_strong_as_fgsm(norm, classifier, test_batch, attacked):
    images, labels = test_batch
    eps = MODERATE_EPS[norm]
    fgsm = accuracy(classifier, attacked("fgsm", norm, eps), labels)
    pgd = accuracy(classifier, attacked("pgd", norm, eps), labels)
    assert pgd <= fgsm, f"{norm} eps {eps}: PGD accuracy {pgd:.3f} > FGSM {fgsm:.3f}"


def test_budget_exact_under_projection_for_tiny_and_per_example_eps():
    """Huge random gradients, pixels at the borders, eps from 0 to tiny to large, one per example."""
    torch.manual_seed(0)
    weight = torch.randn(784, 10) * 1e3
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    model[1].weight.data = weight.T.contiguous()
    images = (torch.rand(6, 1, 28, 28) > 0.5).float()  # every pixel at 0 or 1: clipping is active everywhere
    labels = torch.arange(6)
    for norm in NORMS:
        eps = torch.tensor([0.0, 1e-7, 1e-3, 0.3, 2.0, 50.0])
        for cls in (IFGSM, MIM, PGD):
            attack = cls(ClassifierThreat(model), norm, eps, steps=3, step_size=1.0)
            attack.strict_budget = True
            adversarial = attack(images, labels)
            norms = perturbation_norms(adversarial - images, norm)
            assert bool((norms <= eps.double()).all()), (cls.__name__, norm, norms, eps)
            assert float(adversarial.min()) >= 0 and float(adversarial.max()) <= 1
            assert torch.equal(adversarial[0], images[0])  # eps 0: untouched


def test_seeded_runs_repeat_exactly(classifier, test_batch):
    images, labels = test_batch[0][:16], test_batch[1][:16]
    threat = PipelineThreat(classifier, sigma=0.25, m=2)
    attack = PGD(threat, "l2", 1.0, steps=3)
    first = attack(images, labels, torch.Generator().manual_seed(7))
    again = attack(images, labels, torch.Generator().manual_seed(7))
    other = attack(images, labels, torch.Generator().manual_seed(8))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_targeted_mode_reaches_the_target_more_often(classifier, test_batch):
    images, labels = test_batch
    targets = (labels + 1) % 10
    threat = ClassifierThreat(classifier)
    targeted = PGD(threat, "linf", 0.2, steps=STEPS, targeted=True)(images, targets, torch.Generator().manual_seed(0))
    untargeted = PGD(threat, "linf", 0.2, steps=STEPS)(images, labels, torch.Generator().manual_seed(0))
    with torch.no_grad():
        hit_targeted = float((classifier(targeted).argmax(1) == targets).float().mean())
        hit_untargeted = float((classifier(untargeted).argmax(1) == targets).float().mean())
    assert hit_targeted > hit_untargeted + 0.2, (hit_targeted, hit_untargeted)


class TinyDenoiser(nn.Module):
    """x + a small convolution, started at identity-plus-noise: a differentiable stand-in for a trained denoiser."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 3, padding=1)
        nn.init.normal_(self.conv.weight, std=0.01)
        nn.init.zeros_(self.conv.bias)

    def forward(self, x):
        return (x + self.conv(x)).clamp(0, 1)


@pytest.mark.parametrize("threat_cls", [PipelineThreat, SmoothedThreat])
def test_noisy_threats_run_through_a_denoiser_and_raise_their_loss(threat_cls, classifier, test_batch):
    torch.manual_seed(0)
    denoiser = TinyDenoiser()
    images, labels = test_batch[0][:24], test_batch[1][:24]
    threat = threat_cls(classifier, sigma=0.25, denoiser=denoiser, m=4)
    adversarial = PGD(threat, "l2", 2.0, steps=STEPS)(images, labels, torch.Generator().manual_seed(0))
    assert float(perturbation_norms(adversarial - images, "l2").max()) <= 2.0
    assert all(p.grad is None for p in denoiser.parameters())
    with torch.no_grad():
        clean_loss = threat(images, labels, torch.Generator().manual_seed(1)).mean()
        adv_loss = threat(adversarial, labels, torch.Generator().manual_seed(1)).mean()
    assert float(adv_loss) > float(clean_loss) + 0.5


def test_smoothed_loss_is_minus_log_of_the_averaged_softmax(classifier, test_batch):
    images, labels = test_batch[0][:5], test_batch[1][:5]
    sigma, m = 0.5, 3
    loss = SmoothedThreat(classifier, sigma, m=m)(images, labels, torch.Generator().manual_seed(3))
    noise = torch.randn((m, *images.shape), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        probabilities = torch.stack([classifier(images + sigma * noise[j]).softmax(1) for j in range(m)]).mean(0)
    expected = -probabilities[torch.arange(5), labels].log()
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-4, atol=1e-5)
    eot = PipelineThreat(classifier, sigma, m=m)(images, labels, torch.Generator().manual_seed(3))
    with torch.no_grad():
        ce = torch.stack([nn.functional.cross_entropy(classifier(images + sigma * noise[j]), labels,
                                                      reduction="none") for j in range(m)]).mean(0)
    torch.testing.assert_close(eot.detach(), ce, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("make", [
    lambda t: PGD(t, "l2", -0.1),
    lambda t: FGSM(t, "l3", 1.0),
    lambda t: IFGSM(t, "linf", 0.1, steps=0),
    lambda t: MIM(t, "linf", 0.1, step_size=0.0),
    lambda t: PGD(t, "l2", 1.0, step_size=-1.0),
    lambda t: PGD(t, "l2", math.nan),
    lambda t: MIM(t, "l2", 1.0, decay=-1.0),
    lambda t: build_attack("cw", t, "l2", 1.0),
    lambda t: build_threat("oracle", t.classifier),
    lambda t: PipelineThreat(t.classifier, 0.25, m=0),
    lambda t: SmoothedThreat(t.classifier, 0.0),
])
def test_bad_input_raises_user_error(make, classifier):
    with pytest.raises(UserError):
        make(ClassifierThreat(classifier))


def test_images_outside_unit_range_are_refused(classifier):
    with pytest.raises(UserError, match=r"\[0, 1\]"):
        FGSM(ClassifierThreat(classifier), "l2", 1.0)(torch.full((2, 1, 28, 28), 2.0), torch.zeros(2, dtype=torch.long))
