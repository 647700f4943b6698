"""Checkpoints of stopped `train-draft` runs (EAGLE-3): `--resume` continues one.

A run stopped with Ctrl+C (or SIGTERM) saves its head to --out as usual and, in the cache, what
continuing needs: the fp32 head, the optimizer state, the draft vocabulary, the step, and the
training schedule (seconds planned and used). `--resume` with the same --out and settings loads
it, reuses the target's cached replies (no new generation) and trains on along the same
schedule. A run that finishes removes its checkpoint.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from engine.errors import UserError

# Options that must match between the stopped run and --resume.
MATCHED = ("draft_vocab", "seq_len", "batch_tokens", "ttt_steps", "steps", "lr", "decay", "seed", "gen_frac",
           "greedy_weight", "draft_intermediate", "soft_temperature", "init", "sampled_replies", "reply_temperature")


# Settings added after checkpoints were first written, with the value those runs had.
ADDED_LATER = {"draft_intermediate": 0, "soft_temperature": 1.0, "init": None, "sampled_replies": 0.0,
               "reply_temperature": 0.7}


def folder_for(out: Path) -> Path:
    from engine.paths import cache_dir

    key = hashlib.sha256(str(Path(out).expanduser().resolve()).encode()).hexdigest()[:24]
    return cache_dir() / "train-draft" / "checkpoints" / key


def settings(opts, target: list, device: str) -> dict:
    return {"target": target, "device": device, **{k: getattr(opts, k) for k in MATCHED}}


def save(out: Path, draft, res, draft_ids: torch.Tensor, coverage: dict, run_settings: dict,
         parts: list[dict] = ()) -> Path:
    """parts: the run's parts so far, this one last ({"wall_s", "steps"} each), for the provenance
    of the run that finishes it."""
    folder = folder_for(out)
    folder.mkdir(parents=True, exist_ok=True)
    state = {"settings": run_settings, "draft": {k: v.detach().cpu() for k, v in draft.state_dict().items()},
             "opt": _to_cpu(res.opt_state), "draft_ids": draft_ids.cpu(), "coverage": coverage,
             "step": res.steps_done, "schedule_s": res.schedule_s, "schedule_used_s": res.schedule_used_s,
             "history": res.history, "first_loss": res.first_loss, "parts": list(parts)}
    tmp = folder / "state.pt.tmp"
    torch.save(state, tmp)
    tmp.replace(folder / "state.pt")
    return folder / "state.pt"


def load(out: Path, run_settings: dict, device: torch.device) -> dict:
    path = folder_for(out) / "state.pt"
    if not path.is_file():
        raise UserError(f"--resume: no stopped run to continue for --out {out} (a run stopped with Ctrl+C "
                        "leaves one; a finished run does not)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        saved = state["settings"]
    except Exception:
        raise UserError(f"--resume: the checkpoint {path} cannot be read (damaged, or written by another "
                        "version); start a new run without --resume") from None
    for key, value in run_settings.items():
        if saved.get(key, ADDED_LATER.get(key)) != value:
            what = "the target model's files" if key == "target" else f"--{key.replace('_', '-')}"
            raise UserError(f"--resume: {what} differ from the stopped run's ({saved.get(key)!r} then, "
                            f"{value!r} now); give the same settings or start a new run")
    state["opt"] = _to(state["opt"], device)
    return state


def discard(out: Path) -> None:
    path = folder_for(out) / "state.pt"
    if path.exists():
        path.unlink()


def _to_cpu(obj):
    return _to(obj, torch.device("cpu"))


def _to(obj, device):
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to(v, device) for v in obj]
    return obj
