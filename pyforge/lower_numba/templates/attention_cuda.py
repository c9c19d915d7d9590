"""FusedAttention on cuda (its lowering and cpu kernel: attention.py). Shapes and strides are
literals (local and shared arrays are sized by them).

Many query rows of a wide head (a prefill, head dim 128..256): the prefill kernel, K and V tiles
shared by 16 query rows in shared memory, an online softmax (_CUDA_PRE). Few query rows or wide
heads (a decode step): the per-row kernel, blocks per (query row, head, batch) over the keys the
mask keeps, scores in shared memory (_CUDA_ROW). Else
flash-attention style: one block per (query tile, head, batch); the K and V tiles go through
shared memory; each query row's TPR threads take every TPR-th key of a tile, each with its own
running max, sum and accumulator in registers (an online softmax), merged once at the end.
"""

from __future__ import annotations

from ..emit import HEADER
from ..implicit_conv import SMS

SHARED_FLOATS = 10240  # the tiled kernel: tiles + merge buffer, 40 KiB of the 48 KiB a block gets

_CUDA = """\
from numba import cuda


@cuda.jit(cache=True)
def kernel(n, {params}):
    tid = cuda.threadIdx.x
    r = tid // {TPR}
    lane = tid % {TPR}
    h = cuda.blockIdx.y
    b = cuda.blockIdx.z
    hk = h // {G}
    i = cuda.blockIdx.x * {BQ} + r
    live = i < {SQ}
    sh = cuda.shared.array({SHN}, f32)
    sm = cuda.shared.array({NT}, f32)
    sl = cuda.shared.array({NT}, f32)
    qv = cuda.local.array({D}, f32)
    acc = cuda.local.array({DV}, f32)
    sc = {sc}
    qr = {q_at}
    for d in range({D}):
        qv[d] = f32(0)
        if live:
            qv[d] = {q}[qr + d * {QD}] * sc
    for d in range({DV}):
        acc[d] = f32(0)
    m = f32(-math.inf)
    l = f32(0)
    for k0 in range(0, {SK}, {BK}):
        nk = min({BK}, {SK} - k0)
        for e in range(tid, nk * {D}, {NT}):
            j = e // {D}
            kr = {k_at}
            sh[j * {KP} + e % {D}] = {k}[kr + (e % {D}) * {KD}]
        for e in range(tid, nk * {DV}, {NT}):
            j = e // {DV}
            vr = {v_at}
            sh[{VOFF} + j * {VP} + e % {DV}] = {v}[vr + (e % {DV}) * {VD}]
        cuda.syncthreads()
        if live:
            for j in range(lane, nk, {TPR}):
                x = f32(0)
                for d in range({D}):
                    x += qv[d] * sh[j * {KP} + d]
{mask}
                if x > m:
                    alpha = math.exp(m - x)
                    l *= alpha
                    for d in range({DV}):
                        acc[d] *= alpha
                    m = x
                if x != -math.inf:
                    p = math.exp(x - m)
                    l += p
                    for d in range({DV}):
                        acc[d] += p * sh[{VOFF} + j * {VP} + d]
        cuda.syncthreads()
    sm[tid] = m
    cuda.syncthreads()
    top = f32(-math.inf)
    for u in range({TPR}):
        top = max(top, sm[r * {TPR} + u])
    f = f32(0)
    if m != -math.inf:
        f = math.exp(m - top)
    sl[tid] = l * f
    for d in range({DV}):
        sh[tid * {DV} + d] = acc[d] * f
    cuda.syncthreads()
    if live:
        tot = f32(0)
        for u in range({TPR}):
            tot += sl[r * {TPR} + u]
        orow = {o_at}
        for d in range(lane, {DV}, {TPR}):
            y = f32(0)
            for u in range({TPR}):
                y += sh[(r * {TPR} + u) * {DV} + d]
            {o}[orow + d * {OD}] = y / tot
"""


