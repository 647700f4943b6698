"""`localchat bench`'s report as a table, and the accepted-length histograms it sums."""

from __future__ import annotations


def accept_hist_total(runs: list[dict], length: int = 0) -> list[int]:
    """The prompts' accept_hist summed (at least `length` entries): entry n counts the verify
    steps that gave n tokens."""
    total = [0] * length
    for run in runs:
        hist = run.get("accept_hist") or []
        total += [0] * (len(hist) - len(total))
        for n, count in enumerate(hist):
            total[n] += count
    return total


def _hist_line(hist: list[int]) -> str:
    steps = sum(hist)
    return " · ".join(f"{n}: {c / steps * 100:.0f}%" for n, c in enumerate(hist) if n) if steps else ""


def _table(r: dict) -> str:
    rows = [("prompts", f"{r['prompts']}: {r['prompt_set']}"),
            ("startup (load + capture)", f"{r['startup_s']:.2f} s"),
            ("plain decode", f"{r['plain']['decode_tok_s']:.1f} tok/s"),
            ("plain TTFT", f"{r['plain']['ttft_s'] * 1000:.1f} ms")]
    if r.get("bandwidth_limit_tok_s"):
        rows.append(("bandwidth limit", f"{r['bandwidth_limit_tok_s']:.1f} tok/s "
                                        f"({r['plain']['fraction_of_bandwidth_limit'] * 100:.1f}% reached)"))
    if "spec" in r:
        rows.append(("speculative decode", f"{r['spec']['decode_tok_s']:.1f} tok/s, accept len "
                                           f"{r['spec']['accept_len_mean']:.2f}, {r['spec']['speedup']:.2f}x plain"))
        if _hist_line(r["spec"].get("accept_hist", [])):
            rows.append(("tokens per verify step", _hist_line(r["spec"]["accept_hist"])))
        if any(r.get("draft_alternatives") or ()) and not r.get("temperature"):
            rows.append(("runners-up verified", ", ".join(map(str, r["draft_alternatives"])) + " (drafts 1.."
                         f"{len(r['draft_alternatives'])})"))
    if "transformers" in r:
        rows.append(("transformers generate", f"{r['transformers']['decode_tok_s']:.1f} tok/s "
                                              f"(ours {r['speedup_vs_transformers']:.1f}x)"))
    return "\n".join(f"{a:<26} {b}" for a, b in rows)
