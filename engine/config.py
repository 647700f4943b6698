"""ModelConfig: the target model's shape, read from a Hugging Face `config.json`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelLoadError

# Architectures with our own implementation; all are the Llama decoder with small variations.
SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "MiMoForCausalLM",  # a Qwen2 model that also ships MTP layers (model.mtp_layers.*)
)
# Architectures built as Qwen2: q/k/v bias by default, no o_proj bias.
QWEN2_FAMILY = ("Qwen2ForCausalLM", "MiMoForCausalLM")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # A copy of the HF `rope_scaling` dict ({"rope_type": "llama3", ...}); None for plain RoPE.
    rope_scaling: tuple[tuple[str, object], ...] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm on q and k before RoPE (Qwen3)
    mlp_bias: bool = False
    sliding_window: int | None = None  # recorded, not applied: contexts we serve are shorter
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(
                f"unsupported architecture {self.architecture!r}; supported: "
                + ", ".join(SUPPORTED_ARCHITECTURES)
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise ModelLoadError(f"config.json: {name} must be positive, got {getattr(self, name)}")
        kind = (self.rope_scaling_dict or {}).get("rope_type", (self.rope_scaling_dict or {}).get("type"))
        if kind not in (None, "default", "llama3", "linear", "dynamic", "yarn"):
            raise ModelLoadError(
                f"config.json: unsupported rope_scaling type {kind!r} (supported: llama3, linear, dynamic, yarn)")
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"config.json: num_attention_heads ({self.num_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )

    @property
    def is_qwen2(self) -> bool:
        return self.architecture in QWEN2_FAMILY

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def rope_scaling_dict(self) -> dict | None:
        return dict(self.rope_scaling) if self.rope_scaling else None

    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelConfig":
        archs = cfg.get("architectures") or []
        if not archs:
            raise ModelLoadError("config.json has no 'architectures' entry")
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(
                f"unsupported architecture {arch!r}; supported: " + ", ".join(SUPPORTED_ARCHITECTURES)
            )
        try:
            hidden = int(cfg["hidden_size"])
            num_heads = int(cfg["num_attention_heads"])
            head_dim = cfg.get("head_dim") or hidden // num_heads
            scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters")
            rope_theta = cfg.get("rope_theta")
            if scaling is not None:
                scaling = dict(scaling)
                rope_theta = rope_theta or scaling.get("rope_theta")
                kind = scaling.get("rope_type", scaling.get("type", "default"))
                scaling = None if kind == "default" else tuple(sorted(
                    (k, tuple(v) if isinstance(v, list) else v) for k, v in scaling.items()))
            eos = cfg.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
            return cls(
                architecture=arch,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=num_heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
                head_dim=int(head_dim),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=float(rope_theta or 10000.0),
                rope_scaling=scaling,
                max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=bool(cfg.get("attention_bias", arch in QWEN2_FAMILY)),
                qk_norm=arch == "Qwen3ForCausalLM",
                mlp_bias=bool(cfg.get("mlp_bias", False)),
                sliding_window=cfg.get("sliding_window") if cfg.get("use_sliding_window") else None,
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=eos_ids,
            )
        except KeyError as e:
            raise ModelLoadError(f"config.json is missing the field {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise ModelLoadError(f"config.json has an invalid value: {e}") from None

    @classmethod
    def from_file(cls, path: Path) -> "ModelConfig":
        try:
            return cls.from_hf(json.loads(Path(path).read_text()))
        except json.JSONDecodeError as e:
            raise ModelLoadError(f"{path} is not valid JSON: {e}") from None
