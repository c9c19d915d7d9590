"""Binds a float32 GEMM step of the cpu target to own sgemm: one generated driver per step.

The driver copies a conv's image into zero-bordered (phase) planes (no im2col), runs ``sgemm``
with the weights packed at bind time, and leaves the epilogue to the GEMM's store when it is
bias-per-row (+ residual) (+ Relu); any other epilogue kernel runs after it, as in the BLAS
driver.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace
from functools import cache
from pathlib import Path

import numba
import numpy as np

from ..kernels import load_kernel
from ..steps import GemmStep, KernelStep
from . import conv as cv
from . import pack as pk
from . import sgemm as sg
from . import tiles

OPENBLAS = "@openblas"  # in a step's label (its group's name): opt/egraph chose OpenBLAS for it
SERIAL = "@serial"  # and: opt/egraph chose one thread for it (own sgemm or OpenBLAS)

# every size is read from ``d`` at run time, so steps of one structure share a compiled driver
_DRIVER = """\
# own sgemm {fingerprint}
import sys
import numpy as np
from numba import njit
from pyforge.exec.cpu.pack import pad_image
from pyforge.exec.cpu.tiles import set_threads, threads
from pyforge.exec.cpu.sgemm import sgemm
{imports}

@njit(nogil=True, cache=True)
def kernel(parts, g, d, l, lp, r, koff, phases, c, bias, res, work, rw, x, cin, beta,
           {params}):
    was = threads()
    if parts == 1:  # (see SERIAL_WORK) the regions of sgemm, its prologue and epilogue too
        set_threads(1)
{prologue}    for bi in range(d[0]):
        g[{L_BASE}] = bi * d[1]
        g[{C_BASE}] = bi * d[2]
        if g[{RES_BASE}] >= 0:
            g[{RES_BASE}] = bi * d[2]
        if d[5]:  # a conv: image bi into the zero-bordered planes r
            pad_image(x, bi * d[6] * d[7] * d[8], d[6], d[7], d[8], d[9], d[10], phases, d[11],
                      d[12], r)
        else:
            g[{R_BASE}] = bi * d[13]
        sgemm(parts, g, l, lp[bi * d[3] : bi * d[3] + d[4]], r, koff, c, bias, res, work, rw)
{residual}{epilogue}    set_threads(was)
"""

# D += beta * C (a Gemm's C input); d[14:19] = m, n, ldd, ldc, stride_c
_RESIDUAL = """\
    for bi in range(d[0]):
        for i in range(d[14]):
            for j in range(d[15]):
                c[bi * d[2] + i * d[16] + j] += beta * cin[bi * d[18] + i * d[17] + j]
"""


@cache
def _fingerprint() -> str:
    """What a driver compiles in from sgemm and its helpers: Numba's disk cache of the driver
    keys on the driver's source alone, so the source names this, and a changed sgemm (or a
    micro-tile chosen for another CPU) compiles anew instead of running a stale copy."""
    digest = hashlib.sha1(f"{sg.MR}x{sg.NR}x{pk.LANES}".encode())
    for module in (sg, pk, tiles, cv):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:16]


# A GEMM of at most this many multiply-adds (up to ~0.1 ms on one core) runs on the calling thread
# alone: a parallel region's start and end cost a few us on a quiet machine, but a wake-up of a
# thread that another process keeps off its core costs 0.2-2 ms on a loaded one
SERIAL_WORK = 1 << 21


def threads_for(step: GemmStep) -> int:
    """The threads a GEMM step runs on: one for a small one, else Numba's (starting its pool)."""
    parts = numba.get_num_threads()  # also starts Numba's thread pool (see blas)
    small = step.batch * step.m * step.n * step.k <= SERIAL_WORK
    return 1 if small or SERIAL in step.label else parts