# cuda, one block per query row (decode, few rows, wide heads), or S per row: the keys the mask
# keeps (lo..hi, a scan of the mask row as the cpu's _span) cut into S parts, one block each.
# q in shared memory; per pass of KT keys, C threads a key, each the dot over its chunk of the
# head dim, summed in shared memory; the part's scores kept in shared memory for an exact softmax
# (max and sum by a tree); then each thread one output dim over every C2-th key (coalesced V
# reads), the C2 parts summed. Split: each block writes (max, sum, acc[DV]) to ``ws``; the last
# block of the grid to finish (counted in the step's int32 device word ``err``, which it sets back
# to 0 for the next run) merges every row's parts in a fixed order.
_CUDA_ROW = """\
from numba import cuda


@cuda.jit(cache=True)
def kernel(n, {params}):
    tid = cuda.threadIdx.x
    i = cuda.blockIdx.x
    h = cuda.blockIdx.y
    b = cuda.blockIdx.z // {S}
    s = cuda.blockIdx.z % {S}
    hk = h // {G}
    ss = cuda.shared.array({SS}, f32)
    qs = cuda.shared.array({D}, f32)
    red = cuda.shared.array({NT}, f32)
{span}
    per = (hi - lo + {S} - 1) // {S}
    klo = min(hi, lo + s * per)
    khi = min(hi, klo + per)
    nk = khi - klo
    sc = {sc}
    qr = {q_at}
    for d in range(tid, {D}, {NT}):
        qs[d] = {q}[qr + d * {QD}] * sc
    cuda.syncthreads()
    c = tid // {KT}
    j = tid % {KT}
    m = f32(-math.inf)
    for k0 in range(klo, khi, {KT}):
        part = f32(0)
        if k0 + j < khi:
            kr = {k_at}
            for d in range(c * {DC}, min({D}, c * {DC} + {DC})):
                part += qs[d] * {k}[kr + d * {KD}]
        red[tid] = part
        cuda.syncthreads()
        if tid < {KT} and k0 + j < khi:
            x = red[tid]
            for u in range(1, {C}):
                x += red[tid + u * {KT}]
{mask}
            ss[k0 + j - klo] = x
            m = max(m, x)
        cuda.syncthreads()
{mtree}
    l = f32(0)
    for e in range(tid, nk, {NT}):
        p = f32(0)
        if ss[e] != -math.inf:
            p = math.exp(ss[e] - m)
        ss[e] = p
        l += p
{ltree}
    orow = {o_at}
    k0 = klo
    wb = (((b * {H} + h) * {SQ} + i) * {S} + s) * {W}
{pv}
{merge}
"""
# the output: C2 threads per dim, each every C2-th key, parts summed in shared memory
_PV_PARTS = """\
    d = tid % {DV}
    c2 = tid // {DV}
    y = f32(0)
    if c2 < {C2}:
        for j in range(c2, nk, {C2}):
            vr = {v_at}
            y += ss[j] * {v}[vr + d * {VD}]
    red[tid] = y
    cuda.syncthreads()
    if tid < {DV}:
        for u in range(1, {C2}):
            y += red[tid + u * {DV}]
        {store}"""
# the output when the dims outnumber the threads: each thread whole dims
_PV_DIMS = """\
    for d in range(tid, {DV}, {NT}):
        y = f32(0)
        for j in range(nk):
            vr = {v_at}
            y += ss[j] * {v}[vr + d * {VD}]
        {store}"""
# split: the parts' factors e**(m_u - top) / total in shared memory, then each output element
_MERGE = """\
    if tid == 0:
        ws[wb] = m
        ws[wb + 1] = l
    cuda.threadfence()
    cuda.syncthreads()
    last = cuda.shared.array(1, i32)
    fs = cuda.shared.array({BLOCKS}, f32)
    if tid == 0:
        last[0] = 1 if cuda.atomic.add(err, 0, 1) == {BLOCKS} - 1 else 0
    cuda.syncthreads()
    if last[0] == 1:
        cuda.threadfence()
        for e in range(tid, {BLOCKS}, {NT}):
            fs[e] = ws[e * {W}]
        cuda.syncthreads()
        for g in range(tid, {BLOCKS} // {S}, {NT}):
            top = f32(-math.inf)
            for u in range({S}):
                top = max(top, fs[g * {S} + u])
            tot = f32(0)
            for u in range({S}):
                f = f32(0)
                if fs[g * {S} + u] != -math.inf:
                    f = math.exp(fs[g * {S} + u] - top)
                fs[g * {S} + u] = f
                tot += f * ws[(g * {S} + u) * {W} + 1]
            for u in range({S}):
                fs[g * {S} + u] = fs[g * {S} + u] / tot  # 0 / 0: no key kept, NaN as ORT
        cuda.syncthreads()
        for e in range(tid, {BLOCKS} // {S} * {DV}, {NT}):
            g = e // {DV}
            d = e % {DV}
            y = f32(0)
            for u in range({S}):
                y += ws[(g * {S} + u) * {W} + 2 + d] * fs[g * {S} + u]
            i = g % {SQ}
            h = g // {SQ} % {H}
            b = g // ({SQ} * {H})
            orow = {o_at}
            {o}[orow + d * {OD}] = y
        if tid == 0:
            err[0] = 0"""
