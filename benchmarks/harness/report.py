"""`localchat bench`'s report: each setting's figures summed over the prompts, and the table."""

from __future__ import annotations

import statistics

from benchmarks.harness.timing import summed_tok_s

# Per-answer figures kept in a setting's per_prompt list (token ids are compared, not kept).
PER_PROMPT = ("decode_tok_s", "ttft_s", "prefill_tok_s", "generated_tokens", "decode_s", "accept_len_mean",
              "accept_hist", "accept_by_span")


def summary(runs: list[dict], hist_length: int = 0) -> dict:
    """One setting over the prompts: decode tokens/s (summed_tok_s), mean time to first token and
    prefill speed, the tokens generated; with speculation (hist_length > 0) the verify steps'
    histogram summed and the mean accepted length over all of them."""
    out = {"decode_tok_s": summed_tok_s(runs), "ttft_s": statistics.mean(r["ttft_s"] for r in runs),
           "prefill_tok_s": statistics.mean(r["prefill_tok_s"] for r in runs),
           "generated_tokens": sum(r["generated_tokens"] for r in runs),
           "decode_s": sum(r["decode_s"] for r in runs)}
    if hist_length:
        hist = accept_hist_total(runs, hist_length)
        steps = sum(hist)
        out["accept_len_mean"] = sum(n * c for n, c in enumerate(hist)) / steps if steps else 0.0
        out["accept_hist"] = hist
        verified = [(r.get("verify_steps") or 0, r.get("verify_tokens") or 0.0) for r in runs]
        total = sum(n for n, _ in verified)
        out["verify_tokens"] = sum(n * v for n, v in verified) / total if total else 0.0  # a step's target rows
        out["accept_len_by_span"] = accept_by_span_total(runs)
    out["per_prompt"] = [{k: r[k] for k in PER_PROMPT if k in r} for r in runs]
    return out


def accept_by_span_total(runs: list[dict]) -> dict:
    """The prompts' accept_by_span summed: for each ACCEPT_SPAN answer tokens, the verify steps
    that began there and their mean accepted length (None where no answer reached it)."""
    from engine.types import ACCEPT_SPAN

    steps: list[int] = []
    tokens: list[int] = []
    for run in runs:
        for j, (n, t) in enumerate(run.get("accept_by_span") or []):
            steps += [0] * (j + 1 - len(steps))
            tokens += [0] * (j + 1 - len(tokens))
            steps[j] += n
            tokens[j] += t
    return {"span_tokens": ACCEPT_SPAN, "steps": steps,
            "accept_len": [round(t / n, 3) if n else None for n, t in zip(steps, tokens)]}


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


def _span_line(spans: dict) -> str:
    return " · ".join("-" if a is None else f"{a:.2f} ({n})" for a, n in zip(spans["accept_len"], spans["steps"]))


def _speed(s: dict) -> str:
    return f"{s['decode_tok_s']:.1f} tok/s, TTFT {s['ttft_s'] * 1000:.1f} ms"


def _table(r: dict) -> str:
    n = r["prompts"]
    ending = "exactly" if r["ignore_eos"] else "end at EOS, at most"
    rows = [("prompts", f"{n}: {r['prompt_set']}")]
    if r.get("system_prompt") is not None:
        rows.append(("system prompt", repr(r["system_prompt"]) if r["system_prompt"] else "none"))
    rows += [("answers", f"{ending} {r['new_tokens']} tokens ({r['no_draft']['generated_tokens'] / n:.1f} "
                         "on average with no draft)"),
             ("startup (load + capture)", f"{r['startup_s']:.2f} s"),
             ("plain decode, no draft", _speed(r["no_draft"]))]
    if r.get("bandwidth_limit_tok_s"):
        rows.append(("bandwidth limit", f"{r['bandwidth_limit_tok_s']:.1f} tok/s "
                                        f"({r['no_draft']['fraction_of_bandwidth_limit'] * 100:.1f}% reached)"))
    off = r["plain"]
    if "speedup_vs_no_draft" in off:  # a draft is loaded
        rows.append(("plain decode, draft loaded", f"{_speed(off)} ({off['speedup_vs_no_draft']:.2f}x no draft)"))
    if "spec" in r:
        s = r["spec"]
        rows.append(("speculative decode", f"{s['decode_tok_s']:.1f} tok/s, accept len {s['accept_len_mean']:.2f}: "
                                           f"{s['speedup_vs_no_draft']:.2f}x no draft "
                                           f"({s['speedup_vs_draft_off']:.2f}x draft loaded, speculation off)"))
        if _hist_line(s.get("accept_hist", [])):
            rows.append(("tokens per verify step", _hist_line(s["accept_hist"])))
        spans = s.get("accept_len_by_span") or {}
        if len(spans.get("accept_len") or []) > 1:
            rows.append((f"accept len per {spans['span_tokens']} tokens", _span_line(spans)))
        if s.get("verify_tokens"):
            used = f": {r['tree_used']}" if r.get("tree_used") and r.get("tree_used") != r.get("tree") else ""
            tree = f" (draft tree {r['tree']}{used})" if r.get("tree") else ""
            rows.append(("tokens verified per step", f"{s['verify_tokens']:.1f}{tree}"))
        chose = r.get("runners_up")
        by = f" ({chose['by']})" if chose else ""
        if any(r.get("draft_alternatives") or ()) and not r.get("temperature"):
            rows.append(("runners-up verified", ", ".join(map(str, r["draft_alternatives"])) + " (drafts 1.."
                         f"{len(r['draft_alternatives'])})" + by))
        elif chose and not r.get("temperature"):
            rows.append(("runners-up verified", "none, the chain alone" + by))
    same = [(what, r[key]["same_tokens_as_no_draft"]) for what, key in (("draft loaded", "plain"), ("speculation", "spec"))
            if key in r and "same_tokens_as_no_draft" in r[key]]
    if same:
        rows.append(("same tokens as no draft", ", ".join(f"{what} {k} of {n} answers" for what, k in same)))
    if "transformers" in r:
        rows.append(("transformers generate", f"{r['transformers']['decode_tok_s']:.1f} tok/s "
                                              f"(ours, no draft, {r['speedup_vs_transformers']:.1f}x)"))
    return "\n".join(f"{a:<27} {b}" for a, b in rows)
