"""CLI details a newcomer meets: help for every option, bench's defaults and --quick, --no-spec
loading no draft, doctor's versions, and one exit status per Hub error whichever command hits it."""

import json
from pathlib import Path
import socket
from types import SimpleNamespace

import pytest

from app.cli import build_parser, main
from tests.hub_fixtures import fake_hub, hub_env  # noqa: F401
from tests.hub_server import Drop


def _parsers():
    parser = build_parser()
    subs = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return [("localchat", parser)] + sorted(subs.choices.items())


@pytest.mark.parametrize("name,parser", _parsers(), ids=[n for n, _ in _parsers()])
def test_every_option_says_what_it_does(name, parser):
    silent = [a.option_strings[0] if a.option_strings else a.dest for a in parser._actions
              if a.__class__.__name__ != "_SubParsersAction" and not (a.help or "").strip()]
    assert silent == [], f"{name}: options without help text"


def test_bench_help_gives_every_default(capsys):
    bench = dict(_parsers())["bench"]
    no_default = [a.option_strings[0] for a in bench._actions
                  if a.option_strings and a.nargs != 0 and "default" not in a.help]
    assert no_default == []
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--quick" in text and "(default 256)" in text and "(default 4)" in text and "(default 512)" in text


def test_bench_counts_from_quick_or_full_with_explicit_flags_first():
    from benchmarks.harness.counts import FULL_BENCH, QUICK_BENCH, apply_counts

    full = SimpleNamespace(quick=False, prompts=None, new_tokens=None, prompt_tokens=None)
    apply_counts(full)
    assert vars(full) == dict(FULL_BENCH, quick=False)
    quick = SimpleNamespace(quick=True, prompts=3, new_tokens=None, prompt_tokens=None)
    apply_counts(quick)
    assert vars(quick) == dict(QUICK_BENCH, quick=True, prompts=3)
    assert QUICK_BENCH["prompts"] < FULL_BENCH["prompts"] and QUICK_BENCH["new_tokens"] < FULL_BENCH["new_tokens"]


