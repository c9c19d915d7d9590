"""A plain GEMM kernel from the same emitter: the cuda fallback where cuBLASLt is absent (the
CUDA simulator in CI, a machine without nvmath-python). Correct, not fast. build_plan keeps it
on every GEMM step, so a runtime only loads it like any other kernel."""

from __future__ import annotations

import numpy as np

from .emit import KernelBuilder, KernelCall, type_name
from .program import GemmCall
from .scalar import lit


def gemm_kernel(g: GemmCall, dtype: np.dtype) -> KernelCall:
    """One thread per D element; reads A, B (and C) through the GemmCall's strides."""
    t = type_name(dtype)
    kb = KernelBuilder(f"gemm {g.label}")
    b_, r, c = kb.coords((g.batch, g.m, g.n))
    a, bm, d = kb.tensor(g.a), kb.tensor(g.b), kb.tensor(g.d)
    K = kb.int_param(g.k, "K")
    sa, sb = kb.int_param(g.stride_a, "sa"), kb.int_param(g.stride_b, "sb")
    lda, ldb = kb.int_param(g.lda, "lda"), kb.int_param(g.ldb, "ldb")
    a_idx = f"{b_} * {sa} + " + (f"j * {lda} + {r}" if g.trans_a else f"{r} * {lda} + j")
    b_idx = f"{b_} * {sb} + " + (f"{c} * {ldb} + j" if g.trans_b else f"j * {ldb} + {c}")
    kb.emit(f"acc = {lit(0, t)}")
    kb.emit(f"for j in range({K}):")
    kb.emit(f"acc += {a}[{a_idx}] * {bm}[{b_idx}]", 1)
    kb.emit(f"acc = acc * {lit(g.alpha, t)}")
    if g.c:
        cc = kb.tensor(g.c)
        sc, ldc = kb.int_param(g.stride_c, "sc"), kb.int_param(g.ldc, "ldc")
        kb.emit(f"acc += {lit(g.beta, t)} * {cc}[{b_} * {sc} + {r} * {ldc} + {c}]")
    sd, ldd = kb.int_param(g.stride_d, "sd"), kb.int_param(g.ldd, "ldd")
    kb.emit(f"{d}[{b_} * {sd} + {r} * {ldd} + {c}] = acc")
    return kb.build(g.batch * g.m * g.n)
