"""``pyforge export MODEL.gguf -o decoder.onnx``: a GGUF file as an ONNX decoder."""

from __future__ import annotations


def add_commands(sub) -> None:
    """Register the ``export`` command (not yet built)."""
