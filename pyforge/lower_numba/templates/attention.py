"""FusedAttention: the scores never leave the chip.

cpu: one parallel tile per (batch, head): its keys (transposed) and values packed once into the
panels of own sgemm's MRx16 micro-kernel (exec/cpu/sgemm.py), then per block of qb query rows
(qb x keys scores within L2) the scores are micro-kernel tiles, each row's softmax is exact
(max, then emit.FEXP_CPU's vectorised exp (fexpz) and the sum in one loop) and written as the
left panels of the second product; no BLAS call (OpenBLAS would start its own threads inside the
parallel region). Shapes and strides are int params (one compiled kernel per mask structure).
The cuda kernels: attention_cuda.py.
"""

from __future__ import annotations

import hashlib

from ...ir import Node, Value
from ..emit import (
    FEXP_CPU,
    HEADER,
    RUNTIME_MARK,
    KernelBuilder,
    KernelCall,
    broadcast_strides,
    contiguous_strides,
)
from ..registry import lowering
from ..scalar import lit
from .attention_cuda import per_row, prefill, prefill_kernel, row_kernel, splits, tiled_kernel

SCORES_CPU = 32768  # floats of a query block's scores (qb x keys): 128 KiB, within L2

_CPU = """\
from numba import njit, prange
from pyforge.exec.cpu.pack import MR
from pyforge.exec.cpu.sgemm import _micro
from pyforge.exec.cpu.tiles import claim, threads, tiling


@njit(parallel=True, cache=True, nogil=True, fastmath={{"reassoc", "contract"}})
def kernel(n, {params}):
    sc = {sc}
    skp = ({SK} + 15) // 16 * 16
    dvp = ({DV} + 15) // 16 * 16
    qb = min(({SQ} + MR - 1) // MR, max(1, {SCORES} // (MR * skp))) * MR  # whole MR-row panels
    parts = threads()
    per, tiles, nxt = tiling(n, parts)
    for _ in prange(parts):
        kp = np.zeros({D} * skp, np.float32)
        vp = np.zeros(dvp * {SK}, np.float32)
        qp = np.zeros(qb * {D}, np.float32)
        pp = np.zeros(qb * {SK}, np.float32)
        sb = np.zeros(qb * skp, np.float32)
        ob = np.zeros(qb * dvp, np.float32)
        z = np.zeros(16, np.float32)
        kp0, vp0, qp0, pp0 = kp.ctypes.data, vp.ctypes.data, qp.ctypes.data, pp.ctypes.data
        sb0, ob0, z0 = sb.ctypes.data, ob.ctypes.data, z.ctypes.data
        t = claim(nxt)
        while t < tiles:
            for bh in range(t * per, min(n, t * per + per)):
                h = bh % {H}
                b = bh // {H}
                hk = h // {G}
                k0 = 0
                nk = {SK}
                if {SQ} < MR:  # decode: fewer rows than a panel; K and V read in place
                    for i in range({SQ}):
                        qr = {q_at}
                        for d in range({D}):
                            qp[d] = {q}[qr + d * {QD}] * sc
{span_row}
                        for k0 in range(lo, hi, 64):  # GEMVs below OpenBLAS's threading size
                            nb = min(64, hi - k0)
                            j = 0
                            kr = {k_at}
                            if {KD} == 1 and {KS} == {D}:  # key rows contiguous: in place
                                kblk = {k}[kr : kr + nb * {D}].reshape((nb, {D}))
                                sb[k0 : k0 + nb] = np.dot(kblk, qp[: {D}])
                                continue
                            for j in range(nb):
                                kr = {k_at}
                                x = f32(0)
                                for d in range({D}):
                                    x += qp[d] * {k}[kr + d * {KD}]
                                sb[k0 + j] = x
                        k0 = lo
                        nk = hi - lo
                        sr = sb[lo:hi]
{mask}
{softmax}
                        ob[: {DV}] = 0
                        for k0 in range(lo, hi, 64):
                            nb = min(64, hi - k0)
                            j = 0
                            vr = {v_at}
                            if {VD} == 1 and {VS} == {DV}:
                                vblk = {v}[vr : vr + nb * {DV}].reshape((nb, {DV}))
                                ob[: {DV}] += np.dot(sb[k0 : k0 + nb], vblk)
                                continue
                            for j in range(nb):
                                vr = {v_at}
                                for d in range({DV}):
                                    ob[d] += sb[k0 + j] * {v}[vr + d * {VD}]
                        orow = {o_at}
                        for d in range({DV}):
                            {o}[orow + d * {OD}] = ob[d]
                    continue
{span_all}
                k0 = lo
                nk = hi - lo
                nkp = (nk + 15) // 16 * 16
                for j in range(nk):
                    kr, vr = {k_at}, {v_at}
                    kq = (j // 16) * {D} * 16 + j % 16
                    for d in range({D}):
                        kp[kq + d * 16] = {k}[kr + d * {KD}]
                    for d in range({DV}):
                        vp[(d // 16) * nk * 16 + j * 16 + d % 16] = {v}[vr + d * {VD}]
                for q0 in range(0, {SQ}, qb):
                    rows = min(qb, {SQ} - q0)
                    for r in range(rows):
                        i = q0 + r
                        qr = {q_at}
                        qq = (r // MR) * {D} * MR + r % MR
                        for d in range({D}):
                            qp[qq + d * MR] = {q}[qr + d * {QD}] * sc
                    for r in range(0, rows, MR):
                        for c in range(0, nkp, 16):
                            _micro({D}, qp0 + r * {D} * 4, kp0 + c * {D} * 4, 0,
                                   sb0 + (r * skp + c) * 4, skp, 0, 0, z0, z0, 0, 0)
                    for r in range(rows):
                        i = q0 + r
                        sr = sb[r * skp : r * skp + nk]
{mask}
{softmax}
                        pq = (r // MR) * nk * MR + r % MR
                        for j in range(nk):
                            pp[pq + j * MR] = sr[j]
                    for r in range(0, rows, MR):
                        for c in range(0, dvp, 16):
                            _micro(nk, pp0 + r * nk * 4, vp0 + c * nk * 4, 0,
                                   ob0 + (r * dvp + c) * 4, dvp, 0, 0, z0, z0, 0, 0)
                    for r in range(rows):
                        i = q0 + r
                        orow = {o_at}
                        for d in range({DV}):
                            {o}[orow + d * {OD}] = ob[r * dvp + d]
            t = claim(nxt)
"""

