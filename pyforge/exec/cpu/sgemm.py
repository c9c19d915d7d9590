"""pyforge's own float32 GEMM and convolution for the cpu target.

A micro-kernel written as LLVM IR through a Numba intrinsic (Numba has no vector types; its
auto-vectorised scalar version reached 17 GFLOP/s): 16 columns a row, per k one broadcast of
each of MR left values, the 16 right values loaded once, an FMA per register. AVX-512: 16x16,
sixteen 16-lane accumulators (201 GFLOP/s a core in L1 on Zen 5); AVX2: 6x16, twelve 8-lane
ones (99.5 on the AVX2 machine, 115 on Zen 5). Around it the usual blocking: the left operand
(a conv's weights) packed once at bind time in panels of MR rows, a strided right one packed per
KC x NC block.

What it buys over calling BLAS:
- a convolution needs no im2col matrix. The image is copied once into a zero-bordered
  buffer; in "padded column space" q = oh * Wp + ow (Wp the padded width) the tap (c, ky, kx)
  reads ``xpad[c * Hp * Wp + ky * dh * Wp + kx * dw + q]``, so each row of the implicit column
  matrix is a shifted window of the buffer, which the micro-kernel reads in place (16 floats
  at the row's offset for each k: nothing is packed; taps of one row share cache lines).
  Columns whose ow falls in the padding are computed and dropped at the store. A stride-s conv
  is the same over the s*s phase planes of the image (see ``pack.shifted_conv``).
- the step's epilogue (bias per row, residual, Relu) is applied while the finished tile is
  still in registers, instead of in another pass over the output.
- every output element is summed in the same order (k blocks in turn, an FMA chain within a
  block) whatever its row, column or tile, so equal inputs give bit-equal outputs.

Roles: ``C[i, j] = sum_k L[i, k] R[k, j]``; for a conv L is the weights (rows = output
channels) and R the image, so a tile stores 16 consecutive pixels of 6 channels.
"""

from __future__ import annotations

import numpy as np
from llvmlite import binding as llvm_binding
from llvmlite import ir
from numba import njit, prange, types
from numba.core.extending import intrinsic

from .pack import LANES, MR, NR, pack_panels, packed_size

KC, MC, NC = 256, 96, 512  # k block, L rows per block (L2), R columns per packed block
ROWS_OUTER_K = 64  # a GEMM of at most this k tiles a row panel at a time (see _part)

# the int64 parameter vector of ``sgemm`` (one array, so the drivers stay short)
(K_DIM, L_ROWS, R_COLS, L_BASE, L_RS, L_KS, L_PACKED, R_BASE, R_RS, R_KS, R_MODE, C_BASE, C_RS,
 C_WP, C_OW, RES_BASE, RELU, BIAS, NEXT, N_PARAMS) = range(20)  # fmt: skip
# R read from a strided matrix (packed first), as shifted windows of an image, in place, or
# from ``rw`` packed whole-K already (a constant weight, packed once at bind time)
R_STRIDED, R_SHIFTED, R_PACKED = 0, 1, 2
# a parallel region is cut into about this many tiles per thread, which threads claim in turn: a
# thread that another process keeps off its core holds up at most its current tile
TILES_PER_THREAD = 8

_F32 = ir.FloatType()
_VEC = ir.VectorType(_F32, LANES)
_HALVES = NR // LANES  # registers per row of a tile
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)


def available() -> bool:
    """Whether this CPU runs the AVX2 + FMA micro-kernel."""
    features = llvm_binding.get_host_cpu_features()
    return bool(features.get("avx2")) and bool(features.get("fma"))


def _c64(v: int) -> ir.Constant:
    return ir.Constant(_I64, v)


_SIG = types.void(*[types.int64] * 14)


@intrinsic
def _micro(typingctx, kc, lp, rp, kp, cp, ldc, accumulate, finish, bp, resp, res_ld, relu):
    """The micro-kernel (``_micro_ir``) reading R from packed panels at ``rp`` (``kp`` unused),
    storing all MR rows (the form the cpu attention template calls)."""
    sig = types.void(*[types.int64] * 12)
    return sig, lambda context, builder, sig, args: _micro_ir(
        False, context, builder, [*args, _c64(MR), _c64(0)]
    )


