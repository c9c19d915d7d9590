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


KNOWN: list[Known] = [
    Known(
        2554,
        "mismatch",
        "Range",
        "float Range: np.arange's length, not ONNX's "
        "ceil((limit-start)/delta) in the input type (2 elements vs 3)",
        ("v29",),
    ),
    Known(
        12699,
        "mismatch",
        "GlobalMaxPool",
        "GlobalMaxPool of an all-NaN window is -inf: the "
        "window max starts at -inf and compares with >",
        ("v30",),
        ("v28",),
    ),
    Known(
        4962,
        "mismatch",
        "TopK",
        "TopK with NaN: NaN is not ordered as ORT and the reference order it",
        ("v37",),
    ),
    Known(
        10509,
        "mismatch",
        "MaxPool",
        "MaxPool auto_pad=SAME_LOWER with ceil_mode=1 and "
        "dilations: output length 1 where ORT and the reference give 0",
        ("v32",),
        ("v28",),
    ),
]

# seeds of test_fuzz.CI_SEEDS that hit a known finding (seed -> the KNOWN seed it duplicates)
HITS: dict[int, int] = {61: 2554}
