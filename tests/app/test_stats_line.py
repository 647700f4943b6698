"""The line under an answer: speed, time to first token, and what speculation did."""

from engine.types import GenerationStats

from app.widgets.stats_line import format_stats


def test_speculation_on_off_and_decided_by_a_server():
    on = GenerationStats(decode_tok_s=42.0, ttft_s=0.1, generated_tokens=9, speculative=True, draft_steps=5,
                         accept_len_mean=2.5)
    assert "spec k=5, accept len 2.50" in format_stats(on)
    assert "accept 2.50" in format_stats(on, compact=True)
    off = GenerationStats(decode_tok_s=42.0, speculative=False)
    assert format_stats(off).endswith("spec off") and format_stats(off, compact=True).endswith("spec off")
    # A server other than localchat's decides speculation itself and does not report it.
    server = GenerationStats(decode_tok_s=42.0, speculative=None)
    assert format_stats(server).endswith("spec: the server's")
    assert format_stats(server, compact=True).endswith("spec: the server's")
    assert "spec off" not in format_stats(server)
    # vLLM's or SGLang's own figures: an accepted length without a draft count
    published = GenerationStats(decode_tok_s=42.0, speculative=True, accept_len_mean=2.33)
    assert format_stats(published).endswith("spec accept len 2.33") and "k=" not in format_stats(published)
    tree = GenerationStats(decode_tok_s=42.0, speculative=True, draft_steps=5, accept_len_mean=3.1, tree="4,5,24")
    assert "spec tree 4,5,24, accept len 3.10" in format_stats(tree)