@intrinsic
def _micro_rows(typingctx, kc, lp, rp, kp, cp, ldc, accumulate, finish, bp, resp, res_ld, relu,
                rows, segs):  # fmt: skip
    """``_micro`` storing only the first ``rows`` rows (in segments when ``segs``)."""
    return _SIG, lambda context, builder, sig, args: _micro_ir(False, context, builder, args)


@intrinsic
def _micro_windows(typingctx, kc, lp, rp, kp, cp, ldc, accumulate, finish, bp, resp, res_ld,
                   relu, rows, segs):  # fmt: skip
    """The micro-kernel reading R in place: row k's 16 floats at ``rp + 4 * koff[k]``, the int64
    offsets ``koff`` at byte address ``kp``."""
    return _SIG, lambda context, builder, sig, args: _micro_ir(True, context, builder, args)


def _micro_ir(windows: bool, context, builder: ir.IRBuilder, args: list):
    """C[0:MR, 0:NR] (+)= Lp[kc, MR]^T @ R[kc, NR]; then, when ``finish``, + bias (one value a
    row at ``bp``) + residual (rows ``res_ld`` floats apart at ``resp``), Relu when ``relu``.
    ``relu``: 1 Relu, 2 Relu6 (clamped to [0, 6]). Pointers are byte addresses; with no bias or
    residual they point at zeros (res_ld 0). Only
    the first ``rows`` rows are stored (a last panel's zero rows are summed, never stored).

    ``segs`` 0: each row's NR sums go to ``cp`` + its row offset. Else the byte address of an
    int64 table ``[n, lo, hi, off, ...]``: lanes lo..hi of a row go to elements off + lo..off + hi
    of the row at ``cp`` (and of the residual's at ``resp``), by masked loads and stores: a tile
    whose columns straddle a padded conv's output rows, or the last partial panel, is stored
    straight from registers."""
    kc, lp, rp, kp, cp, ldc, accumulate, finish, bp, resp, res_ld, relu, rows, segs = args
    module = builder.module
    name = f"llvm.fma.v{LANES}f32"
    fma = module.globals.get(name) or ir.Function(
        module, ir.FunctionType(_VEC, [_VEC, _VEC, _VEC]), name
    )
    pf, pv = _F32.as_pointer(), _VEC.as_pointer()
    zero = ir.Constant(_VEC, [0.0] * LANES)
    undef = ir.Constant(_VEC, ir.Undefined)
    splat_mask = ir.Constant(ir.VectorType(_I32, LANES), [0] * LANES)

    def splat(x):
        return builder.shuffle_vector(
            builder.insert_element(undef, x, ir.Constant(_I32, 0)), undef, splat_mask
        )

    entry = builder.basic_block
    loop = builder.function.append_basic_block("micro.loop")
    done = builder.function.append_basic_block("micro.done")
    builder.cbranch(builder.icmp_signed(">", kc, _c64(0)), loop, done)

    builder.position_at_end(loop)
    k = builder.phi(_I64)
    acc = [builder.phi(_VEC) for _ in range(_HALVES * MR)]
    k.add_incoming(_c64(0), entry)
    for a in acc:
        a.add_incoming(zero, entry)
    pa = builder.inttoptr(builder.add(lp, builder.mul(k, _c64(4 * MR))), pf)
    if windows:
        koff = builder.inttoptr(builder.add(kp, builder.mul(k, _c64(8))), _I64.as_pointer())
        pb = builder.inttoptr(builder.add(rp, builder.mul(builder.load(koff), _c64(4))), pv)
    else:
        pb = builder.inttoptr(builder.add(rp, builder.mul(k, _c64(4 * NR))), pv)
    b = [builder.load(builder.gep(pb, [ir.Constant(_I32, h)]), align=4) for h in range(_HALVES)]
    new = []
    for i in range(MR):
        a = splat(builder.load(builder.gep(pa, [ir.Constant(_I32, i)]), align=4))
        new += [builder.call(fma, [a, b[h], acc[_HALVES * i + h]]) for h in range(_HALVES)]
    k_next = builder.add(k, _c64(1))
    tail = builder.basic_block
    k.add_incoming(k_next, tail)
    for a, v in zip(acc, new):
        a.add_incoming(v, tail)
    builder.cbranch(builder.icmp_signed("<", k_next, kc), loop, done)

    builder.position_at_end(done)
    results = []
    for v in new:  # all phis first: LLVM wants them at the top of the block
        results.append(builder.phi(_VEC))
        results[-1].add_incoming(zero, entry)
        results[-1].add_incoming(v, tail)
    adding = builder.icmp_signed("!=", accumulate, _c64(0))
    finishing = builder.icmp_signed("!=", finish, _c64(0))
    clamping = builder.and_(finishing, builder.icmp_signed("!=", relu, _c64(0)))
    # the upper bound: 6 for Relu6 (``relu`` 2) on the last k block, else +inf (never taken)
    six, inf = ir.Constant(_VEC, [6.0] * LANES), ir.Constant(_VEC, [float("inf")] * LANES)
    capping = builder.and_(finishing, builder.icmp_signed("==", relu, _c64(2)))
    top = builder.select(capping, six, inf)
    row_bytes = builder.mul(ldc, _c64(4))
    res_bytes = builder.mul(res_ld, _c64(4))

    def finished(i: int, h: int, val, old, res):
        """Row i's half h: + C's old value, then bias + residual and the clamp on the last block."""
        val = builder.select(adding, builder.fadd(old, val), val)
        bias = splat(builder.load(builder.inttoptr(builder.add(bp, _c64(4 * i)), pf), align=4))
        done_val = builder.fadd(builder.fadd(val, bias), res)
        val = builder.select(finishing, done_val, val)
        positive = builder.fcmp_ordered(">", val, zero)
        val = builder.select(clamping, builder.select(positive, val, zero), val)
        return builder.select(builder.fcmp_ordered(">", val, top), top, val)

    plain = builder.function.append_basic_block("micro.plain")
    seg_head = builder.function.append_basic_block("micro.segs")
    end = builder.function.append_basic_block("micro.end")
    builder.cbranch(builder.icmp_signed("==", segs, _c64(0)), plain, seg_head)

    def store_rows(base, rbase, load, store) -> None:
        """Each stored row's halves finished and stored: C at ``base``, the residual at
        ``rbase`` (plus the row's offset), through ``load(ptr, h)`` and ``store(val, ptr, h)``."""
        for i in range(MR):
            with builder.if_then(builder.icmp_signed(">", rows, _c64(i))):
                row = builder.add(base, builder.mul(row_bytes, _c64(i)))
                res_row = builder.add(rbase, builder.mul(res_bytes, _c64(i)))
                for h in range(_HALVES):
                    ptr = builder.inttoptr(builder.add(row, _c64(4 * LANES * h)), pv)
                    rptr = builder.inttoptr(builder.add(res_row, _c64(4 * LANES * h)), pv)
                    old, res = load(ptr, h), load(rptr, h, residual=True)
                    store(finished(i, h, results[_HALVES * i + h], old, res), ptr, h)

    builder.position_at_end(plain)
    store_rows(
        cp,
        resp,
        lambda ptr, h, residual=False: builder.load(ptr, align=4),
        lambda val, ptr, h: builder.store(val, ptr, align=4),
    )
    builder.branch(end)

    # the segments: a loop over the table, each a masked load / store per row and half
    _masked_store(builder, seg_head, end, (segs, cp, resp, res_ld), store_rows)
    builder.position_at_end(end)
    return context.get_dummy_value()


