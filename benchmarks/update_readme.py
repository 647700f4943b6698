"""Rebuilds the README's benchmark table from the JSON files in benchmarks/results/."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- bench:start -->", "<!-- bench:end -->"


def _load(name: str) -> dict | None:
    path = ROOT / "benchmarks" / "results" / name
    return json.loads(path.read_text()) if path.exists() else None


def _spec_row(name: str, label: str, target: str) -> str | None:
    """A `localchat bench` run with a draft: speculative against plain decoding, same run."""
    b = _load(name)
    if not b or "spec" not in b:
        return None
    s = b["spec"]
    return (f"| speculation, {label} | {s['decode_tok_s']:.0f} tok/s, accept length {s['accept_len_mean']:.2f} | "
            f"plain {b['plain']['decode_tok_s']:.0f} tok/s | {s['speedup']:.2f}x |" + (f" {target} |" if target else " |"))


def _variant_row(name: str, model: str, new: str, old: str, label: str, digits: int = 2,
                 mode: str = "speculative") -> str | None:
    """A `benchmarks/variants.py` comparison of two variants (speculative or plain) in one process."""
    r = (_load(name) or {}).get("results", {}).get(model, {}).get(mode)
    if not r:
        return None
    a, b = r[new], r[old]
    same = a["same_tokens_as_first"] and b["same_tokens_as_first"]  # each against the run's first variant
    return (f"| {label}, one process (`benchmarks/variants.py`), same tokens: {same} | "
            f"{a['tok_s']:.0f} tok/s | {b['tok_s']:.0f} tok/s | {a['tok_s'] / b['tok_s']:.{digits}f}x | |")


def _sampling_label(name: str) -> str:
    """'t0.7 top_p0.9' -> 'temperature 0.7, top-p 0.9'."""
    words = {"t": "temperature", "top_p": "top-p", "top_k": "top-k", "min_p": "min-p"}
    out = []
    for part in name.split():
        key = part.rstrip("0123456789.")
        out.append(f"{words.get(key, key)} {part[len(key):]}")
    return ", ".join(out)


def rows() -> list[str]:
    out = ["| benchmark (H200, batch 1) | ours | compared with, same run | ratio | target |",
           "|---|---|---|---|---|"]
    for name, what in (("h200_8b_plain_final_session17.json", "session 17"),
                       ("h200_8b_plain_final2_session17.json", "session 17, a second run two minutes later"),
                       ("h200_8b_plain_final_session16.json", "session 16, before the norm tails and the fixed split grid")):
        b = _load(name)
        if not b:
            continue
        p, t = b["plain"], b.get("transformers")
        out.append(f"| plain decode, Llama-3.1-8B shape, random bf16, {b['prompt_tokens']}-token prompt ({what}) | "
                   f"{p['decode_tok_s']:.1f} tok/s | bandwidth limit {b['bandwidth_limit_tok_s']:.1f} tok/s "
                   f"({b['copy_bandwidth_GBps']:.0f} GB/s copy) | {p['fraction_of_bandwidth_limit'] * 100:.1f}% | >= 91% |")
        if t:
            out.append(f"| plain decode vs `transformers` generate, 8B shape, the same run | "
                       f"{p['decode_tok_s']:.1f} tok/s | {t['decode_tok_s']:.1f} tok/s (transformers {t['version']}) | "
                       f"{b['speedup_vs_transformers']:.1f}x | >= 15x |")
        out.append(f"| start-up (load + graph capture), 8B shape random weights, the same run | {b['startup_s']:.1f} s | | | "
                   f"<= 20 s |")
    # plain-decode comparisons from variants.py: (file, model, new variant, old variant, label)
    for name, model, new_variant, old_variant, label in (
            ("h200_variants_programs_8b_session17.json", "llama-8b", "base", "prog1024",
             "plain decode, 8B shape, a 4,096-row cache: 17 attention split programs per kv head, each looping "
             "over its splits, vs one program per split"),
            ("h200_variants_programs_demo_shape_session17.json", "smollm2-135m", "base", "prog1024",
             "plain decode, demo shape (random weights), a 4,096-row cache: 44 split programs per kv head vs one "
             "per split"),
            ("h200_variants_tail_attn_8b_session17.json", "llama-8b", "attn2", "tail_off+attn2",
             "plain decode, 8B shape: o_proj and down add the residual and run the next RMSNorm in their last "
             "program (gemv_add_norm) vs add_rms_norm launches"),
            ("h200_variants_tail_attn_8b_session17.json", "llama-8b", "base", "attn2",
             "plain decode, 8B shape: attention in one launch (the last split program of a kv head merges; "
             "not merged) vs split + reduce"),
            ("h200_variants_k4096_8b_session16.json", "llama-8b", "tiles:28672x4096/4/4096/1/4/3", "base",
             "plain decode, 8B shape: the gated gate_up's tile 4 x 4096 (now the default) vs 4 x 1024"),
            ("h200_variants_act_apart_8b_session16.json", "llama-8b", "base", "gated_off",
             "plain decode, 8B shape: the MLP as gated_gemv (4 x 1024 tile) + a plain down GEMV vs "
             "gate_up on cuBLAS + silu_mul_gemv"),
            ("h200_variants_gated_demo_shape_session16.json", "smollm2-135m", "gated", "base",
             "plain decode, demo shape (random weights): the MLP as gated_gemv (4 x 256 tile) + a plain "
             "down GEMV vs the norm-fused gate_up + silu_mul_gemv"),
            ("h200_variants_gated_demo_k1024_session16.json", "smollm2-135m", "tiles:3072x576/4/1024/1/4/3", "base",
             "plain decode, demo shape (random weights): the gated tile 4 x 1024 (now the default) vs 4 x 256"),
            ("h200_variants_norm_session15.json", "smollm2-135m", "mlp_norm", "base",
             "plain decode, demo shape (random weights): the post-attention norm inside gate_up's GEMV vs "
             "add_rms_norm then cuBLAS"),
            ("h200_variants_one_pass_session15.json", "smollm2-135m", "base", "loop_norm",
             "plain decode, demo shape (random weights): the fused norms' mean square from one load of "
             "the row vs a loop over K"),
            ("h200_variants_8b_session14.json", "llama-8b", "base", "row_cublas+rt_off+argmax_torch",
             "plain decode, 8B shape: the three session-14 changes below together vs none"),
            ("h200_variants_8b_session14.json", "llama-8b", "base", "row_cublas",
             "plain decode, 8B shape: qkv on our GEMV vs cuBLAS"),
            ("h200_variants_8b_session14.json", "llama-8b", "base", "rt_off",
             "plain decode, 8B shape: the attention's reduce lets o_proj launch before its wait vs after"),
            ("h200_variants_8b_session14.json", "llama-8b", "base", "argmax_torch",
             "plain decode, 8B shape: greedy_next (argmax, input id, position in one launch) vs torch ops"),
            ("h200_variants_demo_shape_session14.json", "smollm2-135m", "base", "rt_off+argmax_torch",
             "plain decode, demo shape (random weights): the reduce's early launch and greedy_next vs neither"),
            ("h200_variants_8b_session13.json", "llama-8b", "base", "tiles:4096x14336/4/512/1/4/3|4096x4096/4/512/1/4/3",
             "plain decode, 8B shape: 1,024-element GEMV steps for o_proj and down vs 512"),
            ("h200_variants_8b_session13.json", "llama-8b", "base", "kv_late",
             "plain decode, 8B shape: attention reads old K/V before its PDL wait vs after"),
            ("h200_variants_rope_in_attention_session13.json", "llama-8b", "base", "rope_apart",
             "plain decode, 8B shape: RoPE and cache write inside the attention kernel vs a launch of their own")):
        out.append(_variant_row(name, model, new_variant, old_variant, label, 3, "plain"))
    b, old = _load("h200_demo_plain_final_session17.json"), _load("h200_demo_plain.json")
    if b:
        p = b["plain"]
        out.append(f"| plain decode, demo model (SmolLM2-135M, real weights), no draft loaded, {b['prompts']} "
                   f"{b['prompt_set'].split(' (')[0]} (session 17) | "
                   f"{p['decode_tok_s']:.0f} tok/s | bandwidth limit {b['bandwidth_limit_tok_s']:.0f} tok/s | "
                   f"{p['fraction_of_bandwidth_limit'] * 100:.1f}% | >= 1500 tok/s |")
    t = (old or {}).get("transformers")
    if t:
        out.append(f"| plain decode vs `transformers` generate, demo model, no draft loaded (session 3, before PDL) | "
                   f"{old['plain']['decode_tok_s']:.0f} tok/s | {t['decode_tok_s']:.1f} tok/s | "
                   f"{old['speedup_vs_transformers']:.0f}x | |")
    b = _load("h200_pdl_random_session7.json")
    for name, r in (b or {}).get("results", {}).items():
        shape = "Llama-3.1-8B shape" if name == "llama-8b" else "demo shape"
        p = r["plain"]
        out.append(f"| programmatic dependent launch on vs off, plain decode, {shape}, random weights "
                   f"(`benchmarks/pdl.py`), same tokens: {p['same_tokens']} | {p['pdl_on_tok_s']:.1f} tok/s | "
                   f"off {p['pdl_off_tok_s']:.1f} tok/s | {p['ratio']:.2f}x | |")
    b = _load("h200_8b_forced_accept4.json")
    if b and "spec" in b:
        s, lc = b["spec"], b["spec"].get("loop_cost", {})
        out.append(f"| speculation loop, 8B shape, forced accept length 4, k = {b['draft_steps']} | "
                   f"{s['decode_tok_s']:.1f} tok/s | ideal {lc.get('ideal_tok_s', 0):.1f} tok/s (verify "
                   f"{lc.get('verify_ms', 0):.2f} ms + {b['draft_steps'] - 1} draft steps x "
                   f"{lc.get('draft_step_ms', 0):.2f} ms + extend {lc.get('extend_ms', 0):.2f} ms) | "
                   f"{s['decode_tok_s'] / max(lc.get('ideal_tok_s', 1), 1e-9) * 100:.0f}% of ideal | >= 85% |")
    out.append(_spec_row("h200_demo_spec_final_session12.json", "demo model + shipped EAGLE-3 head, greedy, 8 held-out prompts, "
                         "k = 5 and 10 runners-up verified a step (3, 3, 2, 1, 1 for drafts 1..5; plain decode with a "
                         "head loaded runs batch-invariant projections)", ">= 2.5x, >= 3.5"))
    out.append(_spec_row("h200_demo_spec_p16_final_session12.json", "the same, 16 held-out prompts (the 8 above and 8 more)",
                         ""))
    out.append(_spec_row("h200_demo_spec_instruct_session12.json", "the same, 8 held-out instruction-style requests "
                         "(`--prompt-set instruct`; measured earlier in the session, at d3aad82)", ""))
    out.append(_variant_row("h200_variants_first_chain_session12.json", "demo", "base", "first_eager",
                            "the first chain of each answer drafted by one graph replay vs by eager launches after "
                            "the first token, demo model + head, 8 held-out prompts (session 12, before the one-row "
                            "extend)", digits=3))
    prof = _load("h200_iteration_profile_session12.json")
    if prof:
        t = prof.get("graph_timeline") or {}
        out.append(f"| one greedy iteration's graph replay, demo model + head, 10 runners-up, one-row draft-extend "
                   f"(`benchmarks/profile_iteration.py`, session 12; {t.get('kernels', 0)} kernels) | "
                   f"{prof['graph_iter_ms']:.3f} ms | first chain's graph {prof['first_chain_graph_ms']:.3f} ms | | |")
    b = _load("h200_variants_alts_shaped_session11.json")
    r = (b or {}).get("results", {}).get("demo", {}).get("speculative")
    if r:
        for name, what in (("altsauto", "10 runners-up shaped 3, 3, 2, 1, 1 (the default)"),
                           ("alts2", "2 runners-up for every draft")):
            new, old = r[name], r["alts0"]
            out.append(f"| greedy verify steps with {what} vs the plain chain, demo model + head, 8 held-out prompts, "
                       f"one process (`benchmarks/variants.py`), same tokens: {new['same_tokens_as_first']} | "
                       f"{new['tok_s']:.0f} tok/s, accept length {new['accept_len_mean']:.2f} | {old['tok_s']:.0f} tok/s, "
                       f"accept length {old['accept_len_mean']:.2f} | {new['tok_s'] / old['tok_s']:.2f}x | |")
    prof = {a: _load(f"h200_iteration_profile_alts{a}_session11.json") for a in ("0", "auto")}
    if all(prof.values()):
        out.append(f"| one greedy iteration's graph replay, demo model + head (`benchmarks/profile_iteration.py`): 10 "
                   f"runners-up vs the plain chain (their cost: 10 more verify rows, their picks, one "
                   f"launch to take one) | {prof['auto']['graph_iter_ms']:.3f} ms | "
                   f"{prof['0']['graph_iter_ms']:.3f} ms | {prof['auto']['graph_iter_ms'] / prof['0']['graph_iter_ms']:.2f}x "
                   f"the time | |")
    out.append(_spec_row("h200_demo_spec_session11.json", "session 11's build (runners-up; first chain from the host, "
                         "6-row draft-extend), 8 held-out prompts", ""))
    out.append(_spec_row("h200_demo_spec_instruct_session11.json", "session 11's build, 8 held-out instruction-style "
                         "requests", ""))
    out.append(_spec_row("h200_demo_spec_session10.json", "session 10's build (the plain chain), 8 held-out prompts", ""))
    for prompt_set in ("chitchat", "instruct"):
        new, old = _load(f"h200_head_ab_{prompt_set}_instruct01_session10.json"), _load(f"h200_head_ab_{prompt_set}_session9head_session10.json")
        if new and old:
            out.append(f"| shipped head (`--instruct-frac 0.1`) vs session 9's (conversations only), 8 held-out "
                       f"{'chitchat prompts' if prompt_set == 'chitchat' else 'instruction requests'}, one after the other on one GPU | "
                       f"{new['spec']['speedup']:.2f}x plain, accept length {new['spec']['accept_len_mean']:.2f} | "
                       f"{old['spec']['speedup']:.2f}x plain, accept length {old['spec']['accept_len_mean']:.2f} | "
                       f"{new['spec']['accept_len_mean'] / old['spec']['accept_len_mean']:.2f}x accepted | |")
    out.append(_variant_row("h200_variants_lean_session9.json", "demo", "base", "lean_off",
                            "greedy iteration with the lean draft step and one-launch acceptance vs session 8's, demo "
                            "model + head, 8 held-out prompts"))
    b = _load("h200_variants_lean_8b_session9.json")
    r = (b or {}).get("results", {}).get("llama-8b", {}).get("speculative")
    if r:
        new, old = r["base"], r["lean_off"]
        out.append(f"| the same, 8B shape, random head, forced accept length 4 (draft step {new['parts_ms']['draft_step_ms']:.3f} "
                   f"vs {old['parts_ms']['draft_step_ms']:.3f} ms, extend {new['parts_ms']['extend_ms']:.3f} vs "
                   f"{old['parts_ms']['extend_ms']:.3f} ms) | {new['tok_s']:.0f} tok/s | {old['tok_s']:.0f} tok/s | "
                   f"{new['tok_s'] / old['tok_s']:.2f}x | |")
    b = _load("h200_demo_spec.json")
    if b:
        out.append(f"| start-up (load + graph capture, in the bench process), demo model + head, warm start "
                   f"(prepared weights, cached tokenizer and Triton kernels; session 4) | {b['startup_s']:.1f} s | | | <= 5 s |")
    b = _load("h200_startup_first_token_session7.json")
    if b:
        runs = ", ".join(f"{r['first_token_s']:.2f}" for r in b["runs"])
        out.append(f"| the same on a one-GPU host started minutes earlier, after two `bench` runs, PDL on "
                   f"(session 7; runs: {runs} s) | {min(r['first_token_s'] for r in b['runs']):.2f} s | | | <= 5 s |")
    for name, what in (("pyc_final", "with Python's bytecode cache, as after any pip install, commit b4c7fb8 (RoPE table "
                                      "on the CPU), another host"),
                       ("pyc", "with Python's bytecode cache, as after any pip install"),
                       ("imageenv", "in the device image's environment, which keeps no bytecode (PYTHONDONTWRITEBYTECODE=1, "
                                    "no `__pycache__` for torch), so every process compiles torch's sources")):
        b = _load(f"h200_startup_first_token_{name}_session10.json")
        if b:
            runs = ", ".join(f"{r['first_token_s']:.2f}" for r in b["runs"])
            out.append(f"| start-up of a fresh `localchat run` process to the first byte of its answer, demo model + "
                       f"head, draft graphs captured after the first token, warm machine, {what} (session 10; runs: "
                       f"{runs} s) | {b['best_later_run_s']:.2f} s | | | <= 5 s |")
    b = _load("h200_teacher_paths_session7.json")
    for name, r in (b or {}).get("results", {}).items():
        what = ("train-draft's reply generation, tokens read every 8 steps vs every step" if name == "generation" else
                "train-draft's teacher features, one variable-length flash call vs padded groups")
        check = f"same tokens: {r['same_tokens']}" if "same_tokens" in r else f"max abs diff {r['max_abs_diff']}"
        out.append(f"| {what}, demo shape, random weights (`benchmarks/teacher_paths.py`), {check} | "
                   f"{r['new_tok_s']:,} tok/s | {r['old_tok_s']:,} tok/s | {r['ratio']:.2f}x | |")
    prov = ROOT / "assets" / "demo-eagle3" / "provenance.json"
    check = json.loads(prov.read_text()).get("final_eval", {}).get("speculator") if prov.exists() else None
    b = _load("h200_identical_final_session12.json")
    if b:
        out.append(f"| greedy output with the shipped head equals plain decoding, {b['prompts']} held-out prompts, "
                   f"{b['max_tokens']} tokens (`benchmarks/check_identical.py`, session 12) | {b['identical']}/{b['prompts']} "
                   f"identical | | | all |")
    if check:
        out.append(f"| greedy output with the shipped head equals plain decoding, held-out prompts, "
                   f"{check['max_tokens']} tokens (train-draft's final check) | {check['identical']}/{check['prompts']} "
                   f"identical, accept length {check['accept_len_mean']:.2f} | | | all |")
    out.append(_spec_row("h200_demo_mtp.json", "demo model + shipped 2-layer chain-MTP (`--draft demo-mtp`), greedy, "
                         "held-out prompts, k = 2 (measured with an earlier build)", ""))
    out.append(_spec_row("h200_demo_spec_t07_session12.json", "demo model + shipped head, temperature 0.7, 8 held-out "
                         "prompts (sampling verifies the chain alone; session 12, d3aad82)", ""))
    out.append(_spec_row("h200_demo_spec_t07_session11.json", "session 11's build, temperature 0.7", ""))
    out.append(_spec_row("h200_demo_spec_t07_session10.json", "session 10's build, temperature 0.7 (one of its 8 answers "
                         "accepted 4.06, the others 2.0-2.5)", ""))
    b = _load("h200_demo_sampled_cuts.json")
    for r in (b or {}).get("rows", []):
        out.append(f"| demo model + the session-4 head, {_sampling_label(r['sampling'])}, seeded, "
                   f"held-out prompts (`benchmarks/sampled_cuts.py`){', one graph an iteration' if r['graph'] else ''} | "
                   f"{r['spec_tok_s']:.0f} tok/s | plain {r['plain_tok_s']:.0f} tok/s | {r['speedup']:.2f}x, accept "
                   f"{r['accept']:.2f} | |")
    b = _load("h200_ui_cost.json")
    if b:
        same = sum(b["same_text"]) if "same_text" in b else None
        out.append(f"| chat app attached (headless), demo model + head, 256-token answers, "
                   f"{same}/{len(b['app_tok_s'])} answers the same on both sides | "
                   f"{sum(b['app_tok_s']) / len(b['app_tok_s']):.0f} tok/s | engine alone "
                   f"{sum(b['bare_tok_s']) / len(b['bare_tok_s']):.0f} tok/s | {b['ratio'] * 100:.0f}% | >= 95% |")
    b = _load("cpu_demo_plain.json")
    if b:
        t = b.get("transformers", {})
        out.append(f"| CPU (2 cores), demo model, fp32 | {b['plain']['decode_tok_s']:.1f} tok/s | transformers "
                   f"{t.get('decode_tok_s', 0):.1f} tok/s | {b.get('speedup_vs_transformers', 0):.2f}x | > 1x |")
    out.append(_spec_row("cpu_demo_spec_chitchat_session10.json", "CPU (2 cores), demo model + shipped head, greedy, "
                         "4 held-out chitchat prompts, 128 tokens", ""))
    out.append(_spec_row("cpu_demo_spec_instruct_session10.json", "the same on 4 held-out instruction-style requests "
                         "(`--prompt-set instruct`)", ""))
    out.append(_spec_row("cpu_demo_spec_chitchat_session9.json", "CPU (2 cores), demo model + session 9's head, greedy, "
                         "4 held-out chitchat prompts, 128 tokens", ""))
    out.append(_spec_row("cpu_demo_spec_instruct_session9.json", "the same on 4 held-out instruction-style requests "
                         "(`--prompt-set instruct`): that head, trained on small talk only, drafts them poorly", ""))
    return [row for row in out if row is not None]


def main() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    table = "\n".join([START, *rows(), END])
    if START in text:
        text = re.sub(re.escape(START) + ".*?" + re.escape(END), table, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + table + "\n"
    readme.write_text(text)


if __name__ == "__main__":
    main()
