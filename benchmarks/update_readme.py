"""Rebuilds the README's benchmark table from the JSON files in benchmarks/results/.

Each row names the command that wrote its file. To refresh a row, run its command with
`--out benchmarks/results/NEW.json` and point the row's file here at NEW.json.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's harness, installed or not

from benchmarks.harness.limits import step_limit_tok_s  # noqa: E402

START, END = "<!-- bench:start -->", "<!-- bench:end -->"

# Rows written before `localchat bench` kept EOS and put the app's system prompt over its prompts:
# these flags repeat what their commands did then.
BEFORE = " --ignore-eos --system ''"
BENCH_8B = "localchat bench --random-weights llama-8b --prompts 2"
TREE_SHAPES = ("python benchmarks/tree_shapes.py --model demo --tree 4,8,15 --tree 4,8,20 --tree 4,8,24 "
               "--tree 4,10,24 --tree 5,8,24 --tree off --out FILE")
TREE_SHAPES_SPLIT = "python benchmarks/tree_shapes.py --model demo --tree 4,8,15 --tree 4,8,20 --tree 4,8,24 --tree off --out FILE"
TREE_SHAPES_SPLIT_24 = "python benchmarks/tree_shapes.py --model demo --prompts 24 --tree 4,8,15 --tree 4,8,24 --tree off --out FILE"
TREE_SHALLOW_24 = ("python benchmarks/tree_shapes.py --model demo --prompts 24 --tree 4,4,15 --tree 4,7,15 --tree 4,5,24 "
                   "--tree off --lookup 0 --out FILE")

PACKED = "localchat bench --random-weights llama-8b --random-quant Q4_K_M --no-spec --prompts 2 --new-tokens 128 --no-peer"
QWEN = ("localchat bench --random-weights benchmarks/configs/qwen2.5-7b.json --random-quant Q4_K_M --no-spec "
        "--prompts 2 --new-tokens 128 --no-peer")
SMALL_1B = ("localchat bench --random-weights benchmarks/configs/llama-3.2-1b.json --random-quant Q4_K_M --no-spec "
            "--prompts 2 --new-tokens 256 --no-peer")
SMALL_DEMO = ("localchat bench --random-weights benchmarks/configs/smollm2-135m.json --random-quant Q4_1 --no-spec "
              "--prompts 4 --new-tokens 256 --no-peer")
UNSEEN = "localchat bench --model demo --prompts-file benchmarks/prompts/unseen_requests.txt --new-tokens 384 --no-peer"

# (kind, label, command, file): what each row reads is in row() below.
ROWS = (
    ("plain_8b", "plain decode, Llama-3.1-8B shape, random bf16 weights", BENCH_8B,
     "h200_8b_plain_final_session17.json"),
    ("startup_8b", "start-up (load + CUDA-graph capture), the same run", BENCH_8B,
     "h200_8b_plain_final_session17.json"),
    ("no_draft", "plain decode, demo model (SmolLM2-135M), no draft loaded, 12 requests",
     UNSEEN + " --prompts 12", "h200_demo_sampledft_greedy.json"),
    ("spec", "greedy speculation, demo model + its EAGLE-3 head, k = 5, the same 12 requests; runners-up chosen by "
     "the app's first-load measurement (the chain alone)", UNSEEN + " --prompts 12",
     "h200_demo_sampledft_greedy.json"),
    ("identical_bench", "greedy speculation equals plain decoding with the draft loaded, token for token",
     UNSEEN + " --prompts 12", "h200_demo_sampledft_greedy.json"),
    ("spec", "an earlier head with the chain and 10 runners-up verified (before the down projection ran row by row)",
     UNSEEN + " --prompts 12 --runners-up on", "h200_demo_eagle3_gate_runners_up_on.json"),
    ("spec", "the same head at temperature 0.7, all 24 requests",
     UNSEEN + " --temperature 0.7 --prompts 24", "h200_demo_sampledft_t07.json"),
    ("spec", "greedy speculation, demo model + its 2 MTP layers (retrained on the request sets), k = 2, the "
     "first 8 of the requests",
     UNSEEN + " --draft demo-mtp --prompts 8", "h200_demo_share_sms_mtp.json"),
    ("spec", "H100: greedy speculation, demo model + its EAGLE-3 head, the 12 requests, chains (k = 5) with the "
     "head's runners-up verified beside them", UNSEEN + " --prompts 12 --runners-up on", "h100_demo_runners_up_on.json"),
    ("spec", "H100: the same with draft trees 4,8,15 (16 rows verified a step)", UNSEEN + " --prompts 12 --tree 4,8,15",
     "h100_demo_tree_4-8-15_cuts.json"),
    ("spec", "H100: the same with draft trees 4,4,8", UNSEEN + " --prompts 12 --tree 4,4,8",
     "h100_demo_tree_4-4-8_cuts.json"),
    ("tree:4,8,15", "greedy speculation, demo model + its EAGLE-3 head, the 12 requests, draft trees 4,8,15 (16 rows "
     "verified a step), shapes timed in one process", TREE_SHAPES, "h200_tree_one_forward.json"),
    ("tree:4,8,24", "the same run, draft trees 4,8,24 (25 rows verified in one forward)", TREE_SHAPES,
     "h200_tree_one_forward.json"),
    ("tree:4,8,15", "H100: trees 4,8,15, a level's rows and the verify rows' argmax read in parts (the default "
     "since)", TREE_SHAPES_SPLIT, "h100_tree_split_on.json"),
    ("tree:4,8,24", "H100: the same run, trees 4,8,24", TREE_SHAPES_SPLIT, "h100_tree_split_on.json"),
    ("spec", "H100: the same with the chain alone", UNSEEN + " --prompts 12 --runners-up off",
     "h100_demo_runners_up_off.json"),
    ("tree:4,8,15", "H100: all 24 requests (the second 12 accept less), trees 4,8,15", TREE_SHAPES_SPLIT_24,
     "h100_tree_split_on_24.json"),
    ("tree:off", "H100: the same run, the chain with its runners-up", TREE_SHAPES_SPLIT_24,
     "h100_tree_split_on_24.json"),
    ("tree:4,4,15", "H100: all 24 requests, trees 4,4,15 with up to 12 prompt-lookup tokens in their last places, "
     "a chain that may reach past the tree's 4 levels (the shape `--tree auto` picks here)", TREE_SHALLOW_24,
     "h100_tree_launch_cuts_24.json"),
    ("tree:4,7,15", "H100: the same run, trees 4,7,15", TREE_SHALLOW_24, "h100_tree_launch_cuts_24.json"),
    ("tree:4,5,24", "H100: the same run, trees 4,5,24 (25 rows verified a step)", TREE_SHALLOW_24,
     "h100_tree_launch_cuts_24.json"),
    ("tree:4,4,15~lookup0", "H100: the same run, trees 4,4,15 without the lookup tokens", TREE_SHALLOW_24,
     "h100_tree_launch_cuts_24.json"),
    ("tree:off", "H100: the same run, the chain with its runners-up", TREE_SHALLOW_24,
     "h100_tree_launch_cuts_24.json"),
    ("spec", "H100: `--tree auto`, as the app runs greedy answers, all 24 requests (it picked 4,4,15: 16 rows and "
     "3.88 tokens a step)",
     UNSEEN + " --prompts 24 --tree auto", "h100_tree_auto_launch_cuts_24.json"),
    ("spec", "H100: the chain at temperature 0.7, all 24 requests", UNSEEN + " --temperature 0.7 --prompts 24",
     "h100_demo_t07_chain.json"),
    ("spec", "H100: greedy speculation, demo model + its 2 MTP layers, k = 2, the first 8 of the requests",
     UNSEEN + " --draft demo-mtp --prompts 8", "h100_demo_mtp.json"),
    ("spec", "8B shape, random head forced to a published EAGLE-3 head's spread (3.5 tokens per verify step on "
     "average), k = 5; runners-up chosen by measurement, as the app chooses them (the chain alone: the forced "
     "spread never takes a runner-up)",
     "localchat bench --random-weights llama-8b --force-accept 3.5 --prompts 8 --new-tokens 256 --no-peer",
     "h200_8b_forced35_tiles.json"),
    ("spec", "the same with the chain and 10 runners-up verified (an earlier run)",
     "the same with `--runners-up on`", "h200_8b_forced35_runners_up.json"),
    ("packed", "8B shape, random weights packed as a Q4_K_M file (decoded inside the GEMV), plain decode, no draft "
     "loaded (the one-row kernel, the activations rounded to int8 against the blocks, each Q4_K group's scale and "
     "offset codes side by side, q, k and v in one launch; bf16 from an earlier run)",
     f"`{PACKED}` (and without `--random-quant`)",
     "h200_8b_packed_Q4_K_M_one_launch.json, h200_8b_bf16_int8x_high_session.json, "
     "h200_8b_packed_Q4_K_M_two_launches.json"),
    ("packed_short", "the same packed as Q5_K (an earlier run)", "the same with `--random-quant Q5_K`",
     "h200_8b_packed_Q5_K_int8x_high.json, h200_8b_bf16_int8x_high_session.json"),
    ("packed_short", "the same packed as Q6_K", "the same with `--random-quant Q6_K`",
     "h200_8b_packed_Q6_K_int8x_high.json, h200_8b_bf16_int8x_high_session.json"),
    ("packed_short", "the same packed as AWQ 4-bit (group 128) (another run)", "the same with `--random-quant AWQ`",
     "h200_8b_packed_AWQ_int8x.json, h200_8b_bf16_int8x_session.json"),
    ("packed_short", "the same packed as Q8_0 (another run)", "the same with `--random-quant Q8_0`",
     "h200_8b_packed_Q8_0_int8x.json, h200_8b_bf16_int8x_q8_session.json"),
    ("packed_short", "the same as FP8 e4m3, one scale per output channel (another run)",
     "the same with `--random-quant FP8`", "h200_8b_packed_FP8_row.json, h200_8b_bf16_fp8_session.json"),
    ("packed_short", "H100, the same packed as a compressed-tensors W4A16 checkpoint (int4, group 128, no zero "
     "points), with bf16 and AWQ in the same call", "the same with `--random-quant W4A16` (and `AWQ`)",
     "h100_8b_packed_W4A16_session56.json, h100_8b_bf16_session56.json, h100_8b_packed_AWQ_session56.json"),
    ("packed_short", "H100, the same packed as Q4_K_M, x rounded to int8 once by the norm and the activation before "
     "the projections (the default; bf16 from an earlier call)",
     "the same (and with `LOCALCHAT_PACKED_ROUNDED_X=0`)",
     "h100_8b_packed_Q4_K_M_rounded_x1.json, h100_8b_bf16_session56.json, h100_8b_packed_Q4_K_M_rounded_x0.json"),
    ("packed_short", "H100, the same as FP8 e4m3 in 128 x 128 blocks (DeepSeek-V3's and Qwen3's FP8 files), same call",
     "the same with `--random-quant FP8-block` (and `FP8`)",
     "h100_8b_packed_FP8-block_session56.json, h100_8b_bf16_session56.json, h100_8b_packed_FP8_session56.json"),
    ("packed_short", "Qwen2.5-7B shape (widths 3,584 and 18,944), random weights packed as Q4_K_M, no draft loaded",
     f"`{QWEN}` (and without `--random-quant`)",
     "h200_qwen7b_packed_Q4_K_M_int8x.json, h200_qwen7b_bf16_int8x_session.json"),
    ("packed_short", "the same packed as AWQ 4-bit (group 128)", "the same with `--random-quant AWQ`",
     "h200_qwen7b_packed_AWQ_int8x.json, h200_qwen7b_bf16_int8x_session.json"),
    ("packed_short", "H100, Llama-3.2-1B shape (width 2,048), random weights packed as Q4_K_M, no draft loaded",
     f"`{SMALL_1B}` (and without `--random-quant`)", "h100_1b_packed_Q4_K_M.json, h100_1b_bf16.json"),
    ("packed_short", "H100, the demo's shape (SmolLM2-135M, widths 576 and 1,536) packed as Q4_1, no draft loaded "
     "(the demo itself loads as bf16 by default)", f"`{SMALL_DEMO}` (and without `--random-quant`)",
     "h100_demo_shape_packed_Q4_1.json, h100_demo_shape_bf16.json, h100_demo_shape_packed_Q4_1_own_o.json"),
    ("spec_packed", "H100, the same packed as Q4_1 with a random head forced to 3.5 tokens per verify step (the "
     "verify rows on the batch-invariant packed kernel; no EOS, 4 prompts of 256 tokens)",
     "`localchat bench --random-weights benchmarks/configs/smollm2-135m.json --random-quant Q4_1 --force-accept 3.5 "
     "--prompts 4 --new-tokens 256 --no-peer` (and without `--random-quant`)",
     "h100_demo_shape_packed_Q4_1_forced35_pdl.json, h100_demo_shape_bf16_forced35_pdl_session.json"),
    ("spec_packed", "H100, the demo's own Q4_1 file decoded packed (`LOCALCHAT_PACKED_WEIGHTS=1`) with its EAGLE-3 "
     "head, 8 unseen requests, answers ending at EOS (the demo loads as bf16 by default)",
     "`LOCALCHAT_PACKED_WEIGHTS=1 localchat bench --model demo --prompts-file benchmarks/prompts/unseen_requests.txt "
     "--prompts 8 --new-tokens 256 --no-peer` (and `=0`)",
     "h100_real_demo_Q4_1_packed.json, h100_real_demo_Q4_1_bf16.json"),
    ("prefill", "the same Q4_K_M file's prefill of 512-token prompts, each weight tile decoded inside the matmul",
     "the same with `--new-tokens 32`, `LOCALCHAT_PACKED_PREFILL=torch` for the slices",
     "h200_8b_prefill_Q4_K_M_fused.json, h200_8b_prefill_Q4_K_M_torch.json, h200_8b_bf16_row_session.json"),
    ("packed_memory", "8B shape as a Q4_K_M file, embeddings and lm_head packed too: GPU memory, 4,096-token cache",
     "python benchmarks/memory_breakdown.py --quant Q4_K_M", "h200_memory_8b_Q4_K_M_packed_tables.json"),
    ("spec", "Q4_K_M packed, random head forced to 3.5 tokens per verify step, k = 5 (an earlier run, before "
     "the one-row kernel: against an engine with no draft as it runs now, 436 tok/s, this is 1.06x)",
     "localchat bench --random-weights llama-8b --random-quant Q4_K_M --force-accept 3.5 --prompts 2 "
     "--new-tokens 256 --no-peer", "h200_8b_packed_Q4_K_M_forced35.json"),
    ("startup", "a fresh `localchat run --model demo` to the first byte of its answer, warm machine",
     "python benchmarks/startup.py --model demo --runs 4", "h200_startup_first_token_pyc_final_session10.json"),
    ("plain_cpu", "CPU, 2 cores, fp32: plain decode, demo model",
     "localchat bench --model demo --device cpu --draft none --new-tokens 128" + BEFORE, "cpu_demo_plain.json"),
    ("spec", "CPU, 2 cores: greedy speculation, demo model + head, 6 unseen requests, at most 128 tokens "
     "(a CPU measures at first load whether it pays by 1.1x or more)",
     "localchat bench --model demo --device cpu --prompts-file benchmarks/prompts/unseen_requests.txt --prompts 6 "
     "--new-tokens 128 --no-peer", "cpu_demo_sampledft_unseen.json"),
)


def _load(name: str) -> dict:
    return json.loads((ROOT / "benchmarks" / "results" / name).read_text())


def _tok_s(x: float) -> str:
    """A speed as the table shows it: whole tokens/s, a decimal below 100."""
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"


def row(kind: str, label: str, command: str, name: str) -> str:
    """One table row: | what | result | compared with, same run | command | JSON |."""
    files = [n.strip() for n in name.split(",")]
    b = _load(files[0])
    if kind in ("packed", "packed_short"):  # a packed run beside the bf16 run of the same session
        base = _load(files[1])
        tok, peak = b["no_draft"]["decode_tok_s"], b["peak_gpu_mem_GB"]
        btok, bpeak = base["no_draft"]["decode_tok_s"], base["peak_gpu_mem_GB"]
        if kind == "packed":
            result = f"{tok:.0f} tok/s, peak GPU memory {peak:.1f} GB"
            versus = (f"bf16, no draft loaded: {btok:.0f} tok/s, {bpeak:.1f} GB ({tok / btok:.2f}x the speed, "
                      f"{peak / bpeak:.2f}x the memory)")
        else:
            result = f"{tok:.0f} tok/s, peak {peak:.1f} GB"
            versus = f"bf16: {btok:.0f} tok/s ({tok / btok:.2f}x, {peak / bpeak:.2f}x the memory)"
        if len(files) > 2:  # the same packed model with x kept in bf16, or on the batch-invariant kernel
            off = _load(files[2])["no_draft"]["decode_tok_s"]
            what = ("x kept in bf16 (`LOCALCHAT_PACKED_ROW_X=bf16`)" if "bf16x" in files[2]
                    else "each k-quant group's factors apart (the layout before), same call"
                    if "factors_apart" in files[2]
                    else "q, k and v in two launches (`LOCALCHAT_PACKED_ONE_LAUNCH=0`), same call"
                    if "two_launches" in files[2]
                    else "AWQ 4-bit (group 128), same call" if "_packed_AWQ_" in files[2]
                    else "FP8 per output channel, same call" if "_packed_FP8_" in files[2]
                    else "x rounded in every program (`LOCALCHAT_PACKED_ROUNDED_X=0`), same call"
                    if "rounded_x0" in files[2]
                    else "o_proj rounding its own x (`LOCALCHAT_PACKED_ROUNDED_O=0`), same call"
                    if "own_o" in files[2]
                    else "the batch-invariant kernel")
            versus += f"; {what}: {off:.0f} tok/s ({tok / off:.2f}x)"
    elif kind == "prefill":  # packed_matmul against the torch slices (same machine), bf16 from a run beside
        got, old, bf16 = (_load(f)["no_draft"] for f in files)
        result = f"{got['prefill_tok_s']:.0f} tok/s, first token {1000 * got['ttft_s']:.0f} ms"
        versus = (f"slices dequantized by the torch reference: {old['prefill_tok_s']:.0f} tok/s "
                  f"({got['prefill_tok_s'] / old['prefill_tok_s']:.1f}x); bf16 (an earlier run, another H200): "
                  f"{bf16['prefill_tok_s']:.0f} tok/s, first token {1000 * bf16['ttft_s']:.0f} ms")
    elif kind == "packed_memory":
        phases = b["phases"]
        prefill = next(v for k, v in phases.items() if k.startswith("prefill"))
        result = (f"{prefill['peak_since_last_GB']:.2f} GB at a 512-token prefill's peak, "
                  f"{phases['8 decode steps']['allocated_GB']:.2f} GB decoding")
        names = {"model.embed_tokens": "embeddings", "kv cache": "KV cache"}
        versus = ", ".join(f"{names.get(k, k)} {v:.2f} GB" for k, v in b["held_GB"].items() if v >= 0.01)
    elif kind == "plain_8b":
        p, t = b["plain"], b["transformers"]
        limit = step_limit_tok_s(b)
        result = (f"{p['decode_tok_s']:.1f} tok/s, {p['decode_tok_s'] / limit * 100:.1f}% of the "
                  f"bandwidth limit ({limit:.1f} tok/s: the weights a step reads at the measured copy bandwidth)")
        versus = f"`transformers` generate {t['decode_tok_s']:.1f} tok/s: {b['speedup_vs_transformers']:.1f}x"
    elif kind == "startup_8b":
        result, versus = f"{b['startup_s']:.1f} s", ""
    elif kind == "plain":
        result, versus = f"{b['plain']['decode_tok_s']:.0f} tok/s", ""
    elif kind == "plain_cpu":
        t = b["transformers"]
        result = f"{b['plain']['decode_tok_s']:.1f} tok/s"
        versus = f"`transformers` generate {t['decode_tok_s']:.1f} tok/s: {b['speedup_vs_transformers']:.2f}x"
    elif kind == "spec":
        s = b["spec"]
        result = f"{_tok_s(s['decode_tok_s'])} tok/s, accepted length {s['accept_len_mean']:.2f}"
        if "speedup_vs_no_draft" in s:
            versus = (f"no draft loaded, {_tok_s(b['no_draft']['decode_tok_s'])} tok/s: {s['speedup_vs_no_draft']:.2f}x "
                      f"(draft loaded, speculation off, {_tok_s(b['plain']['decode_tok_s'])} tok/s: "
                      f"{s['speedup_vs_draft_off']:.2f}x)")
        else:  # written before bench measured against an engine with no draft loaded
            versus = f"plain decode, draft loaded, {b['plain']['decode_tok_s']:.0f} tok/s: {s['speedup']:.2f}x"
    elif kind == "spec_packed":  # packed speculation, its own no-draft run, and bf16's with the same head
        s, bf = b["spec"], _load(files[1])["spec"]
        result = f"{_tok_s(s['decode_tok_s'])} tok/s, accepted length {s['accept_len_mean']:.2f}"
        versus = (f"no draft loaded, {_tok_s(b['no_draft']['decode_tok_s'])} tok/s: {s['speedup_vs_no_draft']:.2f}x; "
                  f"bf16 with the same head: {_tok_s(bf['decode_tok_s'])} tok/s "
                  f"({s['decode_tok_s'] / bf['decode_tok_s']:.2f}x)")
    elif kind.startswith("tree:"):  # one shape of a benchmarks/tree_shapes.py sweep
        settings = b["settings"]
        s, nd, off = settings[kind[len("tree:"):]], settings["no_draft"], settings["draft_off"]
        result = f"{_tok_s(s['decode_tok_s'])} tok/s, accepted length {s['accept_len_mean']:.2f}"
        versus = (f"no draft loaded, {_tok_s(nd['decode_tok_s'])} tok/s: {s['decode_tok_s'] / nd['decode_tok_s']:.2f}x "
                  f"(draft loaded, speculation off, {_tok_s(off['decode_tok_s'])} tok/s: "
                  f"{s['decode_tok_s'] / off['decode_tok_s']:.2f}x)")
    elif kind == "no_draft":
        nd, off = b["no_draft"], b["plain"]
        result = f"{nd['decode_tok_s']:.0f} tok/s"
        versus = f"the same engine with its draft loaded, speculation off: {off['decode_tok_s']:.0f} tok/s ({off['speedup_vs_no_draft']:.2f}x)"
    elif kind == "identical_bench":
        s = b["spec"]
        result, versus = f"{s['same_tokens_as_draft_off']} of {b['prompts']} answers identical", ""
    elif kind == "identical":
        result, versus = f"{b['identical']} of {b['prompts']} answers identical", ""
    elif kind == "startup":
        runs = ", ".join(f"{r['first_token_s']:.2f}" for r in b["runs"])
        result, versus = f"{b['best_later_run_s']:.2f} s (runs: {runs} s)", ""
    else:
        raise ValueError(f"unknown row kind {kind!r}")
    shown = command if "`" in command else f"`{command}`"  # a command with its own markup stays as written
    return f"| {label} | {result} | {versus} | {shown} | {', '.join(f'`{n}`' for n in files)} |"


def rows() -> list[str]:
    return ["| what (one H200 unless it says CPU) | result | compared with, same run | command | JSON in benchmarks/results/ |",
            "|---|---|---|---|---|", *(row(*spec) for spec in ROWS)]


def main() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    table = "\n".join([START, *rows(), END])
    if START in text:
        text = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: table, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + table + "\n"
    readme.write_text(text)


if __name__ == "__main__":
    main()