ROW_THREADS = 512  # the per-row kernel's block
ROW_CHUNKS = 4  # threads per key's dot product
ROW_KEYS = 8192  # its scores in shared memory: 32 KiB
SPLIT_KEYS = 32  # fewest keys worth a block of their own


def splits(rows: int, sk: int) -> int:
    """Blocks per query row of the per-row kernel: enough to fill the SMs (``rows`` blocks of
    (query row, head, batch) alone leave most idle in a decode step), each SPLIT_KEYS keys."""
    return max(1, min(SMS // rows, -(-sk // SPLIT_KEYS)))


def _tree(var: str, combine: str, nt: int) -> str:
    """Every thread of the block ends with ``combine`` over all threads' ``var`` (a tree in
    ``red``; the syncs also publish the block's writes to ``ss``)."""
    lines = [f"red[tid] = {var}", "cuda.syncthreads()", f"w = {nt // 2}", "while w > 0:"]
    lines += [
        "    if tid < w:",
        f"        red[tid] = {combine.format(a='red[tid]', v='red[tid + w]')}",
    ]
    lines += ["    cuda.syncthreads()", "    w //= 2", f"{var} = red[0]", "cuda.syncthreads()"]
    return "\n".join("    " + ln for ln in lines)


def per_row(sq: int, d: int, sk: int) -> bool:
    """cuda: the per-row kernel for few query rows or wide heads (the tiled kernel gives such a
    row one thread per TPR keys and sizes its registers by the head dim), scores within shared
    memory."""
    return sk <= ROW_KEYS and (sq <= 16 or d >= 128)


def _pow2_floor(x: int) -> int:
    return 1 << (max(x, 1).bit_length() - 1)


def _span(sk: int, nt: int, kept: str | None) -> str:
    """``lo, hi`` as the cpu's _span (``kept``: the mask's test of key j, None: every key), each
    thread every NT-th key, merged by a tree."""
    if kept is None:
        return f"    lo, hi = 0, {sk}"
    lines = [f"lo, hi = {sk}, 0", f"for j in range(tid, {sk}, {nt}):", f"    if {kept}:",
             "        lo = min(lo, j)", "        hi = j + 1",
             f"rlo = cuda.shared.array({nt}, i32)", f"rhi = cuda.shared.array({nt}, i32)",
             "rlo[tid] = lo", "rhi[tid] = hi", "cuda.syncthreads()", f"w = {nt // 2}",
             "while w > 0:", "    if tid < w:", "        rlo[tid] = min(rlo[tid], rlo[tid + w])",
             "        rhi[tid] = max(rhi[tid], rhi[tid + w])", "    cuda.syncthreads()",
             "    w //= 2", "lo, hi = rlo[0], rhi[0]",
             "if hi <= lo:  # no key kept: every key, as unfused", f"    lo, hi = 0, {sk}"]  # fmt: skip
    return "\n".join("    " + ln for ln in lines)


def row_kernel(f: dict, params: str, dims: tuple, split: int, kept: str | None) -> tuple:
    """The per-row kernel's (source, grid, threads) from the template fields ``f``; ``dims`` is
    (batch, heads, query rows, head dim, value dim, keys)."""
    bsz, heads, sq, d, dv, sk = dims
    nt, ch = ROW_THREADS, min(ROW_CHUNKS, d)
    c2 = max(1, nt // dv)
    f = dict(f, NT=nt, C=ch, KT=nt // ch, DC=-(-d // ch), C2=c2, S=split, W=dv + 2)
    f.update(SS=-(-sk // split), BLOCKS=sq * heads * bsz * split, span=_span(sk, nt, kept))
    f["mtree"] = _tree("m", "max({a}, {v})", nt)
    f["ltree"] = _tree("l", "{a} + {v}", nt)
    f["store"] = "ws[wb + 2 + d] = y" if split > 1 else "{o}[orow + d * {OD}] = y / l".format(**f)
    f["pv"] = (_PV_PARTS if c2 > 1 else _PV_DIMS).format(**f)
    f["merge"] = _MERGE.format(**f) if split > 1 else ""
    return HEADER + "\n" + _CUDA_ROW.format(params=params, **f), (sq, heads, bsz * split), nt


def tiled_kernel(f: dict, params: str, dims: tuple) -> tuple:
    """The tiled kernel's (source, grid, threads): NT threads, BQ query rows of TPR threads
    each, the merge reusing the tile buffer; ``dims`` is (batch, heads, query rows, head dim,
    value dim)."""
    bsz, heads, sq, d, dv = dims
    kp, vp = d + 1, dv + 1
    bk = min(64, SHARED_FLOATS // (kp + vp))
    nt = min(128, _pow2_floor(SHARED_FLOATS // dv))
    bq = min(16, 1 << max(sq - 1, 0).bit_length(), nt)
    tpr = min(nt // bq, _pow2_floor(bk))
    nt = bq * tpr
    f = dict(f, TPR=tpr, BQ=bq, NT=nt, BK=bk, KP=kp, VP=vp, VOFF=bk * kp)
    f["SHN"] = max(bk * (kp + vp), nt * dv)
    return HEADER + "\n" + _CUDA.format(params=params, **f), (-(-sq // bq), heads, bsz), nt


# cuda prefill, wide heads: one block per (BQ query rows, head, batch); q rows in shared memory,
# each K then V tile of BK keys shared by the block's rows (a thread 2 x 2 scores over a quarter
# of the head dim, the quarters summed by thread (r, j) for row r, key j; thread (d, row group)
# RPT rows of output dim d); an online softmax per row (max, sum, factor
# in shared memory). Only the tiles within the union of the rows' kept spans are read.
_CUDA_PRE = """\
from numba import cuda


@cuda.jit(cache=True)
def kernel(n, {params}):
    tid = cuda.threadIdx.x
    h = cuda.blockIdx.y
    b = cuda.blockIdx.z
    hk = h // {G}
    q0 = cuda.blockIdx.x * {BQ}
    qs = cuda.shared.array({QN}, f32)
    kv = cuda.shared.array({KN}, f32)
    ps = cuda.shared.array({PN}, f32)
    pp = cuda.shared.array({PN4}, f32)
    ms = cuda.shared.array({BQ}, f32)
    ls = cuda.shared.array({BQ}, f32)
    fs = cuda.shared.array({BQ}, f32)
    acc = cuda.local.array({RPT}, f32)
    sr = tid // {BK}
    sj = tid % {BK}
    od = tid % {DV}
    rg = tid // {DV}
    c = tid // {PB}
    pr = tid % {PB} // {KB} * 2
    pj = tid % {KB} * 2
{span}
    sc = {sc}
    for e in range(tid, {BQ} * {D}, {NT}):
        r = e // {D}
        i = q0 + r
        x = f32(0)
        if i < {SQ}:
            qr = {q_at}
            x = {q}[qr + (e % {D}) * {QD}] * sc
        qs[r * {QP} + e % {D}] = x
    if tid < {BQ}:
        ms[tid] = f32(-math.inf)
        ls[tid] = f32(0)
    for u in range({RPT}):
        acc[u] = f32(0)
    i = q0 + sr
    for k0 in range(lo, hi, {BK}):
        nk = min({BK}, hi - k0)
        for e in range(tid, {BK} * {D}, {NT}):
            j = e // {D}
            x = f32(0)
            if j < nk:
                kr = {k_at}
                x = {k}[kr + (e % {D}) * {KD}]
            kv[j * {KP} + e % {D}] = x
        cuda.syncthreads()
        x00, x01, x10, x11 = f32(0), f32(0), f32(0), f32(0)
        for d in range(c * {DC}, min({D}, c * {DC} + {DC})):
            a0, a1 = qs[pr * {QP} + d], qs[(pr + 1) * {QP} + d]
            z0, z1 = kv[pj * {KP} + d], kv[(pj + 1) * {KP} + d]
            x00 += a0 * z0
            x01 += a0 * z1
            x10 += a1 * z0
            x11 += a1 * z1
        e = c * {NT} + pr * {BK} + pj
        pp[e], pp[e + 1], pp[e + {BK}], pp[e + {BK} + 1] = x00, x01, x10, x11
        cuda.syncthreads()
        x = f32(-math.inf)
        if sj < nk and i < {SQ}:
            j = sj
            x = f32(0)
            for u in range(4):
                x += pp[u * {NT} + tid]
{mask}
        ps[tid] = x
        cuda.syncthreads()
        mo = ms[sr]
        mx = mo
        for u in range({BK}):
            mx = max(mx, ps[sr * {BK} + u])
        p = f32(0)
        if x != -math.inf:
            p = math.exp(x - mx)
        alpha = f32(1)
        if mx != -math.inf:
            alpha = math.exp(mo - mx)
        cuda.syncthreads()
        ps[tid] = p
        if sj == 0:
            fs[sr] = alpha
            ms[sr] = mx
        for e in range(tid, {BK} * {DV}, {NT}):
            j = e // {DV}
            x = f32(0)
            if j < nk:
                vr = {v_at}
                x = {v}[vr + (e % {DV}) * {VD}]
            kv[j * {VP} + e % {DV}] = x
        cuda.syncthreads()
        if tid < {BQ}:
            t = f32(0)
            for u in range({BK}):
                t += ps[tid * {BK} + u]
            ls[tid] = ls[tid] * fs[tid] + t
        for u in range({RPT}):
            acc[u] *= fs[rg + u * {RG}]
        for j in range(nk):
            y = kv[j * {VP} + od]
            for u in range({RPT}):
                acc[u] += ps[(rg + u * {RG}) * {BK} + j] * y
        cuda.syncthreads()
    for u in range({RPT}):
        i = q0 + rg + u * {RG}
        if i < {SQ}:
            orow = {o_at}
            {o}[orow + od * {OD}] = acc[u] / ls[rg + u * {RG}]
"""
PRE_THREADS = 256  # the prefill kernel's block: PRE_ROWS rows x PRE_THREADS // PRE_ROWS keys
PRE_ROWS = 16


def prefill(sq: int, d: int, dv: int) -> bool:
    """cuda: the prefill kernel for many query rows of a wide head (its q rows and K/V tiles in
    shared memory: 16 x 257 floats each at d 256); decode steps (sq <= 16) stay per row."""
    return sq > 16 and 128 <= d <= 256 and PRE_THREADS % dv == 0 and dv >= PRE_THREADS // PRE_ROWS


def _pre_span(sk: int, sq: int, bq: int, bk: int, kept: str | None) -> str:
    """``lo, hi``: the union of the block's rows' kept spans (a row keeping nothing: every key,
    as unfused); thread (row tid // bk) every bk-th key, merged by shared atomics."""
    if kept is None:
        return f"    lo, hi = 0, {sk}"
    lines = [f"rlo = cuda.shared.array({bq}, i32)", f"rhi = cuda.shared.array({bq}, i32)",
             f"if tid < {bq}:", f"    rlo[tid] = {sk}", "    rhi[tid] = 0", "cuda.syncthreads()",
             "i = q0 + sr", f"if i < {sq}:", f"    lo, hi = {sk}, 0",
             f"    for j in range(sj, {sk}, {bk}):", f"        if {kept}:",
             "            lo = min(lo, j)", "            hi = j + 1",
             "    cuda.atomic.min(rlo, sr, i32(lo))", "    cuda.atomic.max(rhi, sr, i32(hi))",
             "cuda.syncthreads()", f"lo, hi = {sk}, 0", f"for u in range({bq}):",
             f"    if q0 + u < {sq}:", "        a, z = rlo[u], rhi[u]", "        if z <= a:",
             f"            a, z = 0, {sk}", "        lo, hi = min(lo, a), max(hi, z)"]  # fmt: skip
    return "\n".join("    " + ln for ln in lines)


def prefill_kernel(f: dict, params: str, dims: tuple, kept: str | None) -> tuple:
    """The prefill kernel's (source, grid, threads); ``dims`` as row_kernel's."""
    bsz, heads, sq, d, dv, sk = dims
    nt, bq = PRE_THREADS, PRE_ROWS
    bk, rg = nt // bq, nt // dv
    f = dict(f, NT=nt, BQ=bq, BK=bk, RG=rg, RPT=bq // rg, QP=d + 1, KP=d + 1, VP=dv + 1)
    f.update(QN=bq * (d + 1), KN=bk * (max(d, dv) + 1), PN=nt, PN4=4 * nt)
    f.update(PB=nt // 4, KB=bk // 2, DC=-(-d // 4))  # 4 chunks of the dot, 2 x 2 scores each
    f["span"] = _pre_span(sk, sq, bq, bk, kept)
    return HEADER + "\n" + _CUDA_PRE.format(params=params, **f), (-(-sq // bq), heads, bsz), nt
