"""Widgets of the chat UI, one per module."""
