"""QuantConfig: the `quantization_config` of a config.json (AWQ, GPTQ or FP8 weights), checked
before any weight is read: what is not supported is refused in one line naming the setting."""

from __future__ import annotations

from dataclasses import dataclass

import json

from engine.config_checks import flag, integer, mapping
from engine.errors import ModelLoadError

METHODS = ("awq", "gptq", "fp8")
# Inputs per scale that AWQ and GPTQ checkpoints use; -1 is one group per row (per channel).
GROUP_SIZES = (32, 64, 128, -1)
# GPTQ checkpoint formats: the original one stores each zero point minus 1 (AutoGPTQ's `pack`),
# GPTQModel's gptq_v2 stores it as it is.
GPTQ_ZERO_OFFSETS = {"gptq": 1, "gptq_v2": 0}


def _shown(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass(frozen=True)
class QuantConfig:
    method: str  # "awq", "gptq" or "fp8"
    group_size: int = -1  # AWQ/GPTQ: inputs sharing a scale and zero point; -1: the whole row
    zero_offset: int = 0  # GPTQ: added to every stored zero point (1 for the original format)

    def __post_init__(self) -> None:
        assert self.method in METHODS and self.group_size in GROUP_SIZES, self

    @property
    def label(self) -> str:
        """The weight format as `localchat run --json` reports it: "AWQ-int4-g128", "FP8-e4m3"."""
        if self.method == "fp8":
            return "FP8-e4m3"
        groups = "per-channel" if self.group_size == -1 else f"g{self.group_size}"
        return f"{self.method.upper()}-int4-{groups}"

    @classmethod
    def from_hf(cls, raw, where: str = "config.json") -> "QuantConfig":
        q = mapping(raw, "quantization_config", where)
        method = q.get("quant_method")
        if not isinstance(method, str) or method.lower() not in METHODS:
            raise ModelLoadError(f"{where}: quantization_config.quant_method {_shown(method)} is not supported "
                                 f"(supported: {', '.join(METHODS)})")
        method = method.lower()

        def refuse(key: str, value, hint: str):
            return ModelLoadError(f"{where}: {method.upper()} with quantization_config.{key} = {_shown(value)} "
                                  f"is not supported; {hint}")

        def setting(key: str, default, *aliases: str):
            for k in (key, *aliases):
                if q.get(k) is not None:
                    return k, q[k]
            return key, default

        if method == "fp8":
            key, fmt = setting("fmt", "e4m3")
            if fmt != "e4m3":
                raise refuse(key, fmt, "FP8 weights must be e4m3")
            key, block = setting("weight_block_size", None)
            if block is not None:
                raise refuse(key, block, "only per-tensor and per-channel FP8 scales are")
            # activation_scheme (static or dynamic) is not read: the weights are decoded and the
            # activations stay in bf16 (weight-only), so input scales are not used.
            return cls("fp8")
        key, bits = setting("bits", 4, "w_bit")
        if integer(bits, f"quantization_config.{key}", where, hi=64) != 4:
            raise refuse(key, bits, "only 4-bit weights are")
        key, size = setting("group_size", 128, "q_group_size")
        if integer(size, f"quantization_config.{key}", where, lo=-1, hi=1 << 20) not in GROUP_SIZES:
            raise refuse(key, size, "group sizes are 32, 64, 128 or -1 (one group per row)")
        if method == "awq":
            key, zero_point = setting("zero_point", True)
            if not flag(zero_point, f"quantization_config.{key}", where):
                raise refuse(key, zero_point, "only AWQ with zero points is")
            key, version = setting("version", "gemm")
            if not isinstance(version, str) or version.lower() != "gemm":
                raise refuse(key, version, "only AWQ's GEMM packing is")
            key, backend = setting("backend", "autoawq")
            if backend != "autoawq":
                raise refuse(key, backend, "only AutoAWQ's packing is")
            return cls("awq", size)
        key, desc_act = setting("desc_act", False)
        if flag(desc_act, f"quantization_config.{key}", where):
            raise refuse(key, desc_act,
                         "act-order checkpoints reorder the groups: use one quantized with desc_act false")
        key, fmt = setting("checkpoint_format", "gptq", "format")
        if fmt not in GPTQ_ZERO_OFFSETS:
            raise refuse(key, fmt, "the GPTQ checkpoint formats are gptq and gptq_v2")
        key, marlin = setting("is_marlin_format", False)
        if flag(marlin, f"quantization_config.{key}", where):
            raise refuse(key, marlin, "use the checkpoint in the plain gptq format")
        key, pack = setting("pack_dtype", "int32")
        if pack != "int32":
            raise refuse(key, pack, "only int32 words are")
        if "sym" in q:
            flag(q["sym"], "quantization_config.sym", where)  # either way: the zero points say it
        return cls("gptq", size, GPTQ_ZERO_OFFSETS[fmt])
