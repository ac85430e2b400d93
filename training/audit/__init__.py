"""The privacy audit run (``transdenoiser privacy-audit``): training with canaries above the privacy layer's
analysis (:mod:`training.privacy.audit`). ``run``: the library function; ``cli``: the command."""
