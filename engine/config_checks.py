"""Typed, bounded reads of raw config values (config.json, GGUF metadata, draft configs), made
before anything is allocated: a wrong value fails in a moment with one line naming it."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Iterable

from engine.errors import ModelLoadError

# Generous bounds: several times the largest released models (hidden 16384, 126 layers, 128
# heads, vocabularies of 256K, a few million positions), and tight enough that a typo in a
# config cannot ask for terabytes.
MAX_VOCAB = 1 << 22
MAX_HIDDEN = 1 << 16
MAX_INTERMEDIATE = 1 << 20
MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_HEAD_DIM = 1024
MAX_POSITIONS = 1 << 26
MAX_TOKEN_ID = 1 << 31
# An integer in a config file longer than this is never a size, an id or a count (and Python
# refuses to print one past 4,300 digits).
_MAX_INT_DIGITS = 40
_MISSING = object()

# What each RoPE scaling type reads from its dict: the required keys, then the optional ones.
ROPE_SCALING_KEYS = {
    "linear": (("factor",), ()),
    "dynamic": (("factor",), ("original_max_position_embeddings",)),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"), ()),
    "yarn": ((), ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
                  "mscale", "mscale_all_dim")),
}


def read_json(path: Path) -> dict:
    """A config file's top-level object."""
    try:
        value = json.loads(Path(path).read_bytes().decode("utf-8"), parse_int=_parse_int)
    except OSError as e:
        raise ModelLoadError(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:  # JSONDecodeError, bad UTF-8, an over-long integer
        raise ModelLoadError(f"{path} is not valid JSON: {str(e).splitlines()[0]}") from None
    if not isinstance(value, dict):
        raise ModelLoadError(f"{path} must hold a JSON object {{...}}, not a {_json_type(value)}")
    return value


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits")
    return int(text)


def _json_type(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    return {dict: "object", list: "list", str: "string", int: "integer", float: "number",
            type(None): "null"}.get(type(value), type(value).__name__)


def _show(value) -> str:
    text = json.dumps(value) if isinstance(value, (str, list, dict)) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def integer(value, name: str, where: str, lo: int = 1, hi: int = MAX_HIDDEN) -> int:
    """An integer in [lo, hi]; a float with an integral value is taken (some converters write 4096.0)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelLoadError(f"{where}: {name} must be an integer, got {_json_type(value)} {_show(value)}")
    if not lo <= value <= hi:
        raise ModelLoadError(f"{where}: {name} must be between {lo:,} and {hi:,}, got {value:,}")
    return value


def number(value, name: str, where: str, lo: float = 0.0, hi: float = math.inf, lo_included: bool = False) -> float:
    """A finite number above `lo` (or equal to it with `lo_included`) and at most `hi`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ModelLoadError(f"{where}: {name} must be a number, got {_json_type(value)} {_show(value)}")
    value = float(value)
    if not (math.isfinite(value) and (lo <= value if lo_included else lo < value) and value <= hi):
        bound = ("at least" if lo_included else "greater than") + f" {lo:g}" + (f" and at most {hi:g}" if hi < math.inf else "")
        raise ModelLoadError(f"{where}: {name} must be a finite number {bound}, got {value!r}")
    return value


def flag(value, name: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise ModelLoadError(f"{where}: {name} must be true or false, got {_json_type(value)} {_show(value)}")
    return value


def mapping(value, name: str, where: str) -> dict:
    if not isinstance(value, dict):
        raise ModelLoadError(f"{where}: {name} must be a JSON object {{...}}, got {_json_type(value)} {_show(value)}")
    return value


def names(value, name: str, where: str) -> list[str]:
    """A list of strings (`architectures`)."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ModelLoadError(f"{where}: {name} must be a list of strings such as [\"LlamaForCausalLM\"], "
                             f"got {_json_type(value)} {_show(value)}")
    return value


def token_ids(value, name: str, where: str) -> tuple[int, ...]:
    """An id or a list of ids (`eos_token_id`); null for none."""
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    return tuple(integer(v, name, where, lo=0, hi=MAX_TOKEN_ID) for v in values)


def get(cfg: dict, key: str, where: str, default=_MISSING):
    """cfg[key], or `default` when it is missing or null; a missing key without a default is an error."""
    if cfg.get(key) is not None:
        return cfg[key]
    if default is _MISSING:
        raise ModelLoadError(f"{where} is missing the field {key!r}")
    return default


def check_rope_scaling(scaling: dict, where: str) -> None:
    """The keys and values the scaling type needs (engine/rope.py reads them)."""
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind in (None, "default"):
        return
    if not isinstance(kind, str) or kind not in ROPE_SCALING_KEYS:
        raise ModelLoadError(f"{where}: unsupported rope_scaling type {_show(kind)} "
                             "(supported: llama3, linear, dynamic, yarn)")
    required, optional = ROPE_SCALING_KEYS[kind]
    missing = [k for k in required if scaling.get(k) is None]
    if missing:
        raise ModelLoadError(f"{where}: rope_scaling of type {kind} needs {', '.join(missing)}")
    for key in required + optional:
        value, name = scaling.get(key), f"rope_scaling.{key}"
        if value is None:
            continue
        if key == "original_max_position_embeddings":
            integer(value, name, where, hi=MAX_POSITIONS)
        elif key == "factor" and kind == "dynamic":  # below 1 the NTK base turns negative
            number(value, name, where, lo=1.0, lo_included=True)
        elif key in ("attention_factor", "mscale", "mscale_all_dim"):
            number(value, name, where, lo_included=True)
        else:  # factors and betas divide or sit under a logarithm
            number(value, name, where)
    if kind == "llama3" and not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
        raise ModelLoadError(f"{where}: rope_scaling needs high_freq_factor > low_freq_factor, got "
                             f"{scaling['high_freq_factor']} and {scaling['low_freq_factor']}")
    if "truncate" in scaling:
        flag(scaling["truncate"], "rope_scaling.truncate", where)


def layer_ids(tensor_names: Iterable[str], prefix: str) -> set[int]:
    """The layer numbers of names `{prefix}{i}.…` (whole-prefix match)."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    return {int(m.group(1)) for n in tensor_names if (m := pattern.match(n))}


def check_layer_count(num_layers: int, tensor_names: Iterable[str], prefix: str, field: str, source: str,
                      allow_extra: bool = False) -> None:
    """The config's layer count against the layers the checkpoint holds, before any is built.
    `allow_extra`: layers past the count are left to the loader, which names them as unexpected."""
    found = layer_ids(tensor_names, prefix)
    wanted = set(range(num_layers))
    if not (found >= wanted if allow_extra else found == wanted):
        raise ModelLoadError(f"{source}: the config says {field} = {num_layers:,} but the weights hold "
                             f"{_describe_layers(found)}; the config does not belong to these weights")


def _describe_layers(found: set[int]) -> str:
    if not found:
        return "no layers"
    ids = sorted(found)
    if ids == list(range(len(ids))):
        return f"{len(ids)} layer{'s' if len(ids) > 1 else ''} (0-{ids[-1]})"
    shown = ", ".join(str(i) for i in ids[:6]) + (", ..." if len(ids) > 6 else "")
    return f"layers {shown}"
