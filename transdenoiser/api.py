"""The Python API: certify, predict, attack and train a private denoiser with any ``torch.nn.Module``.

Everything here works on plain modules and tensors (pixels in [0, 1], shape (N, C, H, W)); no checkpoint
format is needed. The command line is a layer over the same functions. Examples: docs/API.md.

- :class:`Smooth` (randomized smoothing, Cohen et al. 2019): ``predict``, ``certify`` and the adaptive
  ``certify_adaptive`` / ``decide``; ``ABSTAIN`` marks an abstention.
- :class:`FGSM`, :class:`IFGSM`, :class:`MIM`, :class:`PGD`: attacks in the style of torchattacks,
  ``attack = PGD(model, eps=0.5, norm="l2"); x_adv = attack(x, y)``, against the classifier alone or,
  with ``threat="pipeline"`` or ``"smoothed"``, through the noise and an optional denoiser.
- :func:`train_private_denoiser`: a denoiser trained with differential privacy in front of a frozen classifier
  on your tensors or ``torch.utils.data.Dataset``; returns the denoiser and its privacy report.
- The accountant and calculator: :func:`epsilon_report`, :func:`noise_multiplier_for_epsilon`,
  :func:`steps_for_epochs`, :func:`analytic_gaussian_sigma`, :func:`classical_gaussian_sigma`.
- :func:`fit_private_head`: a private linear classifier on feature vectors (Ding et al.'s OPERA or GRPUA with the
  analytic Gaussian mechanism, or DP-SGD), e.g. on a frozen model's penultimate features of private data.
- :class:`CertifyJob` and :func:`run_certify_job`: what ``transdenoiser certify`` / ``predict`` do (checkpoint
  directories and a dataset split in, a resumable run directory with rows, summary.json and report out).
- :func:`load_model`: the module stored in a checkpoint directory written by the command line.
"""
from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from certify.attacks import gradient as _attacks
from certify.attacks.threats import build_threat
from certify.core import ABSTAIN, AdaptiveCertificate, Certificate, Smooth, max_certifiable_radius
from certify.job import CertifyJob, JobOutcome
from certify.job import run_job as run_certify_job
from training.baselines.securesgd import train_securesgd as _train_securesgd
from training.baselines.stobatch import train_stobatch as _train_stobatch
from training.privacy import accounting as _accounting
from training.privacy.accounting import analytic_gaussian_sigma, classical_gaussian_sigma, steps_for_epochs
from training.privacy.report import format_privacy_report
from transdenoiser.convergence import summarised_convergence_warnings
from transdenoiser.errors import UserError
from transdenoiser.progress import Track, silent
from transdenoiser.records import PrivacyReport

__all__ = [
    "ABSTAIN", "AdaptiveCertificate", "Certificate", "Smooth", "max_certifiable_radius",
    "FGSM", "IFGSM", "MIM", "PGD",
    "train_private_denoiser", "train_securesgd", "train_stobatch", "format_privacy_report",
    "epsilon_report", "epsilon_for_accountant", "noise_multiplier_for_epsilon", "steps_for_epochs",
    "analytic_gaussian_sigma", "classical_gaussian_sigma",
    "fit_private_head", "normalise_features", "CertifyJob", "JobOutcome", "run_certify_job", "load_model",
]

IN_MEMORY = "<in memory>"


