"""`localchat bench` as the command line runs it, on CPU with tiny models: the JSON report's
contract (no draft, draft loaded with speculation off, speculation on, the transformers peer,
random weights from a config), answers ending at EOS unless --ignore-eos, --prompts-file, and bad
flags that fail before any work."""

import json

from app.cli import main
from app.settings import Settings


def _head(tmp_path, target):
    from tests.speculative.heads import head_tensors, write_head
    from tests.tiny import read_config

    cfg = read_config(target)
    return write_head(tmp_path / "head", cfg, "sglang", head_tensors(64, 64, 3, cfg["vocab_size"], 200), 64,
                      (0, 1, 2))


def test_bench_reports_no_draft_draft_off_speculation_and_the_peer(tmp_path, tiny_models, capsys):
    out = tmp_path / "r.json"
    code = main(["bench", "--model", str(tiny_models["llama"]), "--draft", str(_head(tmp_path, tiny_models["llama"])),
                 "--device", "cpu", "--prompts", "1", "--new-tokens", "8", "--out", str(out)])
    assert code == 0
    r = json.loads(out.read_text())
    assert r["prompts"] == 1 and r["prompt_set"] and r["draft_steps"] == 5 and r["new_tokens"] == 8
    assert r["ignore_eos"] is False and r["system_prompt"] == Settings().system_prompt and r["tok_s"]
    assert r["order"] == ["no_draft", "plain", "spec"]
    for name in ("no_draft", "plain", "spec"):
        s = r[name]
        assert s["decode_tok_s"] > 0 and s["ttft_s"] > 0 and 1 <= s["generated_tokens"] <= 8
        assert len(s["per_prompt"]) == 1 and "token_ids" not in s["per_prompt"][0]
        want = (s["generated_tokens"] - 1) / s["decode_s"]  # summed tokens after the first over summed time
        assert abs(s["decode_tok_s"] - want) < 1e-9 * want
    assert r["startup_s"] > 0
    spec, off, base = r["spec"], r["plain"], r["no_draft"]["decode_tok_s"]
    assert spec["accept_len_mean"] >= 1 and "speedup" not in spec
    assert spec["speedup_vs_no_draft"] == spec["decode_tok_s"] / base
    assert spec["speedup_vs_draft_off"] == spec["decode_tok_s"] / off["decode_tok_s"]
    assert off["speedup_vs_no_draft"] == off["decode_tok_s"] / base
    # greedy on the CPU: the same tokens every way
    assert spec["same_tokens_as_no_draft"] == spec["same_tokens_as_draft_off"] == off["same_tokens_as_no_draft"] == 1
    assert r["transformers"]["decode_tok_s"] > 0 and r["speedup_vs_transformers"] == base / r["transformers"]["decode_tok_s"]
    table = capsys.readouterr().out
    for row in ("plain decode, no draft", "plain decode, draft loaded", "speculative decode", "x no draft",
                "x draft loaded, speculation off", "transformers generate", "end at EOS, at most 8 tokens",
                "same tokens as no draft     draft loaded 1 of 1 answers, speculation 1 of 1 answers"):
        assert row in table, row
    # the verify steps by tokens they gave, summed over the prompts, and their shares in the table
    hist = spec["accept_hist"]
    one = spec["per_prompt"][0]["accept_hist"]
    assert len(hist) == 7 and hist[:len(one)] == one and sum(hist) == sum(one) >= 1
    assert spec["accept_len_mean"] == sum(n * c for n, c in enumerate(hist)) / sum(hist)
    assert "tokens per verify step" in table and "6: " in table
    # the same steps by the answer span they began in (8 tokens: all in the first)
    assert spec["accept_len_by_span"]["steps"] == [sum(hist)] == [spec["per_prompt"][0]["accept_by_span"][0][0]]
    assert spec["accept_len_by_span"]["accept_len"] == [round(spec["accept_len_mean"], 3)]
    assert r["draft_alternatives"] is None and "runners-up" not in table  # the CPU verifies the chain alone
    assert r["tree"] is None and r["tree_used"] is None  # bench times chains unless told


