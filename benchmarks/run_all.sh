#!/usr/bin/env bash
# Every figure of the README's benchmark table, on one CUDA GPU, into one folder of JSON files:
#
#     bash benchmarks/run_all.sh OUTDIR [quick]
#
# Needs the demo model (and, for held-out prompts, the chitchat data set) in the cache: run
# `localchat run --model demo hi` and `python -c "from speculative.train.data import
# load_chitchat; load_chitchat()"` once with network first. About 10 minutes on an H200
# ("quick": the demo rows only, about 4). To refresh the README's table, copy a file into
# benchmarks/results/, point its row (ROWS in benchmarks/update_readme.py) at it, then run that.
set -u
out=${1:?usage: bash benchmarks/run_all.sh OUTDIR [quick]}
mode=${2:-full}
mkdir -p "$out"
cd "$(dirname "$0")/.."
lc() { python3 -m app.cli "$@"; }
step() { echo "== $*" >&2; }

step "demo + shipped head, greedy, k = 5 (no draft, speculation off, on; held-out prompts)"
lc bench --model demo --prompts 8 --no-peer --out "$out/h200_demo_spec.json"
step "the same on held-out instruction-style requests"
lc bench --model demo --prompts 8 --no-peer --prompt-set instruct --out "$out/h200_demo_spec_instruct.json"
step "the same at temperature 0.7"
lc bench --model demo --prompts 8 --no-peer --temperature 0.7 --out "$out/h200_demo_spec_t07.json"
step "sampled speculation with top-p and top-k + min-p"
python3 benchmarks/sampled_cuts.py "$out/h200_demo_sampled_cuts.json"
step "start-up of fresh localchat run processes (first byte of the answer)"
# Python must keep bytecode, as after a pip install: an image with PYTHONDONTWRITEBYTECODE=1 and
# no __pycache__ compiles torch's sources in every process (seconds of import).
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX="${PYTHONPYCACHEPREFIX:-$out/.pyc}"
python3 benchmarks/startup.py --model demo --runs 4 --out "$out/h200_startup_first_token.json"
for i in 1 2; do python3 benchmarks/startup_phases.py --defer; done > "$out/h200_startup_phases.jsonl"
step "demo model, no draft, against transformers"
lc bench --model demo --draft none --prompts 4 --out "$out/h200_demo_plain.json"
[ "$mode" = quick ] && exit 0

step "8B shape, random weights, against transformers"
lc bench --random-weights llama-8b --prompts 2 --out "$out/h200_8b_plain.json"
step "8B shape, forced accept length 4"
lc bench --random-weights llama-8b --force-accept 4 --draft-steps 5 --prompts 1 --no-peer \
    --out "$out/h200_8b_forced_accept4.json"
step "chat app attached (headless) against the bare engine"
python3 benchmarks/bench_ui.py --model demo --device cuda --out "$out/h200_ui_cost.json"
step "programmatic dependent launch off vs on"
python3 benchmarks/pdl.py --models demo,benchmarks/configs/smollm2-135m.json,llama-8b --rounds 3 --out "$out/h200_pdl.json"
step "train-draft's generation and teacher features, old paths vs new"
python3 benchmarks/teacher_paths.py --out "$out/h200_teacher_paths.json"
step "kernel-routing variants of the 8B decode step"
python3 benchmarks/variants.py --models llama-8b --variants base,row_cublas,gated_off,tail_off,rope_apart --rounds 3 --out "$out/h200_variants_8b.json"
step "the lean draft step and one-launch acceptance against the greedy iteration before them"
python3 benchmarks/variants.py --models demo --variants base,lean_off --prompts 8 --rounds 3 --out "$out/h200_variants_lean.json"
python3 benchmarks/variants.py --models llama-8b --force-accept 4 --variants base,lean_off --rounds 2 \
    --out "$out/h200_variants_lean_8b.json"
step "runners-up in greedy verify steps: none, 2 for every draft, the default shape"
python3 benchmarks/variants.py --models demo --variants alts0,alts2,altsauto --prompts 8 --rounds 3 \
    --out "$out/h200_variants_alts.json"
step "kernels of one greedy speculative iteration, with and without runners-up"
python3 benchmarks/profile_iteration.py "$out/h200_iter_profile.json"
LOCALCHAT_SPEC_ALTS=0 python3 benchmarks/profile_iteration.py "$out/h200_iter_profile_alts0.json"
