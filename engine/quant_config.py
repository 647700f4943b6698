"""QuantConfig: the `quantization_config` of a config.json (AWQ, GPTQ, FP8 or compressed-tensors
weights), checked before any weight is read: what is not supported is refused in one line naming
the setting."""

from __future__ import annotations

from dataclasses import dataclass

import json

from engine.config_checks import flag, integer, mapping
from engine.errors import ModelLoadError

METHODS = ("awq", "gptq", "fp8", "compressed-tensors")
# Inputs per scale that AWQ and GPTQ checkpoints use; -1 is one group per row (per channel).
GROUP_SIZES = (32, 64, 128, -1)
# GPTQ checkpoint formats: the original one stores each zero point minus 1 (AutoGPTQ's `pack`),
# GPTQModel's gptq_v2 stores it as it is.
GPTQ_ZERO_OFFSETS = {"gptq": 1, "gptq_v2": 0}
# compressed-tensors formats whose weights this loader decodes (compressed.py documents each):
# integers packed into int32 words, one integer or one FP8 value a byte.
CT_FORMATS = ("pack-quantized", "int-quantized", "naive-quantized", "float-quantized")
# The ones it refuses, and why: what a user reads in the one-line refusal.
CT_REFUSED = {"marlin-24": "2:4-sparse Marlin tiles", "sparse-24-bitmask": "2:4-sparse weights",
              "sparse-bitmask": "sparse weights", "nvfp4-pack-quantized": "FP4 weights",
              "mxfp4-pack-quantized": "FP4 weights", "mxfp8-quantized": "MX FP8 weights with E8M0 scales",
              "dense": "fake-quantized float weights", "fakequant": "fake-quantized float weights"}
CT_STRATEGIES = ("tensor", "channel", "group", "block")


