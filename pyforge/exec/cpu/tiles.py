"""Dynamic scheduling for the cpu target's parallel loops (generated kernels, image copies).

Numba splits a ``prange`` into one equal part per thread (the OpenMP layer's ``omp for`` is
static, whatever ``numba.set_parallel_chunksize`` says), so a thread that shares its core with
another process holds up the whole region. Here each thread instead claims tiles, about
TILES_PER_THREAD per thread, from one atomic counter until none are left:

    parts = threads()
    per, tiles, nxt = tiling(n, parts)
    for _ in prange(parts):
        t = claim(nxt)
        while t < tiles:
            for i in range(t * per, min(n, t * per + per)):
                ...
            t = claim(nxt)
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.ufunc.parallel import _launch_threads

TILES_PER_THREAD = 8


@intrinsic
def claim(typingctx, counter):
    """``counter[0] += 1`` atomically; the value before (the tile the caller now owns)."""
    if not (isinstance(counter, types.Array) and counter.dtype == types.int64):
        return None

    def codegen(context, builder, signature, args):
        arr = context.make_array(signature.args[0])(context, builder, args[0])
        one = ir.Constant(ir.IntType(64), 1)
        return builder.atomic_rmw("add", arr.data, one, "monotonic")

    return types.int64(counter), codegen


@intrinsic
def threads(typingctx):
    """The calling thread's parallel-region width (``numba.get_num_threads()``), read through
    the threading layer's linked symbol as Numba's own parfors do: a ctypes call, which the
    jitted ``get_num_threads`` is, would keep the kernel out of Numba's disk cache."""
    _launch_threads()  # registers the symbol

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(cgutils.intp_t, []), "get_num_threads"
        )
        return builder.call(fn, [])

    return types.intp(), codegen


@intrinsic
def set_threads(typingctx, n):
    """``numba.set_num_threads(n)`` for the calling thread's next parallel regions, through the
    linked symbol (Numba's jitted form calls it through ctypes: no disk cache; no range check)."""
    if not isinstance(n, types.Integer):
        return None
    _launch_threads()

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i32]), "set_num_threads"
        )
        builder.call(fn, [builder.trunc(args[0], i32)])
        return context.get_dummy_value()

    return types.none(n), codegen


@njit(nogil=True, cache=True)
def tiling(n, parts):
    """(iterations per tile, tiles, a zeroed counter) for a loop of ``n`` over ``parts`` threads."""
    per = max(1, -(-n // (parts * TILES_PER_THREAD)))
    nxt = np.empty(1, np.int64)
    nxt[0] = 0
    return per, -(-n // per), nxt
