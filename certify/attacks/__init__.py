"""Attacks on the smoothed pipeline, one job per module.

- ``names``: the attack, norm and threat names and defaults (no torch: the CLI's flags read them).
- ``gradient``: FGSM, I-FGSM, MIM and PGD over one small base class (:class:`Attack`).
- ``threats``: what an attack differentiates (the classifier, the noisy pipeline, the smoothed pipeline).
- ``evaluate``: accuracy under attack over a bound sweep, and the audit of a certify run's certificates.
- ``report``: the attack run's TSV, figure and overlays.
- ``cli``: ``transdenoiser attack`` and ``transdenoiser audit``.

The attack classes for any ``nn.Module`` are in the Python API, ``transdenoiser.api`` (docs/API.md).
"""