def _shown(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass(frozen=True)
class QuantConfig:
    method: str  # "awq", "gptq", "fp8" or "compressed-tensors"
    group_size: int = -1  # AWQ/GPTQ: inputs sharing a scale and zero point; -1: the whole row
    zero_offset: int = 0  # GPTQ: added to every stored zero point (1 for the original format)
    # FP8 with one scale a block of (rows, inputs): DeepSeek-V3's and Qwen3's FP8 checkpoints
    block: tuple[int, int] | None = None
    # compressed-tensors: the weights of each config group, ("int", bits) or ("float", 8); the
    # tensors of each layer say its group size and zero points (compressed.py)
    schemes: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        assert self.method in METHODS and self.group_size in GROUP_SIZES, self

    @property
    def label(self) -> str:
        """The weight format as `localchat run --json` reports it: "AWQ-int4-g128", "FP8-e4m3",
        "FP8-e4m3-block128x128", "CT-int4-g128" (compressed-tensors)."""
        groups = "per-channel" if self.group_size == -1 else f"g{self.group_size}"
        if self.method == "compressed-tensors":
            kinds = sorted({"fp8" if t == "float" else f"int{b}" for t, b in self.schemes})
            if len(kinds) > 1:
                return "CT-" + "+".join(kinds)
            return f"CT-{kinds[0]}" + ("" if kinds[0] == "fp8" else f"-{groups}")
        if self.method == "fp8":
            return "FP8-e4m3" + (f"-block{self.block[0]}x{self.block[1]}" if self.block else "")
        return f"{self.method.upper()}-int4-{groups}"

    @property
    def all_fp8(self) -> bool:
        """Whether every quantized weight is FP8 (which only GPUs with FP8 keep packed)."""
        return self.method == "fp8" or (self.method == "compressed-tensors"
                                        and all(t == "float" for t, _ in self.schemes))

    @property
    def row_group(self) -> int:
        """The inputs that share a scale in most of the model's projections (-1: a whole row), as
        the one-row kernel's fit is judged (loader.quant_one_row_share)."""
        if self.all_fp8:
            return self.block[1] if self.block else -1
        return self.group_size

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

        if method == "compressed-tensors":
            return _compressed_tensors(q, where)
        if method == "fp8":
            key, fmt = setting("fmt", "e4m3")
            if fmt != "e4m3":
                raise refuse(key, fmt, "FP8 weights must be e4m3")
            key, block = setting("weight_block_size", None)
            if block is not None:
                block = _block(block, f"quantization_config.{key}", where)
            key, scale_fmt = setting("scale_fmt", "float")
            if scale_fmt != "float":
                raise refuse(key, scale_fmt, "only float block scales are")
            # activation_scheme (static or dynamic) is not read: the weights are decoded and the
            # activations stay in bf16 (weight-only), so input scales are not used.
            return cls("fp8", block=block)
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


def _block(value, name: str, where: str) -> tuple[int, int]:
    """A block of weights sharing one scale: [rows, inputs], each a power of two from 16 to 1,024."""
    if not (isinstance(value, (list, tuple)) and len(value) == 2):
        raise ModelLoadError(f"{where}: {name} = {_shown(value)} is not supported; a block is [rows, inputs]")
    rows, inputs = (integer(v, name, where, hi=1 << 20) for v in value)
    if any(v < 16 or v > 1024 or v & (v - 1) for v in (rows, inputs)):
        raise ModelLoadError(f"{where}: {name} = {_shown(value)} is not supported; block sides are powers of two "
                             "from 16 to 1024")
    return rows, inputs


def _compressed_tensors(q: dict, where: str) -> QuantConfig:
    """A compressed-tensors config (llm-compressor's checkpoints: W4A16, W8A16, W8A8, FP8): every
    config group's weights checked; activation and KV-cache schemes are not read, since the
    weights are decoded and everything else runs in bf16 (weight-only, like FP8 above)."""
    head = f"{where}: compressed-tensors"

    def refuse(key: str, value, hint: str):
        return ModelLoadError(f"{head} with {key} = {_shown(value)} is not supported; {hint}")

    for key in ("sparsity_config", "transform_config"):
        extra = q.get(key)
        if extra and not (key == "sparsity_config" and isinstance(extra, dict) and extra.get("format") == "dense"):
            raise refuse(f"quantization_config.{key}", extra, "sparse or transformed weights are not decoded")
    groups = mapping(q.get("config_groups") or {}, "quantization_config.config_groups", where)
    if not groups:
        raise ModelLoadError(f"{head} config has no config_groups: nothing says how its weights are stored")
    top = q.get("format")
    schemes, sizes, blocks = [], [], []
    for name, group in groups.items():
        at = f"quantization_config.config_groups.{name}"
        group = mapping(group, at, where)
        fmt = group.get("format") or top
        fmt_key = f"{at}.format" if group.get("format") else "quantization_config.format"
        if fmt is None:
            raise ModelLoadError(f"{head} config names no format for config group {name!r}")
        if not isinstance(fmt, str):
            raise refuse(fmt_key, fmt, "a format is a name")
        if fmt in CT_REFUSED:
            raise refuse(fmt_key, fmt, f"{CT_REFUSED[fmt]} are not decoded (supported: {', '.join(CT_FORMATS)})")
        if fmt not in CT_FORMATS:
            raise refuse(fmt_key, fmt, f"supported: {', '.join(CT_FORMATS)}")
        w = group.get("weights")
        if w is None:
            continue  # activations only: the weights of its targets stay float
        w = mapping(w, f"{at}.weights", where)
        kind, bits = w.get("type", "int"), w.get("num_bits", 8)
        ok = {"int": (4, 8), "float": (8,)}
        if not isinstance(kind, str) or kind not in ok:
            raise refuse(f"{at}.weights.type", kind, "weights are int or float")
        if isinstance(bits, bool) or bits not in ok[kind]:
            raise refuse(f"{at}.weights.num_bits", bits,
                         "int weights are 4- or 8-bit" if kind == "int" else "float weights are FP8 (8-bit)")
        size = w.get("group_size")
        strategy = w.get("strategy") or ("tensor" if size is None else "channel" if size == -1 else "group")
        if strategy not in CT_STRATEGIES:
            raise refuse(f"{at}.weights.strategy", strategy, f"scales are {', '.join(CT_STRATEGIES)}")
        if strategy == "block":
            if kind != "float":
                raise refuse(f"{at}.weights.strategy", strategy, "block scales are read for FP8 weights")
            structure = w.get("block_structure")
            if isinstance(structure, str):  # the older "128x128"
                structure = [int(v) if v.isdigit() else v for v in structure.split("x")]
            block = _block(structure, f"{at}.weights.block_structure", where)
            if blocks and blocks[-1] != block:
                raise refuse(f"{at}.weights.block_structure", structure, "one block shape for every config group")
            blocks.append(block)
        if strategy == "group":
            if integer(size, f"{at}.weights.group_size", where, lo=-1, hi=1 << 20) not in GROUP_SIZES:
                raise refuse(f"{at}.weights.group_size", size, "group sizes are 32, 64, 128 or -1 (one group per row)")
            sizes.append(size)
        elif kind == "int":
            sizes.append(-1)
        if kind == "int" and fmt == "float-quantized" or kind == "float" and fmt == "pack-quantized":
            raise refuse(fmt_key, fmt, f"it does not hold {kind} weights")
        schemes.append((kind, bits))
    if not schemes:
        raise ModelLoadError(f"{head} config quantizes no weights (its config groups have no weights)")
    # the label's group: the most common one (mixed groups still load: each layer's tensors say its own)
    size = max(set(sizes), key=sizes.count) if sizes else -1
    return QuantConfig("compressed-tensors", size, block=blocks[0] if blocks else None,
                       schemes=tuple(dict.fromkeys(schemes)))
