"""Baselines from other papers, trained, certified and attacked through the same commands as the product's arms.

- :mod:`training.baselines.securesgd`: SecureSGD (Phan et al., IJCAI 2019, "Heterogeneous Gaussian Mechanism:
  Preserving Differential Privacy in Deep Learning with Provable Robustness"), arms ``securesgd-prt`` (a denoiser in
  front of the frozen classifier) and ``securesgd-sct`` (a classifier trained from scratch); its mechanisms and
  noise-layer models in :mod:`~training.baselines.securesgd_mechanisms`, its certificate in
  :mod:`~training.baselines.securesgd_certify`.
- :mod:`training.baselines.stobatch`: StoBatch (Phan et al., ICML 2020, "Scalable Differential Privacy with
  Certified Robustness in Adversarial Learning"), arm ``stobatch``; its mechanisms in
  :mod:`~training.baselines.stobatch_mechanisms`, its privacy analyses in :mod:`~training.baselines.stobatch_privacy`,
  its certificate in :mod:`~training.baselines.stobatch_certify`.
- :mod:`training.baselines.common`: what the baselines share: per-example clipped DP-SGD steps, first-layer
  sensitivity bounds, Monte-Carlo vote counts, the PixelDP-style robustness condition, privacy reports.
- :mod:`training.baselines.train_cli` (``train --arm securesgd-*|stobatch``) and :mod:`training.baselines.cli`
  (``baseline-certify``): the command line; the modules above never read flags or print.

What differs from each paper, and why, is in docs/BASELINES.md.
"""
