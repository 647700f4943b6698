"""Checks that a draft was made for a target before anything large is downloaded or loaded.

EAGLE-3 configs rarely name their target, so the check is the catalog's pairing plus the
widths both config.json files must agree on: the target vocabulary (the draft maps its
tokens into it) and the target hidden size (the draft reads the target's hidden states).
"""

from __future__ import annotations

from pathlib import Path

from engine.hub.catalog import MTP_BUILTIN, load_catalog
from engine.config_checks import read_json
from engine.errors import UserError


def read_config(folder: Path) -> dict | None:
    """config.json of a model folder (a JSON object, or a one-line error), or None when there is
    none (a .gguf file)."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        return None
    return read_json(path)


def _nested(config: dict, key: str) -> dict:
    """config[key] when it is an object (multimodal and speculators configs nest one), else config."""
    value = config.get(key)
    return value if isinstance(value, dict) and value else config


def target_widths(config: dict) -> tuple[int | None, int | None]:
    """(vocab_size, hidden_size) of a target config (multimodal configs nest them in text_config)."""
    text = _nested(config, "text_config")
    return text.get("vocab_size"), text.get("hidden_size")


def draft_widths(config: dict) -> tuple[int | None, int | None]:
    """(target vocab, target hidden size) that an EAGLE-3 draft config expects, in any Hub format."""
    layer = _nested(config, "transformer_layer_config")  # speculators nests the layer config
    vocab = layer.get("vocab_size") or config.get("vocab_size")
    # SpecForge may name the target width; otherwise the draft is as wide as its target
    hidden = config.get("target_hidden_size") or layer.get("target_hidden_size") or layer.get("hidden_size")
    return vocab, hidden


def is_draft_config(config: dict) -> bool:
    """True for EAGLE-3 heads (every known format), False for ordinary models."""
    archs = config.get("architectures")
    archs = " ".join(a for a in archs if isinstance(a, str)) if isinstance(archs, list) else str(archs or "")
    return (
        "draft_vocab_size" in config
        or "eagle_config" in config
        or "speculators_config" in config
        or "Eagle" in archs
        or "Speculator" in archs
    )


def has_builtin_mtp(config: dict) -> bool:
    layers = config.get("num_nextn_predict_layers")
    return isinstance(layers, int) and not isinstance(layers, bool) and layers > 0


def check_draft_pair(target: str, target_config: dict | None, draft: str, draft_config: dict | None) -> None:
    """Raise a UserError naming both when `draft` cannot serve `target`."""
    if draft == MTP_BUILTIN:
        if target_config is not None and not has_builtin_mtp(target_config):
            raise UserError(
                f"draft {MTP_BUILTIN} needs a target with MTP layers, and {target} has none "
                "(no num_nextn_predict_layers in its config.json): choose an EAGLE-3 draft instead"
            )
        return
    catalog = load_catalog()
    made_for = catalog.for_draft(draft)
    if made_for is not None and catalog.for_target(target) is not None and not catalog.pairs(target, draft):
        raise UserError(f"draft {draft} is made for {made_for.target.repo}, not for target {target}")
    if target_config is None or draft_config is None:
        return
    if not is_draft_config(draft_config):
        raise UserError(f"{draft} is not an EAGLE-3 draft head (its config.json has no draft fields); target {target}")
    t_vocab, t_hidden = target_widths(target_config)
    d_vocab, d_hidden = draft_widths(draft_config)
    problems = []
    if t_vocab and d_vocab and t_vocab != d_vocab:
        problems.append(f"vocabulary {d_vocab} vs {t_vocab}")
    if t_hidden and d_hidden and t_hidden != d_hidden:
        problems.append(f"hidden size {d_hidden} vs {t_hidden}")
    if problems:
        raise UserError(f"draft {draft} does not match target {target}: " + ", ".join(problems) + " (draft vs target)")
