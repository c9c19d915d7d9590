"""``pyforge serve``: a model behind Ray Serve on this machine."""

from __future__ import annotations


def add_commands(sub) -> None:
    """Register the ``serve`` command (not yet built)."""
