"""Chain-style multi-token prediction: MTP layers, their config, the speculator and its graphs."""
