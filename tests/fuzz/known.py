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
        2045,
        "crash",
        "Mod",
        "Mod fmod=1 on floats: the kernel calls math.fmod, which Numba does not type",
        ("v9",),
        ("v7",),
    ),
    Known(
        2941, "crash", "Resize", "Resize mode=cubic: the kernel fails Numba typing (mul)", ("v47",)
    ),
    Known(
        2554,
        "mismatch",
        "Range",
        "float Range: np.arange's length, not ONNX's "
        "ceil((limit-start)/delta) in the input type (2 elements vs 3)",
        ("v29",),
    ),
    Known(2185, "mismatch", "Max", "Max drops NaN: Python max(a, nan) is a", ("v33",), ("v22",)),
    Known(
        3731, "mismatch", "Min", "Min drops NaN: Python min(a, nan) is a", ("v12",), ("v2", "v6")
    ),
    Known(
        6913,
        "mismatch",
        "Floor",
        "Floor(inf) is -2**63: math.floor gives an int64 in Numba",
        ("v5",),
    ),
    Known(
        10143, "mismatch", "Ceil", "Ceil(inf) is -2**63: math.ceil gives an int64 in Numba", ("v5",)
    ),
    Known(
        4690,
        "mismatch",
        "Floor",
        "Floor(nan) is -2**63: math.floor gives an int64 in Numba",
        ("v19",),
        ("v15",),
    ),
    Known(
        2585,
        "mismatch",
        "Round",
        "Round(inf) is -2**63: _round builds on math.floor",
        ("v10",),
        ("v2",),
    ),
    Known(
        3570, "mismatch", "HardSigmoid", "HardSigmoid(nan) is 1: max/min clamp drops NaN", ("v2",)
    ),
    Known(
        4426, "mismatch", "Sign", "Sign(nan) is 0: both comparisons are false", ("v18",), ("v11",)
    ),
    Known(
        20678,
        "mismatch",
        "ReduceMin",
        "ReduceMin skips NaN: the reduce compares with <",
        ("v41",),
        ("v38",),
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
    Known(
        6128,
        "mismatch",
        "Div",
        "int64 Div of -2**63: _int_div takes abs(), which overflows",
        ("v22",),
        ("v15",),
    ),
]

# seeds of test_fuzz.CI_SEEDS that hit a known finding (seed -> the KNOWN seed it duplicates)
HITS: dict[int, int] = {61: 2554, 78: 2045, 130: 2185}