_ROW_SOFTMAX = """\
mx = f32(-np.inf)
for j in range(nk):
    mx = max(mx, sr[j])
if mx == -np.inf:  # every key masked: NaN, as ORT gives
    sr[:nk] = np.nan
else:
    tot = f32(0)
    for j in range(nk):
        sr[j] = fexpz(sr[j] - mx)
        tot += sr[j]
    inv = f32(1) / tot
    for j in range(nk):
        sr[j] *= inv"""


def _skips(node: Node) -> bool:
    """Whether skipping the keys no mask keeps is exact: every mask step a "where" filling far
    below the kept scores (exp gives 0), so a static cache's rows past the valid length or
    before a sliding window need never be read."""
    a = node.attrs
    return bool(a["mask"]) and all(s == "where" for s in a["mask"]) and a["fill"] <= -1e30


def _kept(node: Node, names: list[str], num, row: str) -> str:
    """The test that every mask step keeps key ``j`` of query ``row``."""
    a, q = node.attrs, node.inputs[0]
    bsz, heads, sq, _ = (q.shape[p] for p in a["q_perm"])
    full = (bsz, heads, sq, _sk(node))
    kept = []
    for m, name in zip(node.inputs[4:], names[4:-1]):
        mst = [num(z, "s") for z in broadcast_strides(m.shape, full)]
        kept.append(f"{name}[{_at(mst, ('b', 'h', row, 'j'))}] == {lit(a['keep'], 'b1')}")
    return " and ".join(kept)


