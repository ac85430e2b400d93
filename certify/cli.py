"""Subcommands of this area (to be filled in by its issue)."""


def register(subparsers, common) -> None:
    """Add this area's subcommands to the ``transdenoiser`` parser."""
