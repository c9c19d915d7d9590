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

import os
import textwrap

from ...errors import OptionError
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
    keys = (decode_variant() or (0, 0, SPLIT_KEYS))[2]
    return max(1, min(SMS // rows, -(-sk // keys)))


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
    var = decode_variant()
    got = var and warp_kernel(f, params, dims, split, kept, var)
    if got:
        return got
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


# cuda decode, warp-level (PYFORGE_DECODE_ATTN; "w8", the default, was the fastest on the H200 at 9,
# 133 and 1088 keys; "row" is the per-row kernel above): the
# same grid, split and workspace as _CUDA_ROW. A warp a key: each lane the dims lane + 32 t of q
# (in registers) and of the key's row (coalesced), the dot summed by shfl_xor; KU keys a pass,
# their loads all issued before the sums (clamped to the part, so no branch). Scores in shared
# memory, max and sum by shuffles, then one word a warp. PV the same way (a warp a key, a lane
# its dims), the warps' sums in shared memory. Split: as _CUDA_ROW, but the last block merges in
# parallel (a warp per row's parts, every part's acc load of an output issued together).
DECODE = {"row": None, "w4": (4, 2, 32), "w8": (8, 4, 32), "w8k64": (8, 4, 64),
          "w8k128": (8, 4, 128), "w8k256": (8, 4, 256)}  # fmt: skip
_FULL = "0xFFFFFFFF"


def decode_variant() -> tuple | None:
    """(warps, keys a pass, keys a part) of the decode kernel PYFORGE_DECODE_ATTN names (default
    w8), or None for the per-row kernel ("row")."""
    name = os.environ.get("PYFORGE_DECODE_ATTN", "w8")
    if name not in DECODE:
        raise OptionError(f"PYFORGE_DECODE_ATTN={name!r}: not one of {sorted(DECODE)}")
    return DECODE[name]


def _wred(var: str, op: str) -> list[str]:
    """``var`` combined over the warp's lanes (every lane ends with it)."""
    return [f"{var} = {op.format(a=var, v=f'cuda.shfl_xor_sync({_FULL}, {var}, {k})')}"
            for k in (16, 8, 4, 2, 1)]  # fmt: skip


def _ind(lines: list[str], n: int) -> str:
    return "\n".join(" " * n + ln for ln in lines)


def _wspan(sk: int, nt: int, nw: int, kept: str | None) -> list[str]:
    if kept is None:
        return [f"lo, hi = 0, {sk}"]
    out = [f"lo, hi = {sk}, 0", f"for j in range(tid, {sk}, {nt}):", f"    if {kept}:",
           "        lo = min(lo, j)", "        hi = j + 1"]  # fmt: skip
    out += _wred("lo", "min({a}, {v})") + _wred("hi", "max({a}, {v})")
    out += [f"rlo = cuda.shared.array({nw}, i32)", f"rhi = cuda.shared.array({nw}, i32)",
            "if lane == 0:", "    rlo[w] = lo", "    rhi[w] = hi", "cuda.syncthreads()",
            f"for u in range({nw}):", "    lo = min(lo, rlo[u])", "    hi = max(hi, rhi[u])",
            "if hi <= lo:  # no key kept: every key, as unfused", f"    lo, hi = 0, {sk}"]  # fmt: skip
    return out


def warp_kernel(f: dict, params: str, dims: tuple, split: int, kept: str | None, var: tuple):
    """The warp decode kernel's (source, grid, threads), or None where its shared memory would
    not fit; arguments as row_kernel's, ``var`` (warps, keys a pass, keys a part)."""
    bsz, heads, sq, d, dv, sk = dims
    nw, ku, _ = var
    nt, dt, vt = nw * 32, -(-d // 32), -(-dv // 32)
    ssn, blocks, groups = -(-sk // split), sq * heads * bsz * split, sq * heads * bsz
    if ssn + nw * dv + (blocks if split > 1 else 0) > 11000:
        return None
    mask = textwrap.dedent(f["mask"])
    dim = lambda t, n: f"min(lane + {32 * t}, {n - 1})" if 32 * t + 31 >= n else f"lane + {32 * t}"
    body = ["tid = cuda.threadIdx.x", "lane = tid % 32", "w = tid // 32", "i = cuda.blockIdx.x",
            "h = cuda.blockIdx.y", f"b = cuda.blockIdx.z // {split}", f"s = cuda.blockIdx.z % {split}",
            f"hk = h // {f['G']}", f"ss = cuda.shared.array({ssn}, f32)",
            f"rm = cuda.shared.array({nw}, f32)", f"rl = cuda.shared.array({nw}, f32)",
            f"acs = cuda.shared.array({nw * dv}, f32)", *_wspan(sk, nt, nw, kept),
            f"per = (hi - lo + {split} - 1) // {split}", "klo = min(hi, lo + s * per)",
            "khi = min(hi, klo + per)", "nk = khi - klo", f"sc = {f['sc']}", f"qr = {f['q_at']}"]  # fmt: skip
    for t in range(dt):
        q = f"{f['q']}[qr + (lane + {32 * t}) * {f['QD']}] * sc"
        body.append(f"q{t} = {q} if lane + {32 * t} < {d} else f32(0)")
    body += ["m = f32(-math.inf)", f"for k0 in range(klo + w * {ku}, khi, {nw * ku}):"]
    loop = []
    for u in range(ku):
        loop += [f"j = min({u}, khi - 1 - k0)", f"kr{u} = {f['k_at']}"]
        terms = [f"q{t} * {f['k']}[kr{u} + {dim(t, d)} * {f['KD']}]" for t in range(dt)]
        loop.append(f"a{u} = " + " + ".join(terms))
    for u in range(ku):
        loop += _wred(f"a{u}", "{a} + {v}")
    for u in range(ku):
        loop += [f"if k0 + {u} < khi:", f"    j = {u}", f"    x = a{u}"]
        loop += ["    " + ln for ln in mask.splitlines()]
        loop += ["    m = max(m, x)", "    if lane == 0:", f"        ss[k0 + {u} - klo] = x"]
    body += ["    " + ln for ln in loop]
    body += ["if lane == 0:", "    rm[w] = m", "cuda.syncthreads()", f"for u in range({nw}):",
             "    m = max(m, rm[u])", "l = f32(0)", f"for e in range(tid, nk, {nt}):",
             "    p = f32(0)", "    if ss[e] != -math.inf:", "        p = math.exp(ss[e] - m)",
             "    ss[e] = p", "    l += p", *_wred("l", "{a} + {v}"), "if lane == 0:",
             "    rl[w] = l", "cuda.syncthreads()", "l = f32(0)", f"for u in range({nw}):",
             "    l += rl[u]", "k0 = klo"]  # fmt: skip
    body += [f"c{t} = f32(0)" for t in range(vt)]
    body.append(f"for j0 in range(w * {ku}, nk, {nw * ku}):")
    loop = []
    for u in range(ku):
        loop += [f"j = min(j0 + {u}, nk - 1)", f"vr{u} = {f['v_at']}"]
        loop.append(f"p{u} = ss[j] if j0 + {u} < nk else f32(0)")
    for t in range(vt):
        terms = [f"p{u} * {f['v']}[vr{u} + {dim(t, dv)} * {f['VD']}]" for u in range(ku)]
        loop.append(f"c{t} += " + " + ".join(terms))
    body += ["    " + ln for ln in loop]
    for t in range(vt):
        st = f"acs[w * {dv} + lane + {32 * t}] = c{t}"
        body += [st] if 32 * t + 32 <= dv else [f"if lane + {32 * t} < {dv}:", "    " + st]
    wb = f"(((b * {f['H']} + h) * {f['SQ']} + i) * {split} + s) * {dv + 2}"
    body += ["cuda.syncthreads()", f"orow = {f['o_at']}", f"wb = {wb}",
             f"for d in range(tid, {dv}, {nt}):", "    y = f32(0)", f"    for u in range({nw}):",
             f"        y += acs[u * {dv} + d]"]  # fmt: skip
    body.append(
        "    ws[wb + 2 + d] = y" if split > 1 else f"    {f['o']}[orow + d * {f['OD']}] = y / l"
    )
    if split > 1:
        body += _wmerge(f, split, blocks, groups, dv, nt, nw)
    src = "from numba import cuda\n\n\n@cuda.jit(cache=True)\ndef kernel(n, " + params + "):\n"
    return HEADER + "\n" + src + _ind(body, 4) + "\n", (sq, heads, bsz * split), nt


def _wmerge(f: dict, split: int, blocks: int, groups: int, dv: int, nt: int, nw: int) -> list[str]:
    """The split's merge by the grid's last block: a warp per row's parts for the factors, then
    each output element its parts' loads all issued at once."""
    W, S = dv + 2, split
    out = ["if tid == 0:", "    ws[wb] = m", "    ws[wb + 1] = l", "cuda.threadfence()",
           "cuda.syncthreads()", "last = cuda.shared.array(1, i32)",
           f"fs = cuda.shared.array({blocks}, f32)", "if tid == 0:",
           f"    last[0] = 1 if cuda.atomic.add(err, 0, 1) == {blocks - 1} else 0",
           "cuda.syncthreads()", "if last[0] == 1:", "    cuda.threadfence()",
           f"    for e in range(tid, {blocks}, {nt}):", f"        fs[e] = ws[e * {W}]",
           "    cuda.syncthreads()", f"    for g in range(w, {groups}, {nw}):",
           "        top = f32(-math.inf)", f"        for u in range(lane, {S}, 32):",
           f"            top = max(top, fs[g * {S} + u])",
           *["        " + x for x in _wred("top", "max({a}, {v})")],
           "        tot = f32(0)", f"        for u in range(lane, {S}, 32):",
           "            x = f32(0)", f"            if fs[g * {S} + u] != -math.inf:",
           f"                x = math.exp(fs[g * {S} + u] - top)",
           f"            fs[g * {S} + u] = x", f"            tot += x * ws[(g * {S} + u) * {W} + 1]",
           *["        " + x for x in _wred("tot", "{a} + {v}")],
           f"        for u in range(lane, {S}, 32):",
           f"            fs[g * {S} + u] = fs[g * {S} + u] / tot  # 0 / 0: no key kept, NaN as ORT",
           "    cuda.syncthreads()", f"    for e in range(tid, {groups * dv}, {nt}):",
           f"        g = e // {dv}", f"        d = e % {dv}", f"        r = g * {S}"]  # fmt: skip
    for u0 in range(0, S, 16):
        terms = [f"ws[(r + {u}) * {W} + 2 + d] * fs[r + {u}]" for u in range(u0, min(S, u0 + 16))]
        out.append(f"        y{u0 // 16} = " + " + ".join(terms))
    out.append("        y = " + " + ".join(f"y{u}" for u in range(-(-S // 16))))
    out += [f"        i = g % {f['SQ']}", f"        h = g // {f['SQ']} % {f['H']}",
            f"        b = g // ({f['SQ']} * {f['H']})", f"        orow = {f['o_at']}",
            f"        {f['o']}[orow + d * {f['OD']}] = y", "    if tid == 0:", "        err[0] = 0"]  # fmt: skip
    return out


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


def _simulated_shuffles() -> None:
    """Numba's CUDA simulator has no warp shuffles: shfl_xor_sync by a barrier of the warp's 32
    simulator threads (kernels here call it with every lane of a full warp)."""
    import threading

    from numba.cuda.simulator import kernelapi

    lock, warps = threading.Lock(), {}

    def shfl_xor_sync(self, mask, value, lane_mask):
        t = threading.current_thread()
        key = (id(t._manager), tuple(t.blockIdx), t.thread_id // 32)
        with lock:
            slots, bar = warps.setdefault(key, ([None] * 32, threading.Barrier(32, timeout=120)))
        slots[t.thread_id % 32] = value
        bar.wait()
        got = slots[(t.thread_id % 32) ^ lane_mask]
        bar.wait()
        return got

    kernelapi.FakeCUDAModule.shfl_xor_sync = shfl_xor_sync


if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    _simulated_shuffles()
