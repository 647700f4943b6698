"""build_speculator: the one entry point the engine calls to attach a draft to a target."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from engine.weights.checkpoint import iter_tensors, tensor_shapes, weight_files
from engine.config_checks import read_json
from engine.errors import ModelLoadError
from engine.uninitialized import build_uninitialized
from engine.ops import Ops
from engine.weights.int8_rows import widen_int8_rows
from engine.weights.load import load_weights

from speculative.eagle3.config import DraftConfig
from speculative.eagle3.model import Eagle3Draft
from speculative.mtp.model import MTPDraft
from speculative.mtp.config import MTPConfig
from speculative.mtp.speculator import MTPSpeculator
from speculative.protocol import Speculator
from speculative.eagle3.speculator import Eagle3Speculator


def build_speculator(folder: Path, runner, target_cfg, draft_steps: int, target_name: str = "the target") -> Speculator:
    """folder: an EAGLE-3 head, standalone MTP layers, or a target checkpoint that ships MTP layers.
    The runner's model must be built with KernelOptions.batch_invariant (draft_ops checks)."""
    folder = Path(folder)
    path = folder / "config.json"
    if not path.exists():
        raise ModelLoadError(f"{folder} has no config.json; a draft folder needs config.json and "
                             "*.safetensors or pytorch_model*.bin")
    raw = read_json(path)
    if MTPConfig.describes_mtp(raw):
        mc = MTPConfig.from_hf(raw, target_cfg, f"{folder.name}/config.json")
        return build_mtp(folder, mc, runner, target_cfg, draft_steps, target_name)
    return build_eagle3(folder, runner, target_cfg, draft_steps, target_name)


def draft_ops(runner) -> Ops:
    """A draft's kernels: the target's options without batch invariance (a draft's last bits only
    change which tokens it proposes, never the output). Every draft is built with these, so here
    is where a target is checked to be one a draft may verify with: built with batch_invariant,
    since verify rows must carry the bits of the decode steps they stand for and a model's kernels
    are chosen when it is built."""
    assert runner.model.ops.options.batch_invariant, "build the target with batch_invariant to attach a draft"
    options = dataclasses.replace(runner.model.ops.options, batch_invariant=False)
    return Ops.for_device(runner.device, options)


def build_mtp(folder: Path, mc: MTPConfig, runner, target_cfg, draft_steps: int, target_name: str):
    mc.check_fits(target_cfg, folder.name, target_name)
    files = weight_files(folder)  # refused shard paths fail here, before any allocation
    mc.check_tensors(tensor_shapes(files), folder.name)
    dev, dtype = runner.device, runner.dtype
    draft = build_uninitialized(lambda: MTPDraft(mc, target_cfg, draft_ops(runner)), dev, dtype)
    # A MiMo checkpoint holds the target too: read only the MTP namespace (whole-prefix match).
    tensors = ((name, t) for name, t in iter_tensors(files)
               if mc.format != "mimo" or name.startswith(mc.prefix))
    load_weights(draft, tensors, folder.name)
    return MTPSpeculator(draft.eval().requires_grad_(False), runner, draft_steps)


def new_eagle3_draft(dc: DraftConfig, runner, target_cfg) -> Eagle3Draft:
    """An EAGLE-3 head of dc's shape for the runner's target: on its device, in its dtype, with the
    draft's kernels (draft_ops), its weights uninitialized and d2t zero (the caller fills them)."""
    return build_uninitialized(lambda: Eagle3Draft(dc, target_cfg, runner.max_len, draft_ops(runner)),
                               runner.device, runner.dtype)


def build_eagle3(folder: Path, runner, target_cfg, draft_steps: int, target_name: str):
    dc = DraftConfig.from_folder(folder, target_cfg)
    dc.check_fits(target_cfg, folder.name, target_name)
    dev = runner.device
    files = weight_files(folder)  # refused shard paths fail here, before any allocation
    draft = new_eagle3_draft(dc, runner, target_cfg)
    d2t_seen = False

    def tensors():
        nonlocal d2t_seen
        for name, t in widen_int8_rows(iter_tensors(files), folder.name):  # an lm_head kept as int8 rows
            if name == "d2t":
                d2t_seen = True
                if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
                    raise ModelLoadError(f"{folder.name}: d2t must hold integer offsets, not {t.dtype}")
                # a copy: a .bin tensor is a view of the file's mapping, which must not outlive the load
                draft.d2t = t.to(device=dev, dtype=torch.long, copy=True)
                continue
            yield name, t

    load_weights(draft, tensors(), folder.name)
    if not d2t_seen:
        if dc.draft_vocab_size != dc.vocab_size:
            raise ModelLoadError(f"{folder.name}: reduced draft vocabulary ({dc.draft_vocab_size}) without a d2t map")
        draft.d2t = torch.zeros(dc.draft_vocab_size, dtype=torch.long, device=dev)
    if draft.d2t.dim() != 1 or draft.d2t.shape[0] != dc.draft_vocab_size:
        raise ModelLoadError(f"{folder.name}: d2t has {draft.d2t.shape[0]} entries, draft_vocab_size is "
                             f"{dc.draft_vocab_size}")
    check_d2t(draft.d2t, target_cfg.vocab_size, folder.name)
    return Eagle3Speculator(draft.eval().requires_grad_(False), runner, draft_steps)


def check_d2t(d2t: torch.Tensor, target_vocab: int, source: str) -> None:
    """Every draft id must map into the target's vocabulary (`target = draft + d2t[draft]`): an
    offset that leads below 0 or past the vocabulary would fail mid-answer, when first sampled."""
    targets = d2t + torch.arange(d2t.shape[0], device=d2t.device)
    low, high = int(targets.min()), int(targets.max())
    if low < 0 or high >= target_vocab:
        bad = low if low < 0 else high
        raise ModelLoadError(f"{source}: d2t maps a draft token to {bad}, outside the target vocabulary "
                             f"[0, {target_vocab}); this head was made for another model or its d2t is corrupt")
