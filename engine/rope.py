"""Rotary position embeddings: the cos/sin table for every RoPE scaling type we support."""

from __future__ import annotations

import math

import torch

from engine.config import ModelConfig


def _base_inv_freq(base: float, dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    factor = s["factor"]
    low, high = s["low_freq_factor"], s["high_freq_factor"]
    old_ctx = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    # Between the two wavelengths, blend the scaled and original frequencies.
    smooth = (old_ctx / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, blended, scaled)


def _yarn_inv_freq(cfg: ModelConfig, s: dict) -> tuple[torch.Tensor, float]:
    base, dim = cfg.rope_theta, cfg.head_dim
    old_ctx = s.get("original_max_position_embeddings") or cfg.max_position_embeddings
    factor = s.get("factor") or cfg.max_position_embeddings / old_ctx

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn_factor = s.get("attention_factor")
    if attn_factor is None:
        if s.get("mscale") and s.get("mscale_all_dim"):
            attn_factor = mscale(factor, s["mscale"]) / mscale(factor, s["mscale_all_dim"])
        else:
            attn_factor = mscale(factor)
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(old_ctx / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1 - ramp  # 1: keep the original frequency, 0: interpolate
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attn_factor)


def rope_cos_sin(cfg: ModelConfig, max_len: int) -> torch.Tensor:
    """(max_len, head_dim) fp32 table on the CPU, whatever the default device: cos in the first
    head_dim/2 columns, sin in the rest. (Built on a GPU, its dozen small kernels each loaded
    their module on first use: 0.16 s of an H200 host's start-up, for a table of a few MB.)

    `dynamic` NTK scaling grows the base once positions pass the trained context; here the
    table row for position p uses the base for a sequence of p + 1 tokens, which is what a
    token-by-token decoder sees.
    """
    with torch.device("cpu"):
        return _table(cfg, max_len)


def _table(cfg: ModelConfig, max_len: int) -> torch.Tensor:
    dim = cfg.head_dim
    positions = torch.arange(max_len, dtype=torch.float32)
    s = cfg.rope_scaling_dict or {}
    kind = s.get("rope_type", s.get("type", "default"))
    attn_factor = 1.0
    if kind == "default":
        inv_freq = _base_inv_freq(cfg.rope_theta, dim)
    elif kind == "linear":
        inv_freq = _base_inv_freq(cfg.rope_theta, dim) / s["factor"]
    elif kind == "llama3":
        inv_freq = _llama3_inv_freq(_base_inv_freq(cfg.rope_theta, dim), s)
    elif kind == "yarn":
        inv_freq, attn_factor = _yarn_inv_freq(cfg, s)
    elif kind == "dynamic":
        old_ctx = s.get("original_max_position_embeddings") or cfg.max_position_embeddings
        inv_freq = _base_inv_freq(cfg.rope_theta, dim)
        freqs = torch.outer(positions, inv_freq)
        factor = s["factor"]
        for p in range(old_ctx, max_len):
            base = cfg.rope_theta * ((factor * (p + 1) / old_ctx) - (factor - 1)) ** (dim / (dim - 2))
            freqs[p] = p * _base_inv_freq(base, dim)
        return torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    else:
        raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: llama3, linear, dynamic, yarn)")
    freqs = torch.outer(positions, inv_freq)
    return torch.cat([freqs.cos() * attn_factor, freqs.sin() * attn_factor], dim=-1)


def apply_rope(x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """x: (T, H, D); cos_sin: (T, D) rows for x's positions. Half-rotation (HF Llama) style."""
    half = x.shape[-1] // 2
    cos = cos_sin[:, None, :half].to(x.dtype)
    sin = cos_sin[:, None, half:].to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
