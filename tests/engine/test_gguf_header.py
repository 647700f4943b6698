"""The GGUF header reader agrees with the gguf package and refuses damaged files with ValueError."""

import pytest

from engine.weights.gguf_header import read_tensor_infos
from tests.tiny_gguf import make_tiny_gguf


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    base = tmp_path_factory.mktemp("header")
    return make_tiny_gguf(base / "tiny.gguf", base / "work")


def test_tensor_table_matches_the_gguf_package(tiny):
    import gguf

    ours = read_tensor_infos(tiny)
    theirs = gguf.GGUFReader(str(tiny)).tensors
    assert [(t.name, t.shape, t.type_id, t.n_elements) for t in ours] == [
        (t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), int(t.n_elements)) for t in theirs]
    assert any(t.name == "token_embd.weight" for t in ours)


def test_a_cut_header_or_a_non_gguf_is_a_value_error(tiny, tmp_path):
    data = tiny.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: data.index(b"token_embd.weight") - 100])  # before the tensor table ends
    with pytest.raises(ValueError, match="past the end"):
        read_tensor_infos(cut)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ValueError, match="not a GGUF"):
        read_tensor_infos(junk)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ValueError):
        read_tensor_infos(empty)


def test_fit_falls_back_to_the_file_size_for_a_damaged_gguf(tmp_path):
    from engine.hub.fit import local_weights_bytes

    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 8)
    assert local_weights_bytes(junk) == junk.stat().st_size * 4