def _masked_store(builder: ir.IRBuilder, head, end, ptrs: tuple, store_rows) -> None:
    """``_micro_ir``'s segment store: for each (lo, hi, off) of the table at ``segs``, lanes
    lo..hi of each row (masked loads of C and the residual, masked store) at element off, by
    ``_micro_ir``'s ``store_rows``."""
    segs, cp, resp, res_ld = ptrs
    pi, pv = _I64.as_pointer(), _VEC.as_pointer()
    bits = ir.VectorType(ir.IntType(1), LANES)
    module = builder.module
    zero = ir.Constant(_VEC, [0.0] * LANES)
    load_name, store_name = (
        f"llvm.masked.load.v{LANES}f32.p0v{LANES}f32",
        f"llvm.masked.store.v{LANES}f32.p0v{LANES}f32",
    )
    mload = module.globals.get(load_name) or ir.Function(
        module, ir.FunctionType(_VEC, [pv, _I32, bits, _VEC]), load_name
    )
    mstore = module.globals.get(store_name) or ir.Function(
        module, ir.FunctionType(ir.VoidType(), [_VEC, pv, _I32, bits]), store_name
    )
    align = ir.Constant(_I32, 4)
    builder.position_at_end(head)
    table = builder.inttoptr(segs, pi)
    count = builder.load(table)
    body = builder.function.append_basic_block("micro.seg")
    builder.cbranch(builder.icmp_signed(">", count, _c64(0)), body, end)
    builder.position_at_end(body)
    sg_i = builder.phi(_I64)
    sg_i.add_incoming(_c64(0), head)
    at = builder.add(_c64(1), builder.mul(sg_i, _c64(3)))
    lo, hi, off = (builder.load(builder.gep(table, [builder.add(at, _c64(j))])) for j in range(3))
    has_res = builder.icmp_signed("!=", res_ld, _c64(0))
    res_off = builder.select(has_res, builder.mul(off, _c64(4)), _c64(0))
    lanes = [ir.Constant(ir.VectorType(_I64, LANES), [h * LANES + j for j in range(LANES)])
             for h in range(_HALVES)]  # fmt: skip

    def vec(x):
        undef = ir.Constant(ir.VectorType(_I64, LANES), ir.Undefined)
        one = builder.insert_element(undef, x, ir.Constant(_I32, 0))
        return builder.shuffle_vector(
            one, undef, ir.Constant(ir.VectorType(_I32, LANES), [0] * LANES)
        )

    lov, hiv = vec(lo), vec(hi)
    masks = [builder.and_(builder.icmp_signed(">=", ln, lov), builder.icmp_signed("<", ln, hiv))
             for ln in lanes]  # fmt: skip
    # no residual: resp points at zeros and res_ld is 0, so every lane reads them
    all_lanes = ir.Constant(bits, [1] * LANES)
    res_masks = [builder.select(has_res, m, all_lanes) for m in masks]

    def load(ptr, h, residual=False):
        return builder.call(mload, [ptr, align, (res_masks if residual else masks)[h], zero])

    def store(val, ptr, h):
        builder.call(mstore, [val, ptr, align, masks[h]])

    store_rows(builder.add(cp, builder.mul(off, _c64(4))), builder.add(resp, res_off), load, store)
    nxt = builder.add(sg_i, _c64(1))
    sg_i.add_incoming(nxt, builder.basic_block)
    builder.cbranch(builder.icmp_signed("<", nxt, count), body, end)


