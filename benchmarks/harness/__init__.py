"""The benchmark harness: engines on random or loaded weights, timed decoding, and `localchat bench`."""