def test_bench_quick_runs_few_prompts_and_tokens(tmp_path, tiny_models):
    out = tmp_path / "r.json"
    assert main(["bench", "--quick", "--model", str(tiny_models["llama"]), "--device", "cpu", "--no-peer",
                 "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["quick"] and r["prompts"] == 1 and r["new_tokens"] == 64


@pytest.fixture
def tiny_as_demo(tiny_models, monkeypatch):
    """`--model demo` resolves to the tiny llama, so the demo's default draft head would load with it;
    build_speculator records what it is asked for."""
    import engine.build as build
    import speculative.build as spec_build
    from engine.hub.resolve import ModelSource

    real_resolve = build.resolve

    def resolve(spec, log=None, what="model"):
        if what == "model":
            return ModelSource(tiny_models["llama"], "demo", is_demo=True)
        return real_resolve(spec, log, what)

    monkeypatch.setattr(build, "resolve", resolve)
    asked = []
    monkeypatch.setattr(spec_build, "build_speculator", lambda path, *a, **kw: asked.append(path))
    return asked


def test_run_no_spec_loads_no_draft(tiny_as_demo, capsys):
    assert main(["run", "--no-spec", "--device", "cpu", "--json", "--max-tokens", "2", "Hi"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert tiny_as_demo == [] and result["draft"] is None and not result["stats"]["speculative"]


def test_run_without_no_spec_loads_the_default_draft(tiny_as_demo, capsys):
    """The check above can fail: without --no-spec the demo's draft is asked for."""
    assert main(["run", "--device", "cpu", "--json", "--max-tokens", "2", "Hi"]) == 0
    assert len(tiny_as_demo) == 1 and tiny_as_demo[0].name == "demo-eagle3"


def test_spec_with_no_spec_is_a_one_line_error(capsys):
    assert main(["run", "--spec", "--no-spec", "Hi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--spec and --no-spec" in err and "Traceback" not in err


def test_random_quant_errors_are_one_line(capsys):
    """--random-quant without --random-weights, an unknown layout, and a CPU: one line each,
    before any model loads."""
    cases = [(["--random-quant", "Q4_K"], "--random-weights"),
             (["--random-weights", "llama-8b", "--random-quant", "Q9"], "choose one of Q4_K_M"),
             (["--random-weights", str(Path(__file__).parents[2] / "benchmarks/configs/smollm2-135m.json"),
               "--random-quant", "Q4_K", "--device", "cpu",
               "--quick", "--no-peer"], "needs a GPU")]
    for args, says in cases:
        assert main(["bench", *args]) != 0
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err and "Traceback" not in err, err


def test_random_quant_refuses_a_layout_whose_blocks_do_not_divide_the_model():
    """The demo's hidden size (576) is no multiple of the k-quants' 256-input blocks nor of AWQ's
    128-input groups: one line naming the widths, before any model is built; Q4_1's blocks of 32
    and FP8 pack it."""
    from benchmarks.harness.random_packed import check_layout
    from engine.config import ModelConfig
    from engine.errors import UserError
    from engine.config_checks import read_json

    cfg = ModelConfig.from_hf(read_json(Path(__file__).parents[2] / "benchmarks/configs/smollm2-135m.json"), "demo")
    for layout, block in (("Q4_K_M", 256), ("Q6_K", 256), ("AWQ", 128)):
        with pytest.raises(UserError) as e:
            check_layout(layout, cfg)
        msg = str(e.value)
        assert "\n" not in msg and f"blocks of {block} inputs" in msg and "hidden 576" in msg, msg
    for layout in ("Q4_1", "Q8_0", "FP8", "FP8-block"):
        check_layout(layout, cfg)
    with pytest.raises(UserError, match="choose one of"):
        check_layout("Q9", cfg)


def test_no_spec_with_a_draft_is_a_one_line_error(capsys):
    assert main(["run", "--no-spec", "--draft", "some/head", "Hi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--no-spec" in err and "some/head" in err


def test_the_app_with_no_spec_loads_no_draft(monkeypatch):
    import app.tui as tui

    made = {}

    class Recorder:
        return_code = 0

        def __init__(self, **kwargs):
            made.update(kwargs)

    monkeypatch.setattr(tui, "LocalChatApp", Recorder)
    monkeypatch.setattr(tui, "run_app", lambda app: app.return_code)  # the app is only built, not run
    assert main(["--no-spec"]) == 0
    assert made["draft"] == "none" and made["speculative"] is False
    assert main([]) == 0
    assert made["draft"] is None and made["speculative"] is None


def test_doctor_reads_versions_from_package_metadata(capsys):
    from importlib import metadata

    assert main(["doctor"]) == 0
    lines = capsys.readouterr().out.splitlines()
    gguf = next(line for line in lines if line.startswith("gguf "))
    assert gguf.split() == ["gguf", metadata.version("gguf")]
    assert not [line for line in lines if line.rstrip().endswith("?")]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status_and_error(capsys, *argv):
    code = main(list(argv))
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("localchat: error")]
    assert len(err) == 1
    return code, err[0]


def test_an_unreachable_hub_is_status_2_from_run_and_download(hub_env, monkeypatch, capsys):
    from huggingface_hub import constants, hf_api

    url = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(hf_api.api, "endpoint", url)
    download = _status_and_error(capsys, "download", "tiny/llama")
    run = _status_and_error(capsys, "run", "--model", "tiny/llama", "--device", "cpu", "Hi")
    assert download == run and run[0] == 2 and "cannot reach the Hub" in run[1]


def test_a_download_that_breaks_off_is_status_1_from_run_and_download(hub_env, fake_hub, capsys):
    fake_hub.drops[("tiny/llama", "model-00001-of-00002.safetensors")] = Drop(after_bytes=100, times=1000)
    download = _status_and_error(capsys, "download", "tiny/llama")
    run = _status_and_error(capsys, "run", "--model", "tiny/llama", "--device", "cpu", "Hi")
    assert download[0] == run[0] == 1 and "connection dropped" in run[1]


def test_tree_auto_is_the_default_where_a_user_meets_it(monkeypatch):
    """The app, run and serve start with --tree auto (a GPU times chains and a few trees once and
    keeps the fastest for greedy answers; a CPU takes chains); bench times what it is told, chains
    unless --tree says otherwise; --tree off is chains anywhere. The app hands auto to the engine."""
    parser = build_parser()
    assert parser.parse_args([]).tree == "auto"
    assert parser.parse_args(["run", "hi"]).tree == "auto"
    assert parser.parse_args(["serve"]).tree == "auto"
    assert parser.parse_args(["bench"]).tree is None
    assert parser.parse_args(["bench", "--tree", "auto"]).tree == "auto"
    assert parser.parse_args(["run", "--tree", "off", "hi"]).tree is None
    import app.tui as tui

    seen = {}

    class Engine:
        speculator = SimpleNamespace(set_tree=lambda *a, **k: None)

        @classmethod
        def load(cls, model, **kwargs):
            return cls()

        def set_tree(self, tree, log=None):
            seen["tree"] = tree

    import engine as engine_package

    monkeypatch.setattr(engine_package, "Engine", Engine)
    import gc

    try:
        tui._load_engine("demo", tree=parser.parse_args([]).tree)(lambda text, fraction: None)
    finally:
        gc.unfreeze()  # the loader freezes the heap it leaves behind
    assert seen["tree"] == "auto"


def test_run_with_a_draft_tree(tmp_path, tiny_models, capsys):
    """`run --tree TOPK,DEPTH,TOKENS`: the same greedy tokens as chains, each verify step running
    the root and TOKENS nodes (verify_tokens in --json); bad shapes, auto and MTP are one line."""
    from tests.speculative.heads import head_tensors, write_head
    from tests.tiny import read_config

    cfg = read_config(tiny_models["llama"])
    head = write_head(tmp_path / "head", cfg, "sglang", head_tensors(64, 64, 3, cfg["vocab_size"], 200, seed=1), 64,
                      (0, 1, 2))
    args = ["run", "--model", str(tiny_models["llama"]), "--draft", str(head), "--device", "cpu", "--spec", "--json",
            "--max-tokens", "24", "--temperature", "0", "Hi there"]
    results = []
    for tree in ([], ["--tree", "off"], ["--tree", "3,3,10"], ["--tree", "auto"]):
        assert main(args + tree) == 0
        results.append(json.loads(capsys.readouterr().out))
    chain, off, tree, auto = results
    assert chain["token_ids"] == off["token_ids"] == tree["token_ids"] == auto["token_ids"]
    assert tree["stats"]["verify_tokens"] == 11 and chain["stats"]["verify_tokens"] == 6  # k = 5, no runners-up on a CPU
    assert auto["stats"]["verify_tokens"] == 6  # auto takes chains on a CPU
    for bad, says in [("tall", "use off, auto"), ("2,2,9", "lower TOKENS"), ("3,3", "TOPK,DEPTH,TOKENS")]:
        with pytest.raises(SystemExit) as e:
            main(args + ["--tree", bad])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, err


@pytest.mark.parametrize("argv,hint", [(["train-draft", "--model", "demo", "--out", "x"], "--batch-tokens"),
                                       (["run", "--model", "demo", "hi"], "--max-seq-len")])
def test_out_of_gpu_memory_is_one_line_naming_what_to_lower(monkeypatch, capsys, argv, hint):
    """A command that runs out of GPU memory says so in one line and names the setting that takes
    the memory there: train-draft's tokens a step, the other commands' context."""
    import app.cli

    def oom(args):
        raise RuntimeError("CUDA out of memory. Tried to allocate 960.00 MiB.\nmore detail")

    monkeypatch.setattr(app.cli, "handler_for", lambda command: oom)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "out of GPU memory" in err and hint in err
