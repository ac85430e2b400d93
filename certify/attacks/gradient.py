"""Gradient attacks on pixels in [0, 1]: FGSM, I-FGSM (BIM), MIM and PGD, each under the L2 or Linf norm.

One class per attack over a small base class (the torchattacks layout, written here). The base
class owns the device, the norm, the per-example budget ``eps``, targeted/untargeted mode, the
steepest-ascent step of the norm and the projection back into the eps-ball intersected with
[0, 1]. What is differentiated is a *threat* (certify/attacks/threats.py): a callable
``threat(x, labels, generator) -> per-example loss`` (shape (N,)). An untargeted attack
increases that loss at the true labels; a targeted attack decreases it at the target labels.

Only the pixels get gradients (``torch.autograd.grad`` with respect to the input alone), so the
models' parameters are never touched. Perturbation norms are guaranteed: the realised
``x_adv - x`` is checked in float64 after clipping and any example a rounding pushed past its
eps is shrunk until it fits. Setting ``Attack.strict_budget = True`` (the tests do) raises
:class:`BudgetViolation` whenever the projection left more than float rounding to repair, so a broken
projection cannot hide behind that final safety net.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

from certify.attacks.names import ATTACK_NAMES, DEFAULT_MOMENTUM_DECAY, MADRY_STEP_FACTOR, NORMS  # noqa: E402,F401
from transdenoiser.errors import UserError

TINY = 1e-12  # guards divisions by a zero gradient norm
SHRINK_FACTOR = 1.0 - 1e-5  # per retry, when float32 rounding left a perturbation a few ulps past eps
MAX_SHRINK_RETRIES = 20

# threat(x, labels, generator) -> per-example loss (N,); the attack ascends it (untargeted) or descends it (targeted)
Threat = Callable[[torch.Tensor, torch.Tensor, "torch.Generator | None"], torch.Tensor]


def check_norm(norm: str) -> str:
    if norm not in NORMS:
        raise UserError(f"unknown norm {norm!r}; expected one of {', '.join(NORMS)}")
    return norm


def check_eps(eps: float | torch.Tensor) -> None:
    values = torch.as_tensor(eps, dtype=torch.float64)
    if values.numel() == 0 or not bool(torch.isfinite(values).all()) or bool((values < 0).any()):
        raise UserError(f"eps must be a finite number >= 0 (pixels in [0,1]), got {eps}")


class BudgetViolation(AssertionError):
    """Strict mode only: projection left a perturbation past its budget by more than float rounding."""


def rounding_slack(x: torch.Tensor, norm: str) -> float:
    """How far past eps float rounding alone can leave a projected perturbation of ``x`` (N, ...): a few ulps
    of a pixel per coordinate (summed in quadrature for L2)."""
    per_coordinate = 4 * torch.finfo(x.dtype).eps
    return per_coordinate * (math.sqrt(x[0].numel()) if norm == "l2" and len(x) else 1.0)


def perturbation_norms(delta: torch.Tensor, norm: str) -> torch.Tensor:
    """Per-example L2 or Linf norm of ``delta`` (N, ...), in float64."""
    flat = delta.detach().reshape(len(delta), -1).double()
    return flat.norm(p=2, dim=1) if norm == "l2" else flat.abs().amax(dim=1)


def _per_example(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Reshape an (N,) tensor to broadcast over an (N, C, H, W) batch."""
    return value.view(-1, *([1] * (like.dim() - 1)))


