"""The operand layouts of own sgemm (sgemm.py): weight panels, image windows, phase planes.

``pack_panels`` lays a strided matrix out as the micro-kernel reads it (panels of MR or NR rows,
k-major); ``pad_image`` copies a conv's image into zero-bordered planes, one per phase of its
stride, and ``shifted_conv`` says where each tap's row of the implicit column matrix starts in
them, so that the micro-kernel reads that matrix's 16 columns of row k in place.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core.extending import intrinsic

from ..steps import shifted_columns
from .tiles import claim, threads, tiling


def _avx512() -> bool:
    from llvmlite import binding

    return bool(binding.get_host_cpu_features().get("avx512f"))


# The micro-tile (sgemm.py): rows of L per panel, columns of R per panel. With AVX-512 each row
# of 16 columns is one 16-lane register, so 16 rows give 16 accumulators of the 32 registers;
# with AVX2 a row is two 8-lane registers and 6 rows take 12 of the 16.
LANES = 16 if _avx512() else 8
MR, NR = (16 if LANES == 16 else 6), 16

_V8 = ir.VectorType(ir.FloatType(), 8)
_I64 = ir.IntType(64)


@intrinsic
def _copy16(typingctx, dst, src):
    """16 floats from byte address ``src`` to ``dst`` as two unaligned 8-lane moves."""
    sig = types.void(types.int64, types.int64)

    def codegen(context, builder, signature, args):
        dst, src = args
        pv = _V8.as_pointer()
        for h in range(2):
            v = builder.load(
                builder.inttoptr(builder.add(src, ir.Constant(_I64, 32 * h)), pv), align=4
            )
            builder.store(
                v, builder.inttoptr(builder.add(dst, ir.Constant(_I64, 32 * h)), pv), align=4
            )
        return context.get_dummy_value()

    return sig, codegen


@njit(nogil=True, cache=True)
def pack_panels(src, base, rs, ks, rows, r0, nrows, k0, kc, width, out, o0):
    """Rows r0..r0+nrows of a strided matrix (row stride ``rs``, k stride ``ks``), k0..k0+kc,
    as panels of ``width`` rows, each k-major: out[o0 + (p * kc + kk) * width + ii]. Rows past
    ``rows`` are zero."""
    zero = out.dtype.type(0)
    s0, d0 = src.ctypes.data, out.ctypes.data
    for p in range((nrows + width - 1) // width):
        o = o0 + p * kc * width
        r = r0 + p * width
        full = min(width, rows - r)
        if rs == 1 and full == width and width == NR:  # contiguous 16 along the panel
            for kk in range(kc):
                _copy16(d0 + (o + kk * width) * 4, s0 + (base + r + (k0 + kk) * ks) * 4)
            continue
        for ii in range(width):
            if ii < full:
                s = base + (r + ii) * rs + k0 * ks
                for kk in range(kc):
                    out[o + kk * width + ii] = src[s + kk * ks]
            else:
                for kk in range(kc):
                    out[o + kk * width + ii] = zero


@njit(nogil=True, cache=True, parallel=True)
def pad_image(x, x_base, channels, h, w, top, left, phases, hp, wp, xpad):
    """The zero-bordered image, one plane per (phase, channel): for a stride (sh, sw) conv the
    phase (py, px) = ``phases[p]`` holds xpad[p, c, i, j] = x[c, i * sh + py - top,
    j * sw + px - left] (phases[p] also gives sh, sw: rows (py, px, sh, sw)); a stride-1 conv
    has the one phase (0, 0, 1, 1). Zero outside the image and in the 2 * NR floats of slack
    after the planes.
    Planes are claimed in tiles (tiles.py)."""
    planes, parts = len(phases) * channels, threads()
    per, tiles, nxt = tiling(planes, parts)
    for _ in prange(parts):
        tile = claim(nxt)
        while tile < tiles:
            for t in range(tile * per, min(planes, tile * per + per)):
                _pad_plane(x, x_base, channels, h, w, top, left, phases, hp, wp, xpad, t)
            tile = claim(nxt)
    # the slack the last panel of windows reads (shifted_conv's 2 * NR), not the rest of the
    # buffer: it is shared, sized for the model's largest image, and zeroing all of it serially
    # cost each conv of Inception-v3's 17 x 17 stage ~0.3 ms (2.8 MB)
    zero = xpad.dtype.type(0)
    for q in range(planes * hp * wp, min(len(xpad), planes * hp * wp + 2 * NR)):
        xpad[q] = zero


@njit(nogil=True, cache=True)
def _pad_plane(x, x_base, channels, h, w, top, left, phases, hp, wp, xpad, t):
    zero = xpad.dtype.type(0)
    p, c = t // channels, t % channels
    py, px, sh, sw = phases[p, 0], phases[p, 1], phases[p, 2], phases[p, 3]
    o = t * hp * wp
    s = x_base + c * h * w
    for i in range(hp):
        row = o + i * wp
        iy = i * sh + py - top
        if iy < 0 or iy >= h:
            for q in range(wp):
                xpad[row + q] = zero
            continue
        # the columns q whose ix = q * sw + px - left falls in the row: [lo, hi), copied with
        # no test at unsigned indices (no negative wrap: the copy vectorises)
        lo = max(0, -(-(left - px) // sw))
        hi = max(lo, min(wp, (w - 1 - px + left) // sw + 1))
        for q in range(lo):
            xpad[row + q] = zero
        d, src = row + lo, s + iy * w + lo * sw + px - left
        for q in range(hi - lo):
            xpad[np.uint64(d + q)] = x[np.uint64(src + q * sw)]
        for q in range(hi, wp):
            xpad[row + q] = zero


def packed_size(rows: int, kdim: int, width: int) -> int:
    return -(-rows // width) * width * kdim


def shifted_conv(geometry: tuple[int, ...]) -> dict:
    """A conv (ConvGeometry.geometry) as shifted windows: the zero-bordered image planes
    (one per phase of the stride that some tap reads, per channel), each tap row's offset into
    them, and the padded column space q = oh * wp + ow. Stride s reads phase (ky * dh % s) at
    row offset ky * dh // s: a stride-s conv is a stride-1 conv over the phases' planes."""
    c, kh, kw, sh, sw, top, left, dh, dw, oh, _ow = geometry[1:2] + geometry[4:]
    wp, cols = shifted_columns(geometry)
    hp = oh + (kh - 1) * dh // sh
    r = np.arange(c * kh * kw)
    ky, kx, ch = (r // kw) % kh, r % kw, r // (kh * kw)
    used = sorted({(y * dh % sh, x * dw % sw) for y in range(kh) for x in range(kw)})
    slot = {ph: i for i, ph in enumerate(used)}
    phase = np.array([slot[(y * dh % sh, x * dw % sw)] for y, x in zip(ky, kx)], np.int64)
    koff = ((phase * c + ch) * hp + ky * dh // sh) * wp + kx * dw // sw
    phases = np.array([(py, px, sh, sw) for py, px in used], np.int64)
    # the last panel of 16 reads up to 15 columns past the last one
    size = len(used) * c * hp * wp + 2 * NR
    return {"koff": koff.astype(np.int64), "wp": wp, "hp": hp, "cols": cols,
            "size": size, "top": top, "left": left, "phases": phases}  # fmt: skip
