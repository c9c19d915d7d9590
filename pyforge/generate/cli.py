"""``pyforge generate``: stream text from a decoder."""

from __future__ import annotations


def add_commands(sub) -> None:
    """Register the ``generate`` command (not yet built)."""