def _one_convergence_warning(function):
    """dp-accounting's per-order "failed to converge" log lines become one Python warning per call (library code
    never prints; the command line prints the same note once on stderr)."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        notes: list[str] = []
        with summarised_convergence_warnings(notes.append):
            result = function(*args, **kwargs)
        for note in notes:
            warnings.warn(note, RuntimeWarning, stacklevel=2)  # points at the caller's line
        return result

    return wrapper


epsilon_report = _one_convergence_warning(_accounting.epsilon_report)
epsilon_for_accountant = _one_convergence_warning(_accounting.epsilon_for_accountant)
noise_multiplier_for_epsilon = _one_convergence_warning(_accounting.noise_multiplier_for_epsilon)
train_securesgd = _one_convergence_warning(_train_securesgd)
train_stobatch = _one_convergence_warning(_train_stobatch)


# ----------------------------------------------------------------------------------------------- attacks

def _threat(model: nn.Module, threat: str, denoiser: nn.Module | None, sigma: float | None, m: int):
    if not isinstance(model, nn.Module):
        raise UserError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if threat == "classifier":
        if denoiser is not None or sigma is not None:
            raise UserError("threat 'classifier' attacks the classifier alone (no noise, no denoiser); pass "
                            "threat='pipeline' or threat='smoothed' to attack through sigma and the denoiser")
        return build_threat("classifier", model)
    if sigma is None:
        raise UserError(f"threat {threat!r} adds Gaussian noise before the denoiser: pass sigma=")
    return build_threat(threat, model, denoiser, sigma, m)


class FGSM(_attacks.FGSM):
    """FGSM on ``model`` (a classifier module taking [0,1] pixels): ``FGSM(model, eps=0.1)(x, y)``.

    ``norm``: ``"linf"`` (default, as in torchattacks) or ``"l2"``; ``eps`` in [0,1]-pixel units.
    ``threat``: ``"classifier"`` (the model alone), ``"pipeline"`` (EOT over ``m`` noise draws at ``sigma``,
    through ``denoiser`` if given) or ``"smoothed"`` (SmoothAdv). See docs/ATTACKS.md.
    """

    def __init__(self, model: nn.Module, eps: float | torch.Tensor, norm: str = "linf", *,
                 threat: str = "classifier", denoiser: nn.Module | None = None, sigma: float | None = None,
                 m: int = 8, targeted: bool = False, device: torch.device | str | None = None):
        super().__init__(_threat(model, threat, denoiser, sigma, m), norm, eps, targeted, device)


class _IterativeApi:
    def __init__(self, model: nn.Module, eps: float | torch.Tensor, norm: str = "linf", steps: int = 10,
                 step_size: float | None = None, *, threat: str = "classifier", denoiser: nn.Module | None = None,
                 sigma: float | None = None, m: int = 8, targeted: bool = False,
                 device: torch.device | str | None = None, **extra):
        super().__init__(_threat(model, threat, denoiser, sigma, m), norm, eps, steps, step_size,  # type: ignore[call-arg]
                         targeted=targeted, device=device, **extra)


class IFGSM(_IterativeApi, _attacks.IFGSM):
    """Iterative FGSM on ``model``: ``IFGSM(model, eps=0.1, steps=10)(x, y)``; arguments as :class:`FGSM`
    plus ``steps`` and ``step_size`` (default 2.5 * eps / steps)."""


class PGD(_IterativeApi, _attacks.PGD):
    """PGD (random start, then projected steps) on ``model``: ``PGD(model, eps=0.5, norm="l2")(x, y)``;
    arguments as :class:`IFGSM`."""


class MIM(_IterativeApi, _attacks.MIM):
    """Momentum iterative method on ``model``: ``MIM(model, eps=0.1, decay=1.0)(x, y)``; arguments as
    :class:`IFGSM` plus ``decay``."""

    def __init__(self, model: nn.Module, eps: float | torch.Tensor, norm: str = "linf", steps: int = 10,
                 step_size: float | None = None, *, decay: float = _attacks.DEFAULT_MOMENTUM_DECAY,
                 threat: str = "classifier", denoiser: nn.Module | None = None, sigma: float | None = None,
                 m: int = 8, targeted: bool = False, device: torch.device | str | None = None):
        super().__init__(model, eps, norm, steps, step_size, threat=threat, denoiser=denoiser, sigma=sigma, m=m,
                         targeted=targeted, device=device, decay=decay)


# ----------------------------------------------------------------------------------------------- data

def _as_arrays(data, what: str, need_labels: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """(images, labels) as numpy arrays from a tensor, a (images, labels) pair or a torch Dataset."""
    labels = None
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(t, torch.Tensor) for t in data):
        images, labels = data
    elif isinstance(data, torch.Tensor):
        images = data
    elif isinstance(data, torch.utils.data.Dataset):
        try:
            items = [data[i] for i in range(len(data))]  # type: ignore[arg-type]
        except TypeError:
            raise UserError(f"{what}: a torch Dataset must have a length and integer indexing") from None
        if not items:
            raise UserError(f"{what}: the dataset is empty")
        first = items[0]
        if isinstance(first, (tuple, list)):
            images = torch.stack([torch.as_tensor(item[0]) for item in items])
            if len(first) > 1:
                labels = torch.as_tensor([int(item[1]) for item in items])
        else:
            images = torch.stack([torch.as_tensor(item) for item in items])
    else:
        raise UserError(f"{what}: expected a tensor (N, C, H, W), an (images, labels) pair of tensors or a torch "
                        f"Dataset, got {type(data).__name__}")
    if images.dim() != 4:
        raise UserError(f"{what}: images must have shape (N, C, H, W), got {tuple(images.shape)}")
    if need_labels and labels is None:
        raise UserError(f"{what}: labels are needed here: pass (images, labels) or a Dataset of (image, label)")
    images = images.detach().cpu()
    if images.dtype == torch.uint8:
        array = images.numpy()
    else:
        array = images.to(torch.float32).numpy()
        if array.size and not (np.isfinite(array).all() and array.min() >= 0 and array.max() <= 1):
            raise UserError(f"{what}: pixels must be finite and in [0, 1] (or uint8 in 0..255)")
    label_array = None
    if labels is not None:
        labels = torch.as_tensor(labels).detach().cpu().to(torch.int64).reshape(-1)
        if len(labels) != len(array):
            raise UserError(f"{what}: {len(array)} images but {len(labels)} labels")
        label_array = labels.numpy()
    return np.ascontiguousarray(array), label_array


def _split(images: np.ndarray, labels: np.ndarray):
    from training.datasets import Split

    if images.dtype == np.uint8:
        return Split(images, labels)
    return _FloatSplit(images, labels)


def _float_split_class():
    from training.datasets import Split

    class FloatSplit(Split):
        """A split of float32 pixels in [0, 1], used as they are (never quantised to 8 bits)."""

        def tensors(self, device="cpu"):
            return (torch.from_numpy(self.images).to(device=device, dtype=torch.float32),
                    torch.from_numpy(self.labels).to(device=device, dtype=torch.int64))

        def subset(self, indices):
            return FloatSplit(self.images[indices], self.labels[indices])

    return FloatSplit


_FloatSplit = _float_split_class()


def _in_memory_dataset(private: np.ndarray, test_images: np.ndarray, test_labels: np.ndarray, num_classes: int,
                       name: str, private_labels: np.ndarray | None = None, public: np.ndarray | None = None):
    from training.datasets import Dataset

    for what, images in (("test", test_images), ("public", public)):
        if images is not None and private.shape[1:] != images.shape[1:]:
            raise UserError(f"training images have shape {list(private.shape[1:])}, {what} images "
                            f"{list(images.shape[1:])}")
    if private_labels is not None and int(private_labels.max(initial=0)) >= num_classes:
        raise UserError(f"training labels go up to {int(private_labels.max())}, the classifier has {num_classes} "
                        "classes")
    public = public if public is not None else np.zeros((0, *private.shape[1:]), dtype=private.dtype)
    return Dataset(name=name, classes=tuple(str(c) for c in range(num_classes)),
                   public=_split(public, np.zeros(len(public), dtype=np.int64)),  # its labels are never used
                   # the private labels are read by objective classification only
                   private=_split(private, private_labels if private_labels is not None
                                  else np.zeros(len(private), dtype=np.int64)),
                   test=_split(test_images, test_labels), source=IN_MEMORY, split_seed=0)


# ----------------------------------------------------------------------------------------------- training

@_one_convergence_warning
def train_private_denoiser(classifier: nn.Module, images, *, test, arm: str = "sepdp", sigma: float = 0.25,
                           epochs: int = 10, batch_size: int = 64, noise_multiplier: float | None = None,
                           target_epsilon: float | None = None, delta: float | None = None,
                           num_classes: int | None = None, device: torch.device | str | None = None,
                           out: str | Path | None = None, track: Track = silent, dataset_name: str = "in-memory",
                           public=None, **settings: Any) -> tuple[nn.Module, PrivacyReport]:
    """Train a denoiser on ``images`` with differential privacy, in front of the frozen ``classifier``.

    ``classifier``: any module mapping (N, C, H, W) pixels in [0, 1] to logits; never changed (it is
    moved to ``device`` and used in eval mode; its ``requires_grad`` flags and mode are restored after).
    ``images``: the private training images: a tensor (N, C, H, W) of floats in [0, 1] or uint8, or a torch
    Dataset yielding images or (image, label) pairs (labels are read by ``objective="classification"`` only, which
    needs them). ``test``: (images, labels) or a Dataset of (image, label): the public evaluation set whose metrics
    the result carries. ``objective`` (a setting): ``mse`` (default), ``stability``, ``classification`` or
    ``stability+mse``, which trains MSE on ``public`` (public images, as ``images``; no privacy spent on them)
    first, then stability on ``images``.
    ``arm``: ``sepdp`` (DP-SGD, a data-independent epsilon), ``transdenoiser`` (Algorithm 1; its epsilon rests
    on a data-dependent analysis and the report says so) or ``nodp`` (no privacy claim).
    ``noise_multiplier``: std of the Gaussian noise on the summed clipped gradient over the clipping norm
    ``clip_norm`` (the paper's xi_up; default 2.0); ``target_epsilon``: calibrate it to this epsilon instead;
    ``delta``: default 1e-5. ``settings``: any other field of ``training.train_config.TrainConfig`` that ``arm``
    reads (``learning_rate``, ``optimizer``, ``denoiser`` (architecture), ``activation``; the DP arms'
    ``clip_norm``, ``xi_up``; transdenoiser's ``xi_low``; sepdp's ``noise_draws``, ...: each arm's settings are
    its config type's fields, training/methods/denoiser_config.py). A setting the arm does not read is refused,
    ``noise_multiplier``, ``target_epsilon`` and ``delta`` included.
    ``out``: also write the checkpoint there (a directory, as ``transdenoiser train`` writes).
    Returns (denoiser in eval mode, the released privacy report as its typed record,
    :class:`~transdenoiser.records.PrivacyReport`: ``report.named("sepdp").epsilon.value("pld")``; format it
    with :func:`format_privacy_report`, ``report.to_json()`` is the stored dict).
    """
    from training.evaluation import FrozenClassifier
    from training.private_train import train_denoiser
    from training.train_config import TrainConfig

    if not isinstance(classifier, nn.Module):
        raise UserError(f"classifier must be a torch.nn.Module, got {type(classifier).__name__}")
    from training.methods.base import SettingsSource, refuse_unknown
    from training.methods.denoiser_config import ARM_CONFIGS

    spelled = {}
    if noise_multiplier is not None:
        if "xi_up" in settings:
            raise UserError("pass noise_multiplier or xi_up (the same setting), not both")
        settings["xi_up"] = noise_multiplier
        spelled["xi_up"] = "noise_multiplier"
    for name, value in (("target_epsilon", target_epsilon), ("delta", delta)):
        if value is not None:
            settings[name] = value
    if arm in ARM_CONFIGS:  # another arm's setting, given explicitly here, is refused (unknown arms: validate)
        refuse_unknown(arm, ARM_CONFIGS[arm], settings, SettingsSource("train_private_denoiser", spelled),
                       subject=f"train_private_denoiser: arm {arm}")
    objective = settings.get("objective", "mse")
    private, private_labels = _as_arrays(images, "images", need_labels=objective == "classification")
    test_images, test_labels = _as_arrays(test, "test", need_labels=True)
    public_images = _as_arrays(public, "public", need_labels=False)[0] if public is not None else None
    if device is None:
        first = next(iter(classifier.parameters()), None)
        device = first.device if first is not None else torch.device("cpu")
    device = torch.device(device)
    flags = {name: p.requires_grad for name, p in classifier.named_parameters()}
    was_training = classifier.training
    try:
        if num_classes is None:
            with torch.no_grad():
                probe = _split(test_images[:1], test_labels[:1]).tensors(device)[0]
                num_classes = int(classifier.to(device).eval()(probe).shape[-1])
        if int(test_labels.max(initial=0)) >= num_classes:
            raise UserError(f"test labels go up to {int(test_labels.max())}, the classifier has {num_classes} classes")
        dataset = _in_memory_dataset(private, test_images, test_labels, num_classes, dataset_name,
                                     private_labels if objective == "classification" else None, public_images)
        frozen = FrozenClassifier(model=classifier, architecture=f"python:{type(classifier).__qualname__}",
                                  input_shape=tuple(dataset.image_shape), num_classes=num_classes, path=IN_MEMORY,
                                  dataset={"name": dataset_name, "source": IN_MEMORY})
        config = TrainConfig.from_dict({"arm": arm, "sigma": sigma, "epochs": epochs, "batch_size": batch_size,
                                        **settings},
                                       source="train_private_denoiser")
        model, released = train_denoiser(config, dataset, frozen, device, track, checkpoint_dir=out)
    finally:
        for name, p in classifier.named_parameters():
            p.requires_grad_(flags[name])
        classifier.train(was_training)
    return model, PrivacyReport.from_json(released["privacy"], "the released privacy report")


# ----------------------------------------------------------------------------------------------- linear heads

def normalise_features(features) -> torch.Tensor:
    """Rows [f / ||f||, 1] / sqrt(2): L2 norm <= 1, as :func:`fit_private_head`'s sensitivity analyses need."""
    from training.linear_probe import normalise_features as _normalise

    return _normalise(torch.as_tensor(features, dtype=torch.float64))


@_one_convergence_warning
def fit_private_head(features, labels, *, algorithm: str = "opera", loss: str = "logistic", epsilon: float = 1.0,
                     delta: float = 1e-5, reg: float = 1e-3, num_classes: int | None = None,
                     track: Track = silent, **settings: Any) -> tuple[np.ndarray, dict[str, Any]]:
    """A linear classifier on ``features`` (n, d) with (epsilon, delta)-DP (replace-one neighbours).

    ``features``: rows of L2 norm <= 1 (use :func:`normalise_features`); ``labels``: n class indices.
    ``algorithm``: ``opera`` (output perturbation of the regularised minimiser, Ding et al.), ``grpua`` (gradient
    perturbation, T = n^2 steps by default) or ``dpsgd``; ``loss``: ``logistic`` or ``huber-svm``; ``reg``: the
    L2 regularisation lambda. The Gaussian noise is calibrated by the analytic Gaussian mechanism (``settings``:
    ``calibration="classical"`` for the classical one, ``steps``, ``grpua_accountant``, ...: the fields of
    ``training.convex.train.HeadConfig``). The noise is secret (drawn from the OS). Returns the weights,
    shape (d, num_classes) (or (d,) for two classes), and the privacy report naming its analysis.
    """
    import secrets

    from training.convex.train import HeadConfig, fit_head
    from training.methods.base import SettingsSource, refuse_unknown

    X = np.asarray(features.detach().cpu().numpy() if isinstance(features, torch.Tensor) else features,
                   dtype=np.float64)
    y = np.asarray(labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else labels)
    if y.ndim != 1 or len(y) != len(X):
        raise UserError(f"labels must be one class index per feature row ({len(X)}), got shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        raise UserError(f"labels must be integers (class indices), got dtype {y.dtype}")
    if len(y) == 0:
        raise UserError("features and labels are empty: a private head needs at least one example")
    classes = int(y.max()) + 1 if num_classes is None else num_classes
    if y.min(initial=0) < 0 or y.max(initial=0) >= classes:
        raise UserError(f"labels must lie in [0, {classes}), got {int(y.min())}..{int(y.max())}")
    if settings.get("reproducible_noise"):
        raise UserError("fit_private_head draws its noise from the OS and never stores it; reproducible noise is "
                        "for `transdenoiser train-head --reproducible-noise` research runs")
    refuse_unknown("fit_private_head", HeadConfig, settings, SettingsSource("fit_private_head", {}),
                   subject="fit_private_head")
    config = HeadConfig(algorithm=algorithm, loss=loss, epsilon=epsilon, delta=delta, reg=reg, **settings)
    release = fit_head(X, y.astype(np.int64), config, classes, secrets.randbits(63), track)
    return release.weights, release.privacy


# ----------------------------------------------------------------------------------------------- checkpoints

def load_model(directory: str | Path, device: torch.device | str = "cpu") -> nn.Module:
    """The model (classifier or denoiser, eval mode) of a checkpoint directory, its hashes checked."""
    from training.checkpoint import load_checkpoint

    return load_checkpoint(directory, map_location=device).model
