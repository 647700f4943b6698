"""A replayed step's launches summed by stretch, from a profile_iteration.py JSON (its
`graph_slots`: each launch of the graph in order, its duration and the gap before it, negative
where PDL overlapped it with the launch before). A stretch starts at a marker launch and runs to
the next one; its wall time is the sum of durations and gaps, so an overlap is counted once.

Markers (--markers, comma-separated name fragments; the default's): the target's embedding lookup
(`embed_rows`: the verify forward), a tree level (`tree_level`), the kept nodes (`tree_select`),
the greedy acceptance (`greedy_verify`, `tree_accept`, and torch's reduce before tree_accept: the
argmax), a draft step's first launch (`embed_pair_norm`) and a chain's pick (`draft_pick`).

    python benchmarks/profile_stretches.py benchmarks/results/h200_profile_tree_kernels_6-8-15.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MARKERS = ("embed_rows", "tree_level", "tree_select", "greedy_verify", "tree_accept", "reduce_kernel<512",
           "embed_pair_norm", "draft_pick")


def stretches(slots: list[dict], markers=MARKERS) -> list[dict]:
    """[{marker, first, launches, wall_us}] in launch order; launches before the first marker go to
    a stretch named "start"."""
    out = [{"marker": "start", "first": 0, "launches": 0, "wall_us": 0.0}]
    for i, slot in enumerate(slots):
        hit = next((m for m in markers if m in slot["name"]), None)
        if hit is not None:
            out.append({"marker": hit, "first": i, "launches": 0, "wall_us": 0.0})
        out[-1]["launches"] += 1
        out[-1]["wall_us"] += slot["us"] + slot["gap_before_us"]
    return [{**s, "wall_us": round(s["wall_us"], 3)} for s in out if s["launches"]]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", help="a profile_iteration.py JSON")
    ap.add_argument("--markers", default=",".join(MARKERS))
    ap.add_argument("--out", default=None, help="also write the stretches here as JSON")
    a = ap.parse_args(argv)
    try:
        slots = json.loads(Path(a.profile).read_text())["graph_slots"]
        assert isinstance(slots, list) and all({"name", "us", "gap_before_us"} <= set(s) for s in slots)
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        print(f"profile_stretches.py: {a.profile}: not a profile_iteration.py JSON with graph_slots", file=sys.stderr)
        raise SystemExit(1)
    markers = tuple(m for m in a.markers.split(",") if m)
    rows = stretches(slots, markers)
    by_marker: dict[str, dict] = {}
    for r in rows:
        entry = by_marker.setdefault(r["marker"], {"stretches": 0, "launches": 0, "wall_us": 0.0})
        entry["stretches"] += 1
        entry["launches"] += r["launches"]
        entry["wall_us"] = round(entry["wall_us"] + r["wall_us"], 3)
    for r in rows:
        print(f"[{r['first']:4d}] {r['marker']:18s} {r['launches']:4d} launches {r['wall_us']:8.1f} us")
    print(f"total {sum(r['wall_us'] for r in rows):.1f} us in {len(slots)} launches")
    for name, e in by_marker.items():
        print(f"  {name:18s} x{e['stretches']:<3d} {e['launches']:4d} launches {e['wall_us']:8.1f} us")
    if a.out:
        Path(a.out).write_text(json.dumps({"profile": a.profile, "stretches": rows, "by_marker": by_marker}, indent=1))


if __name__ == "__main__":
    main()
