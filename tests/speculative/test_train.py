"""`localchat train-draft` on a tiny target: the loss falls, the head is in the SGLang format,
loads through Engine.load, and speculation with it is lossless (greedy)."""

import json
import random
from argparse import Namespace
from dataclasses import replace

import pytest
import torch
from safetensors import safe_open

from engine import Engine
from engine.errors import UserError
from engine.types import SamplingParams
from speculative.train.command import cmd_train
from speculative.train.data import HELDOUT_PERCENT, heldout_prompts, is_heldout, load_jsonl, split
from tests.tiny import make_tiny_model

WORDS = ("the quick brown fox jumps over a lazy dog hello how are you today fine thank "
         "paris is capital of france numbers one two three").split()


def _write_data(path, n=200, seed=0):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            msgs = [{"role": "user" if t % 2 == 0 else "assistant",
                     "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))}
                    for t in range(rng.randint(2, 6))]
            f.write(json.dumps({"messages": msgs}) + "\n")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    base = tmp_path_factory.mktemp("train")
    target = make_tiny_model(base / "target", "llama", num_layers=4)
    data = _write_data(base / "data.jsonl")
    out = base / "head"
    args = Namespace(model=str(target), out=str(out), kind="eagle3", data=str(data), draft_vocab=128, steps=40,
                     device="cpu", seq_len=128, batch_tokens=512, gen=3, gen_tokens=16, eval_every=20,
                     eval_prompts=2, lr=2e-3, time_budget=None, instruct_frac=0.34,
                     prompt_sets="instruct")
    assert cmd_train(args) == 0
    return target, data, out


@pytest.mark.slow  # the module's training run
def test_loss_falls_and_provenance(trained):
    _, _, out = trained
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["train"]["steps_done"] == 40
    assert prov["train"]["last_loss"] < prov["train"]["first_loss"] - 0.5
    assert prov["validation_history"] and prov["final_eval"]["step_acc"]
    assert prov["final_eval"]["speculator"]["identical"] == 2
    assert "sha256(id)" in prov["data"]["split"]
    # --instruct-frac 0.34 of 3 prompts: one built-in instruction prompt, recorded with its split
    assert prov["data"]["requests"] == {"instruct": 1} and prov["data"]["generated_responses"] == 3
    assert "sha256(text)" in prov["data"]["requests_split"] and "--instruct-frac 0.34" in prov["command"]
    assert "1 from instruct:" in (out / "README.md").read_text()
    assert (out / "README.md").read_text().startswith("# EAGLE-3 draft head")


@pytest.mark.slow  # the module's training run
def test_sglang_format(trained):
    target, _, out = trained
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [0, 1, 2], "use_aux_hidden_state": True}
    assert cfg["draft_vocab_size"] == 128 and cfg["vocab_size"] == 384 and cfg["target_hidden_size"] == 64
    assert cfg["torch_dtype"] == "bfloat16"
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        assert f.get_tensor("d2t").dtype == torch.int64 and f.get_tensor("t2d").dtype == torch.bool
        assert f.get_tensor("midlayer.self_attn.q_proj.weight").dtype == torch.bfloat16
        d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
    assert t2d.sum() == 128 and torch.equal(torch.nonzero(t2d).flatten(), torch.arange(128) + d2t)
    proj = {f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"} | {f"midlayer.mlp.{p}_proj.weight"
                                                                      for p in ("gate", "up", "down")}
    assert proj | {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= names
    assert not any("qkv_proj" in n or "gate_up" in n for n in names)


@pytest.mark.slow  # the module's training run
def test_head_loads_and_is_lossless(trained):
    target, data, out = trained
    engine = Engine.load(str(target), draft=str(out), device="cpu", draft_steps=4)
    prompts = heldout_prompts(3, data=str(data))
    assert len(prompts) == 3
    for msgs in prompts:
        params = SamplingParams(max_tokens=40)
        plain = engine.generate(msgs, params, speculative=False)
        engine.reset()
        spec = engine.generate(msgs, params, speculative=True)
        engine.reset()
        assert spec.token_ids == plain.token_ids
        assert spec.stats.verify_steps > 0


def test_split_is_deterministic_and_disjoint(tmp_path):
    convs = load_jsonl(_write_data(tmp_path / "d.jsonl", n=400))
    train, held = split(convs)
    assert len(train) + len(held) == 400 and 0 < len(held) < 0.15 * 400
    assert all(is_heldout(c.id) for c in held) and not any(is_heldout(c.id) for c in train)
    assert HELDOUT_PERCENT == 5
    assert split(load_jsonl(tmp_path / "d.jsonl"))[1] == held
    first = heldout_prompts(2, data=str(tmp_path / "d.jsonl"))
    assert [m["role"] for m in first[0]] == ["user"]
    assert first[0][0]["content"] == held[0].messages[0]["content"]


def test_bad_data(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": "hi"}\n')
    with pytest.raises(UserError, match="line 1"):
        load_jsonl(bad)


def test_train_prompts_use_every_conversation_before_any_twice():
    from types import SimpleNamespace

    from speculative.train.data import Conversation
    from speculative.train.prepare import _train_prompts

    def conv(i, turns):
        msgs = []
        for t in range(turns):
            msgs += [{"role": "user", "content": f"c{i} u{t} " + "x" * (40 * t)},
                     {"role": "assistant", "content": f"c{i} a{t}"}]
        return Conversation(id=str(i), messages=msgs)

    class Tok:  # one token per character: later turns are longer
        def apply_chat_template(self, msgs):
            return [ord(c) for m in msgs for c in m["content"]] + [0]

    convs = [conv(i, 1 + i % 4) for i in range(10)]  # 25 user turns in all
    opts = SimpleNamespace(seed=0, seq_len=330, gen_tokens=100, gen_prompts=12, instruct_frac=0.0,
                           prompt_sets=("instruct",))
    out, counts = _train_prompts(convs, Tok(), opts)
    assert len(out) == 12 and counts == {}
    first_ten = {bytes(p[:3]).decode() for p in out[:10]}
    assert len(first_ten) == 10  # every conversation once before any twice
    opts.gen_prompts = 100
    out, _ = _train_prompts(convs, Tok(), opts)
    # Each prompt ends on a user turn and leaves room for a reply; too-long later turns are skipped.
    assert all(len(p) <= opts.seq_len - opts.gen_tokens - 1 for p in out)
    assert len({tuple(p) for p in out}) == len(out)
    assert 10 < len(out) < 25


def test_instruct_prompts_split_and_mix():
    """The built-in instruction prompts: fixed, no duplicates, a held-out split by the same hash
    rule as the conversations; --instruct-frac takes that share of the generation prompts from the
    training split only, interleaved evenly with the conversations' prompts."""
    from types import SimpleNamespace

    from speculative.train.instruct_prompts import all_prompts, instruct_prompts
    from speculative.train.data import Conversation, is_heldout
    from speculative.train.prepare import _train_prompts

    every = all_prompts()
    assert len(every) == len(set(every)) > 4000
    train, held = instruct_prompts(heldout=False), instruct_prompts(heldout=True)
    assert set(train).isdisjoint(held) and len(train) + len(held) == len(every)
    assert all(is_heldout(p) for p in held) and 0.03 < len(held) / len(every) < 0.07
    assert any(p.startswith("Write a Python function") for p in train) and any("poem" in p for p in train)

    class Tok:  # the user's text after a "|" when a system prompt comes first
        def apply_chat_template(self, msgs):
            return [ord(c) for c in "|".join(m["content"] for m in msgs)]

    convs = [Conversation(id=str(i), messages=({"role": "user", "content": f"chat {i}"},
                                               {"role": "assistant", "content": "ok"})) for i in range(40)]
    opts = SimpleNamespace(seed=0, seq_len=600, gen_tokens=100, gen_prompts=40, instruct_frac=0.25,
                           prompt_sets=("instruct",))
    out, counts = _train_prompts(convs, Tok(), opts)
    texts = ["".join(map(chr, p)) for p in out]
    asked = [t.split("|")[-1] for t in texts]
    assert len(out) == 40 and counts == {"instruct": 10} and sum(t in train for t in asked) == 10
    assert not any(t in held for t in asked)
    # every other request under the app's default system prompt, the rest under the template's
    assert sum(t.startswith("You are a helpful assistant.|") for t in texts) == 5
    positions = [i for i, t in enumerate(asked) if t in train]
    assert positions[0] < 8 and positions[-1] > 31  # spread over the whole list, not bunched
    opts.instruct_frac = 1.0  # more than the set holds: all of its training split, then conversations
    opts.gen_prompts = len(train) + 5
    out, counts = _train_prompts(convs, Tok(), opts)
    assert counts == {"instruct": len(train)} and len(out) == len(train) + 5


def _stopped_run(tmp_path, monkeypatch, kind, error):
    """(args(out): a short training run's arguments for `kind`; stop_at(n): from now on, the run's
    n-th training batch raises `error`; the target's folder)."""
    import speculative.train.ttt as ttt

    target = make_tiny_model(tmp_path / "target", "llama", num_layers=4)
    data = _write_data(tmp_path / "data.jsonl")
    calls = {"n": 0}
    real = ttt.TTTBatch.from_rows

    def stop_at(n):
        def from_rows(*a, **kw):
            calls["n"] += 1
            if calls["n"] == n:
                raise error
            return real(*a, **kw)
        calls["n"] = 0
        monkeypatch.setattr(ttt.TTTBatch, "from_rows", classmethod(lambda cls, *a, **kw: from_rows(*a, **kw)))

    def args(out):
        return Namespace(model=str(target), out=str(out), kind=kind, data=str(data), draft_vocab=128, steps=40,
                         device="cpu", seq_len=128, batch_tokens=512, gen=0, gen_tokens=16, eval_every=0,
                         eval_prompts=1, lr=2e-3, time_budget=None, mtp_layers=2)

    return args, stop_at, target


@pytest.mark.parametrize("kind", ["eagle3", "mtp"])
def test_ctrl_c_saves_what_is_trained(tmp_path, monkeypatch, kind):
    """Ctrl+C during training stops it, saves the head (or layers) trained so far, which loads,
    records the interruption, and exits with 130; before the first step it just stops."""
    args, stop_at, target = _stopped_run(tmp_path, monkeypatch, kind, KeyboardInterrupt)
    stop_at(6)
    out = tmp_path / "head"
    assert cmd_train(args(out)) == 130
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["interrupted"] and prov["train"]["steps_done"] == 5
    assert prov["final_eval"] == {"skipped": "interrupted after 5 steps"}
    assert "Ctrl+C" in (out / "README.md").read_text()
    engine = Engine.load(str(target), draft=str(out), device="cpu", draft_steps=2)
    assert engine.generate([{"role": "user", "content": "hello"}], SamplingParams(max_tokens=8)).token_ids

    stop_at(1)
    with pytest.raises(KeyboardInterrupt):
        cmd_train(args(tmp_path / "none"))
    assert not (tmp_path / "none" / "model.safetensors").exists()


@pytest.mark.parametrize("kind", ["eagle3", "mtp"])
def test_running_out_of_gpu_memory_saves_what_is_trained(tmp_path, monkeypatch, kind, capsys):
    """Out of GPU memory during training: the head (or layers) trained so far is saved and loads,
    with a checkpoint; the run says so and how to go on (a smaller --batch-tokens), and exits with
    1. Before the first step the error goes on: nothing to save."""
    args, stop_at, target = _stopped_run(tmp_path, monkeypatch, kind,
                                         torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 960.00 MiB."))
    stop_at(4)
    out = tmp_path / "head"
    assert cmd_train(args(out)) == 1
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["out_of_memory"] and prov["interrupted"] and prov["train"]["steps_done"] == 3
    assert prov["final_eval"] == {"skipped": "out of GPU memory after 3 steps"}
    assert "ran out of memory" in (out / "README.md").read_text()
    logged = capsys.readouterr()
    assert "--batch-tokens" in logged.out + logged.err
    engine = Engine.load(str(target), draft=str(out), device="cpu", draft_steps=2)
    assert engine.generate([{"role": "user", "content": "hello"}], SamplingParams(max_tokens=8)).token_ids

    stop_at(1)
    with pytest.raises(torch.OutOfMemoryError):
        cmd_train(args(tmp_path / "none"))
    assert not (tmp_path / "none" / "model.safetensors").exists()


def test_a_second_run_reuses_the_replies(tmp_path, monkeypatch):
    """The target's replies are kept (speculative/train/reply_cache.py): a second run for the same
    target takes them from the cache and generates nothing; another target does not see them."""
    import speculative.train.teacher as teacher_mod

    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    target = make_tiny_model(tmp_path / "target", "llama", num_layers=4)
    data = _write_data(tmp_path / "data.jsonl")

    def args(out, model=target):
        return Namespace(model=str(model), out=str(out), kind="eagle3", data=str(data), draft_vocab=128, steps=3,
                         device="cpu", seq_len=128, batch_tokens=512, gen=5, prompt_sets="instruct", gen_tokens=12, eval_every=0,
                         eval_prompts=0, lr=2e-3, time_budget=None)

    assert cmd_train(args(tmp_path / "a")) == 0
    first = json.loads((tmp_path / "a" / "provenance.json").read_text())["data"]
    assert first["generated_responses"] == 5 and first["responses_from_cache"] == 0

    def no_generation(self, prompts, *a, **kw):
        raise AssertionError(f"generated {len(prompts)} replies again")

    monkeypatch.setattr(teacher_mod.Teacher, "generate", no_generation)
    assert cmd_train(args(tmp_path / "b")) == 0
    second = json.loads((tmp_path / "b" / "provenance.json").read_text())["data"]
    assert second["generated_responses"] == 5 and second["responses_from_cache"] == 5 + 4  # + held-out replies
    assert second["generated_tokens"] == first["generated_tokens"]

    other = make_tiny_model(tmp_path / "other", "llama", num_layers=4, seed=9)
    with pytest.raises(AssertionError, match="generated"):
        cmd_train(args(tmp_path / "c", other))


def test_sampled_replies_reach_the_run_and_the_cache(tmp_path, monkeypatch):
    """--sampled-replies draws that share of the training replies (the prompts chosen by their own
    hash, so a second run finds them in the cache) at --reply-temperature; the held-out replies
    stay greedy; a run without it generates greedy replies for those prompts."""
    import speculative.train.teacher as teacher_mod

    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    target = make_tiny_model(tmp_path / "target", "llama", num_layers=4)
    data = _write_data(tmp_path / "data.jsonl")
    asked = []
    real = teacher_mod.Teacher.generate

    def recording(self, prompts, max_tokens, deadline, log=None, temperatures=None, seed=0):
        asked.append(list(temperatures or [0.0] * len(prompts)))
        return real(self, prompts, max_tokens, deadline, log, temperatures, seed)

    monkeypatch.setattr(teacher_mod.Teacher, "generate", recording)

    def args(out, **kw):
        return Namespace(**{**dict(model=str(target), out=str(out), kind="eagle3", data=str(data), draft_vocab=128,
                                   steps=2, device="cpu", seq_len=128, batch_tokens=512, gen=24, prompt_sets="instruct",
                                   gen_tokens=8, eval_every=0, eval_prompts=0, lr=2e-3, time_budget=None), **kw})

    assert cmd_train(args(tmp_path / "a", sampled_replies=0.5, reply_temperature=1.2)) == 0
    prov = json.loads((tmp_path / "a" / "provenance.json").read_text())
    drawn = prov["data"]["drawn_responses"]
    assert 0 < drawn < 24 and prov["train"]["sampled_replies"] == 0.5 and prov["train"]["reply_temperature"] == 1.2
    assert "--sampled-replies 0.5 --reply-temperature 1.2" in prov["command"]
    assert f"24 replies ({24 - drawn} greedy, {drawn} drawn at temperature 1.2)" in (tmp_path / "a" / "README.md").read_text()
    assert set(asked[0]) == {0.0}  # held-out replies
    assert sorted(asked[1]).count(1.2) == drawn and set(asked[1]) == {0.0, 1.2}
    asked.clear()
    assert cmd_train(args(tmp_path / "b", sampled_replies=0.5, reply_temperature=1.2)) == 0
    assert asked == []  # all from the cache
    assert json.loads((tmp_path / "b" / "provenance.json").read_text())["data"]["responses_from_cache"] == 24 + 4
    assert cmd_train(args(tmp_path / "c")) == 0  # greedy: the drawn prompts' greedy replies are new
    assert asked == [[0.0] * drawn]
    with pytest.raises(UserError, match="--sampled-replies"):
        cmd_train(args(tmp_path / "d", sampled_replies=1.5))
    with pytest.raises(UserError, match="--reply-temperature must be in"):
        cmd_train(args(tmp_path / "e", sampled_replies=0.5, reply_temperature=0.0))


def test_reply_cache_pieces(tmp_path):
    from speculative.train.reply_cache import ReplyCache, replies_for
    from speculative.train.data import Sequence

    cache = ReplyCache(tmp_path / "c")
    assert cache.load() == {}
    prompts = [[1, 2], [3], [4, 5, 6], [7]]

    def partial(ps, temps):  # a deadline: only the first two missing prompts get replies
        return [Sequence(p + [9, 9], response_start=len(p)) for p in ps[:2]]

    seqs, cached, new = replies_for(prompts, {}, partial)
    assert [s.ids for s in seqs] == [[1, 2, 9, 9], [3, 9, 9]] and cached == 0 and len(new) == 2
    cache.save(new)
    known = cache.load()
    assert known == new
    seqs, cached, new = replies_for(prompts, known, lambda ps, ts: [Sequence(p + [8], response_start=len(p)) for p in ps])
    assert [s.ids for s in seqs] == [[1, 2, 9, 9], [3, 9, 9], [4, 5, 6, 8], [7, 8]] and cached == 2 and len(new) == 2
    # a drawn reply is its own entry: the greedy one cached for the prompt does not stand in for it
    asked = []
    seqs, cached, new = replies_for(prompts, known, lambda ps, ts: asked.append((ps, ts)) or
                                    [Sequence(p + [5], response_start=len(p)) for p in ps], [0.0, 0.7, 0.0, 0.0])
    assert asked[0][1] == [0.7, 0.0, 0.0] and [s.ids for s in seqs][1] == [3, 5] and len(new) == 3
    cache.file.write_text('{"p": "x", "r": [1, "a"]}\n')  # damaged: counts as empty
    assert cache.load() == {}


def test_resume_continues_a_stopped_run(tmp_path, monkeypatch):
    """A run stopped with Ctrl+C leaves a checkpoint; --resume continues it along the same
    schedule with the same vocabulary and replies (no new generation) to the planned step
    count; the finished run removes the checkpoint; mismatched settings are refused."""
    import speculative.train.teacher as teacher_mod
    from speculative.train import checkpoint as train_checkpoint

    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    target = make_tiny_model(tmp_path / "target", "llama", num_layers=4)
    data = _write_data(tmp_path / "data.jsonl")
    out = tmp_path / "head"

    def args(**kw):
        base = dict(model=str(target), out=str(out), kind="eagle3", data=str(data), draft_vocab=128, steps=12,
                    device="cpu", seq_len=128, batch_tokens=512, gen=4, prompt_sets="instruct", gen_tokens=12, eval_every=4,
                    eval_prompts=1, lr=2e-3, time_budget=None, resume=False)
        return Namespace(**{**base, **kw})

    real_clip = torch.nn.utils.clip_grad_norm_
    calls = {"n": 0}

    def clip(*a, **kw):  # called once per training step, between backward and the optimizer step
        calls["n"] += 1
        if calls["n"] == 8:
            raise KeyboardInterrupt
        return real_clip(*a, **kw)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    assert cmd_train(args()) == 130
    stopped = json.loads((out / "provenance.json").read_text())
    assert stopped["interrupted"] and stopped["train"]["steps_done"] == 7 and "parts" not in stopped
    assert (train_checkpoint.folder_for(out) / "state.pt").is_file()
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", real_clip)

    with pytest.raises(UserError, match="--lr"):
        cmd_train(args(resume=True, lr=1e-3))
    state = train_checkpoint.folder_for(out) / "state.pt"
    saved = state.read_bytes()
    state.write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="cannot be read"):
        cmd_train(args(resume=True))
    state.write_bytes(saved)

    def no_generation(self, prompts, *a, **kw):
        raise AssertionError("a resumed run generated replies")

    monkeypatch.setattr(teacher_mod.Teacher, "generate", no_generation)
    assert cmd_train(args(resume=True)) == 0
    done = json.loads((out / "provenance.json").read_text())
    assert done["resumed_at_step"] == 7 and done["train"]["steps_done"] == 12 and not done["interrupted"]
    # the provenance covers the whole run: the command that started it, both parts' steps and seconds
    assert done["data"]["generated_responses"] == 4 and "--resume" not in done["command"]
    parts = done["parts"]
    assert [p["steps"] for p in parts] == [7, 5] and all(p["wall_s"] > 0 for p in parts)
    assert done["wall_s"] == pytest.approx(sum(p["wall_s"] for p in parts), abs=0.11)
    assert "in 2 parts (7 steps in" in (out / "README.md").read_text()
    assert [v["step"] for v in done["validation_history"]] == [4, 8]
    assert done["final_eval"]["speculator"]["identical"] == 1
    assert not (train_checkpoint.folder_for(out) / "state.pt").exists()
    with pytest.raises(UserError, match="no stopped run"):
        cmd_train(args(resume=True))
    with pytest.raises(UserError, match="only EAGLE-3"):
        cmd_train(args(resume=True, kind="mtp"))


@pytest.mark.parametrize("signum,times", [("SIGTERM", 1), ("SIGTERM", 2), ("SIGINT", 2)])
def test_sigterm_stops_like_ctrl_c(tmp_path, monkeypatch, signum, times):
    """SIGTERM stops training as Ctrl+C does and the head is saved; the same stop delivered
    twice at once (GNU timeout signals the process, then its group) still saves."""
    import os
    import signal

    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    target = make_tiny_model(tmp_path / "target", "llama", num_layers=4)
    data = _write_data(tmp_path / "data.jsonl")
    real_clip = torch.nn.utils.clip_grad_norm_
    calls = {"n": 0}

    def clip(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 3:
            os.kill(os.getpid(), getattr(signal, signum))
        return real_clip(*a, **kw)

    import speculative.train.loop as train_loop

    real_on_ctrl_c = train_loop.on_ctrl_c

    def on_ctrl_c(*a):  # the second delivery lands while the first stop is being handled
        if times == 2:
            os.kill(os.getpid(), getattr(signal, signum))
        return real_on_ctrl_c(*a)

    monkeypatch.setattr(train_loop, "on_ctrl_c", on_ctrl_c)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    before = signal.getsignal(signal.SIGTERM)
    args = Namespace(model=str(target), out=str(tmp_path / "head"), kind="eagle3", data=str(data), draft_vocab=128,
                     steps=20, device="cpu", seq_len=128, batch_tokens=512, gen=0, gen_tokens=12, eval_every=0,
                     eval_prompts=0, lr=2e-3, time_budget=None)
    assert cmd_train(args) == 130
    prov = json.loads((tmp_path / "head" / "provenance.json").read_text())
    assert prov["interrupted"] and 2 <= prov["train"]["steps_done"] <= 3
    assert signal.getsignal(signal.SIGTERM) == before  # the handlers are put back
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_out_must_be_a_writable_folder(tmp_path):
    """A bad --out fails before any work (it used to fail at the save, after the training)."""
    a_file = tmp_path / "file"
    a_file.write_text("x")
    base = dict(model=str(tmp_path / "no-model"), kind="eagle3", data=None, draft_vocab=128, steps=1, device="cpu")
    with pytest.raises(UserError, match="is a file"):
        cmd_train(Namespace(out=str(a_file), **base))
    with pytest.raises(UserError, match="cannot write there"):
        cmd_train(Namespace(out=str(a_file / "sub"), **base))
    with pytest.raises(UserError, match="no such file or folder"):  # the model is checked next
        cmd_train(Namespace(out=str(tmp_path / "new" / "head"), **base))
    assert not (tmp_path / "new" / "head").exists()  # the folder it made for the head is gone again


def test_progress_bar_on_a_terminal_only():
    import io

    from speculative.train.progress import ProgressBar

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    bar = ProgressBar(stream=tty, width=10, min_interval=0)
    bar.update(0.5, "step 5")
    bar.log(lambda m: tty.write(m + "\n"), "held-out @ 5")
    bar.update(1.0, "step 10")
    bar.close()
    out = tty.getvalue()
    assert "[#####-----]  50%  step 5" in out and "[##########] 100%  step 10" in out
    # the log line is written on a cleared line, and the bar comes back under it
    assert "\r\x1b[2Kheld-out @ 5\n[#####-----]" in out
    assert out.endswith("\r\x1b[2K")

    plain = io.StringIO()  # a log file: no bar at all, log lines as they are
    bar = ProgressBar(stream=plain, min_interval=0)
    bar.update(0.5, "step 5")
    bar.log(lambda m: plain.write(m + "\n"), "held-out @ 5")
    bar.close()
    assert plain.getvalue() == "held-out @ 5\n"


def test_ctrl_c_while_generating_keeps_the_replies(tmp_path, monkeypatch):
    """Ctrl+C during generation stops the run; the replies finished by then are in the cache,
    and the next run generates only the rest."""
    import speculative.train.teacher as teacher_mod

    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    target = make_tiny_model(tmp_path / "target", "llama", num_layers=4)
    data = _write_data(tmp_path / "data.jsonl")
    real = teacher_mod.reply_batch
    calls = {"n": 0}

    def batch_then_stop(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 3:  # held-out replies, one training batch, then Ctrl+C
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(teacher_mod, "reply_batch", batch_then_stop)
    real_init = teacher_mod.Teacher.__init__

    def small_batches(self, *a, **kw):
        real_init(self, *a, **kw)
        self.gen_batch = 4

    monkeypatch.setattr(teacher_mod.Teacher, "__init__", small_batches)

    def args(out):
        return Namespace(model=str(target), out=str(out), kind="eagle3", data=str(data), draft_vocab=128, steps=2,
                         device="cpu", seq_len=128, batch_tokens=512, gen=10, prompt_sets="instruct", gen_tokens=8, eval_every=0,
                         eval_prompts=0, lr=2e-3, time_budget=None)

    with pytest.raises(KeyboardInterrupt):
        cmd_train(args(tmp_path / "a"))
    assert not (tmp_path / "a").exists()
    monkeypatch.setattr(teacher_mod, "reply_batch", real)
    assert cmd_train(args(tmp_path / "b")) == 0
    data_b = json.loads((tmp_path / "b" / "provenance.json").read_text())["data"]
    assert data_b["generated_responses"] == 10
    assert data_b["responses_from_cache"] == 4 + 4  # the held-out replies and the first training batch


def test_greedy_weight_and_gen_frac_reach_the_run(tmp_path):
    """--greedy-weight and --gen-frac reach the loss and the provenance, and bad values get a
    one-line error."""
    target = make_tiny_model(tmp_path / "target", "llama", num_layers=4)
    data = _write_data(tmp_path / "data.jsonl", n=60)
    out = tmp_path / "head"
    args = Namespace(model=str(target), out=str(out), kind="eagle3", data=str(data), draft_vocab=128, steps=6,
                     device="cpu", seq_len=128, batch_tokens=512, gen=3, prompt_sets="instruct", gen_tokens=16, eval_every=0,
                     eval_prompts=0, lr=2e-3, time_budget=None, greedy_weight=0.5, gen_frac=1.0,
                     soft_temperature=0.7)
    assert cmd_train(args) == 0
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["train"]["greedy_weight"] == 0.5 and prov["train"]["gen_frac"] == 1.0
    assert prov["train"]["soft_temperature"] == 0.7 and "--soft-temperature 0.7" in prov["command"]
    assert prov["train"]["steps_done"] == 6
    bad = Namespace(**{**vars(args), "greedy_weight": -1.0, "out": str(tmp_path / "bad")})
    with pytest.raises(UserError, match="--greedy-weight"):
        cmd_train(bad)
    with pytest.raises(UserError, match=r"--gen-frac must be in \[0, 1\]"):
        cmd_train(Namespace(**{**vars(args), "gen_frac": 1.5, "out": str(tmp_path / "bad")}))
    with pytest.raises(UserError, match=r"--soft-temperature must be in \[0.05, 10\]"):
        cmd_train(Namespace(**{**vars(args), "soft_temperature": 0.0, "out": str(tmp_path / "bad")}))
    with pytest.raises(UserError, match="--soft-temperature sets an EAGLE-3 head's loss"):
        cmd_train(Namespace(**{**vars(args), "kind": "mtp", "out": str(tmp_path / "bad")}))
    with pytest.raises(UserError, match=r"--instruct-frac must be in \[0, 1\]"):
        cmd_train(Namespace(**{**vars(args), "instruct_frac": -0.1, "out": str(tmp_path / "bad")}))
    with pytest.raises(UserError, match="--prompt-sets: unknown set wiki; known: instruct, humaneval"):
        cmd_train(Namespace(**{**vars(args), "prompt_sets": "instruct,wiki", "out": str(tmp_path / "bad")}))
    for name, value, says in (("gen", -1, "--gen must be at least 0"), ("eval_every", -1, "--eval-every must be"),
                              ("eval_prompts", -2, "--eval-prompts must be"), ("gen_tokens", 0, "--gen-tokens must")):
        with pytest.raises(UserError, match=says):
            cmd_train(Namespace(**{**vars(args), name: value, "out": str(tmp_path / "bad")}))


def test_feature_cache_takes_the_free_memory_less_a_steps_working_set(monkeypatch):
    """Set after the target is loaded: free memory less 16 GiB per 16,384 tokens a step at 8,192
    draft tokens and 5 unrolled steps, in proportion above (the demo run's features, about 86 GB,
    fit on a 141 GB GPU; the old cap of 64 GiB made every later step recompute about a quarter of
    them)."""
    from speculative.train.options import TrainOptions, feature_cache_bytes

    opts = TrainOptions.from_args(Namespace(model="m", out="o"), torch.device("cpu"))
    assert feature_cache_bytes(opts, torch.device("cpu")).cache_bytes == 2 << 30
    free = {"b": 130 << 30}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free["b"], 141 << 30))
    gpu = replace(opts, batch_tokens=16384)
    assert feature_cache_bytes(gpu, torch.device("cuda")).cache_bytes == 114 << 30
    assert feature_cache_bytes(replace(gpu, batch_tokens=32768), torch.device("cuda")).cache_bytes == 98 << 30
    # a grown draft vocabulary: its logits take 15,360 / 8,192 times the room (the demo head grown
    # to 15,360 tokens ran out of an H100's memory 1,050 steps in, once the cache had filled)
    assert feature_cache_bytes(replace(gpu, draft_vocab=15360), torch.device("cuda")).cache_bytes == 100 << 30
    assert feature_cache_bytes(replace(gpu, ttt_steps=8), torch.device("cuda")).cache_bytes == int((130 - 25.6) * (1 << 30))
    free["b"] = 10 << 30  # a small card: still a little cache
    assert feature_cache_bytes(gpu, torch.device("cuda")).cache_bytes == 1 << 30


def test_draft_intermediate_sets_the_heads_mlp_and_reaches_the_command(tmp_path):
    """--draft-intermediate N: the head's MLP is N wide in its config and weights, it loads
    and stays lossless; the recorded command carries it (with --gen-frac and --greedy-weight,
    which --resume must match); bad values and --kind mtp get a one-line error."""
    target = make_tiny_model(tmp_path / "target", "llama", num_layers=4)
    data = _write_data(tmp_path / "data.jsonl", n=60)
    out = tmp_path / "head"
    args = Namespace(model=str(target), out=str(out), kind="eagle3", data=str(data), draft_vocab=128, steps=4,
                     device="cpu", seq_len=128, batch_tokens=512, gen=2, prompt_sets="instruct", gen_tokens=12, eval_every=0,
                     eval_prompts=1, lr=2e-3, time_budget=None, draft_intermediate=40, gen_frac=0.6,
                     greedy_weight=0.25)
    assert cmd_train(args) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["intermediate_size"] == 40
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert tuple(f.get_tensor("midlayer.mlp.gate_proj.weight").shape) == (40, 64)
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["train"]["draft_intermediate"] == 40 and prov["final_eval"]["speculator"]["identical"] == 1
    for flag in ("--draft-intermediate 40", "--gen-frac 0.6", "--greedy-weight 0.25"):
        assert flag in prov["command"]
    with pytest.raises(UserError, match="--draft-intermediate must be positive"):
        cmd_train(Namespace(**{**vars(args), "draft_intermediate": 0, "out": str(tmp_path / "bad")}))
    with pytest.raises(UserError, match="--draft-intermediate sets an EAGLE-3"):
        cmd_train(Namespace(**{**vars(args), "kind": "mtp", "out": str(tmp_path / "bad")}))


def _first_head(tmp_path):
    """(the run's args, its data file, its head folder): a small head trained on a tiny target, for
    the --init tests (96 draft tokens, MLP width 40)."""
    target = make_tiny_model(tmp_path / "target", "llama", num_layers=4)
    data = _write_data(tmp_path / "data.jsonl", n=60)
    first = tmp_path / "first"
    args = Namespace(model=str(target), out=str(first), kind="eagle3", data=str(data), draft_vocab=96, steps=3,
                     device="cpu", seq_len=128, batch_tokens=512, gen=2, prompt_sets="instruct", gen_tokens=12,
                     eval_every=0, eval_prompts=0, lr=2e-3, time_budget=None, draft_intermediate=40)
    assert cmd_train(args) == 0
    return args, data, first


def test_init_starts_from_a_head(tmp_path):
    """--init HEAD: the run starts from that head's weights and draft vocabulary (a step at a
    negligible learning rate writes the same bf16 weights back), takes its shape, records it in
    the provenance and the command; a head of another shape or kind, or a conflicting
    --draft-vocab, gets a one-line error before any work."""
    import shutil

    args, data, first = _first_head(tmp_path)
    again = tmp_path / "again"
    assert cmd_train(Namespace(**{**vars(args), "out": str(again), "init": str(first), "draft_vocab": None,
                                  "draft_intermediate": None, "steps": 1, "lr": 1e-12, "data": str(data)})) == 0
    with safe_open(str(first / "model.safetensors"), framework="pt") as a, \
            safe_open(str(again / "model.safetensors"), framework="pt") as b:
        assert sorted(a.keys()) == sorted(b.keys())
        for name in a.keys():
            assert torch.equal(a.get_tensor(name), b.get_tensor(name)), name
    prov = json.loads((again / "provenance.json").read_text())
    assert prov["init"]["head"] == str(first.resolve()) and len(prov["init"]["sha256"]) == 64
    assert f"--init {first}" in prov["command"] and prov["draft_vocab_size"] == 96
    assert json.loads((again / "config.json").read_text())["intermediate_size"] == 40
    from speculative.train.options import TrainOptions

    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert TrainOptions.from_args(Namespace(model="m", out="o", init=str(first)), cpu).lr == 2e-4
    assert TrainOptions.from_args(Namespace(model="m", out="o", init=str(first)), gpu).lr == 4e-4
    assert TrainOptions.from_args(Namespace(model="m", out="o"), gpu).lr == 1.2e-3
    assert TrainOptions.from_args(Namespace(model="m", out="o", init=str(first), lr=1e-3), gpu).lr == 1e-3

    def refused(says, **changes):
        with pytest.raises(UserError, match=says):
            cmd_train(Namespace(**{**vars(args), "out": str(tmp_path / "bad"), "init": str(first),
                                   "draft_vocab": None, "draft_intermediate": None, **changes}))
        assert not (tmp_path / "bad").exists()

    refused(r"--draft-vocab 64: the --init head has 96 tokens; a vocabulary can grow from there, not shrink",
            draft_vocab=64)
    refused(r"--draft-intermediate 64: the --init head has 40", draft_intermediate=64)
    refused("no such file or folder", init=str(tmp_path / "nowhere"))
    refused("MTP layers start from the target's last block", kind="mtp")
    refused("--init demo-eagle3 was trained for the demo model", init="demo-eagle3")
    refused("--init demo-mtp: those are MTP layers", init="demo-mtp")
    mtp = tmp_path / "mtp"
    mtp.mkdir()
    (mtp / "config.json").write_text(json.dumps({"architectures": ["LocalchatMTP"]}))
    refused("that folder holds MTP layers", init=str(mtp))
    other = tmp_path / "other"
    shutil.copytree(first, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [0, 0, 2]
    (other / "config.json").write_text(json.dumps(cfg))
    refused("its aux_layer_ids differ from the head train-draft builds", init=str(other))
    from safetensors.torch import load_file, save_file

    twice = tmp_path / "twice"
    shutil.copytree(first, twice)
    tensors = load_file(str(twice / "model.safetensors"))
    tensors["d2t"][1] = tensors["d2t"][0] - 1  # draft token 1 now stands for draft token 0's target
    save_file(tensors, str(twice / "model.safetensors"))
    refused("maps two draft tokens to the same target token", init=str(twice))


def test_init_grows_the_draft_vocabulary_and_keeps_an_int8_lm_head(tmp_path):
    """--init HEAD --draft-vocab N (N above the head's): the head's tokens keep their rows, the most
    frequent others join with the target's rows at a tenth of the head's norm; --int8-lm-head saves the
    lm_head as int8 rows with a scale each, which the engine widens on load (the run's own check
    decodes with it, lossless); the README and provenance say both."""
    args, data, first = _first_head(tmp_path)
    grown = tmp_path / "grown"
    assert cmd_train(Namespace(**{**vars(args), "out": str(grown), "init": str(first), "draft_vocab": 160,
                                  "draft_intermediate": None, "steps": 1, "lr": 1e-12, "eval_prompts": 1,
                                  "int8_lm_head": True})) == 0
    with safe_open(str(first / "model.safetensors"), framework="pt") as a, \
            safe_open(str(grown / "model.safetensors"), framework="pt") as b:
        old_ids = a.get_tensor("d2t") + torch.arange(96)
        new_ids = b.get_tensor("d2t") + torch.arange(160)
        old_rows, q, scale = (a.get_tensor("lm_head.weight").float(), b.get_tensor("lm_head.weight"),
                              b.get_tensor("lm_head.weight_scale"))
        for name in a.keys():  # the rest of the head carries over as it was
            if name not in ("d2t", "t2d", "lm_head.weight"):
                assert torch.equal(a.get_tensor(name), b.get_tensor(name)), name
        assert int(b.get_tensor("t2d").sum()) == 160
    assert q.dtype == torch.int8 and q.shape == (160, old_rows.shape[1]) and scale.shape == (160,)
    assert bool(torch.isin(old_ids, new_ids).all()) and bool((new_ids.diff() > 0).all())
    at = torch.searchsorted(new_ids, old_ids)
    rows = q.float() * scale[:, None]
    assert (rows[at] - old_rows).abs().max() <= scale[at].max() / 2 + 1e-2 * old_rows.abs().max()
    new = torch.ones(160, dtype=torch.bool)
    new[at] = False
    ratio = rows[new].norm(dim=1).mean() / old_rows.norm(dim=1).mean()
    assert 0.09 < float(ratio) < 0.11  # the target's rows at a tenth of the head's norm (NEW_ROW_NORM)
    prov = json.loads((grown / "provenance.json").read_text())
    assert prov["draft_vocab_size"] == 160 and prov["init"]["draft_vocab_size"] == 96
    assert "--draft-vocab 160" in prov["command"] and "--int8-lm-head" in prov["command"]
    assert prov["final_eval"]["speculator"]["identical"] == prov["final_eval"]["speculator"]["prompts"] == 1
    readme = (grown / "README.md").read_text()
    assert "grown to 160" in readme and "int8 rows" in readme
    assert json.loads((grown / "config.json").read_text())["draft_vocab_size"] == 160
    with pytest.raises(UserError, match="--int8-lm-head stores an EAGLE-3 head's lm_head"):
        cmd_train(Namespace(**{**vars(args), "kind": "mtp", "int8_lm_head": True, "draft_intermediate": None,
                               "out": str(tmp_path / "bad")}))


@pytest.mark.slow  # loads the demo model on the CPU
def test_the_shipped_head_is_a_start_for_the_demo(demo_gguf, tmp_path):
    """`--model demo --init demo-eagle3`: the shipped head is one train-draft could have built
    for the demo (shape, aux layers, draft vocabulary), so a run starts from it; a step at a
    negligible learning rate writes its weights back unchanged."""
    from engine.hub.demo import demo_draft_path

    data = _write_data(tmp_path / "data.jsonl", n=60)
    out = tmp_path / "head"
    args = Namespace(model="demo", out=str(out), kind="eagle3", data=str(data), init="demo-eagle3", steps=1,
                     device="cpu", seq_len=64, batch_tokens=128, gen=0, eval_every=0, eval_prompts=0, lr=1e-12,
                     time_budget=None, ttt_steps=2)
    assert cmd_train(args) == 0
    shipped = demo_draft_path("eagle3")
    with safe_open(str(shipped / "model.safetensors"), framework="pt") as a, \
            safe_open(str(out / "model.safetensors"), framework="pt") as b:
        assert sorted(a.keys()) == sorted(b.keys())
        for name in a.keys():
            assert torch.equal(a.get_tensor(name), b.get_tensor(name)), name
    assert json.loads((out / "config.json").read_text()) == json.loads((shipped / "config.json").read_text())
