"""Denoiser architectures (registered in training.models). Filled in by the private-training work."""