@njit(nogil=True, cache=True)
def _mk(windows, kc, lp, rp, kp, cp, ldc, accumulate, finish, bp, resp, res_ld, relu, rows, segs):
    if windows:
        _micro_windows(kc, lp, rp, kp, cp, ldc, accumulate, finish, bp, resp, res_ld, relu, rows,
                       segs)  # fmt: skip
    else:
        _micro_rows(kc, lp, rp, kp, cp, ldc, accumulate, finish, bp, resp, res_ld, relu, rows,
                    segs)  # fmt: skip


@intrinsic
def _claim(typingctx, g):
    """The next free tile of the running region: ``g[NEXT]``, atomically incremented."""
    if not (isinstance(g, types.Array) and g.dtype == types.int64):
        return None

    def codegen(context, builder, signature, args):
        arr = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.gep(arr.data, [_c64(NEXT)])
        return builder.atomic_rmw("add", ptr, _c64(1), "monotonic")

    return types.int64(g), codegen


@njit(nogil=True, cache=True)
def _tiles(panels, parts):
    """(tiles, panels per tile) for a region over ``panels`` panels on ``parts`` threads."""
    per = max(1, -(-panels // (parts * TILES_PER_THREAD)))
    return -(-panels // per), per


@njit(nogil=True, cache=True)
def _tile_col(g, q):
    """Element offset of C column ``q`` within a row, or -1 for a dropped (padding) column."""
    if g[C_WP] == 0:
        return q
    col = q % g[C_WP]
    return -1 if col >= g[C_OW] else (q // g[C_WP]) * g[C_OW] + col


@njit(nogil=True, cache=True)
def _segments(g, q0, nr, segs):
    """The runs of tile columns q0..q0 + nr that C keeps, as ``_micro_ir``'s table in ``segs``:
    [n, (first lane, lane past the last, C column of lane 0) * n]. A padded conv's tile may
    straddle output rows, dropping the padding columns between; a plain GEMM's last panel is
    one run of nr lanes."""
    if g[C_WP] == 0:
        segs[0], segs[1], segs[2], segs[3] = 1, 0, nr, q0
        return
    wp, ow = g[C_WP], g[C_OW]
    n = 0
    for row in range(q0 // wp, (q0 + nr - 1) // wp + 1):
        lo, hi = max(q0, row * wp) - q0, min(q0 + nr, row * wp + ow) - q0
        if lo < hi:
            segs[1 + 3 * n], segs[2 + 3 * n], segs[3 + 3 * n] = lo, hi, q0 + row * (ow - wp)
            n += 1
    segs[0] = n


@njit(nogil=True, cache=True)
def _part(g, lp, r, rp, koff, c, bias, res, i0, i1, j0, j1, rbuf, zeros):
    """C rows i0..i1 (i0 a multiple of MR), columns j0..j1 (j0 a multiple of NR).

    A tile landing on one contiguous run of C is stored whole; any other (straddling a padded
    conv's output rows, or the last partial panel) in the runs C keeps, by masked stores."""
    kdim = g[K_DIM]
    lp0, c0, z0 = lp.ctypes.data, c.ctypes.data, zeros.ctypes.data
    b0, res0 = bias.ctypes.data, res.ctypes.data
    has_res, relu = g[RES_BASE] >= 0, g[RELU]
    segs = np.empty(3 * NR + 1, np.int64)  # (see _segments)
    sp = segs.ctypes.data
    windows = g[R_MODE] == R_SHIFTED  # R read in place: a panel is 16 columns' address
    # tiles a row panel at a time when k is short: C's traffic then outweighs the sums, and a
    # column at a time would write every row of the block at once (MC streams: MobileNetV2's
    # 16 -> 96 expansion at 112 x 112 took 1.6x as long)
    rows_outer = kdim <= ROWS_OUTER_K
    for jc in range(j0, j1, NC):
        nc = min(NC, j1 - jc)
        for pc in range(0, kdim, KC):
            kc = min(KC, kdim - pc)
            kp = koff.ctypes.data + pc * 8
            if windows:
                rb0, rstride, rstart = r.ctypes.data + (g[R_BASE] + jc) * 4, 1, 0
            elif rp.size:  # R packed whole-K by sgemm: panel q from row pc on
                rb0, rstride, rstart = rp.ctypes.data, kdim * NR, (jc // NR) * kdim * NR + pc * NR
            else:
                pack_panels(r, g[R_BASE], g[R_RS], g[R_KS], g[R_COLS], jc, nc, pc, kc, NR, rbuf, 0)
                rb0, rstride, rstart = rbuf.ctypes.data, kc * NR, 0
            adding, finishing = 0 if pc == 0 else 1, 1 if pc + kc == kdim else 0
            for ic in range(i0, i1, MC):
                ie = min(ic + MC, i1)
                rpanels, cpanels = (ie - ic + MR - 1) // MR, (nc + NR - 1) // NR
                for t in range(rpanels * cpanels):
                    if rows_outer:
                        ri, ci = t // cpanels, t % cpanels
                    else:
                        ci, ri = t // rpanels, t % rpanels
                    row, jr = ic + ri * MR, ci * NR
                    mr = min(MR, ie - row)
                    lpp = lp0 + ((row // MR) * kdim * MR + pc * MR) * 4
                    q0 = jc + jr
                    nr = min(NR, j1 - q0)
                    rpp = rb0 + (rstart + (jr if windows else (jr // NR) * rstride)) * 4
                    bp = b0 + row * 4 if g[BIAS] else z0
                    # the whole tile on one contiguous run of C? (the column map is increasing
                    # and skips dropped columns, so its ends tell)
                    at = _tile_col(g, q0)
                    whole = nr == NR and at >= 0 and _tile_col(g, q0 + NR - 1) == at + NR - 1
                    table = 0
                    if not whole:  # C's row, with the runs' columns in the table
                        at, table = 0, sp
                        _segments(g, q0, nr, segs)
                    o = g[C_BASE] + row * g[C_RS] + at
                    rsp, rld = z0, 0
                    if has_res:
                        rsp, rld = res0 + (g[RES_BASE] + row * g[C_RS] + at) * 4, g[C_RS]
                    _mk(windows, kc, lpp, rpp, kp, c0 + o * 4, g[C_RS], adding, finishing, bp,
                        rsp, rld, relu, mr, table)  # fmt: skip


@njit(nogil=True, cache=True, parallel=True)
def sgemm(parts, g, l, lp, r, koff, c, bias, res, work, rw):
    """C = L @ R (+ bias + residual, Relu: see the parameter vector ``g``) on ``parts`` threads.

    L: a strided view into ``l`` or, when ``g[L_PACKED]``, already packed in ``lp`` (else packed
    here into ``lp``). R: a strided view into ``r``, or shifted windows of the padded image
    ``r`` at offsets ``koff`` (R_SHIFTED), or packed in ``rw`` already (R_PACKED). ``work``
    holds ``work_size(parts)`` floats; otherwise ``rw`` receives all of R packed once where the
    threads split L's rows (if it is large enough)."""
    kdim, lrows, rcols = g[K_DIM], g[L_ROWS], g[R_COLS]
    lpanels = (lrows + MR - 1) // MR
    if not g[L_PACKED]:
        tiles, per = _tiles(lpanels, parts)
        g[NEXT] = 0
        for _ in prange(parts):
            tile = _claim(g)
            while tile < tiles:
                lo, hi = tile * per, min(lpanels, (tile + 1) * per)
                pack_panels(l, g[L_BASE], g[L_RS], g[L_KS], lrows, lo * MR, (hi - lo) * MR, 0,
                            kdim, MR, lp, lo * kdim * MR)  # fmt: skip
                tile = _claim(g)
    rpanels = (rcols + NR - 1) // NR
    split_r = rpanels >= lpanels
    if g[R_MODE] == R_SHIFTED and (lpanels % parts == 0 or lpanels >= 4 * parts):
        # a conv's windows: threads take rows (each tile a weight panel kept in L1 against every
        # window) wherever the row panels share out evenly: 3x3 c128@28 1.28 -> 0.94 ms on two
        # threads, Inception's 80 -> 192 @73 6.5 -> 5.1 (column tiles of all rows reload them)
        split_r = False
    rp = rw[:0]
    if g[R_MODE] == R_PACKED:
        rp = rw[: rpanels * NR * kdim]
    elif not split_r and g[R_MODE] != R_SHIFTED and len(rw) >= rpanels * NR * kdim:
        g[NEXT] = 0
        for _ in prange(parts):
            q = _claim(g)
            while q < rpanels:
                o = q * kdim * NR
                pack_panels(r, g[R_BASE], g[R_RS], g[R_KS], rcols, q * NR, NR, 0, kdim, NR, rw, o)
                q = _claim(g)
        rp = rw[: rpanels * NR * kdim]
    per_t = KC * NC + 2 * NR
    tiles, per = _tiles(rpanels if split_r else lpanels, parts)
    g[NEXT] = 0
    for t in prange(parts):
        rbuf = work[t * per_t : t * per_t + KC * NC]
        zeros = work[t * per_t + KC * NC : (t + 1) * per_t]  # a missing bias or residual
        zeros[:] = 0
        tile = _claim(g)
        while tile < tiles:
            i0, i1, j0, j1 = 0, lrows, 0, rcols
            if split_r:
                j0, j1 = tile * per * NR, min(rcols, (tile + 1) * per * NR)
            else:
                i0, i1 = tile * per * MR, min(lrows, (tile + 1) * per * MR)
            _part(g, lp, r, rp, koff, c, bias, res, i0, i1, j0, j1, rbuf, zeros)
            tile = _claim(g)


def work_size(parts: int) -> int:
    return parts * (KC * NC + 2 * NR)


def whole_r_size(m: int, n: int, k: int) -> int:
    """Floats ``sgemm`` needs in ``rw`` to pack R once for all threads (0 where it splits R)."""
    return packed_size(n, k, NR) if -(-n // NR) < -(-m // MR) else 0