def test_bench_reports_the_tree_it_ran(tmp_path, tiny_models, capsys):
    out = tmp_path / "r.json"
    code = main(["bench", "--model", str(tiny_models["llama"]), "--draft", str(_head(tmp_path, tiny_models["llama"])),
                 "--device", "cpu", "--prompts", "1", "--new-tokens", "8", "--no-peer", "--tree", "2,2,3",
                 "--out", str(out)])
    assert code == 0
    r = json.loads(out.read_text())
    assert r["tree"] == r["tree_used"] == "2,2,3" and r["spec"]["verify_tokens"] == 4.0
    assert "(draft tree 2,2,3)" in capsys.readouterr().out
    from benchmarks.harness.report import _table

    assert "(draft tree auto: 2,2,3)" in _table({**r, "tree": "auto"})  # what --tree auto picked


def test_bench_without_a_draft_times_one_setting(tmp_path, tiny_models, capsys):
    out = tmp_path / "r.json"
    code = main(["bench", "--model", str(tiny_models["llama"]), "--device", "cpu", "--prompts", "1",
                 "--new-tokens", "6", "--no-peer", "--system", "", "--out", str(out)])
    assert code == 0
    r = json.loads(out.read_text())
    assert r["order"] == ["no_draft"] and r["plain"] == r["no_draft"] and "spec" not in r
    assert r["system_prompt"] == "" and "speedup_vs_no_draft" not in r["plain"]
    table = capsys.readouterr().out
    assert "plain decode, no draft" in table and "draft loaded" not in table and "system prompt               none" in table


def test_bench_keeps_eos_unless_told_to_ignore_it(tmp_path, tiny_models):
    """A target whose greedy answer is two tokens and then EOS: bench's answers end there, and
    with --ignore-eos run on to --new-tokens."""
    from engine.engine import Engine
    from tests.speculative.heads import markov_target

    probe = Engine.load(str(tiny_models["llama"]), device="cpu")
    system = [{"role": "system", "content": Settings().system_prompt}]
    last = probe.tokenizer.apply_chat_template(system + [{"role": "user", "content": "Hi"}])[-1]
    eos = min(probe.tokenizer.eos_token_ids)
    target = markov_target(tiny_models["llama"], tmp_path / "target", {last: 40, 40: 41, 41: eos})
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hi\n")
    for flags, tokens in (([], 2), (["--ignore-eos"], 12)):
        out = tmp_path / "r.json"
        code = main(["bench", "--model", str(target), "--device", "cpu", "--prompts-file", str(prompts),
                     "--new-tokens", "12", "--no-peer", "--out", str(out), *flags])
        assert code == 0
        r = json.loads(out.read_text())
        assert r["no_draft"]["generated_tokens"] == tokens and r["ignore_eos"] is bool(flags)


