"""What rounding x to int8 costs a real model: the one-row packed kernel's int8_x path (each vector of
32 inputs to int8 with one scale, then integer dot products) emulated in float32 on the CPU.

Every decoder projection's input (qkv, o_proj, gate_up, down: what an 8B-class model runs on the
one-row kernel) is rounded as the kernel rounds it (int8 per block of --block inputs, max|x| / 127
a block); beside it, the same inputs rounded to bf16 (the precision a GPU runs them in anyway) as a
yardstick. The model's own greedy answers to each prompt (float32, nothing rounded) are then read
back by each setting, teacher-forced: at every answer position, whether its top token is the
unrounded model's, the KL divergence of its next-token distribution from the unrounded one, and
how far its top two logits are apart where it disagrees.

    python benchmarks/int8_x_quality.py --model demo --prompts-file benchmarks/prompts/unseen_requests.txt \
        --out int8_x_quality.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.settings import Settings  # noqa: E402
from engine import Engine  # noqa: E402
from engine.forward_batch import ForwardBatch  # noqa: E402
from engine.kv_cache import KVCache  # noqa: E402
from engine.types import SamplingParams  # noqa: E402

PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def rounded_int8(x: torch.Tensor, block: int) -> torch.Tensor:
    """x as the kernel rounds it: blocks of `block` inputs to int8, one scale max|x| / 127 each."""
    b = x.float().reshape(-1, block)
    amax = b.abs().amax(dim=1, keepdim=True)
    inv = 127.0 / amax.clamp(min=1e-30)
    return (torch.round(b * inv) * (amax * (1.0 / 127.0))).reshape(x.shape).to(x.dtype)


@contextlib.contextmanager
def inputs_rounded(model: torch.nn.Module, how: str, block: int):
    """Every decoder projection's input rounded `how` ("int8", "bf16", or "none") while inside."""
    def hook(_module, args):
        x = args[0]
        if how == "int8":
            return (rounded_int8(x, block),) + args[1:]
        return (x.to(torch.bfloat16).to(x.dtype),) + args[1:]

    handles = []
    if how != "none":
        for name, module in model.named_modules():
            if name.rpartition(".")[2] in PROJECTIONS:
                handles.append(module.register_forward_pre_hook(hook))
    try:
        yield len(handles)
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def logits_of(engine: Engine, ids: list[int]) -> torch.Tensor:
    """The model's next-token logits at every position of ids, one forward from position 0."""
    model, cfg = engine.runner.model, engine.runner.model.config
    kv = KVCache(cfg.num_layers, len(ids) + 1, cfg.num_kv_heads, cfg.head_dim, torch.float32, torch.device("cpu"))
    out = model(ForwardBatch.eager(torch.tensor(ids), 0), kv)
    return model.logits(out.hidden).float()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo")
    ap.add_argument("--prompts-file", type=Path, required=True)
    ap.add_argument("--prompts", type=int, default=None)
    ap.add_argument("--new-tokens", type=int, default=192)
    ap.add_argument("--block", type=int, default=32, help="inputs sharing one int8 scale (the kernel's vector)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    prompts = [p.strip() for p in args.prompts_file.read_text().splitlines() if p.strip()][:args.prompts]
    engine = Engine.load(args.model, draft="none", device="cpu")
    model = engine.runner.model
    settings = ("bf16", "int8")
    totals = {s: {"positions": 0, "top1_same": 0, "kl_sum": 0.0, "margins": []} for s in settings}
    rows = []
    for i, prompt in enumerate(prompts):
        messages = [{"role": "system", "content": Settings().system_prompt}, {"role": "user", "content": prompt}]
        prompt_ids = engine.tokenizer.apply_chat_template(messages)
        answer = [t for ev in engine.stream_ids(prompt_ids, SamplingParams(max_tokens=args.new_tokens))
                  for t in ev.token_ids]
        ids = prompt_ids + answer
        ref = logits_of(engine, ids)[len(prompt_ids) - 1:len(ids) - 1]  # the positions that chose the answer
        assert torch.equal(ref.argmax(-1), torch.tensor(answer)), "the teacher-forced forward is not the answer's"
        row = {"prompt": prompt, "answer_tokens": len(answer)}
        for s in settings:
            with inputs_rounded(model, s, args.block) as hooked:
                got = logits_of(engine, ids)[len(prompt_ids) - 1:len(ids) - 1]
            assert hooked == len(PROJECTIONS) * engine.runner.model.config.num_layers, hooked
            same = got.argmax(-1) == ref.argmax(-1)
            kl = torch.nn.functional.kl_div(got.log_softmax(-1), ref.log_softmax(-1), log_target=True,
                                            reduction="none").sum(-1)
            top2 = ref.topk(2, dim=-1).values
            margins = (top2[:, 0] - top2[:, 1])[~same].tolist()  # the reference's own margin where they part
            t = totals[s]
            t["positions"] += len(answer)
            t["top1_same"] += int(same.sum())
            t["kl_sum"] += float(kl.sum())
            t["margins"] += margins
            row[s] = {"top1_same": int(same.sum()), "mean_kl": float(kl.mean()),
                      "first_different": int((~same).nonzero()[0]) if (~same).any() else None}
        rows.append(row)
        print(f"{i:2d} {len(answer):4d} tokens  " + "  ".join(
            f"{s}: top-1 {row[s]['top1_same']}/{len(answer)}, KL {row[s]['mean_kl']:.2e}" for s in settings), flush=True)
    summary = {s: {"positions": t["positions"], "top1_agreement": t["top1_same"] / t["positions"],
                   "mean_kl": t["kl_sum"] / t["positions"],
                   "median_margin_where_different": sorted(t["margins"])[len(t["margins"]) // 2] if t["margins"] else None}
               for s, t in totals.items()}
    report = {"model": args.model, "weights": engine.weights, "device": "cpu", "dtype": "float32",
              "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
              "threads": torch.get_num_threads(), "block": args.block, "new_tokens": args.new_tokens,
              "prompts_file": str(args.prompts_file), "prompts": len(rows),
              "what": "teacher-forced over the unrounded model's greedy answers: every decoder projection's input "
                      "rounded to bf16 (yardstick) or to int8 per block (the int8_x kernel path)",
              "summary": summary, "answers": rows}
    args.out.write_text(json.dumps(report, indent=1))
    for s, v in summary.items():
        print(f"{s}: top-1 agreement {100 * v['top1_agreement']:.2f}% of {v['positions']} positions, "
              f"mean KL {v['mean_kl']:.2e}, median margin where different {v['median_margin_where_different']}")


if __name__ == "__main__":
    main()
