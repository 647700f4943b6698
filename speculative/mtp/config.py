"""MTPConfig: the shape and conventions of multi-token-prediction layers, from either layout.

Two layouts are read:
  - "mimo": layers shipped inside a `MiMoForCausalLM` checkpoint (`model.mtp_layers.{i}.*`,
    `num_nextn_predict_layers` in the target's own config.json); shapes are the target's.
  - "localchat": standalone layers for a Llama-family target (`architectures: ["LocalchatMTP"]`,
    tensors `mtp_layers.{i}.*`), as `localchat train-draft --kind mtp` writes them.

It is the single authority for the two widths an MTP step sees (both the target's hidden size:
the window pass consumes target states, chain steps consume their own outputs) and for the
per-layout conventions below. Every buffer, graph buffers included, is sized from it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from engine.config import ModelConfig
from engine.config_checks import (MAX_HEAD_DIM, MAX_HEADS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_VOCAB,
                                  check_layer_count, flag, get, integer, names, number, read_json)
from engine.errors import ModelLoadError

LOCALCHAT_ARCH = "LocalchatMTP"


@dataclass(frozen=True)
class MTPConfig:
    format: str  # "mimo" | "localchat"
    num_layers: int  # S: physical MTP layers; step s runs layer s
    # Chain: step s + 1 consumes the state step s produced (DeepSeek-V3's sequential MTP, which
    # MiMo's layers follow); non-chain: every step consumes the target's state at that position.
    chain: bool
    hidden_size: int  # the target's: MTP layers read and write target-width states
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int  # the target's: embeddings and lm_head are shared with it
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False  # q/k/v bias (MiMo's blocks are Qwen2 blocks)

    def __post_init__(self) -> None:
        if self.format not in ("mimo", "localchat"):
            raise ValueError(f"unknown MTP layout {self.format!r}")
        if self.num_layers < 1:
            raise ModelLoadError(f"MTP config: num_nextn_predict_layers must be >= 1, got {self.num_layers}")
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(f"MTP config: {self.num_heads} heads is not a multiple of "
                                 f"{self.num_kv_heads} KV heads")
        assert self.extend_width == self.decode_width  # chain states overwrite target states in one buffer

    # --- widths -------------------------------------------------------------------------
    @property
    def extend_width(self) -> int:
        """Width of the target states the window pass consumes (the target's post-norm hidden)."""
        return self.hidden_size

    @property
    def decode_width(self) -> int:
        """Width of the state a step passes on to the next in chain mode."""
        return self.hidden_size

    # --- per-layout conventions (facts about the checkpoints, not choices) --------------
    @property
    def hidden_first(self) -> bool:
        """input_proj reads [hidden_layernorm(h), token_layernorm(e)] in MiMo's checkpoints and
        [token_layernorm(e), hidden_layernorm(h)] (DeepSeek-V3's [enorm; hnorm]) in ours."""
        return self.format == "mimo"

    @property
    def norm_in_layer(self) -> bool:
        """MiMo's layer returns final_layernorm's output and chains that; ours treats the final
        norm as part of the output head and chains the block output (DeepSeek-V3 style)."""
        return self.format == "mimo"

    @property
    def mask_position0(self) -> bool:
        """MiMo zeroes the token embedding of the row at position 0 (as vLLM and SGLang do)."""
        return self.format == "mimo"

    @property
    def prefix(self) -> str:
        """Checkpoint name prefix of the layers; layer i is `{prefix}{i}.`."""
        return "model.mtp_layers." if self.format == "mimo" else "mtp_layers."

    def layer_config(self, target: ModelConfig) -> ModelConfig:
        """One MTP block's shape as a ModelConfig. RoPE is the target's: MTP layers run at the
        target's positions and share its cos/sin table."""
        return replace(target, architecture="Qwen2ForCausalLM" if self.attention_bias else "LlamaForCausalLM",
                       hidden_size=self.hidden_size, intermediate_size=self.intermediate_size, num_layers=1,
                       num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                       rms_norm_eps=self.rms_norm_eps, attention_bias=self.attention_bias, qk_norm=False,
                       mlp_bias=False)

    # --- reading ------------------------------------------------------------------------
    @staticmethod
    def describes_mtp(cfg: dict) -> bool:
        """True for a config.json that carries MTP layers (either layout)."""
        archs = cfg.get("architectures")
        archs = archs if isinstance(archs, list) else []
        return LOCALCHAT_ARCH in archs or ("MiMoForCausalLM" in archs and "num_nextn_predict_layers" in cfg)

    @classmethod
    def from_hf(cls, cfg: dict, target: ModelConfig, where: str = "MTP config.json") -> "MTPConfig":
        """Every value is type- and range-checked: one line naming a wrong field."""
        archs = names(cfg.get("architectures") or [], "architectures", where)
        num = integer(get(cfg, "num_nextn_predict_layers", where), "num_nextn_predict_layers", where, lo=0,
                      hi=MAX_LAYERS)
        if "MiMoForCausalLM" in archs:
            if num < 1:
                raise ModelLoadError("this MiMo checkpoint has no MTP layers (num_nextn_predict_layers is 0)")
            return cls(format="mimo", num_layers=num, chain=flag(get(cfg, "mtp_chain", where, True), "mtp_chain", where),
                       hidden_size=target.hidden_size, intermediate_size=target.intermediate_size,
                       num_heads=target.num_heads, num_kv_heads=target.num_kv_heads, head_dim=target.head_dim,
                       vocab_size=target.vocab_size, rms_norm_eps=target.rms_norm_eps,
                       attention_bias=target.attention_bias)
        if LOCALCHAT_ARCH not in archs:
            raise ModelLoadError(f"MTP config: unknown architectures {archs}; expected MiMoForCausalLM "
                                 f"or {LOCALCHAT_ARCH}")
        if "mtp_chain" not in cfg:
            raise ModelLoadError(f"{LOCALCHAT_ARCH} config.json must say mtp_chain: true or false")
        size = lambda key, hi, *default: integer(get(cfg, key, where, *default), key, where, hi=hi)  # noqa: E731
        hidden, heads = size("hidden_size", MAX_HIDDEN), size("num_attention_heads", MAX_HEADS)
        if cfg.get("head_dim") is None and hidden % heads:
            raise ModelLoadError(f"{where}: hidden_size {hidden} is not divisible by num_attention_heads {heads}, "
                                 "and no head_dim is given")
        return cls(format="localchat", num_layers=num, chain=flag(cfg["mtp_chain"], "mtp_chain", where),
                   hidden_size=hidden, intermediate_size=size("intermediate_size", MAX_INTERMEDIATE), num_heads=heads,
                   num_kv_heads=size("num_key_value_heads", MAX_HEADS, heads),
                   head_dim=size("head_dim", MAX_HEAD_DIM, hidden // heads),
                   vocab_size=size("vocab_size", MAX_VOCAB, target.vocab_size),
                   rms_norm_eps=number(get(cfg, "rms_norm_eps", where, 1e-6), "rms_norm_eps", where, hi=1.0),
                   attention_bias=flag(get(cfg, "attention_bias", where, False), "attention_bias", where))

    @classmethod
    def from_folder(cls, folder: Path, target: ModelConfig) -> "MTPConfig":
        return cls.from_hf(read_json(Path(folder) / "config.json"), target, f"{Path(folder).name}/config.json")

    def check_tensors(self, tensor_names, source: str) -> None:
        """The layer count against the MTP layers the checkpoint holds, before any is built."""
        check_layer_count(self.num_layers, tensor_names, self.prefix, "num_nextn_predict_layers", source,
                          allow_extra=True)

    def to_hf(self) -> dict:
        """config.json of the localchat layout (what train-draft writes)."""
        assert self.format == "localchat"
        return {"architectures": [LOCALCHAT_ARCH], "num_nextn_predict_layers": self.num_layers,
                "mtp_chain": self.chain, "hidden_size": self.hidden_size,
                "intermediate_size": self.intermediate_size, "num_attention_heads": self.num_heads,
                "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim,
                "vocab_size": self.vocab_size, "rms_norm_eps": self.rms_norm_eps,
                "attention_bias": self.attention_bias}

    def check_fits(self, target: ModelConfig, draft_name: str, target_name: str) -> None:
        if self.vocab_size != target.vocab_size:
            raise ModelLoadError(f"MTP layers {draft_name} have vocabulary {self.vocab_size} but target "
                                 f"{target_name} has {target.vocab_size}; they were made for another model")
        if self.hidden_size != target.hidden_size:
            raise ModelLoadError(f"MTP layers {draft_name} have hidden size {self.hidden_size} but target "
                                 f"{target_name} has {target.hidden_size}; they were made for another model")
