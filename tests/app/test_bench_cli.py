"""`localchat bench` as the command line runs it, on CPU with tiny models: the JSON report's
contract (plain, speculative, the transformers peer, random weights from a config), and a bad
--out that fails before any work."""

import json

from app.cli import main


def _head(tmp_path, target):
    from tests.speculative.heads import head_tensors, write_head
    from tests.tiny import read_config

    cfg = read_config(target)
    return write_head(tmp_path / "head", cfg, "sglang", head_tensors(64, 64, 3, cfg["vocab_size"], 200), 64,
                      (0, 1, 2))


def test_bench_reports_plain_speculative_and_the_peer(tmp_path, tiny_models, capsys):
    out = tmp_path / "r.json"
    code = main(["bench", "--model", str(tiny_models["llama"]), "--draft", str(_head(tmp_path, tiny_models["llama"])),
                 "--device", "cpu", "--prompts", "1", "--new-tokens", "8", "--out", str(out)])
    assert code == 0
    r = json.loads(out.read_text())
    assert r["prompts"] == 1 and r["prompt_set"] and r["draft_steps"] == 5 and r["new_tokens"] == 8
    assert r["plain"]["decode_tok_s"] > 0 and r["plain"]["ttft_s"] > 0 and r["startup_s"] > 0
    assert r["spec"]["accept_len_mean"] >= 1 and r["spec"]["speedup"] > 0 and len(r["spec"]["per_prompt"]) == 1
    assert r["transformers"]["decode_tok_s"] > 0 and r["speedup_vs_transformers"] > 0
    table = capsys.readouterr().out
    assert "plain decode" in table and "speculative decode" in table and "transformers generate" in table
    # the verify steps by tokens they gave, summed over the prompts, and their shares in the table
    hist = r["spec"]["accept_hist"]
    one = r["spec"]["per_prompt"][0]["accept_hist"]
    assert len(hist) == 7 and hist[:len(one)] == one and sum(hist) == sum(one) >= 1
    assert "tokens per verify step" in table and "6: " in table
    assert r["draft_alternatives"] is None and "runners-up" not in table  # the CPU verifies the chain alone


def test_bench_reports_the_runners_up_it_verified(tmp_path, tiny_models, monkeypatch, capsys):
    monkeypatch.setenv("LOCALCHAT_SPEC_ALTS", "auto")
    out = tmp_path / "r.json"
    code = main(["bench", "--model", str(tiny_models["llama"]), "--draft", str(_head(tmp_path, tiny_models["llama"])),
                 "--device", "cpu", "--prompts", "1", "--new-tokens", "8", "--no-peer", "--out", str(out)])
    assert code == 0
    assert json.loads(out.read_text())["draft_alternatives"] == [3, 3, 2, 1, 1]
    assert "runners-up verified        3, 3, 2, 1, 1 (drafts 1..5)" in capsys.readouterr().out


def test_accept_hist_total_sums_histograms_of_any_length():
    from benchmarks.harness.report import _hist_line, accept_hist_total

    assert accept_hist_total([{"accept_hist": [0, 2, 1]}, {"accept_hist": [0, 1, 0, 0, 3]}, {}]) == [0, 3, 1, 0, 3]
    assert accept_hist_total([{"accept_hist": [0, 2]}], 4) == [0, 2, 0, 0]
    assert _hist_line([0, 1, 0, 3]) == "1: 25% · 2: 0% · 3: 75%" and _hist_line([]) == ""


def test_bench_instruct_prompt_set(tmp_path, tiny_models):
    """--prompt-set instruct asks held-out built-in instruction prompts, and says so."""
    from benchmarks.harness.prompts import HELD_OUT_INSTRUCT, chat_prompts_from
    from speculative.train.instruct_prompts import instruct_prompts

    prompts, which = chat_prompts_from(3, "instruct")
    held = set(instruct_prompts(heldout=True))
    assert which == HELD_OUT_INSTRUCT and len(prompts) == 3
    assert all(len(m) == 1 and m[0]["role"] == "user" and m[0]["content"] in held for m in prompts)
    assert len({m[0]["content"] for m in prompts}) == 3
    out = tmp_path / "r.json"
    code = main(["bench", "--model", str(tiny_models["llama"]), "--device", "cpu", "--prompts", "2",
                 "--prompt-set", "instruct", "--new-tokens", "4", "--no-peer", "--out", str(out)])
    assert code == 0 and json.loads(out.read_text())["prompt_set"] == HELD_OUT_INSTRUCT


def test_bench_random_weights_from_a_config(tmp_path, tiny_models):
    out = tmp_path / "r.json"
    code = main(["bench", "--random-weights", str(tiny_models["qwen3"] / "config.json"), "--device", "cpu",
                 "--prompts", "1", "--prompt-tokens", "12", "--new-tokens", "6", "--no-peer", "--out", str(out)])
    assert code == 0
    r = json.loads(out.read_text())
    assert r["prompt_tokens"] == 12 and r["prompt_set"].startswith("random token ids")
    assert r["plain"]["decode_tok_s"] > 0 and "spec" not in r and "transformers" not in r


def test_bench_bad_out_fails_first(tmp_path, monkeypatch, capsys):
    import benchmarks.harness.run as setup

    def no_load(*a, **kw):
        raise AssertionError("loaded a model before checking --out")

    monkeypatch.setattr(setup, "build_bench_engine", no_load)
    assert main(["bench", "--model", "demo", "--out", str(tmp_path / "missing" / "r.json")]) == 2
    assert "--out" in capsys.readouterr().err
    assert main(["bench", "--model", "demo", "--out", str(tmp_path)]) == 2


def test_bench_bad_counts_are_one_line_errors(monkeypatch, capsys):
    import benchmarks.harness.run as setup

    def no_load(*a, **kw):
        raise AssertionError("loaded a model before checking the counts")

    monkeypatch.setattr(setup, "build_bench_engine", no_load)
    for flags, says in ((["--prompts", "0"], "--prompts must be at least 1, got 0"),
                        (["--new-tokens", "1"], "--new-tokens >= 2")):
        assert main(["bench", "--model", "demo", *flags]) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
