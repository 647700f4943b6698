"""`localchat run` input that can never work is refused before the model loads: a seed the
generator does not take, a prompt that is not UTF-8 (on stdin or in argv)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from app.cli import main
from engine.errors import UserError
from engine.types import SamplingParams

# Refusals must come before the load: with a model that does not exist, a load would say so.
NO_MODEL = "/nonexistent/model-folder"


def _one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if not line.startswith("[localchat]")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("seed", [str(2**70), str(2**64), "-1", "abc", "1" + "0" * 5000])
def test_seed_out_of_range_is_refused_at_parsing(capsys, seed):
    with pytest.raises(SystemExit) as e:
        main(["run", "--model", NO_MODEL, "--seed", seed, "hi"])
    assert e.value.code == 2
    line = _one_line(capsys.readouterr().err)
    assert "--seed" in line and "2**64 - 1" in line and "no such" not in line.lower(), line
    assert len(line) < 200


def test_seeds_the_generator_takes_are_accepted():
    from app.cli import build_parser

    for seed in (0, 12345, 2**64 - 1):
        assert build_parser().parse_args(["run", "--seed", str(seed), "hi"]).seed == seed
        assert SamplingParams(temperature=1.0, seed=seed).seed == seed


@pytest.mark.parametrize("seed", [-1, 2**64, 2**70])
def test_sampling_params_refuse_a_seed_out_of_range(seed):
    with pytest.raises(UserError, match="--seed"):
        SamplingParams(temperature=1.0, seed=seed)


def _run(args: list, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    # A C locale: Python then decodes stdin and argv with surrogateescape, which hid the bad bytes.
    env = dict(os.environ, LC_ALL="C", LANG="C", PYTHONUTF8="0")
    return subprocess.run([sys.executable, "-m", "app.cli", *args], input=stdin, capture_output=True,
                          timeout=120, env=env)


def test_stdin_that_is_not_utf8():
    out = _run(["run", "--model", NO_MODEL, "-"], stdin=b"caf\xe9 au lait\n")
    assert out.returncode == 2, out.stderr
    line = _one_line(out.stderr.decode("utf-8", "replace"))
    assert "not UTF-8" in line and "0xe9" in line, line


@pytest.mark.parametrize("flag", [None, "--system", "--stop"])
def test_argv_that_is_not_utf8(flag):
    bad = b"caf\xe9"
    args = ["run", "--model", NO_MODEL] + ([flag.encode(), bad, b"hi"] if flag else [bad])
    out = _run(args)
    assert out.returncode == 2, out.stderr
    line = _one_line(out.stderr.decode("utf-8", "replace"))
    assert "not valid UTF-8" in line and "0xe9" in line, line
    assert (flag or "the prompt") in line


def test_utf8_prompts_pass_the_check(capsys):
    """Non-ASCII UTF-8 is fine: the run gets as far as the (missing) model."""
    assert main(["run", "--model", NO_MODEL, "--system", "Réponds en français", "café 東京 😀"]) == 2
    assert "no such file" in _one_line(capsys.readouterr().err).lower()
