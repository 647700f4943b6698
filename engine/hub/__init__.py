"""Where models come from: resolving --model/--draft, the Hugging Face Hub (download, cache,
metadata checks), local models, the catalog and its pairing and fit checks, the demo model, PyPI."""
