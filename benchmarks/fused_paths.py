"""The two fused kernel paths of speculation, separated: KernelOptions.fuse_invariant (the
target's batch-invariant fused norm + projection kernels) and KernelOptions.fused_draft (the
draft layer's fused kernels; engine/options.py). For each of the four combinations: a fresh demo engine with its
head, greedy answers plain and speculative on NP chat prompts (mean accepted length, tokens/s,
answers identical). Then, eagerly on one engine: the target's aux states and logits of a 6-row
step with and without the fused invariant kernels, rows of a 1-row step against the 6-row step,
and the draft's extend and decode logits with and without its fused kernels.

    NP=6 OUTF=fused_paths.json python benchmarks/fused_paths.py     (CUDA)
"""
import dataclasses, json, sys, os
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch
from engine.engine import Engine
from engine.options import KernelOptions
from engine.types import SamplingParams
from engine.forward_batch import ForwardBatch
from benchmarks.harness.prompts import chat_prompts

out = {}
prompts = chat_prompts(int(os.environ.get("NP", "6")))
params = SamplingParams(max_tokens=int(os.environ.get("MT", "256")))
eng = None
for inv in (0, 1):
    for dr in (0, 1):
        options = dataclasses.replace(KernelOptions.from_env(), fuse_invariant=bool(inv), fused_draft=bool(dr))
        del eng; torch.cuda.empty_cache()
        eng = Engine.load("demo", draft="demo-eagle3", device=os.environ.get("DEV", "cuda"), options=options)
        acc, toks, secs, same = [], 0, 0.0, 0
        for m in prompts:
            eng.reset(); a = eng.generate(m, params, speculative=False)
            eng.reset(); b = eng.generate(m, params, speculative=True)
            acc.append(b.stats.accept_len_mean); toks += b.stats.generated_tokens; secs += b.stats.decode_s
            same += a.token_ids == b.token_ids
        out[f"inv{inv}_draft{dr}"] = {"accept": acc, "mean_accept": sum(acc) / len(acc), "tok_s": toks / secs, "identical": same}
        print(f"inv{inv} draft{dr}: accept {sum(acc)/len(acc):.3f} tok/s {toks/secs:.0f} identical {same}/{len(prompts)}", flush=True)

# eager diffs on the last engine (both fused paths on), its target's weights also without the fused invariant kernels
model, kv = eng.runner.model, eng.runner.kv
twins = {inv: model.with_options(dataclasses.replace(model.ops.options, fuse_invariant=inv)) for inv in (False, True)}
spec = eng.speculator
ids = torch.tensor(eng.tokenizer.apply_chat_template(prompts[0]) if hasattr(eng.tokenizer, "apply_chat_template") else list(range(100, 160)), device=os.environ.get("DEV", "cuda"))
aux_ids = eng.runner.aux_layer_ids
n = ids.shape[0]
with torch.no_grad():
    model(ForwardBatch.eager(ids[:-6], 0), kv, aux_ids)
    res = {}
    for inv in (False, True):
        model = twins[inv]
        o = model(ForwardBatch.eager(ids[-6:], n - 6), kv, aux_ids)
        o1 = model(ForwardBatch.eager(ids[-6:-5], n - 6), kv, aux_ids)
        res[inv] = (o.aux_hidden.float().clone(), o.hidden.float().clone(), model.logits(o.hidden).clone(), o1.aux_hidden.float().clone(), o1.hidden.float().clone())
    a0, h0, l0, a10, h10 = res[False]; a1, h1, l1, a11, h11 = res[True]
    H = model.config.hidden_size
    d = {"aux_maxdiff_per_layer": [(a0[:, i*H:(i+1)*H] - a1[:, i*H:(i+1)*H]).abs().max().item() for i in range(a0.shape[1] // H)],
         "aux_scale_per_layer": [a0[:, i*H:(i+1)*H].abs().max().item() for i in range(a0.shape[1] // H)],
         "hidden_maxdiff": (h0 - h1).abs().max().item(), "hidden_scale": h0.abs().max().item(),
         "argmax_equal": (l0.argmax(-1) == l1.argmax(-1)).tolist(),
         "row1_vs_row6_aux_fusedinv": (a11[0] - a1[0]).abs().max().item(),
         "row1_vs_row6_hidden_fusedinv": (h11[0] - h1[0]).abs().max().item(),
         "row1_vs_row6_aux_unfused": (a10[0] - a0[0]).abs().max().item()}
    out["target_eager"] = d
    print("target", json.dumps(d), flush=True)
    # draft: extend over the 6 rows with the target states (unfused-inv ones), fused vs not
    draft = spec.draft
    ts = a0.to(eng.runner.dtype)
    pos = torch.arange(n - 6, n, device=os.environ.get("DEV", "cuda"))
    r = {}
    for f in ((False, True) if eng.runner.device.type == "cuda" else (False, False)):
        draft.fused = f
        lg, hd = draft(ids[-6:], pos, ts, True, spec.embed, spec.kv, start_pos=n - 6)
        lg2, hd2 = draft(ids[-1:], pos[-1:] + 1, hd[-1:], False, spec.embed, spec.kv, start_pos=n)
        r[f] = (lg.clone(), hd.float().clone(), lg2.clone())
    dd = {"extend_argmax_equal": (r[False][0].argmax(-1) == r[True][0].argmax(-1)).tolist(),
          "extend_logit_maxdiff": (r[False][0] - r[True][0]).abs().max().item(),
          "extend_logit_scale": r[False][0].abs().max().item(),
          "extend_hidden_maxdiff": (r[False][1] - r[True][1]).abs().max().item(),
          "decode_argmax_equal": (r[False][2].argmax(-1) == r[True][2].argmax(-1)).tolist(),
          "decode_logit_maxdiff": (r[False][2] - r[True][2]).abs().max().item()}
    out["draft_eager"] = dd
    print("draft", json.dumps(dd), flush=True)
json.dump(out, open(os.environ.get("OUTF", "fusediag.json"), "w"), indent=1)
