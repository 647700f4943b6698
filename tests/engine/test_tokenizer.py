"""The tokenizer's two backends: transformers on a first load, then the verified direct path
(tokenizers + our Jinja environment) from the cache, with the same prompts and text."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import engine.tokenizer as tokenizer_module
from engine.tokenizer import Tokenizer
from tests.tiny import write_tokenizer

# Llama-3 style: BOS from the template, a system default, loop controls, raise_exception, tojson.
RICH_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(sys=false) %}"
    "{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('bad role') }}{% endif %}"
    "{% if m['role'] == 'system' %}{% set ns.sys = true %}{% endif %}"
    "{% if loop.first and not ns.sys %}<|im_start|>system\nBe brief.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n"
    "{% if m['role'] == 'assistant' %}{% continue %}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant {{ {'k': 'é'} | tojson }}\n{% endif %}"
)

CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "  Two\nlines, café 東京 😀  "}],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}],
]


def _folder(tmp_path, template=None):
    folder = tmp_path / "tok"
    write_tokenizer(folder)
    if template is not None:
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
        cfg["chat_template"] = template
        (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
        jinja = folder / "chat_template.jinja"
        if jinja.exists():
            jinja.write_text(template)
    return folder


def _same(a: Tokenizer, b: Tokenizer) -> None:
    assert a.eos_token_ids == b.eos_token_ids and a.bos_token_id == b.bos_token_id
    for conv in CONVERSATIONS:
        ids = a.apply_chat_template(conv)
        assert b.apply_chat_template(conv) == ids
        assert b.render(conv, add_generation_prompt=False) == a.render(conv, add_generation_prompt=False)
        assert b.decode(ids) == a.decode(ids)
        assert [b.decode(ids[:i]) for i in range(len(ids))] == [a.decode(ids[:i]) for i in range(len(ids))]


@pytest.mark.parametrize("template", [None, RICH_TEMPLATE], ids=["tiny", "rich"])
def test_second_load_skips_transformers_and_agrees(tmp_path, template):
    folder = _folder(tmp_path, template)
    first = Tokenizer.from_folder(folder, (2,), cache=tmp_path / "cache")
    second = Tokenizer.from_folder(folder, (2,), cache=tmp_path / "cache")
    assert first.hf is not None and second.hf is None
    _same(first, second)
    if template is not None:
        assert second.render(CONVERSATIONS[0]).endswith('assistant {"k": "é"}\n')
        with pytest.raises(Exception, match="bad role"):
            second.render([{"role": "tool", "content": "x"}])


def test_an_edited_tokenizer_is_checked_again(tmp_path):
    folder = _folder(tmp_path)
    cache = tmp_path / "cache"
    Tokenizer.from_folder(folder, cache=cache)
    assert Tokenizer.from_folder(folder, cache=cache).hf is None
    edited = _folder(tmp_path, RICH_TEMPLATE)  # same folder, new template
    tok = Tokenizer.from_folder(edited, cache=cache)
    assert tok.hf is not None and tok.render(CONVERSATIONS[0]).startswith("<|im_start|><|im_start|>system\nBe brief.")
    assert Tokenizer.from_folder(edited, cache=cache).render(CONVERSATIONS[0]) == tok.render(CONVERSATIONS[0])


def test_a_disagreeing_direct_path_is_never_used(tmp_path, monkeypatch):
    folder = _folder(tmp_path)
    cache = tmp_path / "cache"

    class Off:
        def render(self, **kw):
            return "not what transformers renders"

    monkeypatch.setattr(tokenizer_module, "compile_template", lambda source: Off())
    Tokenizer.from_folder(folder, cache=cache)
    facts = json.loads(next(cache.glob("*/facts.json")).read_text())
    assert facts["fast"] is False
    tok = Tokenizer.from_folder(folder, cache=cache)
    assert tok.hf is not None  # still transformers, and right
    assert tok.render(CONVERSATIONS[0]) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_a_damaged_cache_entry_is_rebuilt(tmp_path):
    folder = _folder(tmp_path)
    cache = tmp_path / "cache"
    good = Tokenizer.from_folder(folder, cache=cache)
    entry = next(cache.glob("*/tokenizer.json"))
    entry.write_text("{ not json")
    again = Tokenizer.from_folder(folder, cache=cache)
    assert again.hf is not None
    _same(good, again)
    assert Tokenizer.from_folder(folder, cache=cache).hf is None  # rebuilt


@pytest.mark.slow  # two processes that load the demo model
def test_the_demo_model_starts_without_importing_transformers(demo_gguf):
    """Once its tokenizer is cached, loading the demo model and answering imports no transformers."""
    code = ("import sys; from engine.engine import Engine; e = Engine.load('demo', draft='none', device='cpu'); "
            "r = e.generate([{'role': 'user', 'content': 'Name a color.'}]); "
            "print(repr(r.text[:40]), 'transformers' in sys.modules)")
    env = dict(os.environ, PYTHONPATH=str(tokenizer_module.Path(__file__).resolve().parents[2]))
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
    texts = [r.stdout.strip().rsplit(" ", 1) for r in runs]
    assert texts[1][1] == "False"
    assert texts[0][0] == texts[1][0] and len(texts[0][0]) > 4
