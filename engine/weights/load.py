"""Weight loading: exact-name copy of checkpoint tensors into a model; the safetensors reader
(which files to read, and .bin files: engine/weights/checkpoint.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator

import torch

from engine.errors import ModelLoadError


def iter_safetensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open
    from safetensors import SafetensorError

    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        except (SafetensorError, OSError, RuntimeError) as e:
            from engine.hub.cache import repair_hint

            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ModelLoadError(
                f"cannot read {path}: {first} (file truncated or corrupt?); {repair_hint(path)}"
            ) from None


def safetensors_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """Every tensor's name and shape, from the files' headers alone (no tensor data is read)."""
    from safetensors import SafetensorError, safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                shapes.update((name, tuple(f.get_slice(name).get_shape())) for name in f.keys())
        except (SafetensorError, OSError, RuntimeError) as e:
            raise ModelLoadError(f"cannot read {path.name}: {str(e).splitlines()[0]} (file truncated or corrupt?)") from None
    return shapes


def _summary(names: list[str], limit: int = 4) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


@torch.no_grad()
def load_weights(model: torch.nn.Module, tensors: Iterable[tuple[str, torch.Tensor]], source: str) -> None:
    """Copies every tensor into the parameter `model.checkpoint_target(name)` names and checks
    that nothing is missing, left over or of the wrong shape. A PackedWeight (kept quantized by
    the loader) for an nn.Linear's weight waits for the other parts of its projection (q, k, v;
    gate, up); then one PackedLinear over them all takes the nn.Linear's place."""
    from engine.weights.packed import PackedWeight

    params = dict(model.named_parameters())
    device = next((p.device for p in params.values() if not p.is_meta), torch.device("cpu"))
    filled: dict[str, int] = {name: 0 for name in params}  # rows filled, for fused projections
    unexpected: list[str] = []
    parts: dict[str, list[tuple[int, PackedWeight]]] = {}  # weight name -> (row offset, part)
    for name, tensor in tensors:
        target = model.checkpoint_target(name)
        if target is None:
            continue
        pname, offset, rows = target
        param = params.get(pname)
        if param is None:
            unexpected.append(name)
            continue
        dest = param if rows < 0 else param[offset:offset + rows]
        if tuple(dest.shape) != tuple(tensor.shape):
            raise ModelLoadError(
                f"{source}: tensor {name} has shape {tuple(tensor.shape)}, the model expects {tuple(dest.shape)}")
        if isinstance(tensor, PackedWeight):
            parts.setdefault(pname, []).append((max(offset, 0), tensor))
            filled[pname] += dest.shape[0]
            if sum(p.shape[0] for _, p in parts[pname]) == param.shape[0]:  # every part of it packed
                _pack_linear(model, pname, [p for _, p in sorted(parts.pop(pname), key=lambda t: t[0])], device)
            continue
        if param.is_meta:  # a projection built for packing that gets floats: allocated now
            param = params[pname] = _materialize(model, pname, param, device)
            dest = param if rows < 0 else param[offset:offset + rows]
        dest.copy_(tensor)
        filled[pname] += dest.shape[0] if dest.dim() else 1
    for pname, waiting in parts.items():  # a projection with a float part too: all of it as floats
        from engine.weights.packed import dequantize

        if params[pname].is_meta:
            params[pname] = _materialize(model, pname, params[pname], device)
        for offset, p in waiting:
            params[pname][offset:offset + p.shape[0]].copy_(dequantize(p))
    missing = [n for n, p in params.items() if filled[n] != (p.shape[0] if p.dim() else 1)]
    if unexpected or missing:
        parts = []
        if missing:
            parts.append(f"missing tensors: {_summary(missing)}")
        if unexpected:
            parts.append(f"unexpected tensors: {_summary(unexpected)}")
        raise ModelLoadError(f"{source}: checkpoint does not match the model ({'; '.join(parts)})")


def _materialize(model: torch.nn.Module, pname: str, param: torch.nn.Parameter,
                 device: torch.device) -> torch.nn.Parameter:
    """A meta parameter replaced by an allocated (uninitialized) one on `device`, in its module."""
    path, _, leaf = pname.rpartition(".")
    new = torch.nn.Parameter(torch.empty(param.shape, dtype=param.dtype, device=device), requires_grad=False)
    setattr(model.get_submodule(path), leaf, new)
    if pname == "model.embed_tokens.weight" and model.config.tie_word_embeddings:
        model.lm_head.weight = new  # still tied
    return new


def _pack_linear(model: torch.nn.Module, pname: str, parts: list, device: torch.device) -> None:
    """Replaces the nn.Linear whose weight is `pname` by a PackedLinear over `parts` (its bias, if
    any, stays the same parameter, loaded as usual), or the embeddings by a PackedEmbedding (and a
    tied lm_head by a PackedLinear over the same blocks)."""
    from engine.packed_linear import PackedEmbedding, PackedLinear
    from engine.weights.grouped import grouped_blocks

    path, _, leaf = pname.rpartition(".")
    assert leaf == "weight", pname
    parent_path, _, attr = path.rpartition(".")
    parent = model.get_submodule(parent_path)
    old = getattr(parent, attr)
    blocks = grouped_blocks([p.to(device) for p in parts])
    if isinstance(old, torch.nn.Embedding):
        assert len(blocks) == 1, "embeddings come as one tensor"
        embed = PackedEmbedding(blocks[0], old.weight.dtype)
        setattr(parent, attr, embed)
        if model.config.tie_word_embeddings:
            model.lm_head = embed.as_linear()
        return
    setattr(parent, attr, PackedLinear(blocks, old.bias))
