"""Weight files: safetensors and PyTorch .bin checkpoints, GGUF files and their prepared folders,
quantized weights (PackedWeight and the torch references that decode them), and the exact-name
copy of tensors into a model."""
