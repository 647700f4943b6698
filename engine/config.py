"""ModelConfig: the target model's shape, read from a Hugging Face `config.json`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.config_checks import (MAX_HEAD_DIM, MAX_HEADS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_POSITIONS,
                            MAX_VOCAB, check_layer_count, check_rope_scaling, flag, get, integer, mapping, names,
                            number, read_json, token_ids)
from engine.errors import ModelLoadError
from engine.quant_config import QuantConfig

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
# Size fields: (config.json key, largest value taken).
_SIZES = {
    "vocab_size": ("vocab_size", MAX_VOCAB),
    "hidden_size": ("hidden_size", MAX_HIDDEN),
    "intermediate_size": ("intermediate_size", MAX_INTERMEDIATE),
    "num_layers": ("num_hidden_layers", MAX_LAYERS),
    "num_heads": ("num_attention_heads", MAX_HEADS),
    "num_kv_heads": ("num_key_value_heads", MAX_HEADS),
    "head_dim": ("head_dim", MAX_HEAD_DIM),
    "max_position_embeddings": ("max_position_embeddings", MAX_POSITIONS),
}


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
    quantization: QuantConfig | None = None  # AWQ, GPTQ, FP8 or compressed-tensors weights (quantization_config)

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(
                f"unsupported architecture {self.architecture!r}; supported: "
                + ", ".join(SUPPORTED_ARCHITECTURES)
            )
        for name, (key, hi) in _SIZES.items():
            integer(getattr(self, name), key, "config.json", hi=hi)
        number(self.rms_norm_eps, "rms_norm_eps", "config.json", hi=1.0)
        number(self.rope_theta, "rope_theta", "config.json", lo=1.0)  # the base of RoPE's frequencies
        if self.head_dim % 2:
            raise ModelLoadError(f"config.json: head_dim must be even (RoPE rotates pairs), got {self.head_dim}")
        if self.rope_scaling_dict:
            check_rope_scaling(self.rope_scaling_dict, "config.json")
            kind = self.rope_scaling_dict.get("rope_type", self.rope_scaling_dict.get("type"))
            if kind == "dynamic" and self.head_dim < 4:
                raise ModelLoadError("config.json: dynamic RoPE scaling needs head_dim >= 4")
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"config.json: num_attention_heads ({self.num_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )

    def check_tensors(self, shapes: dict[str, tuple[int, ...]], source: str, layers_key: str = "num_hidden_layers"
                      ) -> None:
        """The config against the checkpoint's tensor list (names -> shapes, read from headers)
        before anything is allocated: a wrong layer count or vocabulary fails here in a moment,
        not after building the model. `layers_key`: what the source calls the layer count."""
        check_layer_count(self.num_layers, shapes, "model.layers.", layers_key, source)
        embed = shapes.get("model.embed_tokens.weight")
        if embed is not None and tuple(embed) != (self.vocab_size, self.hidden_size):
            raise ModelLoadError(f"{source}: the embedding has shape {tuple(embed)} but the config says "
                                 f"vocab_size {self.vocab_size} x hidden_size {self.hidden_size}")

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
    def from_hf(cls, cfg: dict, where: str = "config.json") -> "ModelConfig":
        """Every value is type- and range-checked here: a config that would allocate garbage
        fails with one line naming the field."""
        archs = names(cfg.get("architectures") or [], "architectures", where)
        if not archs:
            raise ModelLoadError(f"{where} has no 'architectures' entry")
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(
                f"unsupported architecture {arch!r}; supported: " + ", ".join(SUPPORTED_ARCHITECTURES)
            )
        size = {name: integer(get(cfg, key, where), key, where, hi=hi) for name, (key, hi) in _SIZES.items()
                if name not in ("num_kv_heads", "head_dim", "max_position_embeddings")}
        hidden, num_heads = size["hidden_size"], size["num_heads"]
        if cfg.get("head_dim") is None and hidden % num_heads:
            raise ModelLoadError(f"{where}: hidden_size {hidden} is not divisible by num_attention_heads "
                                 f"{num_heads}, and no head_dim is given")
        opt = lambda key, default: get(cfg, key, where, default)  # noqa: E731
        scaling = opt("rope_scaling", None) or opt("rope_parameters", None)
        rope_theta = opt("rope_theta", None)
        if scaling is not None:
            scaling = dict(mapping(scaling, "rope_scaling", where))
            rope_theta = rope_theta if rope_theta is not None else scaling.get("rope_theta")
            check_rope_scaling(scaling, where)
            kind = scaling.get("rope_type", scaling.get("type", "default"))
            scaling = None if kind == "default" else tuple(sorted(
                (k, tuple(v) if isinstance(v, list) else v) for k, v in scaling.items()))
        window = None
        if flag(opt("use_sliding_window", False), "use_sliding_window", where):
            window = integer(get(cfg, "sliding_window", where), "sliding_window", where, hi=MAX_POSITIONS)
        bos = token_ids(cfg.get("bos_token_id"), "bos_token_id", where)
        return cls(
            architecture=arch,
            head_dim=integer(opt("head_dim", hidden // num_heads), "head_dim", where, hi=MAX_HEAD_DIM),
            num_kv_heads=integer(opt("num_key_value_heads", num_heads), "num_key_value_heads", where, hi=MAX_HEADS),
            rms_norm_eps=number(opt("rms_norm_eps", 1e-6), "rms_norm_eps", where, hi=1.0),
            rope_theta=number(10000.0 if rope_theta is None else rope_theta, "rope_theta", where, lo=1.0),
            rope_scaling=scaling,
            max_position_embeddings=integer(opt("max_position_embeddings", 4096), "max_position_embeddings", where,
                                            hi=MAX_POSITIONS),
            tie_word_embeddings=flag(opt("tie_word_embeddings", False), "tie_word_embeddings", where),
            attention_bias=flag(opt("attention_bias", arch in QWEN2_FAMILY), "attention_bias", where),
            qk_norm=arch == "Qwen3ForCausalLM",
            mlp_bias=flag(opt("mlp_bias", False), "mlp_bias", where),
            sliding_window=window,
            bos_token_id=bos[0] if bos else None,
            eos_token_ids=token_ids(cfg.get("eos_token_id"), "eos_token_id", where),
            quantization=_quantization(cfg, where),
            **size,
        )

    @classmethod
    def from_file(cls, path: Path) -> "ModelConfig":
        return cls.from_hf(read_json(path), f"{Path(path).parent.name}/config.json")


def _quantization(cfg: dict, where: str) -> QuantConfig | None:
    """config.json's quantization_config, or compression_config, where older compressed-tensors
    checkpoints keep it."""
    for key in ("quantization_config", "compression_config"):
        if cfg.get(key) is not None:
            return QuantConfig.from_hf(cfg[key], where)
    return None