class Attack:
    """Base class: budget, norm, mode, steepest-ascent step and projection. Subclasses write ``perturb``.

    ``eps``: the perturbation budget in [0,1]-pixel units, a number or one value per example (N,).
    ``targeted``: when True the labels passed to ``__call__`` are target classes to reach.
    """

    name = "attack"
    strict_budget = False  # True: raise BudgetViolation instead of silently repairing a broken projection

    def __init__(self, threat: Threat, norm: str, eps: float | torch.Tensor, targeted: bool = False,
                 device: torch.device | str | None = None):
        check_norm(norm)
        check_eps(eps)
        if not callable(threat):
            raise UserError(f"{type(self).__name__}: threat must be callable (x, labels, generator) -> loss")
        self.threat = threat
        self.norm = norm
        self.eps = eps
        self.targeted = bool(targeted)
        self.device = torch.device(device) if device is not None else None

    def __call__(self, images: torch.Tensor, labels: torch.Tensor,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Adversarial versions of ``images`` (N, C, H, W) in [0, 1]; ``labels`` are true labels or targets."""
        if images.dim() < 2 or len(images) != len(labels):
            raise UserError(f"{self.name}: need a batch of images and one label each, got {tuple(images.shape)} "
                            f"and {tuple(labels.shape)}")
        device = self.device or images.device
        x = images.detach().to(device)
        if x.numel() and (float(x.min()) < 0 or float(x.max()) > 1):
            raise UserError(f"{self.name}: images must have pixels in [0, 1]")
        y = labels.detach().to(device)
        exact_eps = self._eps_tensor(x)
        eps = self._rounded_down(exact_eps, x.dtype)  # the working budget never exceeds the exact one
        adv = self.perturb(x, y, eps, generator)
        return self._enforce_budget(adv, x, eps, exact_eps)

    # ------------------------------------------------------------------ to be written by each attack

    def perturb(self, x: torch.Tensor, y: torch.Tensor, eps: torch.Tensor,
                generator: torch.Generator | None) -> torch.Tensor:
        raise NotImplementedError

    # ------------------------------------------------------------------ shared pieces

    def _eps_tensor(self, x: torch.Tensor) -> torch.Tensor:
        """The exact budget per example, in float64 (0.3 in float32 would be 0.30000001, past the budget)."""
        eps = torch.as_tensor(self.eps, dtype=torch.float64).to(x.device)
        if eps.dim() == 0:
            return eps.expand(len(x)).clone()
        if eps.shape != (len(x),):
            raise UserError(f"{self.name}: per-example eps has shape {tuple(eps.shape)}, the batch has {len(x)} "
                            "images")
        return eps

    @staticmethod
    def _rounded_down(eps: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``eps`` in ``dtype``, rounded towards zero where the conversion rounded up."""
        low = eps.to(dtype)
        return torch.where(low.double() > eps, torch.nextafter(low, torch.zeros_like(low)), low)

    def ascent_gradient(self, x: torch.Tensor, y: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """Gradient of the attack's objective with respect to the pixels only (loss up, or target loss down)."""
        with torch.enable_grad():  # also inside a caller's no_grad block
            x = x.detach().requires_grad_(True)
            loss = self.threat(x, y, generator)
            objective = -loss.sum() if self.targeted else loss.sum()
            (grad,) = torch.autograd.grad(objective, x)
        return grad.detach()

    def steepest_direction(self, grad: torch.Tensor) -> torch.Tensor:
        """Unit-norm steepest-ascent direction of the norm: sign(g) for Linf, g / ||g||_2 for L2."""
        if self.norm == "linf":
            return grad.sign()
        norms = grad.reshape(len(grad), -1).norm(p=2, dim=1)
        return grad / _per_example(norms + TINY, grad)

    def project(self, x_adv: torch.Tensor, x: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        """Project onto {x' : ||x' - x|| <= eps} and then clip to [0, 1] (clipping never grows the norm)."""
        delta = x_adv - x
        if self.norm == "linf":
            bound = _per_example(eps, delta)
            delta = torch.maximum(torch.minimum(delta, bound), -bound)
        else:
            norms = delta.reshape(len(delta), -1).norm(p=2, dim=1)
            factor = torch.clamp(eps / (norms + TINY), max=1.0)
            delta = delta * _per_example(factor, delta)
        return (x + delta).clamp(0.0, 1.0)

    def random_start(self, x: torch.Tensor, eps: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """A point drawn uniformly from the eps-ball around ``x`` (then clipped to [0, 1])."""
        if self.norm == "linf":
            u = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype)
            delta = (2 * u - 1) * _per_example(eps, x)
        else:
            direction = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
            direction = direction / _per_example(direction.reshape(len(x), -1).norm(p=2, dim=1) + TINY, x)
            dim = x[0].numel()
            radius = torch.rand(len(x), generator=generator, device=x.device, dtype=x.dtype) ** (1.0 / dim)
            delta = direction * _per_example(radius * eps, x)
        return self.project(x + delta, x, eps)

    def _enforce_budget(self, adv: torch.Tensor, x: torch.Tensor, eps: torch.Tensor,
                        exact_eps: torch.Tensor) -> torch.Tensor:
        """Guarantee ||adv - x|| <= exact_eps (measured in float64) and adv in [0, 1]."""
        adv = self.project(adv.detach(), x, eps)
        limit = exact_eps
        if self.strict_budget:
            excess = float((perturbation_norms(adv - x, self.norm) - limit).max()) if len(x) else 0.0
            outside = bool(len(x)) and (float(adv.min()) < 0 or float(adv.max()) > 1)
            if excess > rounding_slack(x, self.norm) or outside:
                raise BudgetViolation(f"{self.name}/{self.norm}: projection left a perturbation {excess:.3g} past "
                                      f"its budget (pixels outside [0, 1]: {outside})")
        for _ in range(MAX_SHRINK_RETRIES):
            over = perturbation_norms(adv - x, self.norm) > limit
            if not bool(over.any()):
                return adv
            delta = (adv - x) * SHRINK_FACTOR
            adv = torch.where(_per_example(over, adv), (x + delta).clamp(0.0, 1.0), adv)
        over = perturbation_norms(adv - x, self.norm) > limit
        # reached only when the pixels' float spacing is coarse against eps itself (budgets near 1e-6): no change
        return torch.where(_per_example(over, adv), x, adv)


class FGSM(Attack):
    """Fast gradient method (Goodfellow et al., 2015): one step of length eps along the norm's steepest direction."""

    name = "fgsm"

    def perturb(self, x, y, eps, generator):
        grad = self.ascent_gradient(x, y, generator)
        return self.project(x + _per_example(eps, x) * self.steepest_direction(grad), x, eps)


class _Iterative(Attack):
    """Shared settings of the iterative attacks: ``steps`` and ``step_size`` (default 2.5 * eps / steps)."""

    def __init__(self, threat: Threat, norm: str, eps: float | torch.Tensor, steps: int = 10,
                 step_size: float | None = None, targeted: bool = False, device: torch.device | str | None = None):
        super().__init__(threat, norm, eps, targeted, device)
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise UserError(f"{self.name}: steps must be an integer >= 1, got {steps}")
        if step_size is not None and not (math.isfinite(step_size) and step_size > 0):
            raise UserError(f"{self.name}: step size must be > 0, got {step_size}")
        self.steps = steps
        self.step_size = step_size

    def step_sizes(self, eps: torch.Tensor) -> torch.Tensor:
        if self.step_size is not None:
            return torch.full_like(eps, self.step_size)
        return MADRY_STEP_FACTOR * eps / self.steps

    def iterate(self, start: torch.Tensor, x: torch.Tensor, y: torch.Tensor, eps: torch.Tensor,
                generator: torch.Generator | None) -> torch.Tensor:
        alpha = _per_example(self.step_sizes(eps), x)
        adv = start
        for _ in range(self.steps):
            grad = self.ascent_gradient(adv, y, generator)
            adv = self.project(adv + alpha * self.steepest_direction(grad), x, eps)
        return adv


class IFGSM(_Iterative):
    """Iterative FGSM / basic iterative method (Kurakin et al., 2017): FGSM steps from x, projected each time."""

    name = "ifgsm"

    def perturb(self, x, y, eps, generator):
        return self.iterate(x, x, y, eps, generator)


class PGD(_Iterative):
    """Projected gradient descent (Madry et al., 2018): a uniform random start in the eps-ball, then I-FGSM steps."""

    name = "pgd"

    def perturb(self, x, y, eps, generator):
        return self.iterate(self.random_start(x, eps, generator), x, y, eps, generator)


class MIM(_Iterative):
    """Momentum iterative method (Dong et al., 2018).

    g <- decay * g + grad / ||grad||_1 (per example), then a step along the norm's steepest direction of g.
    """

    name = "mim"

    def __init__(self, threat: Threat, norm: str, eps: float | torch.Tensor, steps: int = 10,
                 step_size: float | None = None, decay: float = DEFAULT_MOMENTUM_DECAY, targeted: bool = False,
                 device: torch.device | str | None = None):
        super().__init__(threat, norm, eps, steps, step_size, targeted, device)
        if not (math.isfinite(decay) and decay >= 0):
            raise UserError(f"mim: momentum decay must be >= 0, got {decay}")
        self.decay = float(decay)

    def perturb(self, x, y, eps, generator):
        alpha = _per_example(self.step_sizes(eps), x)
        momentum = torch.zeros_like(x)
        adv = x
        for _ in range(self.steps):
            grad = self.ascent_gradient(adv, y, generator)
            l1 = grad.reshape(len(grad), -1).abs().sum(dim=1)
            momentum = self.decay * momentum + grad / _per_example(l1 + TINY, grad)
            adv = self.project(adv + alpha * self.steepest_direction(momentum), x, eps)
        return adv


ATTACKS: dict[str, type[Attack]] = {cls.name: cls for cls in (FGSM, IFGSM, MIM, PGD)}
assert tuple(ATTACKS) == ATTACK_NAMES, "certify/attacks/names.py must list every attack"


def build_attack(name: str, threat: Threat, norm: str, eps: float | torch.Tensor, steps: int = 10,
                 step_size: float | None = None, decay: float = DEFAULT_MOMENTUM_DECAY, targeted: bool = False,
                 device: torch.device | str | None = None) -> Attack:
    """The attack called ``name`` (fgsm, ifgsm, mim, pgd); FGSM ignores steps, step size and decay."""
    if name not in ATTACKS:
        raise UserError(f"unknown attack {name!r}; expected one of {', '.join(ATTACKS)}")
    if name == "fgsm":
        return FGSM(threat, norm, eps, targeted, device)
    if name == "mim":
        return MIM(threat, norm, eps, steps, step_size, decay, targeted, device)
    return ATTACKS[name](threat, norm, eps, steps, step_size, targeted, device)
