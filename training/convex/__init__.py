"""Private convex ERM for a linear head (Ding et al., "Private ERM with the analytic Gaussian mechanism").

- :mod:`training.convex.losses`: logistic (one-vs-rest), multinomial logistic (softmax) and Huber-SVM
  (one-vs-rest) losses on feature vectors of L2 norm <= 1, with their Lipschitz and smoothness constants.
- :mod:`training.convex.mechanisms`: OPERA (output perturbation) and GRPUA (gradient perturbation), both
  calibrated with the analytic Gaussian mechanism; the classical Gaussian mechanism for comparison; a DP-SGD
  baseline on the head. Every result carries the analysis behind its epsilon.
- the ``linear-probe`` architecture these heads train (frozen feature extractor + linear head), a classifier like
  any other for ``certify``, ``attack`` and ``serve``, is :mod:`training.linear_probe`, beside the other
  architectures (it loads without this package's training code).
- :mod:`training.convex.train`: features of the private split, training, metadata and privacy report.

Neighbouring relation throughout: REPLACE-ONE (the dataset size n is public), the relation of the paper.
This module imports nothing heavy on import; :mod:`head` needs only torch.
"""
