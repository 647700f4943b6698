"""Batched generation (Teacher.generate): greedy rows equal batch-1 greedy decoding token for token,
drawn rows follow the target's distribution at their temperature."""

import time
from pathlib import Path

import pytest
import torch

from speculative.train import batched_generate as batched
from engine.loader import load_folder
from engine.runner import ModelRunner
from speculative.train.teacher import Teacher
from tests.tiny import make_tiny_model

MAX_LEN = 48  # the 30-token prompt has room for 18 reply tokens only
MAX_TOKENS = 20
LENGTHS = (5, 17, 9, 30, 1, 12)  # not sorted: results must come back in this order


def one_at_a_time(runner: ModelRunner, prompt: list[int], max_tokens: int, eos) -> list[int]:
    """The batch-1 reference: the engine's own forward over its static cache, one token a step."""
    logits, _, _ = runner.forward(torch.tensor(prompt), 0, all_logits=False)
    n, reply = len(prompt), []
    while len(reply) < max_tokens and n < runner.max_len:
        t = int(logits[-1].argmax())
        reply.append(t)
        if t in eos or n + 1 >= runner.max_len:
            break
        logits, _, _ = runner.forward(torch.tensor([t]), n)
        n += 1
    return reply


@pytest.fixture(scope="module", params=["llama", "mistral", "qwen2", "qwen3"])
def target(request, tmp_path_factory):
    folder = make_tiny_model(tmp_path_factory.mktemp(request.param), request.param, num_layers=3, seed=1)
    loaded = load_folder(folder, torch.device("cpu"), torch.float32, MAX_LEN)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 380, (n,), generator=g).tolist() for n in LENGTHS]
    runner = ModelRunner(loaded.model, MAX_LEN)
    plain = [one_at_a_time(runner, p, MAX_TOKENS, ()) for p in prompts]
    # EOS: a token the target emits in the middle of some reply, so that some replies stop on
    # it (right after its first occurrence) and others run to max_tokens or the context end.
    eos = plain[1][6]
    ref = [one_at_a_time(runner, p, MAX_TOKENS, {eos}) for p in prompts]
    return loaded, prompts, plain, eos, ref


def _teacher(loaded, eos, **kw) -> Teacher:
    teacher = Teacher(loaded, (1,), MAX_LEN, 1 << 20, **kw)
    teacher.eos_ids = frozenset(eos)
    return teacher


@pytest.mark.parametrize("gen_batch", [2, 4, 64])  # batches of 2 + 2 + 2, 4 + 2, or one of all six
@pytest.mark.parametrize("sync", [1, 3, batched.SYNC_EVERY, 64])  # steps between reads of the tokens
def test_batched_equals_one_at_a_time(target, gen_batch, sync, monkeypatch):
    """Rows that end inside a run of unread steps (EOS, their limit, the context's end) keep
    exactly their reply; no step writes K/V past the batch's columns."""
    monkeypatch.setattr(batched, "SYNC_EVERY", sync)
    run = batched._next_tokens

    def inside_the_columns(model, ids, positions, kv, start, mask, *rest):
        assert start + ids.shape[1] <= kv[0][0].shape[2]
        return run(model, ids, positions, kv, start, mask, *rest)

    monkeypatch.setattr(batched, "_next_tokens", inside_the_columns)
    loaded, prompts, _, eos, ref = target
    stopped = [r for r in ref if r and r[-1] == eos]
    assert stopped and any(len(r) > 1 for r in stopped), "setup: the EOS token must end some reply"
    assert any(len(r) == MAX_TOKENS and eos not in r for r in ref), "setup: some reply must reach max_tokens"
    assert len(ref[3]) == MAX_LEN - LENGTHS[3] or eos in ref[3], "setup: the long prompt fills the context"

    teacher = _teacher(loaded, {eos}, gen_batch=gen_batch)
    seqs = teacher.generate(prompts, MAX_TOKENS, None)
    assert [s.ids[:s.response_start] for s in seqs] == prompts
    assert [s.ids[s.response_start:] for s in seqs] == ref
    for s in seqs:
        reply = s.ids[s.response_start:]
        assert eos not in reply[:-1] and len(reply) <= MAX_TOKENS and len(s.ids) <= MAX_LEN


def test_kv_budget_and_deadline(target):
    loaded, prompts, ref, _, _ = target
    # A budget of one row's K/V: every batch holds a single prompt, the same replies come back.
    teacher = _teacher(loaded, (), gen_batch=64, gen_kv_bytes=1)
    calls = []
    teacher._take_batch = lambda *a, f=teacher._take_batch: calls.append(f(*a)) or calls[-1]
    assert [s.ids[s.response_start:] for s in teacher.generate(prompts, MAX_TOKENS, None)] == ref
    assert len(calls) == len(prompts) and all(len(b) == 1 for b in calls)
    # No batch starts after the deadline.
    assert teacher.generate(prompts, MAX_TOKENS, time.perf_counter() - 1) == []