def takes(m: int, n: int, k: int) -> bool:
    """At least 6 rows (a last panel's missing rows are summed as zeros, never stored), one
    panel of columns and big enough to split: the GEMM sizes own sgemm runs."""
    return m >= 6 and n >= sg.NR and m * n * k >= 1 << 18


def usable(step: GemmStep, views: dict, constant: bool) -> bool:
    """float32, at least one full micro-tile, big enough to split, an alpha foldable into the
    prepacked weight, and a CPU with AVX2 + FMA."""
    b = step.conv.x if step.conv else step.b  # a conv's columns may be left unmade
    return (
        all(views[t].dtype == np.float32 for t in (step.a, b, step.d))
        and takes(step.m, step.n, step.k)
        and (step.alpha == 1.0 or constant)
        and sg.available()
        and OPENBLAS not in step.label
    )


def shared_scratch(steps: list) -> dict:
    """Buffers every own-GEMM step of one runtime shares (steps run one at a time): the largest
    whole-R packing and padded image."""
    gemms = [s for s in steps if isinstance(s, GemmStep)]
    rw = max((sg.whole_r_size(s.m, s.n, s.k) for s in gemms), default=0)
    convs = [(s, pk.shifted_conv(s.conv.geometry)) for s in gemms if s.conv]
    # (strided 1x1 convs take im2col instead, so this may be more than needed)
    xpad = max((p["size"] for _, p in convs), default=0)
    return {"rw": np.empty(rw, np.float32), "xpad": np.empty(xpad, np.float32)}


def _prepack(
    step: GemmStep, a: np.ndarray, constant: bool, packed: dict
) -> tuple[np.ndarray, int, int, bool]:
    """(packed-L buffer, per-batch offset, per-batch size, packed already) for step's A; a
    weight is packed once into ``packed`` and read by every context of the runtime."""
    m, k, batch = step.m, step.k, step.batch
    size = pk.packed_size(m, k, sg.MR)
    if not constant:
        return np.empty(size, np.float32), 0, size, False
    # by address: the runtimes of plans sharing one weights array share ``packed``; one
    # weight read by every batch entry (a conv over n images) packs alike for any n
    where = a.__array_interface__["data"][0]
    per_entry = batch if step.stride_a else 0
    key = (where, a.size, step.alpha, m, k, step.lda, step.trans_a, per_entry, step.stride_a)
    if key not in packed:
        packed[key] = _pack_weight(step, a, size)
    return packed[key]


def _pack_weight(step: GemmStep, a: np.ndarray, size: int) -> tuple[np.ndarray, int, int, bool]:
    m, k, batch = step.m, step.k, step.batch
    rs, ks = (1, step.lda) if step.trans_a else (step.lda, 1)
    one = step.stride_a == 0  # one weight for every batch entry (a conv over n images)
    lp = np.empty(size if one else size * batch, np.float32)
    src = a if step.alpha == 1.0 else (a * np.float32(step.alpha)).astype(np.float32)
    for bi in range(1 if one else batch):
        pk.pack_panels(src, bi * step.stride_a, rs, ks, m, 0, m, 0, k, sg.MR, lp, bi * size)
    return lp, (0 if one else size), size, True


