"""Fetching wheels from PyPI: a failure is one clear line, nothing is left behind."""

import pytest

from engine.errors import UserError
from engine.hub.pypi import download_wheel, sha256_file


def test_a_wheel_pip_cannot_find_is_one_line(tmp_path):
    with pytest.raises(UserError) as err:
        download_wheel("localchat-no-such-package-zz==9.9.9", tmp_path, "check the network")
    msg = str(err.value)
    assert "\n" not in msg and "localchat-no-such-package-zz" in msg and msg.endswith("check the network")
    assert not list(tmp_path.iterdir())


def test_sha256_file(tmp_path):
    f = tmp_path / "x"
    f.write_bytes(b"abc")
    assert sha256_file(f) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
