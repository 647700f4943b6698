"""Speculative decoding: draft configs and models (EAGLE-3, MTP), drafting, verification."""
