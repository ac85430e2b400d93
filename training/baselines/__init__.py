"""Baselines from other papers, trained, certified and attacked through the same commands as the product's arms.

- :mod:`training.baselines.securesgd`: SecureSGD (Phan et al., IJCAI 2019, "Heterogeneous Gaussian Mechanism:
  Preserving Differential Privacy in Deep Learning with Provable Robustness"), arms ``securesgd-prt`` (a denoiser in
  front of the frozen classifier) and ``securesgd-sct`` (a classifier trained from scratch).
- :mod:`training.baselines.common`: what the baselines share: per-example clipped DP-SGD steps, first-layer
  sensitivity bounds, the PixelDP-style robustness condition, privacy reports.

What differs from each paper, and why, is in docs/BASELINES.md.
"""
