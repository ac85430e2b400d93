"""TransDenoiser: certified predictions from a frozen classifier behind a privately trained denoiser.

The Python API (docs/API.md) is loaded on first use, so that importing the package (and running
``transdenoiser --help``) does not import torch::

    import transdenoiser
    smooth = transdenoiser.Smooth(classifier, num_classes=10, sigma=0.25, denoiser=denoiser)
"""

from transdenoiser.version import __version__ as __version__

_API_NAMES = ("ABSTAIN", "AdaptiveCertificate", "Certificate", "Smooth", "max_certifiable_radius",
              "FGSM", "IFGSM", "MIM", "PGD", "train_private_denoiser", "train_securesgd", "train_stobatch",
              "format_privacy_report",
              "epsilon_report", "epsilon_for_accountant", "noise_multiplier_for_epsilon", "steps_for_epochs",
              "analytic_gaussian_sigma", "classical_gaussian_sigma",
              "fit_private_head", "normalise_features", "CertifyJob", "JobOutcome", "run_certify_job",
              "load_model")


def __getattr__(name: str):
    if name in _API_NAMES:
        from transdenoiser import api

        return getattr(api, name)
    raise AttributeError(f"module 'transdenoiser' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_API_NAMES])
