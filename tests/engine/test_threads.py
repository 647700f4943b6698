"""torch's CPU threads: the cores free at start, --threads, or OMP_NUM_THREADS."""

import pytest
import torch

from engine.errors import UserError
from engine.threads import CpuLoad, apply_threads, choose_threads, free_cores


@pytest.mark.parametrize("cores,usable,load,expected", [
    (2, 2, 0.0, 2),  # an idle machine: every core
    (2, 2, 1.3, 1),  # another process keeps one core busy
    (2, 2, 7.9, 1),  # overloaded: still one thread
    (16, 4, 2.0, 4),  # an affinity mask or quota of 4 on a big, lightly used machine
    (16, 16, 10.4, 6),
    (8, 8, 0.4, 8),  # load rounds to the nearest whole core
    (8, 8, 0.6, 7),
])
def test_free_cores(cores, usable, load, expected):
    assert free_cores(CpuLoad(cores, usable, load)) == expected


def test_measured_load_is_within_the_machine():
    load = CpuLoad.now()
    assert 1 <= load.usable <= load.cores and load.load_1min >= 0
    assert 1 <= free_cores(load) <= load.usable


def test_requested_threads_win_and_omp_num_threads_is_respected(monkeypatch):
    monkeypatch.setattr(CpuLoad, "now", classmethod(lambda cls: CpuLoad(4, 4, 1.0)))
    assert choose_threads(None, environ={}) == 3
    assert choose_threads(2, environ={}) == 2
    assert choose_threads(None, environ={"OMP_NUM_THREADS": "1"}) is None
    assert choose_threads(5, environ={"OMP_NUM_THREADS": "1"}) == 5
    with pytest.raises(UserError, match="--threads must be at least 1, got 0"):
        choose_threads(0)


@pytest.fixture
def saved_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_apply_threads_sets_torch_on_the_cpu_only(monkeypatch, saved_threads):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(CpuLoad, "now", classmethod(lambda cls: CpuLoad(2, 2, 1.0)))
    torch.set_num_threads(2)
    assert apply_threads("cuda", None) == 2  # the GPU path leaves torch's threads alone
    assert apply_threads("cpu", None) == 1 == torch.get_num_threads()
    assert apply_threads("cuda", 2) == 2 == torch.get_num_threads()  # asked for: set on any device


def test_engine_load_and_the_cli_take_threads(tiny_models, saved_threads, capsys):
    from app.cli import main
    from engine import Engine

    torch.set_num_threads(2)
    Engine.load(str(tiny_models["llama"]), device="cpu", threads=1)
    assert torch.get_num_threads() == 1
    assert main(["run", "--model", str(tiny_models["llama"]), "--device", "cpu", "--threads", "0", "Hi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--threads must be at least 1" in err