def _span(node: Node, names: list[str], num, row: str | None) -> str:
    """cpu: ``lo, hi``, the keys from the first to the last one the mask keeps for query row
    ``row`` (None: any row of the (batch, head)); every key where no mask allows it, or where no
    key is kept (as unfused)."""
    pad, sk_n = " " * (24 if row else 16), num(_sk(node), "SK")
    if not _skips(node):
        return pad + f"lo, hi = 0, {sk_n}"
    sq_n = num(node.inputs[0].shape[node.attrs["q_perm"][2]], "SQ")
    kept = _kept(node, names, num, row or "ii")
    scan = [f"for j in range({sk_n}):", f"    if {kept}:", "        lo = min(lo, j)",
            "        break", f"for j in range({sk_n} - 1, lo - 1, -1):",
            f"    if {kept}:", "        hi = max(hi, j + 1)", "        break"]  # fmt: skip
    if row is None:
        scan = [f"for ii in range({sq_n}):"] + ["    " + ln for ln in scan]
    body = [f"lo, hi = {sk_n}, 0", *scan, "if hi <= lo:  # no key kept: every key, as unfused",
            f"    lo, hi = 0, {sk_n}"]  # fmt: skip
    return "\n".join(pad + ln for ln in body)


def _sk(node: Node) -> int:
    return node.inputs[1].shape[node.attrs["k_perm"][2]]


def _at(strides: list[str], coords: tuple[str, ...]) -> str:
    terms = [c if s == "1" else f"{c} * {s}" for s, c in zip(strides, coords) if s != "0"]
    return " + ".join(terms) or "0"


def _strides(v: Value, perm: list[int]) -> list[int]:
    """Element strides of the canonical axes of ``v`` read through ``perm`` (0 on a dim of 1)."""
    st = contiguous_strides(v.shape)
    return [0 if v.shape[p] == 1 else st[p] for p in perm]


