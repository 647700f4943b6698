"""The tree step's kernel switches timed as a user meets them: `localchat bench` on the unseen
requests (greedy, answers ending at EOS, each run against no draft loaded in its own process),
one process for each arm and --tree shape, and one JSON of them all, written after every run
(a run cut off by a time limit keeps the runs before it).

Arms (--arms, comma-separated), each a set of LOCALCHAT_* switches over the environment's:
  base      the defaults
  before    the tree step's switches off (KernelOptions.draft_rows, rope_in_tree, tree_kv_move,
            tree_select_passes, tree_level_keys: SWITCHES below) and LOCALCHAT_ROW_STATS=down,
            the defaults before they were timed
  down      LOCALCHAT_ROW_STATS=down (a verify step's down on the one-row tile row by row)
  no_draft_rows, no_rope_in_tree, no_kv_move, no_select_passes, no_level_keys
            one of SWITCHES off
  select_blocks
            LOCALCHAT_TREE_SELECT_BLOCKS=1 (tree_select comparing every pair, off until timed)

    python benchmarks/tree_switches.py --out h100_tree_switches.json --tree 4,4,8 --tree 4,8,15 --tree off
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SWITCHES = {"draft_rows": "LOCALCHAT_DRAFT_ROWS", "rope_in_tree": "LOCALCHAT_ROPE_IN_TREE",
            "kv_move": "LOCALCHAT_TREE_KV_MOVE", "select_passes": "LOCALCHAT_TREE_SELECT_PASSES",
            "level_keys": "LOCALCHAT_TREE_LEVEL_KEYS"}
ARMS = {"base": {}, "before": {**{name: "0" for name in SWITCHES.values()}, "LOCALCHAT_ROW_STATS": "down"},
        "down": {"LOCALCHAT_ROW_STATS": "down"},
        # one of SWITCHES off at a time, to tell their shares apart
        **{f"no_{arm}": {name: "0"} for arm, name in SWITCHES.items()},
        "select_blocks": {"LOCALCHAT_TREE_SELECT_BLOCKS": "1"}}
PROMPTS = ROOT / "benchmarks" / "prompts" / "unseen_requests.txt"


def fail(message: str) -> None:
    print(f"tree_switches.py: {message}", file=sys.stderr)
    raise SystemExit(1)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the JSON report")
    ap.add_argument("--tree", action="append", default=None,
                    help="a shape, TOPK,DEPTH,TOKENS or off (the chain); repeat it (default: 4,4,8, 6,8,15, off)")
    ap.add_argument("--arms", default="base,before", help=f"comma-separated, of {', '.join(ARMS)}")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--new-tokens", type=int, default=384)
    ap.add_argument("--timeout", type=int, default=120, help="seconds a run may take")
    ap.add_argument("--dry-run", action="store_true", help="print the runs, run nothing")
    a = ap.parse_args(argv)
    from engine.errors import UserError
    from speculative.tree.shape import TreeShape, parse_tree

    a.tree = a.tree or ["4,4,8", "6,8,15", "off"]
    for tree in a.tree:
        try:
            shape = parse_tree(tree)
        except (UserError, ValueError):
            shape = "bad"
        if tree.strip().lower() != "off" and not isinstance(shape, TreeShape):
            fail(f"--tree {tree!r}: give TOPK,DEPTH,TOKENS such as 6,8,15, or off (the chain)")
    a.arms = [arm for arm in a.arms.split(",") if arm]
    unknown = [arm for arm in a.arms if arm not in ARMS]
    if unknown or not a.arms:
        fail(f"--arms: unknown {', '.join(unknown) or '(none given)'}; use {', '.join(ARMS)}")
    if a.prompts < 1 or a.new_tokens < 1 or a.timeout < 1:
        fail("--prompts, --new-tokens and --timeout must be positive")
    return a


def summary(report: dict) -> dict:
    nd, spec = report.get("no_draft", {}), report.get("spec", {})
    return {"no_draft_tok_s": nd.get("decode_tok_s"), "spec_tok_s": spec.get("decode_tok_s"),
            "speedup": spec.get("speedup_vs_no_draft"), "accept_len": spec.get("accept_len_mean"),
            "same_tokens_as_draft_off": spec.get("same_tokens_as_draft_off")}


def main(argv: list[str] | None = None) -> None:
    a = parse(argv)
    out = {"machine": {"python": platform.python_version(), "host": platform.node()},
           "prompts_file": str(PROMPTS.relative_to(ROOT)), "prompts": a.prompts, "new_tokens": a.new_tokens,
           "arms": {arm: ARMS[arm] for arm in a.arms}, "runs": []}
    for tree in a.tree:
        for arm in a.arms:
            with tempfile.TemporaryDirectory() as tmp:
                report_path = Path(tmp) / "bench.json"
                cmd = [sys.executable, "-c", "from app.cli import main; main()", "bench", "--model", "demo",
                       "--prompts-file", str(PROMPTS), "--prompts", str(a.prompts), "--new-tokens",
                       str(a.new_tokens), "--no-peer", "--tree", tree, "--out", str(report_path)]
                env_text = " ".join(f"{k}={v}" for k, v in ARMS[arm].items())
                if a.dry_run:
                    print(f"{env_text} {' '.join(cmd[3:])}".strip())
                    continue
                try:
                    run = subprocess.run(cmd, env={**os.environ, **ARMS[arm]}, cwd=ROOT, capture_output=True,
                                         text=True, timeout=a.timeout)
                    rc, tail = run.returncode, (run.stderr or run.stdout).strip().splitlines()[-3:]
                except subprocess.TimeoutExpired:
                    rc, tail = "timeout", []
                report = json.loads(report_path.read_text()) if report_path.exists() else {}
            row = {"arm": arm, "tree": tree, "rc": rc, **summary(report), "report": report}
            if rc != 0:
                row["error_tail"] = tail
            out["runs"].append(row)
            Path(a.out).write_text(json.dumps(out, indent=1))
            speed = f"{row['speedup']:.3f}x" if row["speedup"] else "-"
            print(f"{tree:8s} {arm:16s} rc={rc} no draft {row['no_draft_tok_s']} spec {row['spec_tok_s']} ({speed}) "
                  f"accepted {row['accept_len']} same {row['same_tokens_as_draft_off']}", flush=True)


if __name__ == "__main__":
    main()
