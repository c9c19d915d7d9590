"""The typed steps of an ExecutionPlan: what lowering hands the runtimes, and what plan.json holds.

    step = GemmStep.from_json(json.loads(text))     # equal to the step that was saved
    step.tensors()                                  # every tensor it reads or writes
    step.parts()                                    # its kernels, in run order

Every field is a plain value (str, int, float, bool, tuples of them), so a step is hashable,
compares by value and writes to JSON without help.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

# a kernel argument: ("t", tensor) | ("w", tensor read as 16-byte elements on cuda) | ("i", int)
# | ("e", 0): the kernel's int32 error word (cuda index checks; a dummy on cpu)
Arg = tuple[str, Any]
TENSOR_ARGS = ("t", "w")


@dataclass(frozen=True)
class KernelStep:
    """One generated kernel launch: ``plan.kernels[kernel]`` over ``n`` iterations."""

    kernel: str  # key into plan.kernels
    n: int
    args: tuple[Arg, ...]
    label: str = ""
    inner: int = 0  # > 0: iterations are rows x inner (a 2-d launch on cuda)
    # cuda: an explicit (grid, threads per block) for a kernel written for one launch shape;
    # None: the grid-stride launch every other kernel takes
    launch: tuple[tuple[int, ...], int] | None = None

    def tensors(self) -> list[str]:
        return [v for kind, v in self.args if kind in TENSOR_ARGS]

    def parts(self) -> list[KernelStep]:
        return [self]

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "kind": "kernel",
            "kernel": self.kernel,
            "n": self.n,
            "inner": self.inner,
            "label": self.label,
            "args": [list(a) for a in self.args],
        }
        if self.launch is not None:
            d["launch"] = [list(self.launch[0]), self.launch[1]]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> KernelStep:
        launch = d.get("launch")
        return cls(
            kernel=d["kernel"],
            n=int(d["n"]),
            args=tuple((kind, int(v) if kind in ("i", "e") else v) for kind, v in d["args"]),
            label=d.get("label", ""),
            inner=int(d.get("inner", 0)),
            launch=None if launch is None else (tuple(int(g) for g in launch[0]), int(launch[1])),
        )


@dataclass(frozen=True)
class EpiloguePattern:
    """A GEMM's epilogue in BLAS-library terms, when exactly expressible so: a target whose
    GEMM library has such epilogues may run it there and skip the epilogue kernel."""

    bias: str | None = None  # a bias vector tensor
    bias_axis: str | None = None  # "m" (per row) or "n" (per column)
    residual: str | None = None  # a tensor added to D (as the library's C, beta 1)
    act: str | None = None  # "relu", "gelu", "relu6" (Clip(0, 6)) or None

    def tensors(self) -> list[str]:
        return [t for t in (self.bias, self.residual) if t]


@dataclass(frozen=True)
class ConvGeometry:
    """A dense NCHW conv's im2col (``x`` -> ``col``): lets a target run its own im2col in
    place of the generic prologue kernel."""

    x: str
    col: str
    # (n, c, h, w, kh, kw, sh, sw, pad top, pad left, dh, dw, oh, ow)
    geometry: tuple[int, ...]

    def tensors(self) -> list[str]:
        return [self.x, self.col]

    def reads_windows(self) -> bool:
        """Whether the cpu's own sgemm reads the windows from the padded image itself, with no
        column matrix: stride 1, or a kernel wider than 1x1 (a strided 1x1 keeps its im2col),
        unless the padded rows it would compute are over twice the output (a wide dilation)."""
        g = self.geometry
        wide = shifted_columns(g)[1] > 2 * g[12] * g[13]
        return (tuple(g[6:8]) == (1, 1) or g[4] * g[5] > 1) and not wide


def shifted_columns(geometry: tuple[int, ...]) -> tuple[int, int]:
    """(padded width, columns) of a conv's padded column space q = oh * Wp + ow, where every
    output column's window lies inside the padded row (exec/cpu/pack.shifted_conv)."""
    kw, sw, dw, oh, ow = geometry[5], geometry[7], geometry[11], geometry[12], geometry[13]
    wp = ow + (kw - 1) * dw // sw
    return wp, (oh - 1) * wp + ow


@dataclass(frozen=True)
class GemmStep:
    """Row-major strided-batched D[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b], with the
    kernels fused before (im2col) and after it (elementwise, in place on D)."""

    a: str
    b: str
    d: str
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldd: int
    trans_a: bool = False
    trans_b: bool = False
    batch: int = 1
    stride_a: int = 0
    stride_b: int = 0
    stride_d: int = 0
    alpha: float = 1.0
    beta: float = 0.0
    c: str | None = None
    ldc: int = 0
    stride_c: int = 0
    label: str = ""
    prologue: KernelStep | None = None
    epilogue: KernelStep | None = None
    pattern: EpiloguePattern | None = None
    conv: ConvGeometry | None = None
    # the same GEMM as a plain generated kernel: what a cuda runtime without cuBLASLt runs in
    # place of the library call (correct, not fast); not one of parts(), which always run
    fallback: KernelStep | None = None

    def tensors(self) -> list[str]:
        names = [t for t in (self.a, self.b, self.c, self.d) if t]
        for part in self.parts():
            names += part.tensors()
        for extra in (self.pattern, self.conv):
            names += extra.tensors() if extra is not None else []
        return names

    def parts(self) -> list[KernelStep]:
        return [p for p in (self.prologue, self.epilogue) if p is not None]

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": "gemm"}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, KernelStep):
                v = v.to_json()
            elif isinstance(v, EpiloguePattern):
                v = {g.name: getattr(v, g.name) for g in fields(v)}
            elif isinstance(v, ConvGeometry):
                v = {"x": v.x, "col": v.col, "geometry": list(v.geometry)}
            d[f.name] = v
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GemmStep:
        kw = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        for part in ("prologue", "epilogue", "fallback"):
            kw[part] = KernelStep.from_json(kw[part]) if kw.get(part) else None
        if kw.get("pattern"):
            kw["pattern"] = EpiloguePattern(**kw["pattern"])
        if kw.get("conv"):
            c = kw["conv"]
            kw["conv"] = ConvGeometry(c["x"], c["col"], tuple(int(g) for g in c["geometry"]))
        return cls(**kw)


Step = KernelStep | GemmStep


def step_from_json(d: dict[str, Any]) -> Step:
    """The step a ``to_json()`` dict describes (its "kind" says which)."""
    if d.get("kind") == "gemm":
        return GemmStep.from_json(d)
    if d.get("kind") == "kernel":
        return KernelStep.from_json(d)
    raise ValueError(f"unknown plan step kind {d.get('kind')!r}")


def kernel_steps(steps: list[Step]) -> list[KernelStep]:
    """Every kernel the steps always run, in run order (GEMM fallbacks not included)."""
    return [p for s in steps for p in s.parts()]
