"""One-GPU inference engine: models, weights, KV cache, attention, sampling, graphs, facade.

`Engine` is imported lazily so that `engine.types` and `engine.errors` stay free of torch.
"""

from engine.errors import ModelLoadError, UserError
from engine.types import GenerationResult, GenerationStats, SamplingParams, StreamEvent

__all__ = ["Engine", "GenerationResult", "GenerationStats", "ModelLoadError", "SamplingParams",
           "StreamEvent", "UserError"]


def __getattr__(name: str):
    if name == "Engine":
        from engine.engine import Engine

        return Engine
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