def test_prefill_in_row_chunks(target, monkeypatch):
    loaded, prompts, _, eos, ref = target
    monkeypatch.setattr(batched, "PREFILL_TOKENS", 2 * max(LENGTHS))  # 2 rows of 30 a forward
    forwards = []
    run = batched._next_tokens
    monkeypatch.setattr(batched, "_next_tokens", lambda model, ids, *a: forwards.append(ids.shape) or run(model, ids, *a))
    seqs = _teacher(loaded, {eos}, gen_batch=64).generate(prompts, MAX_TOKENS, None)
    assert [s.ids[s.response_start:] for s in seqs] == ref
    assert forwards[:3] == [(2, max(LENGTHS))] * 3 and all(shape[1] == 1 for shape in forwards[3:])


def test_no_room_for_a_reply(target):
    loaded, prompts = target[:2]
    full = prompts[0] * 10  # 50 tokens > MAX_LEN
    seqs = _teacher(loaded, ()).generate([full, prompts[0]], 3, None)
    assert seqs[0].ids == full and seqs[0].response_start == len(full)
    assert len(seqs[1].ids) == len(prompts[0]) + 3


def test_drawn_rows_beside_greedy_ones(target):
    """Rows with a temperature draw their tokens; the greedy rows of the same batch keep the
    greedy replies (also after finished rows leave the batch); a seed repeats its draws."""
    loaded, prompts, _, eos, ref = target
    temps = [0.0, 1.5, 0.0, 0.0, 1.5, 0.0]
    teacher = _teacher(loaded, {eos}, gen_batch=64)
    seqs = teacher.generate(prompts, MAX_TOKENS, None, temperatures=temps, seed=3)
    replies = [s.ids[s.response_start:] for s in seqs]
    assert [r for r, t in zip(replies, temps) if t == 0] == [r for r, t in zip(ref, temps) if t == 0]
    assert any(r != g for r, g, t in zip(replies, ref, temps) if t > 0)
    again = teacher.generate(prompts, MAX_TOKENS, None, temperatures=temps, seed=3)
    assert [s.ids for s in again] == [s.ids for s in seqs]
    other = teacher.generate(prompts, MAX_TOKENS, None, temperatures=temps, seed=4)
    assert [s.ids for s in other] != [s.ids for s in seqs]
    for s in seqs:
        assert eos not in s.ids[s.response_start:-1] and len(s.ids) - s.response_start <= MAX_TOKENS
    # batches of 4: the four greedy prompts in one, the two drawn ones in another (no noise drawn
    # for greedy rows), the greedy replies the same
    small = _teacher(loaded, {eos}, gen_batch=4)
    batches = []
    small._take_batch = lambda *a, f=small._take_batch: batches.append(f(*a)) or batches[-1]
    apart = small.generate(prompts, MAX_TOKENS, None, temperatures=temps, seed=3)
    assert sorted(map(sorted, batches)) == [[0, 2, 3, 5], [1, 4]]
    assert [s.ids for s, t in zip(apart, temps) if t == 0] == [s.ids for s, t in zip(seqs, temps) if t == 0]


def test_picker_follows_dropped_rows():
    pick = batched._Picker([0.0, 1.0, 0.0, 2.0], 0, torch.device("cpu"))
    pick.keep(torch.tensor([1, 3]))
    assert pick.inv.tolist() == [1.0, 0.5]
    assert batched._Picker([0.0, 0.0], 0, torch.device("cpu")).inv is None
    with pytest.raises(ValueError):
        batched._Picker([1.0, float("nan")], 0, torch.device("cpu"))


def test_drawn_first_tokens_follow_softmax_over_temperature(tmp_path):
    """6,000 rows of one prompt, one token each at T = 0.8: the counts against softmax(z / T) of
    the batch-1 forward, chi-square over cells expecting 5 or more (the rest pooled). A draw
    at T = 1 (the temperature ignored) or of the argmax fails it."""
    folder = make_tiny_model(tmp_path, "llama", num_layers=2, seed=5)
    loaded = load_folder(folder, torch.device("cpu"), torch.float32, 16)
    prompt = [7, 11, 13]
    logits, _, _ = ModelRunner(loaded.model, 16).forward(torch.tensor(prompt), 0, all_logits=False)
    n, T = 6000, 0.8
    rows = batched.reply_batch(loaded.model, [prompt] * n, [1] * n, (), temperatures=[T] * n, seed=1)
    counts = torch.bincount(torch.tensor([r[0] for r in rows]), minlength=logits.shape[-1]).double()

    def z_score(temperature: float) -> float:
        expected = torch.softmax(logits[-1].double() / temperature, -1) * n
        big = expected >= 5
        obs = torch.cat([counts[big], counts[~big].sum()[None]])
        exp = torch.cat([expected[big], expected[~big].sum()[None]])
        keep = exp > 0
        chi2 = float((((obs - exp) ** 2)[keep] / exp[keep]).sum())
        df = int(keep.sum()) - 1
        return (chi2 - df) / (2 * df) ** 0.5

    assert z_score(T) < 4.5
    assert z_score(1.0) > 4.5 and z_score(0.4) > 4.5
