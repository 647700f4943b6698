"""Builds a CausalLM on a device from a Hugging Face folder or a GGUF file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from .config import ModelConfig
from .errors import ModelLoadError
from .gguf_file import hf_config, iter_gguf_tensors, open_gguf
from .model import CausalLM
from .ops import Ops
from .options import KernelOptions
from .tokenizer import Tokenizer
from .weights import iter_safetensors, load_weights, safetensors_files


@dataclass
class LoadedModel:
    model: CausalLM
    tokenizer: Tokenizer
    config: ModelConfig
    source: Path


def build_uninitialized(make: Callable[[], nn.Module], device: torch.device, dtype: torch.dtype) -> nn.Module:
    """make() on `device` with its floating parameters in `dtype` and left uninitialized: the
    checkpoint fills them next. (Building on the meta device instead costs about a second of
    lazy torch imports at every start; building in fp32 and casting doubles peak memory.)
    Float buffers a constructor computes come out in `dtype` too: recompute any that need fp32."""
    saved = nn.Linear.reset_parameters, nn.Embedding.reset_parameters, torch.get_default_dtype()
    nn.Linear.reset_parameters = nn.Embedding.reset_parameters = _no_init
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return make()
    finally:
        nn.Linear.reset_parameters, nn.Embedding.reset_parameters = saved[:2]
        torch.set_default_dtype(saved[2])


def _no_init(module: nn.Module) -> None:
    pass


def build_model(cfg: ModelConfig, tensors, source: str, device: torch.device, dtype: torch.dtype,
                max_len: int, options: KernelOptions = KernelOptions()) -> CausalLM:
    model = build_uninitialized(lambda: CausalLM(cfg, max_len, Ops.for_device(device, options)), device, dtype)
    load_weights(model, tensors, source)
    return model.eval().requires_grad_(False)


def load_folder(folder: Path, device: torch.device, dtype: torch.dtype, max_len: int | None,
                options: KernelOptions = KernelOptions()) -> LoadedModel:
    if not (folder / "config.json").exists():
        raise ModelLoadError(f"{folder} has no config.json; point --model at a Hugging Face model folder, "
                             "a .gguf file, a Hub repo id or 'demo'")
    cfg = ModelConfig.from_file(folder / "config.json")
    files = safetensors_files(folder)
    max_len = max_len or min(cfg.max_position_embeddings, 8192)
    model = build_model(cfg, iter_safetensors(files), folder.name, device, dtype, max_len, options)
    eos = _generation_eos(folder) or cfg.eos_token_ids
    return LoadedModel(model, Tokenizer.from_folder(folder, eos), cfg, folder)


def load_gguf(path: Path, device: torch.device, dtype: torch.dtype, max_len: int | None,
              prepared_dir: Path | None = None, options: KernelOptions = KernelOptions()) -> LoadedModel:
    """Loads a GGUF file. With `prepared_dir`, the first load also writes there an HF folder
    (config, the dequantized fp32 tensors, the converted tokenizer) and later loads read that
    instead: parsing the GGUF vocabulary and dequantizing cost seconds at every start."""
    if prepared_dir is not None and (prepared_dir / "complete").exists():
        return load_folder(prepared_dir, device, dtype, max_len, options)
    reader = open_gguf(path)
    raw = hf_config(reader, path)
    cfg = ModelConfig.from_hf(raw)
    max_len = max_len or min(cfg.max_position_embeddings, 8192)
    tensors = iter_gguf_tensors(reader, raw, path)
    if prepared_dir is not None:
        tensors = dict(tensors)
    model = build_model(cfg, iter(tensors.items()) if isinstance(tensors, dict) else tensors, path.name,
                        device, dtype, max_len, options)
    tok = Tokenizer.from_folder(path.parent, cfg.eos_token_ids, gguf_file=path.name)
    if prepared_dir is not None:
        _write_prepared(prepared_dir, raw, tensors, tok)
    return LoadedModel(model, tok, cfg, path)


def _write_prepared(folder: Path, raw_config: dict, tensors: dict, tok: Tokenizer) -> None:
    import json

    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw_config, indent=1))
    save_file(tensors, str(folder / "model.safetensors"))
    tok.hf.save_pretrained(str(folder))
    (folder / "complete").write_text("written after every other file\n")


def _generation_eos(folder: Path) -> tuple[int, ...]:
    import json

    path = folder / "generation_config.json"
    if not path.exists():
        return ()
    try:
        eos = json.loads(path.read_text()).get("eos_token_id")
    except json.JSONDecodeError:
        return ()
    return tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
