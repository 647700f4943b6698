"""Weight files: safetensors and PyTorch .bin checkpoints, GGUF files and their prepared folders,
and the exact-name copy of tensors into a model."""
