"""DraftConfig: an EAGLE-3 head's shape, read from any of the Hub's three config formats.

It is the single authority for the two hidden widths a draft sees: the extend phase consumes
target states (`extend_width`), the decode phase its own outputs (`decode_width`). Every
buffer, graph buffers included, is sized from these properties.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from engine.config import ModelConfig
from engine.errors import ModelLoadError


@dataclass(frozen=True)
class DraftConfig:
    format: str  # "eagle" (EAGLE official), "sglang" (SGLang/SpecForge), "speculators"
    hidden_size: int
    target_hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int  # the target's vocabulary: embeddings and d2t map into it
    draft_vocab_size: int
    # Inputs of these target layers are concatenated (input-of-layer convention; id == L means
    # the final stream before the last norm).
    aux_layer_ids: tuple[int, ...]
    use_aux_hidden_state: bool = True
    norm_before_residual: bool = False
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: tuple | None = None
    max_position_embeddings: int = 4096

    def __post_init__(self) -> None:
        if self.use_aux_hidden_state and not self.aux_layer_ids:
            raise ModelLoadError("draft config: use_aux_hidden_state is set but no aux layer ids are known")
        if self.draft_vocab_size > self.vocab_size:
            raise ModelLoadError(f"draft config: draft_vocab_size {self.draft_vocab_size} exceeds the "
                                 f"vocabulary {self.vocab_size}")

    @property
    def num_aux(self) -> int:
        return len(self.aux_layer_ids) if self.use_aux_hidden_state else 1

    @property
    def extend_width(self) -> int:
        """Width of the target states the draft-extend pass consumes."""
        return self.num_aux * self.target_hidden_size

    @property
    def decode_width(self) -> int:
        """Width of the draft's own output state fed to its next decode step."""
        return self.hidden_size

    @property
    def owns_embeddings(self) -> bool:
        return self.hidden_size != self.target_hidden_size

    @property
    def needs_fc(self) -> bool:
        return self.extend_width != self.hidden_size

    def layer_config(self, target: ModelConfig) -> ModelConfig:
        """The draft's decoder layer shape as a ModelConfig (for RoPE and sizes)."""
        return ModelConfig(
            architecture="LlamaForCausalLM", vocab_size=self.vocab_size, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_layers=1, num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta, rope_scaling=self.rope_scaling,
            max_position_embeddings=max(self.max_position_embeddings, target.max_position_embeddings))

    @classmethod
    def from_hf(cls, cfg: dict, target: ModelConfig) -> "DraftConfig":
        archs = cfg.get("architectures") or []
        L = target.num_layers
        default_ids = (2, L // 2, L - 3)  # EAGLE-3's choice, as inputs of layers
        if "Eagle3Speculator" in archs or cfg.get("speculators_model_type") == "eagle3":
            fmt, layer = "speculators", dict(cfg.get("transformer_layer_config") or {})
            ids = cfg.get("eagle_aux_hidden_state_layer_ids")
            aux = tuple(int(i) for i in ids) if ids else default_ids  # already input-of-layer ids
            use_aux = bool(cfg.get("use_aux_hidden_state", True))
            target_hidden = cfg.get("target_hidden_size") or layer.get("hidden_size")
        elif any(a.endswith("Eagle3") for a in archs) or "eagle_config" in cfg:
            fmt, layer = "sglang", cfg
            eagle = cfg.get("eagle_config") or {}
            ids = eagle.get("eagle_aux_hidden_state_layer_ids")
            aux = tuple(int(i) + 1 for i in ids) if ids else default_ids  # SGLang names outputs of layers
            use_aux = bool(eagle.get("use_aux_hidden_state", True))
            target_hidden = cfg.get("target_hidden_size") or cfg.get("hidden_size")
        elif "draft_vocab_size" in cfg:
            fmt, layer = "eagle", cfg
            aux, use_aux = default_ids, True
            target_hidden = cfg.get("target_hidden_size") or cfg.get("hidden_size")
        else:
            raise ModelLoadError(f"draft config: not an EAGLE-3 head (architectures {archs}); expected "
                                 "LlamaForCausalLMEagle3, Eagle3Speculator, or an EAGLE config with draft_vocab_size")
        try:
            hidden = int(layer["hidden_size"])
            heads = int(layer["num_attention_heads"])
            vocab = int(layer.get("vocab_size") or cfg.get("vocab_size") or target.vocab_size)
            scaling = layer.get("rope_scaling")
            return cls(
                format=fmt, hidden_size=hidden, target_hidden_size=int(target_hidden),
                intermediate_size=int(layer["intermediate_size"]), num_heads=heads,
                num_kv_heads=int(layer.get("num_key_value_heads") or heads),
                head_dim=int(layer.get("head_dim") or hidden // heads), vocab_size=vocab,
                draft_vocab_size=int(cfg.get("draft_vocab_size") or layer.get("draft_vocab_size") or vocab),
                aux_layer_ids=tuple(aux) if use_aux else (), use_aux_hidden_state=use_aux,
                norm_before_residual=bool(cfg.get("norm_before_residual", layer.get("norm_before_residual", False))),
                rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
                rope_theta=float(layer.get("rope_theta") or target.rope_theta),
                rope_scaling=tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in scaling.items()))
                if scaling else None,
                max_position_embeddings=int(layer.get("max_position_embeddings", 4096)),
            )
        except KeyError as e:
            raise ModelLoadError(f"draft config is missing the field {e.args[0]!r}") from None

    @classmethod
    def from_folder(cls, folder: Path, target: ModelConfig) -> "DraftConfig":
        path = Path(folder) / "config.json"
        if not path.exists():
            raise ModelLoadError(f"{folder} has no config.json; a draft folder needs config.json and "
                                 "*.safetensors or pytorch_model*.bin")
        try:
            return cls.from_hf(json.loads(path.read_text()), target)
        except json.JSONDecodeError as e:
            raise ModelLoadError(f"{path} is not valid JSON: {e}") from None

    def check_fits(self, target: ModelConfig, draft_name: str, target_name: str) -> None:
        """Refuses a draft built for another target, naming both sizes."""
        if self.vocab_size != target.vocab_size:
            raise ModelLoadError(f"draft {draft_name} has vocabulary {self.vocab_size} but target {target_name} "
                                 f"has {target.vocab_size}; this head was made for another model")
        if self.target_hidden_size != target.hidden_size:
            raise ModelLoadError(f"draft {draft_name} expects target hidden size {self.target_hidden_size} but "
                                 f"target {target_name} has {target.hidden_size}; this head was made for another model")
        bad = [i for i in self.aux_layer_ids if not 0 <= i <= target.num_layers]
        if bad:
            raise ModelLoadError(f"draft {draft_name} reads layers {bad} but target {target_name} has "
                                 f"{target.num_layers} layers")
