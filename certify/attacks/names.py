"""Names and defaults of the attacks and threat models, importable without torch (the CLI needs them at start-up)."""

ATTACK_NAMES = ("fgsm", "ifgsm", "mim", "pgd")
NORMS = ("l2", "linf")
THREATS = ("classifier", "pipeline", "smoothed")
DEFAULT_MOMENTUM_DECAY = 1.0  # MIM's mu (Dong et al., 2018)
MADRY_STEP_FACTOR = 2.5  # default step size = 2.5 * eps / steps (Madry et al., 2018)