def bind_own_step(
    step: GemmStep,
    views: dict[str, np.ndarray],
    kernel_fn: Callable[[KernelStep], tuple],
    constants: frozenset[str],
    shared: dict,
) -> Callable[[], None] | None:
    """One callable running the GEMM step on own sgemm, or None where it does not apply."""
    if not usable(step, views, step.a in constants) or "rw" not in shared:
        return None
    if step.conv is not None and _pointwise(step.conv.geometry):
        step = _as_matmul(step)
    conv, shift = step.conv, None
    # a strided 1x1 conv keeps its im2col (a plain subsample): its windows would not overlap,
    # and its tiles would straddle output rows
    if conv is not None and conv.reads_windows():
        shift = _shifted(conv.geometry, shared.setdefault("packed", {}))
    g, d, lp, operands = _operands(step, views, constants, shared, shift)
    names: list[str] = []
    values: list[object] = []
    imports, calls = [], {"prologue": "", "epilogue": ""}

    def param(value: object) -> str:
        names.append(f"p{len(names)}")
        values.append(value)
        return names[-1]

    bias, res, step = _store_epilogue(step, views, g)
    if conv is not None and shift is None:
        from .conv import im2col_nchw  # noqa: F401  (compiled before the driver)

        imports.append("from pyforge.exec.cpu.conv import im2col_nchw")
        ps = [param(views[conv.x]), param(views[conv.col])]
        ps.append(param(np.array(conv.geometry, np.int64)))
        calls["prologue"] = f"    im2col_nchw({', '.join(ps)})\n"
    elif step.prologue is not None and shift is None:
        calls["prologue"] = _kernel_call("prologue", step.prologue, kernel_fn, param, imports)
    if step.epilogue is not None:
        calls["epilogue"] = _kernel_call("epilogue", step.epilogue, kernel_fn, param, imports)
    cin, beta = np.zeros(1, np.float32), np.float32(0)
    if step.c:
        cin, beta = views[step.c], np.float32(step.beta)
        d[14:19] = step.m, step.n, step.ldd, step.ldc or step.ldd, step.stride_c or 0
    source = _DRIVER.format(
        fingerprint=_fingerprint(),
        imports="\n".join(imports),
        params=", ".join(names) or "_unused=0",
        prologue=calls["prologue"],
        residual=_RESIDUAL if step.c else "",
        epilogue=calls["epilogue"],
        **{f: getattr(sg, f) for f in ("L_BASE", "C_BASE", "RES_BASE", "R_BASE")},
    )
    driver, path = load_kernel(source, "cpu")
    parts = threads_for(step)
    key = ("work", parts)
    if key not in shared:
        shared[key] = np.empty(sg.work_size(parts), np.float32)
    r, koff, phases, x, rw = operands
    if rw is None:
        rw = shared["rw"]
        if len(rw) < sg.whole_r_size(step.m, step.n, step.k):
            rw = rw[:0]
    args = (parts, g, d, views[step.a], lp, r, koff, phases, views[step.d], bias, res)
    args += (shared[key],)
    args += (rw, x, cin, beta, *values)
    call = lambda: driver(*args)
    call.source_path = path  # what explain shows for the step
    return call


def _pointwise(geometry: tuple[int, ...]) -> bool:
    """A 1x1 conv of stride 1 and no padding: its column matrix is the image itself."""
    h, w, kh, kw, sh, sw, pt, pl = geometry[2:10]
    return (kh, kw, sh, sw, pt, pl, *geometry[12:14]) == (1, 1, 1, 1, 0, 0, h, w)


def _as_matmul(step: GemmStep) -> GemmStep:
    """A pointwise conv as the plain GEMM weights @ image: R read (and packed) from the image
    in place, with no padded copy and no im2col."""
    return replace(step, b=step.conv.x, conv=None, prologue=None, stride_b=step.k * step.n)


def _shifted(geometry: tuple[int, ...], packed: dict) -> dict:
    """pack.shifted_conv's windows, made once per runtime (and the plans sharing ``packed``):
    they depend on what it reads, the geometry less its batch and input size."""
    key = ("shifted", *geometry[1:2], *geometry[4:])
    if key not in packed:
        packed[key] = pk.shifted_conv(list(geometry))
    return packed[key]


