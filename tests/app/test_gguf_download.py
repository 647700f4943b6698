"""One file of a GGUF repo from the (fake) Hub: `localchat download REPO:Q8_0` fetches that file
alone (no config.json: the GGUF carries its own), `--model REPO:Q8_0` then runs from the cache
offline, and a tag or file the repo lacks is a one-line error that lists what it has."""

from __future__ import annotations

import json

import pytest

from app.cli import main
from engine.errors import UserError
from engine.hub.gguf_files import parse_gguf_spec, pick_gguf, quant_tags
from tests.hub_fixtures import fake_hub, hub_env  # noqa: F401
from tests.hub_server import FakeRepo
from tests.tiny_gguf import make_tiny_gguf

REPO = "someone/Tiny-Llama-GGUF"


def test_picking_a_file_by_tag_or_name():
    names = ["README.md", "tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf", "tiny-f16.gguf", "mmproj-tiny-f16.gguf",
             "big/big-Q4_K_M-00001-of-00002.gguf", "big/big-Q4_K_M-00002-of-00002.gguf", "tiny-IQ4_XS.gguf"]
    assert parse_gguf_spec(f"{REPO}:Q4_K_M") == (REPO, "Q4_K_M")
    assert parse_gguf_spec(f"{REPO}:sub/x.gguf") == (REPO, "sub/x.gguf")
    assert parse_gguf_spec(REPO) is None and parse_gguf_spec("./model.gguf") is None
    assert parse_gguf_spec("C:/models/x.gguf") is None  # a Windows path is no repo id
    assert quant_tags(names) == ["Q4_K_M", "Q8_0", "F16", "IQ4_XS"]  # the projector is not a model
    assert pick_gguf(names, "q8_0", REPO) == "tiny-Q8_0.gguf"  # case does not matter
    assert pick_gguf(names, "F16", REPO) == "tiny-f16.gguf"
    assert pick_gguf(names, "tiny-IQ4_XS.gguf", REPO) == "tiny-IQ4_XS.gguf"
    with pytest.raises(UserError, match="no .gguf file of someone/Tiny-Llama-GGUF is tagged Q5_K_M; its "
                                        "quantizations: Q4_K_M, Q8_0, F16, IQ4_XS"):
        pick_gguf(names, "Q5_K_M", REPO)
    with pytest.raises(UserError, match="Q4_K matches|tagged Q4_K;"):
        pick_gguf(names, "Q4_K", REPO)  # a tag is whole: Q4_K is not Q4_K_M
    with pytest.raises(UserError, match="2 files .* are tagged Q4_K_M|split into several files"):
        pick_gguf(names, "Q4_K_M", REPO)
    with pytest.raises(UserError, match="split into several files"):
        pick_gguf([n for n in names if n != "tiny-Q4_K_M.gguf"], "Q4_K_M", REPO)
    with pytest.raises(UserError, match="has no file nope.gguf"):
        pick_gguf(names, "nope.gguf", REPO)
    with pytest.raises(UserError, match="has no .gguf model file"):
        pick_gguf(["config.json", "model.safetensors"], "Q4_K_M", REPO)
    with pytest.raises(UserError, match="neither a quantization tag"):
        pick_gguf(names, "Q4*", REPO)


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory):
    work = tmp_path_factory.mktemp("gguf")
    return {q: make_tiny_gguf(work / f"tiny-{q}.gguf", work, q).read_bytes() for q in ("F32", "Q8_0")}


