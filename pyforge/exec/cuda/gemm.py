"""The cuda target's GEMM chooser: cuBLASLt (nvmath-python) where it is importable, else the
step's fallback kernel, a plain generated GEMM (the CUDA simulator in CI, a machine without
nvmath-python)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ...errors import ModelLoadError
from ..steps import GemmStep

if TYPE_CHECKING:
    from .runtime import CudaContext

WORKSPACE_BYTES = 32 << 20


def gemm_backend(simulated: bool) -> str:
    """ "cublaslt", or "numba" (the fallback kernels) where cuBLASLt cannot run."""
    if simulated:
        return "numba"
    try:
        from . import cublaslt  # noqa: F401

        return "cublaslt"
    except ImportError:
        return "numba"


def choose_gemm(rt: CudaContext, step: GemmStep) -> tuple[Callable[[], None], bool]:
    """(the GEMM as one bound call, whether it applies the step's epilogue too)."""
    if rt.gemm_backend == "numba":
        if step.fallback is None:
            raise ModelLoadError(
                f"GEMM step {step.label!r} has no fallback kernel, and cuBLASLt is unavailable"
            )
        return rt.bind_kernel(step.fallback), False
    return _lt_gemm(rt, step)


def _lt_gemm(rt: CudaContext, g: GemmStep) -> tuple[Callable[[], None], bool]:
    """A cuBLASLt call; with the epilogue folded in when cuBLASLt can express it."""
    from .cublaslt import LtGemm

    common = dict(
        trans_a=g.trans_a,
        trans_b=g.trans_b,
        lda=g.lda,
        ldb=g.ldb,
        ldd=g.ldd,
        batch=g.batch,
        stride_a=g.stride_a,
        stride_b=g.stride_b,
        stride_d=g.stride_d,
        alpha=g.alpha,
        precision=_gemm_precision(rt, g),
        workspace_bytes=WORKSPACE_BYTES,
    )
    pat = g.pattern if rt.library_epilogues else None
    lt, folded = None, False
    if pat and not g.c and pat.act != "relu6":  # cuBLASLt has no Relu6: the kernel runs it
        try:
            lt = LtGemm(
                g.m,
                g.n,
                g.k,
                ldc=g.ldd,
                stride_c=g.stride_d,
                beta=1.0 if pat.residual else 0.0,
                act=pat.act,
                bias_axis=pat.bias_axis,
                **common,
            )
            c, bias, folded = pat.residual or g.d, pat.bias, True
        except NotImplementedError:
            lt = None
    if lt is None:
        lt = LtGemm(
            g.m,
            g.n,
            g.k,
            ldc=g.ldc or g.ldd,
            stride_c=g.stride_c,
            beta=g.beta if g.c else 0.0,
            **common,
        )
        c, bias = g.c or g.d, None
    views = rt.views
    a, b = pointer(views[g.a]), pointer(views[g.b])
    cc, d = pointer(views[c]), pointer(views[g.d])
    bp = pointer(views[bias]) if bias else 0
    ws, handle = pointer(rt.workspace), rt.stream_handle
    call = lambda: lt.run(a, b, cc, d, bp, ws, handle)
    call.lt = lt  # explain names its algorithm
    return call, folded


def _gemm_precision(rt: CudaContext, g: GemmStep) -> str:
    """float16 operands (a plan compiled with precision="fp16") run cuBLASLt's fp16 tensor
    cores, accumulating in float32; float32 GEMMs left in such a plan run TF32."""
    if np.dtype(rt.plan.slots[g.d].dtype) == np.float16:
        return "fp16"
    return "tf32" if rt.precision == "fp16" else rt.precision


def pointer(arr) -> int:
    """A device array's address."""
    return int(arr.__cuda_array_interface__["data"][0])
