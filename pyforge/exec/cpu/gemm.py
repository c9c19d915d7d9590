"""The cpu target's GEMM chooser: pyforge's own AVX2 sgemm, else a CBLAS driver, else numpy.

The first two run the whole step (prologue, GEMM, epilogue) as one compiled call; numpy's
``matmul`` runs between the step's kernels, three calls from Python.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..kernels import sequence
from ..steps import GemmStep, KernelStep
from .blas import _blas, _loaded_libraries, bind_blas_step
from .own import bind_own_step


def choose_gemm(
    step: GemmStep,
    views: dict[str, np.ndarray],
    bound: Callable[[KernelStep], tuple],
    kernel: Callable[[KernelStep], Callable[[], None]],
    constants: frozenset[str],
    shared: dict,
    *,
    own_gemm: bool,
    fused_steps: bool,
) -> tuple[Callable[[], None], int, str]:
    """(one callable running the step, launches it counts as, the GEMM implementation's name).

    ``bound(kernel_step)`` is (module name, dispatcher, n, args) for a driver to call the kernel
    itself; ``kernel(kernel_step)`` the kernel as a bound Python call. ``constants`` names the
    weight slots own sgemm packs once, ``shared`` its scratch (own.shared_scratch)."""
    if fused_steps:
        driver = bind_own_step(step, views, bound, constants, shared) if own_gemm else None
        if driver is not None:
            return driver, 1, "pyforge sgemm (AVX2)"
        driver = bind_blas_step(step, views, bound)
        if driver is not None:
            dtype = views[step.d].dtype
            gemv = step.m == 1 and _blas(dtype)[1] is not None
            lib = "OpenBLAS" if any("openblas" in p for p in _loaded_libraries()) else "CBLAS"
            return driver, 1, f"{lib} {'sd'[dtype.itemsize == 8]}{'gemv' if gemv else 'gemm'}"
    parts = [kernel(step.prologue)] if step.prologue else []
    parts.append(bind_matmul(step, views))
    parts += [kernel(step.epilogue)] if step.epilogue else []
    return sequence(parts), len(parts), "numpy matmul"


def strided(
    flat: np.ndarray, batch: int, rows: int, cols: int, ld: int, bstride: int
) -> np.ndarray:
    isz = flat.itemsize
    return np.lib.stride_tricks.as_strided(
        flat, (batch, rows, cols), (bstride * isz, ld * isz, isz), writeable=True
    )


def gemm_operands(g: GemmStep, views: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A, B, D) as batched numpy views implementing the step's row-major semantics."""
    m, n, k, batch = g.m, g.n, g.k, g.batch
    a = strided(views[g.a], batch, *((k, m) if g.trans_a else (m, k)), g.lda, g.stride_a)
    b = strided(views[g.b], batch, *((n, k) if g.trans_b else (k, n)), g.ldb, g.stride_b)
    d = strided(views[g.d], batch, m, n, g.ldd, g.stride_d)
    a = a.transpose(0, 2, 1) if g.trans_a else a
    b = b.transpose(0, 2, 1) if g.trans_b else b
    if batch == 1:
        return a[0], b[0], d[0]
    return a, b, d


def bind_matmul(g: GemmStep, views: dict) -> Callable[[], None]:
    """The GEMM alone, through numpy's matmul (any dtype, any leading dimensions)."""
    a, b, d = gemm_operands(g, views)
    alpha, beta = g.alpha, g.beta
    c = None
    if g.c:
        c = strided(views[g.c], g.batch, g.m, g.n, g.ldc, g.stride_c)
        c = c[0] if g.batch == 1 else c

    def run() -> None:
        np.matmul(a, b, out=d)
        if alpha != 1.0:
            np.multiply(d, d.dtype.type(alpha), out=d)
        if c is not None:
            np.add(d, d.dtype.type(beta) * c, out=d)

    return run