def test_download_one_quantization_then_run_it_offline(hub_env, fake_hub, gguf_files, tmp_path, capsys,
                                                     monkeypatch):
    from huggingface_hub import constants

    fake_hub.add(FakeRepo(REPO, {"README.md": b"# tiny\n", "tiny-F32.gguf": gguf_files["F32"],
                                 "tiny-Q8_0.gguf": gguf_files["Q8_0"]}))
    fake_hub.requests.clear()
    assert main(["download", f"{REPO}:Q8_0"]) == 0
    out = capsys.readouterr()
    path = out.out.strip()
    assert path.endswith("tiny-Q8_0.gguf") and "to download" in out.err
    import hashlib

    wanted = {"tiny-Q8_0.gguf", hashlib.sha256(gguf_files["Q8_0"]).hexdigest()}  # by name, or its CDN blob
    assert [p.rsplit("/", 1)[-1] for p in fake_hub.file_gets()] in ([w] for w in wanted)  # that file alone
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    fake_hub.requests.clear()
    args = ["--device", "cpu", "--json", "--max-tokens", "8", "--no-spec", "Hello there"]
    assert main(["run", "--model", f"{REPO}:q8_0", *args]) == 0
    from_hub = json.loads(capsys.readouterr().out)
    assert main(["run", "--model", path, *args]) == 0, capsys.readouterr().err
    direct = json.loads(capsys.readouterr().out)
    assert fake_hub.requests == []
    assert from_hub["token_ids"] == direct["token_ids"] and len(direct["token_ids"]) > 0
    assert from_hub["weights"] == "Q8_0"
    # `localchat models` (and the wizard) list it under the name --model takes
    assert main(["models", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert f"{REPO}:Q8_0" in [m["name"] for m in listing["local"]]
    # offline, a quantization that was never fetched: one line saying how to get it
    assert main(["run", "--model", f"{REPO}:F32", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"localchat download {REPO}:F32" in err and "Traceback" not in err


def test_a_missing_quantization_is_one_line_listing_the_repos(hub_env, fake_hub, gguf_files, capsys):
    fake_hub.add(FakeRepo(REPO + "2", {"tiny-Q8_0.gguf": gguf_files["Q8_0"]}))
    assert main(["download", f"{REPO}2:Q4_K_M"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tagged Q4_K_M; its quantizations: Q8_0" in err
    # run fetches on demand, and says the same
    assert main(["run", "--model", f"{REPO}2:Q4_K_M", "--device", "cpu", "hi"]) != 0
    assert "tagged Q4_K_M; its quantizations: Q8_0" in capsys.readouterr().err


def test_the_wizard_plans_one_quantization_and_fits_it_as_bf16(hub_env, fake_hub, gguf_files, monkeypatch):
    """The wizard's plan for `REPO:Q8_0`: that file alone, named in the plan's text, and a fit
    estimate that counts the bf16 model it is dequantized to at load, not the file; offline, the
    cached file needs nothing and a quantization never fetched is one line."""
    from huggingface_hub import constants

    from app.wizard_tasks import is_missing_path, plan_choice
    from engine.hub.fit import gguf_gpu_bytes
    from engine.hub.download import run_download

    fake_hub.add(FakeRepo(REPO + "3", {"README.md": b"# tiny\n", "tiny-F32.gguf": gguf_files["F32"],
                                       "tiny-Q8_0.gguf": gguf_files["Q8_0"]}))
    spec = f"{REPO}3:Q8_0"
    assert not is_missing_path(spec) and not is_missing_path(f"{REPO}3:tiny-Q8_0.gguf")
    choice = plan_choice(spec, None, None)
    assert [f.name for f in choice.plan.target.files] == ["tiny-Q8_0.gguf"]
    assert f"{REPO}3/tiny-Q8_0.gguf" in choice.summary and "to download" in choice.summary
    size = len(gguf_files["Q8_0"])
    bf16 = gguf_gpu_bytes(size, "q8_0")
    assert bf16 == int(size * 16 / 8.5) and gguf_gpu_bytes(size, "tiny.gguf") is None
    from engine.units import format_bytes

    assert f"weights take {format_bytes(bf16)} of GPU memory" in choice.summary
    run_download(choice.plan)
    assert "already downloaded" in plan_choice(spec, None, None).summary
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert "offline mode uses the cache" in plan_choice(spec, None, None).summary
    with pytest.raises(UserError, match="not in the cache and HF_HUB_OFFLINE is set"):
        plan_choice(f"{REPO}3:F32", None, None)
