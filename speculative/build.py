"""build_speculator: the one entry point the engine calls to attach a draft to a target."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from engine.errors import ModelLoadError
from engine.loader import build_uninitialized
from engine.ops import Ops
from engine.weights import iter_safetensors, load_weights, safetensors_files

from .config import DraftConfig
from .eagle3 import Eagle3Draft
from .mtp import MTPDraft
from .mtp_config import MTPConfig
from .mtp_speculator import MTPSpeculator
from .protocol import Speculator
from .speculator import Eagle3Speculator


def build_speculator(folder: Path, runner, target_cfg, num_steps: int, target_name: str = "the target") -> Speculator:
    """folder: an EAGLE-3 head, standalone MTP layers, or a target checkpoint that ships MTP layers."""
    folder = Path(folder)
    path = folder / "config.json"
    if not path.exists():
        raise ModelLoadError(f"{folder} has no config.json; a draft folder needs config.json and *.safetensors")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path} is not valid JSON: {e}") from None
    if MTPConfig.describes_mtp(raw):
        spec = build_mtp(folder, MTPConfig.from_hf(raw, target_cfg), runner, target_cfg, num_steps, target_name)
    else:
        spec = build_eagle3(folder, runner, target_cfg, num_steps, target_name)
    # Verify rows must carry the bits of the decode steps they stand for (engine/ops.py).
    runner.model.ops.set_batch_invariant(True)
    return spec


def build_mtp(folder: Path, mc: MTPConfig, runner, target_cfg, num_steps: int, target_name: str):
    mc.check_fits(target_cfg, folder.name, target_name)
    dev, dtype = runner.device, runner.dtype
    draft = build_uninitialized(lambda: MTPDraft(mc, target_cfg, Ops.for_device(dev)), dev, dtype)
    # A MiMo checkpoint holds the target too: read only the MTP namespace (whole-prefix match).
    tensors = ((name, t) for name, t in iter_safetensors(safetensors_files(folder))
               if mc.format != "mimo" or name.startswith(mc.prefix))
    load_weights(draft, tensors, folder.name)
    return MTPSpeculator(draft.eval().requires_grad_(False), runner, num_steps)


def build_eagle3(folder: Path, runner, target_cfg, num_steps: int, target_name: str):
    dc = DraftConfig.from_folder(folder, target_cfg)
    dc.check_fits(target_cfg, folder.name, target_name)
    dev, dtype = runner.device, runner.dtype
    draft = build_uninitialized(lambda: Eagle3Draft(dc, target_cfg, runner.max_len, Ops.for_device(dev)),
                                dev, dtype)
    d2t_seen = False

    def tensors():
        nonlocal d2t_seen
        for name, t in iter_safetensors(safetensors_files(folder)):
            if name == "d2t":
                d2t_seen = True
                draft.d2t = t.to(device=dev, dtype=torch.long)
                continue
            yield name, t

    load_weights(draft, tensors(), folder.name)
    if not d2t_seen:
        if dc.draft_vocab_size != dc.vocab_size:
            raise ModelLoadError(f"{folder.name}: reduced draft vocabulary ({dc.draft_vocab_size}) without a d2t map")
        draft.d2t = torch.zeros(dc.draft_vocab_size, dtype=torch.long, device=dev)
    if draft.d2t.shape[0] != dc.draft_vocab_size:
        raise ModelLoadError(f"{folder.name}: d2t has {draft.d2t.shape[0]} entries, draft_vocab_size is "
                             f"{dc.draft_vocab_size}")
    top = int((draft.d2t + torch.arange(dc.draft_vocab_size, device=dev)).max())
    if top >= target_cfg.vocab_size:
        raise ModelLoadError(f"{folder.name}: d2t maps into token {top}, outside the target vocabulary "
                             f"{target_cfg.vocab_size}")
    return Eagle3Speculator(draft.eval().requires_grad_(False), runner, num_steps)