def _fields(node: Node, names: list[str], num, cpu: bool) -> dict:
    """The template's shape and stride fields; ``num`` writes an int (a literal or a param)."""
    a = node.attrs
    q, k, v = node.inputs[:3]
    _, heads, sq, d = (q.shape[p] for p in a["q_perm"])
    hk, sk, dv = k.shape[a["k_perm"][1]], k.shape[a["k_perm"][2]], v.shape[a["v_perm"][3]]
    ys = contiguous_strides(node.outputs[0].shape)
    st = {
        "q": _strides(q, a["q_perm"]),
        "k": _strides(k, a["k_perm"]),
        "v": _strides(v, a["v_perm"]),
        "o": [ys[a["out_perm"].index(axis)] for axis in range(4)],
    }
    f = dict(H=num(heads, "H"), G=num(heads // hk, "G"), SQ=num(sq, "SQ"), SK=num(sk, "SK"))
    f.update(D=num(d, "D"), DV=num(dv, "DV"), sc=f"{names[3]}[0]")
    f.update(q=names[0], k=names[1], v=names[2], o=names[-1])
    for t, rows in (("q", ("b", "h", "i")), ("k", ("b", "hk", "(k0 + j)"))):
        f[f"{t}_at"] = _at([num(x, "s") for x in st[t][:3]], rows)
        f[t.upper() + "D"] = num(st[t][3], "s")
    f["v_at"] = _at([num(x, "s") for x in st["v"][:3]], ("b", "hk", "(k0 + j)"))
    f["o_at"] = _at([num(x, "s") for x in st["o"][:3]], ("b", "h", "i"))
    f["VD"], f["OD"] = num(st["v"][3], "s"), num(st["o"][3], "s")
    f["KS"], f["VS"] = num(st["k"][2], "s"), num(st["v"][2], "s")
    f["mask"] = _mask(node, names, num, cpu)
    return f


def _mask(node: Node, names: list[str], num, cpu: bool, indent: int = 0) -> str:
    """The mask steps, in order, on the scores of row i: cpu a loop over the block's keys on
    ``sr[j]``, cuda on its key's ``x``."""
    a, lines, x = node.attrs, [], "sr[j]" if cpu else "x"
    q, k = node.inputs[:2]
    bsz, heads, sq, _ = (q.shape[p] for p in a["q_perm"])
    full = (bsz, heads, sq, k.shape[a["k_perm"][2]])
    for step, m, name in zip(a["mask"], node.inputs[4:], names[4:-1]):
        mst = [num(z, "s") for z in broadcast_strides(m.shape, full)]
        at = f"{name}[{_at(mst, ('b', 'h', 'i', '(k0 + j)'))}]"
        if step == "add":
            body = [f"{x} += {at}"]
        else:
            body = [f"if {at} != {lit(a['keep'], 'b1')}:", f"    {x} = {lit(a['fill'], 'f32')}"]
        if cpu:
            body = ["for j in range(nk):"] + ["    " + ln for ln in body]
        lines += [" " * (indent or (24 if cpu else 16)) + ln for ln in body]
    return "\n".join(lines)


@lowering("FusedAttention", form="rows")
def attention_rows(node: Node, kb: KernelBuilder) -> KernelCall:
    q, k, v = node.inputs[:3]
    a = node.attrs
    bsz, heads, sq, d = (q.shape[p] for p in a["q_perm"])
    sk, dv = k.shape[a["k_perm"][2]], v.shape[a["v_perm"][3]]
    names = [kb.tensor(t.name) for t in node.inputs] + [kb.tensor(node.outputs[0].name)]
    n = bsz * heads
    # cpu: shapes and strides are int params (one compiled kernel per mask structure); the mask
    # loops over the row's keys
    cpu_f = _fields(node, names, kb.int_param, True)
    cpu_f["SCORES"] = SCORES_CPU
    cpu_f["softmax"] = "\n".join(" " * 24 + ln for ln in _ROW_SOFTMAX.splitlines())
    cpu_f["span_row"] = _span(node, names, kb.int_param, "i")
    cpu_f["span_all"] = _span(node, names, kb.int_param, None)
    # cuda: literals (local and shared array sizes must be); the prefill, per-row or tiled kernel
    lit_num = lambda value, hint: str(int(value))
    cuda_f = _fields(node, names, lit_num, False)
    pre = prefill(sq, d, dv)
    rows = per_row(sq, d, sk) and not pre
    split = splits(sq * heads * bsz, sk) if rows else 1
    if split > 1:  # the block counter, then the parts' buffer (lower.py adds it: workspace)
        kb.params += ["err", "ws"]
        kb.args.append(("e", 0))
    params = ", ".join(kb.params)
    cpu = HEADER + RUNTIME_MARK + "\n" + _CPU.format(params=params, **cpu_f) + FEXP_CPU
    kept = _kept(node, names, lit_num, "i") if _skips(node) else None
    if pre or rows:
        cuda_f["mask"] = _mask(node, names, lit_num, False, 12)
    if pre:
        cuda, grid, nt = prefill_kernel(cuda_f, params, (bsz, heads, sq, d, dv, sk), kept)
    elif rows:
        cuda, grid, nt = row_kernel(cuda_f, params, (bsz, heads, sq, d, dv, sk), split, kept)
    else:
        cuda, grid, nt = tiled_kernel(cuda_f, params, (bsz, heads, sq, d, dv))
    key = hashlib.sha1(cpu.encode() + cuda.encode()).hexdigest()[:16]
    call = KernelCall(cpu, cuda, key, n, list(kb.args), kb.label)
    call.launch = (grid, nt)
    call.workspace = sq * heads * bsz * split * (dv + 2) if split > 1 else 0
    return call
