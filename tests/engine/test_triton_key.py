"""remember_triton_key: Triton gets its installation hash from the cache folder, computed once."""

import pytest

triton = pytest.importorskip("triton")
import triton.runtime.cache as tc  # noqa: E402

from engine.kernels.triton_key import remember_triton_key  # noqa: E402


@pytest.fixture
def original(monkeypatch):
    fn = tc.triton_key
    monkeypatch.setattr(tc, "triton_key", fn)  # restored after the test
    return fn


def test_the_stored_key_is_triton_s_own_and_later_processes_read_it(tmp_path, original):
    assert remember_triton_key(tmp_path)
    (stored,) = tmp_path.iterdir()
    assert stored.read_text() == original() == tc.triton_key()
    assert remember_triton_key(tmp_path)  # already handed over: nothing changes

    # A later process: the file is read, not recomputed.
    tc.triton_key = original
    stored.write_text(triton.__version__ + "-from-the-file")
    assert remember_triton_key(tmp_path)
    assert tc.triton_key() == triton.__version__ + "-from-the-file"


def test_a_damaged_file_or_an_unknown_triton_leaves_triton_alone(tmp_path, original):
    assert remember_triton_key(tmp_path)
    (stored,) = tmp_path.iterdir()
    tc.triton_key = original
    stored.write_text("not a key")
    assert not remember_triton_key(tmp_path) and tc.triton_key is original
    tc.triton_key = lambda: "something else"  # not the function this was written against
    assert not remember_triton_key(tmp_path / "other")
    assert not (tmp_path / "other").exists()
