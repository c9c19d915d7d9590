"""What lowering produces: tensors plus an ordered list of kernel and GEMM calls."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..ir import Value
from .emit import KernelCall


@dataclass
class GemmCall:
    """Row-major strided-batched D[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b]."""

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
    prologue: KernelCall | None = None  # im2col, run before the GEMM
    epilogue: KernelCall | None = None  # the fused elementwise epilogue, in place on D
    # the epilogue as BLAS-library terms (bias vector, residual C, activation) when it is exactly
    # expressible so; a target whose GEMM library has such epilogues may skip the kernel
    pattern: dict | None = None
    # a dense NCHW conv's geometry (im2col "x" -> "col"): lets a target run its own im2col in
    # place of the generic prologue kernel (the cpu target's row-copy im2col)
    conv: dict | None = None


@dataclass
class TensorInfo:
    shape: tuple[int, ...]
    dtype: np.dtype
    const: np.ndarray | None = None
    alias: str | None = None  # a view: same bytes as this tensor
    offset: int = 0  # a view's first byte within its alias


@dataclass
class Program:
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    steps: list[KernelCall | GemmCall] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    def add(self, v: Value) -> str:
        if v.name not in self.tensors:
            self.tensors[v.name] = TensorInfo(v.shape, np.dtype(v.dtype), v.const)
        return v.name

    def temp(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> str:
        self.tensors[name] = TensorInfo(tuple(shape), np.dtype(dtype))
        return name
