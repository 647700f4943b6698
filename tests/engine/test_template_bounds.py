"""Chat templates render within bounds: a hostile or broken template fails fast, in bounded
memory, with one line naming the template; real templates render exactly as before."""

from __future__ import annotations

import json
import shutil
import time
import tracemalloc

import pytest

from app.cli import main
from engine.chat_template import ChatTemplate, TemplateLimitError, render_limit
from engine.errors import UserError
from tests.tiny import CHAT_TEMPLATE, make_tiny_model

HI = [{"role": "user", "content": "hi"}]
LIMIT = render_limit(HI, 8192)

# Each builds gigabytes or runs for minutes without the bounds.
HOSTILE = {
    "repeat": "{{ 'A' * 10**10 }}",
    "repeat-list": "{% set l = ['a' * 1000000] %}{{ (l * 1000000) | join }}",
    "power": "{{ 7 ** (10 ** 9) }}",
    "loops-in-loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "loops-over-strings": "{% set s = 'a' * 1000000 %}{% for i in s %}{% for j in s %}{% endfor %}{% endfor %}",
    "doubling": "{% set ns = namespace(x='a') %}{% for i in range(64) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}",
    "doubling-macro": "{% macro d(s, n) %}{% if n %}{{ d(s ~ s, n - 1) }}{% else %}{{ s | length }}{% endif %}"
                      "{% endmacro %}{{ d('a', 64) }}",
    "calls-in-calls": "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
    "squaring": "{% set ns = namespace(x=3) %}{% for i in range(64) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
    "padding": "{{ 'a' | center(10**10) }}{{ 'a'.ljust(10**10) }}",
    "format-width": "{{ '%0999999999d' % 1 }}",
    "format-spec": "{{ '{:>9999999999}'.format(1) }}",
    "replace": "{% set s = 'a' * 100000 %}{{ s.replace('a', s) }}",
    "join": "{% set s = 'a' * 100000 %}{{ s.join(s) }}",
    "indent": "{% set s = '\n' * 1000000 %}{{ s | indent(1000000) }}",
    "lipsum": "{{ lipsum(10**7) }}",
    "long-output": "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
    "work": "{% set s = 'a' * 1000000 %}{% for i in range(100000) %}{% set t = s | upper %}{% endfor %}",
    "range": "{{ range(10**12) | list | length }}",
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_templates_fail_fast_in_bounded_memory(name):
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(TemplateLimitError, match="chat template"):
            ChatTemplate(HOSTILE[name]).render(max_chars=LIMIT, messages=HI, add_generation_prompt=True)
    finally:
        elapsed = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert elapsed < 10.0, f"{name}: {elapsed:.1f} s"
    assert peak < 256 * 2**20, f"{name}: {peak / 2**20:.0f} MiB"


@pytest.mark.parametrize("source,needle", [
    ("{{ raise_exception('Conversation roles must alternate') }}", "roles must alternate"),
    ("{% for %}", "does not compile"),
    ("{{ " + "9" * 5000 + " }}", "does not compile"),
    ("{{ messages.append(1) }}", "unsafe"),
])
def test_failing_templates_are_one_line_user_errors(source, needle):
    with pytest.raises(UserError, match=needle) as e:
        ChatTemplate(source).render(max_chars=LIMIT, messages=HI, add_generation_prompt=True)
    assert "\n" not in str(e.value) and "chat template" in str(e.value)


def test_long_real_conversations_fit_the_bounds():
    """A chat of thousands of turns and a prompt of megabytes render; the limit grows with them."""
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " * 20} for i in range(4000)]
    text = ChatTemplate(CHAT_TEMPLATE).render(max_chars=render_limit(turns, 8192), messages=turns,
                                              add_generation_prompt=True)
    assert text.count("<|im_start|>") == 4001
    huge = [{"role": "user", "content": "word " * 1_000_000}]
    text = ChatTemplate(CHAT_TEMPLATE).render(max_chars=render_limit(huge, 8192), messages=huge,
                                              add_generation_prompt=True)
    assert len(text) > 5_000_000


def _transformers_render(source: str, messages, **special) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template([messages], chat_template=source, add_generation_prompt=True, **special)
    return rendered[0]


CONVERSATIONS = [
    HI,
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Two\nlines: café 東京 😀 <b>&"}],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "3+3?"}],
]


def test_the_demo_models_template_renders_as_transformers_does(demo_gguf):
    import gguf

    source = gguf.GGUFReader(str(demo_gguf)).fields["tokenizer.chat_template"].contents()
    special = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
    for messages in CONVERSATIONS:
        ours = ChatTemplate(source).render(max_chars=render_limit(messages, 8192), messages=messages,
                                           add_generation_prompt=True, **special)
        assert ours == _transformers_render(source, messages, **special)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("template-bounds") / "llama", "llama")


@pytest.mark.parametrize("name", ["repeat", "loops-in-loops"])
def test_a_hostile_template_through_the_cli(tmp_path, llama, capsys, name):
    folder = tmp_path / "m"
    shutil.copytree(llama, folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["chat_template"] = HOSTILE[name]
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    if (folder / "chat_template.jinja").exists():
        (folder / "chat_template.jinja").write_text(HOSTILE[name])
    t0 = time.perf_counter()
    rc = main(["run", "--device", "cpu", "--max-tokens", "2", "--model", str(folder), "hi"])
    elapsed = time.perf_counter() - t0
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if not line.startswith("[localchat]")]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "chat template" in lines[0]
    assert elapsed < 30.0, f"{elapsed:.1f} s"  # loads the model too; the template part is well under a second
