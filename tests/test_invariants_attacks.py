"""Attack budgets end to end: every iterate an attack evaluates lies in the eps-ball and in [0, 1], not only the
image it returns; projection against its closed form; and the budget check can fail (strict mode)."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from certify.attacks.gradient import ATTACKS, PGD, Attack, BudgetViolation, build_attack, rounding_slack

EPS = {"l2": 1.0, "linf": 0.1}


def l2(delta: torch.Tensor) -> torch.Tensor:
    return delta.reshape(len(delta), -1).double().pow(2).sum(1).sqrt()


def linf(delta: torch.Tensor) -> torch.Tensor:
    return delta.reshape(len(delta), -1).double().abs().amax(1)


NORM_OF = {"l2": l2, "linf": linf}


class RecordingThreat:
    """Cross-entropy of a fixed linear model; remembers every input the attack evaluates (its iterates)."""

    def __init__(self, in_features: int, seed: int = 0):
        torch.manual_seed(seed)
        self.model = nn.Sequential(nn.Flatten(), nn.Linear(in_features, 10))
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.seen: list[torch.Tensor] = []

    def __call__(self, x, labels, generator):
        self.seen.append(x.detach().clone())
        return nn.functional.cross_entropy(self.model(x), labels, reduction="none")


@pytest.fixture
def strict(monkeypatch):
    monkeypatch.setattr(Attack, "strict_budget", True)


@pytest.fixture(scope="module")
def batch():
    generator = torch.Generator().manual_seed(0)
    images = 0.3 + 0.4 * torch.rand((8, 1, 12, 12), generator=generator)  # room to move before clipping binds
    return images, torch.arange(8) % 10


@pytest.mark.parametrize("norm", ["l2", "linf"])
@pytest.mark.parametrize("name", list(ATTACKS))
def test_every_iterate_stays_in_the_ball_and_the_unit_cube(name, norm, batch, strict):
    images, labels = batch
    threat = RecordingThreat(images[0].numel())
    eps = EPS[norm]
    adversarial = build_attack(name, threat, norm, eps, steps=10)(images, labels, torch.Generator().manual_seed(1))
    norm_of = NORM_OF[norm]
    slack = 4 * torch.finfo(torch.float32).eps * (math.sqrt(images[0].numel()) if norm == "l2" else 1.0)
    assert len(threat.seen) == (1 if name == "fgsm" else 10)
    for step, iterate in enumerate(threat.seen):
        assert float(norm_of(iterate - images).max()) <= eps + slack, (name, norm, step)
        assert float(iterate.min()) >= 0 and float(iterate.max()) <= 1, (name, norm, step)
    final = norm_of(adversarial - images)
    assert float(final.max()) <= eps  # the returned image: exactly within the budget
    # a linear model's gradient keeps its direction: the attack ends on the sphere, not back at the clean image
    assert float(final.min()) >= (0.99 if name != "pgd" or norm == "linf" else 0.9) * eps, final


@pytest.mark.parametrize("norm", ["l2", "linf"])
def test_projection_matches_its_closed_form(norm, batch):
    images, _ = batch
    attack = PGD(RecordingThreat(images[0].numel()), norm, 0.05)
    eps = torch.full((len(images),), 0.05)
    direction = torch.randn(images.shape, generator=torch.Generator().manual_seed(2))
    if norm == "l2":
        far = direction / l2(direction).float().view(-1, 1, 1, 1) * 0.5  # ten times the budget
        expected = images + far * 0.1  # shrunk onto the sphere along the same ray
        near = far * 0.05  # a quarter of the budget: kept as it is
    else:
        far = direction.sign() * 0.2 * torch.rand(images.shape, generator=torch.Generator().manual_seed(3))
        expected = images + far.clamp(-0.05, 0.05)  # each coordinate clamped to [-eps, eps]
        near = far.clamp(-0.04, 0.04)
    torch.testing.assert_close(attack.project(images + far, images, eps), expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(attack.project(images + near, images, eps), images + near, atol=1e-7, rtol=0)
    # clipping to [0, 1] afterwards
    corner = torch.ones_like(images)
    projected = attack.project(corner + far.abs(), corner, eps)
    assert torch.equal(projected, corner)


class NoBallPGD(PGD):
    """A broken PGD whose projection forgets the eps-ball (clips to [0, 1] only)."""

    def project(self, x_adv, x, eps):
        return x_adv.clamp(0.0, 1.0)


@pytest.mark.parametrize("norm", ["l2", "linf"])
def test_budget_check_can_fail(norm, batch, monkeypatch):
    images, labels = batch
    attack = NoBallPGD(RecordingThreat(images[0].numel()), norm, EPS[norm] / 4, steps=10)
    monkeypatch.setattr(Attack, "strict_budget", True)
    with pytest.raises(BudgetViolation):
        attack(images, labels, torch.Generator().manual_seed(0))
    # out of strict mode the safety net hides it by returning the clean image: the budget holds, nothing moved
    monkeypatch.setattr(Attack, "strict_budget", False)
    adversarial = attack(images, labels, torch.Generator().manual_seed(0))
    assert torch.equal(adversarial, images)


def test_strict_mode_accepts_rounding_only(batch, strict):
    images, labels = batch
    assert rounding_slack(images, "l2") == pytest.approx(4 * 2 ** -23 * 12)
    eps = torch.tensor([0.0, 1e-6, 1e-3, 0.3, 1.0, 2.0, 5.0, 50.0])
    for norm in ("l2", "linf"):
        for name in ATTACKS:
            threat = RecordingThreat(images[0].numel())
            adversarial = build_attack(name, threat, norm, eps, steps=3)(images, labels,
                                                                          torch.Generator().manual_seed(0))
            assert bool((NORM_OF[norm](adversarial - images) <= eps.double()).all()), (name, norm)
