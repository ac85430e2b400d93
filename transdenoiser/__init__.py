"""TransDenoiser: certified predictions from a frozen classifier behind a privately trained denoiser."""

__version__ = "0.1.0"
