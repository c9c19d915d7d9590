"""One compiled call per GEMM step on the cpu target: im2col prologue, CBLAS GEMM, epilogue.

numpy's ``matmul`` runs the GEMM from Python, so a conv step used to be three calls (prologue
kernel, matmul, epilogue kernel). Here a generated ``@njit`` driver calls the step's two kernels
and the BLAS library's CBLAS ``gemm`` itself: one call per step. The BLAS routine is the one numpy
already loaded (same library, same threads), found among the process's loaded libraries and
passed to the driver as a ctypes function pointer, so the driver is cached on disk like any kernel.
Where no CBLAS is found, the dtype is not float32/float64, or the GEMM is degenerate, the runtime
keeps the numpy path.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

import numba
import numpy as np
from numba import cfunc

from ..kernels import load_kernel
from ..steps import GemmStep
from .own import SERIAL

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112
SPLIT_MIN = 1 << 18  # multiply-adds below which one thread runs the whole GEMM
# the same for a one-row GEMM (GEMV): Gemma 3's 262k x 640 tied logits (A/B in BENCHMARKS.md,
# decode on the cpu); a decode layer's 0.6-1.3M GEMVs gained nothing sure on a loaded host
GEMV_SPLIT_MIN = 1 << 22

# (symbol, integer type): numpy's wheels bundle an ILP64 OpenBLAS with prefixed names; other
# builds (distro, conda) export the plain CBLAS names with 32-bit integers
_SYMBOLS = (
    ("scipy_cblas_{t}gemm64_", ctypes.c_int64),
    ("cblas_{t}gemm64_", ctypes.c_int64),
    ("cblas_{t}gemm", ctypes.c_int),
)
_FOUND: dict[str, tuple] = {}


@cfunc("int32(int32)")
def _keep_threads(n):
    """Stands in for ``openblas_set_num_threads_local`` where the BLAS has none."""
    return n


def _loaded_libraries() -> list[str]:
    """Shared libraries mapped into this process whose name says BLAS (Linux /proc only)."""
    import numpy.linalg  # noqa: F401  (makes sure numpy's BLAS is mapped)

    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if ".so" in line}
    except OSError:
        return []
    return sorted(p for p in paths if "blas" in os.path.basename(p).lower())


def cblas_gemm(dtype: np.dtype) -> object | None:
    """A ctypes CBLAS ``sgemm``/``dgemm`` for ``dtype`` (float32/float64), or None."""
    return _blas(dtype)[0]


def _blas(dtype: np.dtype) -> tuple:
    """(gemm, gemv, the BLAS's per-thread thread-count setter), each None where missing."""
    t = {np.dtype(np.float32): "s", np.dtype(np.float64): "d"}.get(np.dtype(dtype))
    if t is None:
        return None, None, None
    if t not in _FOUND:
        _FOUND[t] = _find(t)
    return _FOUND[t]


def _find(t: str) -> tuple:
    real = ctypes.c_float if t == "s" else ctypes.c_double
    vp, enum = ctypes.c_void_p, ctypes.c_int
    for path in _loaded_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for pattern, it in _SYMBOLS:
            fn = getattr(lib, pattern.format(t=t), None)
            if fn is None:
                continue
            # some 64-bit-integer builds keep the plain names (e.g. a libopenblas64): calling
            # them with 32-bit ints would be wrong, so an unsuffixed name there is not used
            if it is ctypes.c_int and "64" in os.path.basename(path):
                continue
            proto = ctypes.CFUNCTYPE(
                None, enum, enum, enum, it, it, it, real, vp, it, vp, it, real, vp, it
            )
            local = getattr(lib, "openblas_set_num_threads_local", None)
            threads = None
            if local is not None:
                threads = ctypes.CFUNCTYPE(enum, enum)(ctypes.cast(local, vp).value)
            gemv = getattr(lib, pattern.format(t=t).replace("gemm", "gemv"), None)
            if gemv is not None:
                gemv_proto = ctypes.CFUNCTYPE(
                    None, enum, enum, it, it, real, vp, it, vp, it, real, vp, it
                )
                gemv = gemv_proto(ctypes.cast(gemv, vp).value)
            return proto(ctypes.cast(fn, vp).value), gemv, threads
    return None, None, None


_DRIVER = """\
import sys
import numpy as np
from numba import njit, prange
{imports}

@njit(nogil=True, cache=True, parallel={parallel})
def kernel(gemm, threads, g, alpha, beta, parts, {params}):
{prologue}    isz = {itemsize}
{product}{residual}{epilogue}"""

# Numba's threads each run a slice of rows (or columns) of the GEMM with a single-threaded BLAS
# call (``threads(1)``, restored after)
_SPLIT_GEMM = """\
    m, n = g[0], g[1]
    rows = m >= n
    step = ((m if rows else n) + parts - 1) // parts
    for part in prange(parts):
        lo = part * step
        hi = min(m if rows else n, lo + step)
        if hi > lo:
            before = threads(1)
            for bi in range(g[6]):
                a0 = a.ctypes.data + bi * g[7] * isz
                b0 = b.ctypes.data + bi * g[8] * isz
                d0 = d.ctypes.data + bi * g[9] * isz
                if rows:  # rows lo..hi of A and D
                    a0 += (lo * g[3] if g[10] == {no_trans} else lo) * isz
                    d0 += lo * g[5] * isz
                    gemm({row_major}, g[10], g[11], hi - lo, n, g[2], alpha, a0, g[3], b0, g[4],
                         beta, d0, g[5])
                else:  # columns lo..hi of B and D
                    b0 += (lo if g[11] == {no_trans} else lo * g[4]) * isz
                    d0 += lo * isz
                    gemm({row_major}, g[10], g[11], g[0], hi - lo, g[2], alpha, a0, g[3], b0,
                         g[4], beta, d0, g[5])
            threads(before)
"""

# one row (m == 1): D = op(B)^T applied to A's row, as GEMV (GEMM would pack all of B per call);
# a large one split by output columns over Numba's threads, one single-threaded GEMV each (a
# decode step's weights are read by every core, not one)
_GEMV = """\
    step = (g[1] + parts - 1) // parts
    for part in prange(parts):
        lo = part * step
        hi = min(g[1], lo + step)
        if hi > lo:
            before = threads(1)
            for bi in range(g[6]):
                b0 = b.ctypes.data + (bi * g[8] + lo * {bstep}) * isz
                d0 = d.ctypes.data + (bi * g[9] + lo) * isz
                gemm({row_major}, {op}, {rows}, {cols}, alpha, b0, g[4],
                     a.ctypes.data + bi * g[7] * isz, {incx}, beta, d0, 1)
            threads(before)
"""

_RESIDUAL = """\
    for bi in range(g[6]):
        for r in range(g[0]):
            for col in range(g[1]):
                d[bi * g[9] + r * g[5] + col] += cbeta * c[bi * g[13] + r * g[12] + col]
"""


def _valid(g: GemmStep) -> bool:
    """CBLAS accepts only these leading dimensions (row-major); degenerate sizes stay on numpy."""
    if min(g.m, g.n, g.k) <= 0:
        return False
    need_a = g.m if g.trans_a else g.k
    need_b = g.k if g.trans_b else g.n
    return g.lda >= need_a and g.ldb >= need_b and g.ldd >= g.n


def bind_blas_step(
    step: GemmStep,
    views: dict[str, np.ndarray],
    kernel_fn: Callable,
) -> Callable[[], None] | None:
    """One callable running the whole GEMM step in compiled code, or None (use numpy).

    ``kernel_fn(kernel_step)`` returns (module name, dispatcher, n, args) for a kernel step."""
    dtype = views[step.d].dtype
    gemm, gemv, threads = _blas(dtype)
    if gemm is None or not _valid(step) or any(views[t].dtype != dtype for t in (step.a, step.b)):
        return None
    names: list[str] = []
    values: list[object] = []

    def param(value: object, hint: str) -> str:
        names.append(f"{hint}{len(names)}")
        values.append(value)
        return names[-1]

    imports, calls = _part_calls(step, views, kernel_fn, param)
    for t, tensor in (("a", step.a), ("b", step.b), ("d", step.d)):
        names.append(t)
        values.append(views[tensor])
    residual = ""
    if step.c:
        names += ["c", "cbeta"]
        values += [views[step.c], dtype.type(step.beta)]
        residual = _RESIDUAL
    # Numba's threads each run one slice of the GEMM with a single-threaded BLAS call: one
    # thread pool, not two (OpenBLAS's idle workers spin and starve Numba's, and the reverse:
    # measured stalls of 24 ms on a 2 ms GEMM). Without a per-thread setter, BLAS threads alone.
    # A small GEMM runs whole on the calling thread, in a serial driver: starting a parallel
    # region costs more than it (mlp: 0.07 -> 0.23 ms per predict with parallel drivers).
    # With the GEMMs on Numba's threads, OpenMP's default wait policy (spin a while, then sleep)
    # is left alone: a region then starts in 2-24 us instead of 80-120 us when passive, and a
    # ResNet-50 inference starts ~130 of them.
    parts = 1
    if threads is not None and step.m * step.n * step.k >= SPLIT_MIN:
        parts = numba.get_num_threads()
    # a small GEMM runs single-threaded too: OpenBLAS's workers, once woken, spin on after the
    # call and starve Numba's threads in the steps that follow (ResNet-50 with the fc GEMV on
    # two OpenBLAS threads: 160 ms per inference, on one: 97 ms)
    threads = threads or _keep_threads.ctypes
    product = _SPLIT_GEMM.format(row_major=ROW_MAJOR, no_trans=NO_TRANS)
    if step.m == 1 and gemv is not None:
        gemm = gemv
        parts = numba.get_num_threads() if step.n * step.k >= GEMV_SPLIT_MIN else 1
        # B row-major [k, n] (transposed [n, k]): y[n] = B^T x (B x); x = A's row; a part takes
        # output columns lo..hi: B's rows lo..hi (transposed) or its columns lo..hi
        op, rows, cols, bstep = (
            (NO_TRANS, "hi - lo", "g[2]", "g[4]")
            if step.trans_b
            else (TRANS, "g[2]", "hi - lo", "1")
        )
        incx = "g[3]" if step.trans_a else "1"
        product = _GEMV.format(
            row_major=ROW_MAJOR, op=op, rows=rows, cols=cols, incx=incx, bstep=bstep
        )
    parts = 1 if SERIAL in step.label else parts
    source = _DRIVER.format(
        product=product,
        parallel=parts > 1,
        imports="\n".join(imports),
        params=", ".join(names),
        prologue=calls.get("prologue", ""),
        epilogue=calls.get("epilogue", ""),
        residual=residual,
        itemsize=dtype.itemsize,
    )
    driver, path = load_kernel(source, "cpu")
    # a driver loaded from Numba's disk cache calls its parallel kernels' compiled code directly,
    # and that code needs Numba's thread pool: nothing starts the pool when no parallel kernel was
    # called from Python first (a segfault on the first conv). get_num_threads() starts it.
    numba.get_num_threads()
    g = _sizes(step)
    alpha, beta = dtype.type(step.alpha), dtype.type(0)
    args = tuple(values)
    call = lambda: driver(gemm, threads, g, alpha, beta, parts, *args)
    call.source_path = path  # what explain shows for the step
    return call


def _part_calls(
    step: GemmStep, views: dict, kernel_fn: Callable, param: Callable
) -> tuple[list[str], dict[str, str]]:
    """(the driver's import lines, its prologue and epilogue call lines) for the step."""
    imports, calls = [], {}
    conv = step.conv
    if conv and views[conv.x].dtype == views[step.d].dtype:  # the row-copy im2col
        imports.append("from pyforge.exec.cpu.conv import im2col_nchw")
        ps = [param(views[conv.x], "x"), param(views[conv.col], "x")]
        ps.append(param(np.array(conv.geometry, np.int64), "x"))
        calls["prologue"] = f"    im2col_nchw({', '.join(ps)})\n"
    for part, kstep in (("prologue", step.prologue), ("epilogue", step.epilogue)):
        if kstep is None or part in calls:
            continue
        module, _, n, args = kernel_fn(kstep)
        imports.append(f'{part} = sys.modules["{module}"].kernel')
        ps = [param(np.int64(n), "n")] + [param(v, "x") for v in args]
        calls[part] = f"    {part}({', '.join(ps)})\n"
    return imports, calls


def _sizes(step: GemmStep) -> np.ndarray:
    """The driver's ``g``: sizes, leading dimensions, batch strides and CBLAS transposes."""
    trans = [TRANS if t else NO_TRANS for t in (step.trans_a, step.trans_b)]
    return np.array(
        [step.m, step.n, step.k, step.lda, step.ldb, step.ldd, step.batch]
        + [step.stride_a, step.stride_b, step.stride_d, *trans, step.ldc or 0, step.stride_c or 0],
        np.int64,
    )
