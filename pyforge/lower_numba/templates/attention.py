"""FusedAttention: the scores never leave the chip, the softmax runs online (a running max and
sum per query row, the accumulator rescaled when the max grows).

cpu: one prange iteration per (batch, head, block of QB query rows); per block of BK keys, the
keys are packed transposed once, then per row its BK scores are summed over the head dim as
runs over keys and its accumulator updated as runs over the head dim (both loops vectorise).
cuda, flash-attention style: one block per (query tile, head, batch); the K and V tiles go
through shared memory; each query row's TPR threads take every TPR-th key of a tile, each with
its own running max, sum and accumulator in registers, merged once at the end.
Every shape and stride is a literal of the source: a kernel per attention shape.
"""

from __future__ import annotations

import hashlib

from ...ir import Node, Value
from ..emit import HEADER, KernelBuilder, KernelCall, broadcast_strides, contiguous_strides
from ..registry import lowering
from ..scalar import lit

QB_CPU, BK_CPU = 16, 64
SHARED_FLOATS = 10240  # cuda: tiles + merge buffer, 40 KiB of the 48 KiB a block gets

_CPU = """\
from numba import njit, prange


@njit(parallel={parallel}, cache=True, nogil=True)
def kernel(n, {params}):
    sc = {scale}
    for t in prange(n):
        qb = t % {NQB}
        h = (t // {NQB}) % {H}
        b = t // ({NQB} * {H})
        hk = h // {G}
        q0 = qb * {QB}
        rows = min({QB}, {SQ} - q0)
        kt = np.empty({D} * {BK}, np.float32)
        s = np.empty({BK}, np.float32)
        m = np.full({QB}, -np.inf, np.float32)
        l = np.zeros({QB}, np.float32)
        acc = np.zeros({QB} * {DV}, np.float32)
        for k0 in range(0, {SK}, {BK}):
            nk = min({BK}, {SK} - k0)
            for j in range(nk):
                kr = {k_at}
                for d in range({D}):
                    kt[d * {BK} + j] = {k}[kr + d * {KD}]
            for r in range(rows):
                i = q0 + r
                qr = {q_at}
                for j in range(nk):
                    s[j] = 0
                for d in range({D}):
                    qd = {q}[qr + d * {QD}] * sc
                    for j in range(nk):
                        s[j] += qd * kt[d * {BK} + j]
{mask}
                mx = m[r]
                for j in range(nk):
                    mx = max(mx, s[j])
                if mx == -np.inf:
                    continue
                alpha = math.exp(m[r] - mx)
                l[r] *= alpha
                a = acc[r * {DV} : (r + 1) * {DV}]
                for d in range({DV}):
                    a[d] *= alpha
                for j in range(nk):
                    p = math.exp(s[j] - mx)
                    l[r] += p
                    vr = {v_at}
                    for d in range({DV}):
                        a[d] += p * {v}[vr + d * {VD}]
                m[r] = mx
        for r in range(rows):
            i = q0 + r
            orow = {o_at}
            for d in range({DV}):
                {o}[orow + d * {OD}] = acc[r * {DV} + d] / l[r]
"""

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
    sc = {scale}
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


def _pow2_floor(x: int) -> int:
    return 1 << (max(x, 1).bit_length() - 1)


def _at(strides: list[int], coords: tuple[str, ...]) -> str:
    terms = [c if s == 1 else f"{c} * {s}" for s, c in zip(strides, coords) if s]
    return " + ".join(terms) or "0"


def _strides(v: Value, perm: list[int]) -> list[int]:
    """Element strides of the canonical axes of ``v`` read through ``perm`` (0 on a dim of 1)."""
    st = contiguous_strides(v.shape)
    return [0 if v.shape[p] == 1 else st[p] for p in perm]


def _mask_lines(node: Node, names: list[str], full: tuple, cpu: bool) -> str:
    """The mask steps, in order, on ``s[j]`` (cpu) or ``x`` (cuda) for key k0 + j of row i."""
    lines, pad = [], " " * 16
    for step, v, name in zip(node.attrs["mask"], node.inputs[3:], names):
        st = broadcast_strides(v.shape, full)
        at = f"{name}[{_at(st, ('b', 'h', 'i', '(k0 + j)'))}]"
        x = "s[j]" if cpu else "x"
        if step == "add":
            body = [f"{x} += {at}"]
        else:
            keep, fill = lit(node.attrs["keep"], "b1"), lit(node.attrs["fill"], "f32")
            body = [f"if {at} != {keep}:", f"    {x} = {fill}"]
        if cpu:
            body = ["for j in range(nk):"] + ["    " + ln for ln in body]
        lines += [pad + ln for ln in body]
    return "\n".join(lines)


@lowering("FusedAttention", form="rows")
def attention_rows(node: Node, kb: KernelBuilder) -> KernelCall:
    a = node.attrs
    q, k, v = node.inputs[:3]
    out = node.outputs[0]
    qs, ks, vs = _strides(q, a["q_perm"]), _strides(k, a["k_perm"]), _strides(v, a["v_perm"])
    bsz, heads, sq, d = (q.shape[p] for p in a["q_perm"])
    hk, sk, dv = k.shape[a["k_perm"][1]], k.shape[a["k_perm"][2]], v.shape[a["v_perm"][3]]
    ys = contiguous_strides(out.shape)
    os_ = [ys[a["out_perm"].index(axis)] for axis in range(4)]
    names = [kb.tensor(t.name) for t in node.inputs] + [kb.tensor(out.name)]
    full = (bsz, heads, sq, sk)
    common = dict(
        params=", ".join(kb.params), H=heads, G=heads // hk, SQ=sq, SK=sk, D=d, DV=dv,
        q=names[0], k=names[1], v=names[2], o=names[-1], scale=lit(a["scale"], "f32"),
        q_at=_at(qs[:3], ("b", "h", "i")), QD=qs[3], k_at=_at(ks[:3], ("b", "hk", "(k0 + j)")),
        KD=ks[3], v_at=_at(vs[:3], ("b", "hk", "(k0 + j)")), VD=vs[3],
        o_at=_at(os_[:3], ("b", "h", "i")), OD=os_[3],
    )  # fmt: skip
    nqb = -(-sq // QB_CPU)
    n = bsz * heads * nqb
    cpu = _CPU.format(
        parallel=n > 1, NQB=nqb, QB=QB_CPU, BK=BK_CPU,
        mask=_mask_lines(node, names[3:-1], full, True), **common,
    )  # fmt: skip
    # cuda: NT threads, BQ query rows of TPR threads each; the merge reuses the tile buffer
    kp, vp = d + 1, dv + 1
    bk = min(64, SHARED_FLOATS // (kp + vp))
    nt = min(128, _pow2_floor(SHARED_FLOATS // dv))
    bq = min(16, 1 << max(sq - 1, 0).bit_length(), nt)
    tpr = min(nt // bq, _pow2_floor(bk))
    nt = bq * tpr
    cuda = _CUDA.format(
        TPR=tpr, BQ=bq, NT=nt, BK=bk, KP=kp, VP=vp, VOFF=bk * kp,
        SHN=max(bk * (kp + vp), nt * dv), mask=_mask_lines(node, names[3:-1], full, False),
        **common,
    )  # fmt: skip
    cpu, cuda = HEADER + "\n" + cpu, HEADER + "\n" + cuda
    key = hashlib.sha1(cpu.encode() + cuda.encode()).hexdigest()[:16]
    call = KernelCall(cpu, cuda, key, n, list(kb.args), kb.label)
    call.launch = ((-(-sq // bq), heads, bsz), nt)
    return call