def _operands(
    step: GemmStep, views: dict, constants: frozenset[str], shared: dict, shift: dict | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple]:
    """(sgemm's parameters g, the driver's sizes d, packed L, (R, koff, phases, image, R
    packed at bind time or None))."""
    g = np.zeros(sg.N_PARAMS, np.int64)
    g[sg.K_DIM], g[sg.L_ROWS], g[sg.R_COLS] = step.k, step.m, step.n
    g[sg.L_RS], g[sg.L_KS] = (1, step.lda) if step.trans_a else (step.lda, 1)
    g[sg.C_RS], g[sg.RES_BASE] = step.ldd, -1
    packed = shared.setdefault("packed", {})
    lp, lstep, lsize, g[sg.L_PACKED] = _prepack(step, views[step.a], step.a in constants, packed)
    d = np.zeros(19, np.int64)  # the driver's sizes (see _DRIVER, _RESIDUAL)
    d[:5] = step.batch, step.stride_a, step.stride_d, lstep, lsize
    d[13] = step.stride_b
    koff, x, phases = np.zeros(1, np.int64), np.zeros(1, np.float32), np.zeros((1, 4), np.int64)
    if shift is not None:  # R: shifted windows of the padded image
        geo = step.conv.geometry
        r, koff, x, phases = shared["xpad"], shift["koff"], views[step.conv.x], shift["phases"]
        g[sg.R_MODE], g[sg.R_COLS] = sg.R_SHIFTED, shift["cols"]
        g[sg.C_WP], g[sg.C_OW] = shift["wp"], geo[13]
        d[5:13] = 1, *geo[1:4], shift["top"], shift["left"], shift["hp"], shift["wp"]
    else:  # R: the strided matrix B (a strided conv: its im2col, run first)
        r = views[step.b]
        g[sg.R_RS], g[sg.R_KS] = (step.ldb, 1) if step.trans_b else (1, step.ldb)
        one_weight = step.batch == 1 or step.stride_b == 0  # packed once, here
        if step.b in constants and one_weight and step.conv is None and step.prologue is None:
            g[sg.R_MODE] = sg.R_PACKED
            return g, d, lp, (r, koff, phases, x, _prepack_r(step, r, g, packed))
    return g, d, lp, (r, koff, phases, x, None)


def _prepack_r(step: GemmStep, b: np.ndarray, g: np.ndarray, packed: dict) -> np.ndarray:
    """A constant B (a MatMul's or Gemm's weight) packed whole-K as sgemm reads R, once per
    runtime and the plans sharing its weights (keyed by address, as ``_prepack``)."""
    where, rs, ks = b.__array_interface__["data"][0], int(g[sg.R_RS]), int(g[sg.R_KS])
    key = ("r", where, b.size, step.n, step.k, rs, ks)
    if key not in packed:
        out = np.empty(pk.packed_size(step.n, step.k, sg.NR), np.float32)
        pk.pack_panels(b, 0, rs, ks, step.n, 0, step.n, 0, step.k, sg.NR, out, 0)
        packed[key] = out
    return packed[key]


_ACTS = {None: 0, "relu": 1, "relu6": 2}  # the activation codes of sgemm's store


def _store_epilogue(
    step: GemmStep, views: dict, g: np.ndarray
) -> tuple[np.ndarray, np.ndarray, GemmStep]:
    """(bias, residual, step): an epilogue of bias per row (+ residual) (+ Relu/Relu6) moves into
    the GEMM's store (``g``'s flags), and the step returned has no epilogue kernel left."""
    bias, res = np.zeros(1, np.float32), np.zeros(1, np.float32)
    pat = step.pattern
    if pat and not step.c and pat.bias_axis in (None, "m") and pat.act in _ACTS:
        if pat.bias:
            bias, g[sg.BIAS] = views[pat.bias], 1
        if pat.residual:
            res, g[sg.RES_BASE] = views[pat.residual], 0
        g[sg.RELU] = _ACTS[pat.act]
        step = replace(step, epilogue=None)
    return bias, res, step


def _kernel_call(part: str, kstep: KernelStep, kernel_fn, param, imports: list[str]) -> str:
    module, _, n, args = kernel_fn(kstep)
    imports.append(f'{part} = sys.modules["{module}"].kernel')
    ps = [param(np.int64(n))] + [param(v) for v in args]
    return f"    {part}({', '.join(ps)})\n"
