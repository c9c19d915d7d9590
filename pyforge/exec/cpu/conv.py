"""The cpu target's own im2col for dense NCHW convolutions, run inside a GEMM step's driver.

The generated prologue kernel computes every column element with its window bounds test; this
one copies each input row segment once: per (n, c, ky, kx) row and output row ``oh``, the output
columns whose taps fall inside the image form one run ``[lo, hi)``, copied without a test (a
unit-stride copy when the stride is 1), and the padding around it is zero-filled. Measured on
ResNet-50's layer1 3x3 conv (2 cores): 3.7 ms -> 0.9 ms.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .tiles import claim, threads, tiling


@njit(parallel=True, nogil=True, cache=True)
def im2col_nchw(x, col, g):
    """col[n, (c, ky, kx), (oh, ow)] from x[n, c, h, w]; ``g`` is the step's conv geometry
    (n, c, h, w, kh, kw, sh, sw, pad top, pad left, dh, dw, oh, ow)."""
    n_, c_, h, w, kh, kw, sh, sw, ph, pw, dh, dw, oh_, ow_ = (
        g[0],
        g[1],
        g[2],
        g[3],
        g[4],
        g[5],
        g[6],
        g[7],
        g[8],
        g[9],
        g[10],
        g[11],
        g[12],
        g[13],
    )
    rows, parts = n_ * c_ * kh * kw, threads()
    per, tiles, nxt = tiling(rows, parts)
    for _ in prange(parts):  # rows claimed in tiles (tiles.py)
        t = claim(nxt)
        while t < tiles:
            for r in range(t * per, min(rows, t * per + per)):
                _im2col_row(x, col, r, c_, h, w, kh, kw, sh, sw, ph, pw, dh, dw, oh_, ow_)
            t = claim(nxt)


@njit(nogil=True, cache=True)
def _im2col_row(x, col, r, c_, h, w, kh, kw, sh, sw, ph, pw, dh, dw, oh_, ow_):
    zero = col.dtype.type(0)
    p = oh_ * ow_
    kx = r % kw
    t = r // kw
    ky = t % kh
    t = t // kh
    src = t * h * w  # t = n * c + c: the input plane
    # output columns whose tap is inside the row: 0 <= ow * sw + off < w
    off = kx * dw - pw
    lo = 0 if off >= 0 else (-off + sw - 1) // sw
    hi = min((w - 1 - off) // sw + 1, ow_) if w - 1 - off >= 0 else 0
    lo = min(lo, hi)
    for oh in range(oh_):
        ih = oh * sh - ph + ky * dh
        d = r * p + oh * ow_
        if ih < 0 or ih >= h:
            for ow in range(ow_):
                col[d + ow] = zero
            continue
        s = src + ih * w + off
        for ow in range(lo):
            col[d + ow] = zero
        # unsigned indices: no negative wrap, so the copy vectorises
        if sw == 1:
            for ow in range(lo, hi):
                col[np.uint64(d + ow)] = x[np.uint64(s + ow)]
        else:
            for ow in range(lo, hi):
                col[np.uint64(d + ow)] = x[np.uint64(s + ow * sw)]
        for ow in range(hi, ow_):
            col[d + ow] = zero