def test_bench_prompts_file_sends_each_line_as_a_user_turn(tmp_path, tiny_models, monkeypatch):
    import benchmarks.harness.run as run

    sent = []
    original = run.bench_prompts

    def spy(engine, args, system=None, file_prompts=None):
        ids, source = original(engine, args, system, file_prompts)
        sent.append((system, file_prompts, ids))
        return ids, source

    monkeypatch.setattr(run, "bench_prompts", spy)
    prompts = tmp_path / "mine.txt"
    prompts.write_text("First question?\n\n   \nSecond one.  \n")
    out = tmp_path / "r.json"
    assert main(["bench", "--model", str(tiny_models["llama"]), "--device", "cpu", "--prompts-file", str(prompts),
                 "--new-tokens", "3", "--no-peer", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["prompts"] == 2 and str(prompts) in r["prompt_set"]
    system, lines, ids = sent[0]
    assert system == Settings().system_prompt and lines == ["First question?", "Second one."]
    from engine.engine import Engine

    tok = Engine.load(str(tiny_models["llama"]), device="cpu").tokenizer
    assert ids == [tok.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": line}])
                   for line in lines]
    assert main(["bench", "--model", str(tiny_models["llama"]), "--device", "cpu", "--prompts-file", str(prompts),
                 "--prompts", "1", "--new-tokens", "3", "--no-peer", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["prompts"] == 1


def test_bench_reports_the_runners_up_it_verified(tmp_path, tiny_models, monkeypatch, capsys):
    monkeypatch.setenv("LOCALCHAT_SPEC_ALTS", "auto")
    out = tmp_path / "r.json"
    code = main(["bench", "--model", str(tiny_models["llama"]), "--draft", str(_head(tmp_path, tiny_models["llama"])),
                 "--device", "cpu", "--prompts", "1", "--new-tokens", "8", "--no-peer", "--out", str(out)])
    assert code == 0
    assert json.loads(out.read_text())["draft_alternatives"] == [3, 3, 2, 1, 1]
    assert "runners-up verified         3, 3, 2, 1, 1 (drafts 1..5)" in capsys.readouterr().out


def test_accept_hist_total_sums_histograms_of_any_length():
    from benchmarks.harness.report import _hist_line, accept_hist_total

    assert accept_hist_total([{"accept_hist": [0, 2, 1]}, {"accept_hist": [0, 1, 0, 0, 3]}, {}]) == [0, 3, 1, 0, 3]
    assert accept_hist_total([{"accept_hist": [0, 2]}], 4) == [0, 2, 0, 0]
    assert _hist_line([0, 1, 0, 3]) == "1: 25% · 2: 0% · 3: 75%" and _hist_line([]) == ""


def test_acceptance_by_answer_span_follows_the_answer_and_sums_over_prompts():
    """A verify step counts in the 128-token span of the answer it began in (the first token comes
    from the prefill), and the report sums the prompts' spans into a mean accepted length each."""
    from benchmarks.harness.report import _span_line, accept_by_span_total
    from engine.engine import accept_spans
    from engine.types import ACCEPT_SPAN

    assert ACCEPT_SPAN == 128
    # 1 + 42 steps of 3 tokens reach token 127; the 43rd begins at 127; the next at 130
    lens = [3] * 43 + [1, 6]
    assert accept_spans(lens) == [[43, 129], [2, 7]]
    assert accept_spans([]) == []
    assert accept_spans([127, 300, 2]) == [[1, 127], [1, 300], [0, 0], [1, 2]]
    # an answer's events add their own steps to what the earlier ones counted
    from engine.engine import add_verify_steps

    hist, spans = [], []
    add_verify_steps(hist, spans, lens[:20])
    add_verify_steps(hist, spans, lens[20:])
    assert spans == accept_spans(lens) and hist == [0, 1, 0, 43, 0, 0, 1]
    total = accept_by_span_total([{"accept_by_span": [[43, 129], [2, 7]]}, {"accept_by_span": [[10, 20]]}, {}])
    assert total == {"span_tokens": 128, "steps": [53, 2], "accept_len": [round(149 / 53, 3), 3.5]}
    assert accept_by_span_total([{"accept_by_span": [[1, 2], [0, 0], [1, 4]]}])["accept_len"] == [2.0, None, 4.0]
    assert _span_line({"accept_len": [2.5, None], "steps": [4, 0]}) == "2.50 (4) · -"


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
    assert r["system_prompt"] is None and r["no_draft"] == r["plain"]


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


def test_bench_prompts_file_errors_are_one_line_before_any_load(tmp_path, monkeypatch, capsys):
    import benchmarks.harness.run as setup

    def no_load(*a, **kw):
        raise AssertionError("loaded a model before checking --prompts-file")

    monkeypatch.setattr(setup, "build_bench_engine", no_load)
    blank = tmp_path / "blank.txt"
    blank.write_text("\n   \n\n")
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00bad")
    two = tmp_path / "two.txt"
    two.write_text("a\nb\n")
    cases = ((["--prompts-file", str(tmp_path / "nope.txt")], "no such file"),
             (["--prompts-file", str(blank)], "has no prompts (one per line; blank lines are skipped)"),
             (["--prompts-file", str(tmp_path)], "is a folder"),
             (["--prompts-file", str(binary)], "not UTF-8 text"),
             (["--prompts-file", str(two), "--prompts", "3"], "--prompts 3 asks for more than the 2 prompts"),
             (["--prompts-file", str(two), "--random-weights", "llama-8b"], "--random-weights times random token ids"))
    for flags, says in cases:
        assert main(["bench", "--model", "demo", *flags]) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (flags, err)
