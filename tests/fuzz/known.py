"""Findings pyforge has now: each a seed, how its minimised graph is cut from the seed's graph,
and why it fails. test_fuzz.py runs each as ``xfail(strict=True)``: fixing one makes the test
fail until its entry is removed here (and from FINDINGS.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Known:
    seed: int
    cls: str  # "crash" or "mismatch"
    op: str  # the ops of the minimised graph
    reason: str
    outputs: tuple[str, ...]
    inputs: tuple[str, ...] = ()  # intermediate values fed in as graph inputs
    inits: tuple[str, ...] = ()  # intermediate values fed in as initializers

    @property
    def cut(self) -> dict:
        return {"outputs": self.outputs, "inputs": self.inputs, "inits": self.inits}


KNOWN: list[Known] = []

# seeds of test_fuzz.CI_SEEDS that hit a known finding (seed -> the KNOWN seed it duplicates)
HITS: dict[int, int] = {}
