"""DraftConfig: an EAGLE-3 head's shape, read from any of the Hub's three config formats.

It is the single authority for the two hidden widths a draft sees: the extend phase consumes
target states (`extend_width`), the decode phase its own outputs (`decode_width`). Every
buffer, graph buffers included, is sized from these properties.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.config import ModelConfig
from engine.config_checks import (MAX_HEAD_DIM, MAX_HEADS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_POSITIONS,
                                  MAX_VOCAB, check_rope_scaling, flag, get, integer, mapping, names, number, read_json)
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
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(f"draft config: num_attention_heads ({self.num_heads}) is not a multiple of "
                                 f"num_key_value_heads ({self.num_kv_heads})")
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
    def from_hf(cls, cfg: dict, target: ModelConfig, where: str = "draft config.json") -> "DraftConfig":
        """Every value is type- and range-checked: a head config that would allocate garbage
        fails with one line naming the field."""
        archs = names(cfg.get("architectures") or [], "architectures", where)
        L = target.num_layers
        default_ids = (2, L // 2, L - 3)  # EAGLE-3's choice, as inputs of layers
        use_aux = True
        if "Eagle3Speculator" in archs or cfg.get("speculators_model_type") == "eagle3":
            fmt = "speculators"
            layer = mapping(get(cfg, "transformer_layer_config", where, {}), "transformer_layer_config", where)
            ids = _aux_ids(cfg.get("eagle_aux_hidden_state_layer_ids"), where, lowest=0)
            aux = ids or default_ids  # already input-of-layer ids
            use_aux = flag(get(cfg, "use_aux_hidden_state", where, True), "use_aux_hidden_state", where)
            target_hidden = cfg.get("target_hidden_size") or layer.get("hidden_size")
        elif any(a.endswith("Eagle3") for a in archs) or "eagle_config" in cfg:
            fmt, layer = "sglang", cfg
            eagle = mapping(get(cfg, "eagle_config", where, {}), "eagle_config", where)
            # SGLang names outputs of layers: -1 is the embedding output, the input of layer 0
            ids = _aux_ids(eagle.get("eagle_aux_hidden_state_layer_ids"), f"{where} eagle_config", lowest=-1)
            aux = tuple(i + 1 for i in ids) or default_ids
            use_aux = flag(get(eagle, "use_aux_hidden_state", where, True), "eagle_config.use_aux_hidden_state", where)
            target_hidden = cfg.get("target_hidden_size") or cfg.get("hidden_size")
        elif "draft_vocab_size" in cfg:
            fmt, layer, aux = "eagle", cfg, default_ids
            target_hidden = cfg.get("target_hidden_size") or cfg.get("hidden_size")
        else:
            raise ModelLoadError(f"{where}: not an EAGLE-3 head (architectures {archs}); expected "
                                 "LlamaForCausalLMEagle3, Eagle3Speculator, or an EAGLE config with draft_vocab_size")
        size = lambda key, hi, *default: integer(get(layer, key, where, *default), key, where, hi=hi)  # noqa: E731
        hidden, heads = size("hidden_size", MAX_HIDDEN), size("num_attention_heads", MAX_HEADS)
        if layer.get("head_dim") is None and hidden % heads:
            raise ModelLoadError(f"{where}: hidden_size {hidden} is not divisible by num_attention_heads {heads}, "
                                 "and no head_dim is given")
        vocab = integer(layer.get("vocab_size") or cfg.get("vocab_size") or target.vocab_size, "vocab_size", where,
                        hi=MAX_VOCAB)
        draft_vocab = cfg.get("draft_vocab_size") or layer.get("draft_vocab_size") or vocab
        scaling = get(layer, "rope_scaling", where, None)
        if scaling is not None:
            check_rope_scaling(mapping(scaling, "rope_scaling", where), where)
        theta = get(layer, "rope_theta", where, None)
        return cls(
            format=fmt, hidden_size=hidden, target_hidden_size=integer(target_hidden, "target_hidden_size", where),
            intermediate_size=size("intermediate_size", MAX_INTERMEDIATE), num_heads=heads,
            num_kv_heads=size("num_key_value_heads", MAX_HEADS, heads),
            head_dim=size("head_dim", MAX_HEAD_DIM, hidden // heads), vocab_size=vocab,
            draft_vocab_size=integer(draft_vocab, "draft_vocab_size", where, hi=MAX_VOCAB),
            aux_layer_ids=tuple(aux) if use_aux else (), use_aux_hidden_state=use_aux,
            norm_before_residual=flag(get(cfg, "norm_before_residual", where, layer.get("norm_before_residual", False)),
                                      "norm_before_residual", where),
            rms_norm_eps=number(get(layer, "rms_norm_eps", where, 1e-6), "rms_norm_eps", where, hi=1.0),
            rope_theta=number(target.rope_theta if theta is None else theta, "rope_theta", where, lo=1.0),
            rope_scaling=tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in scaling.items()))
            if scaling else None,
            max_position_embeddings=size("max_position_embeddings", MAX_POSITIONS, 4096),
        )

    @classmethod
    def from_folder(cls, folder: Path, target: ModelConfig) -> "DraftConfig":
        path = Path(folder) / "config.json"
        if not path.exists():
            raise ModelLoadError(f"{folder} has no config.json; a draft folder needs config.json and "
                                 "*.safetensors or pytorch_model*.bin")
        return cls.from_hf(read_json(path), target, f"{Path(folder).name}/config.json")

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


def _aux_ids(value, where: str, lowest: int) -> tuple[int, ...]:
    """A list of target layer numbers (`eagle_aux_hidden_state_layer_ids`); empty when absent."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ModelLoadError(f"{where}: eagle_aux_hidden_state_layer_ids must be a list of layer numbers")
    return tuple(integer(i, "eagle_aux_hidden_state_layer_ids", where, lo=lowest, hi=MAX_LAYERS) for i in value)
