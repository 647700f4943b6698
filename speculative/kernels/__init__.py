"""Triton kernels of speculation, each beside its plain-torch reference (as engine/kernels)."""
