"""The package's version, recorded in every checkpoint's metadata (``package_version``) and printed by
``transdenoiser --version``; the same number as ``version`` in pyproject.toml."""

__version__ = "0.1.0"
