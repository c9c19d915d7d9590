"""Implicit-GEMM convolution (channels last, fp32): the conv, its bias, residual and Relu in one
kernel, instead of an im2col kernel plus a GEMM.

The GEMM is D[P, Co] = col[P, K] @ W[Co, K]^T with K ordered (ky, kx, c), as for im2col, but the
col tile is gathered straight from x into shared memory. A block computes a BM x BN tile (pixels x
output channels), stepping over K in BK chunks; each thread keeps a TM x TN tile of accumulators
in named scalars (the generated source is unrolled, so they stay in registers) and prefetches the
next chunk into registers while it multiplies the current one. Shapes are baked in as constants.
With ``split`` > 1 the K range is cut into that many blocks per tile (for layers with few output
tiles); each writes its partial tile to a workspace and the last to finish (an atomic counter per
tile, reset by that block for the next run) sums them in a fixed order and applies the epilogue,
so a split conv is still one launch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ..ir import Node
from .emit import HEADER, KernelCall

SMS = 132  # streaming multiprocessors of an H200: enough blocks to fill them is the aim


@dataclass(frozen=True)
class Tile:
    """Block tile BM x BN over K chunks of BK, TM x TN outputs per thread, K split ``split`` ways
    (0: as many as keep the GPU busy, see split_for)."""

    # the default measured fastest of 32x32x16/4x4, 32x32x32/4x4, 64x32x16/4x4 (split K by
    # split_for) on the stem and the layer1/2 3x3 convs of ResNet-50 at batch 1 on the H200
    bm: int = 64
    bn: int = 32
    bk: int = 16
    tm: int = 4
    tn: int = 4
    split: int = 0

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)

    @classmethod
    def parse(cls, text: str) -> Tile:
        """ "32x32x16/4x4" or "32x32x16/4x4/s4" (BMxBNxBK/TMxTN/split)."""
        parts = text.split("/")
        bm, bn, bk = (int(v) for v in parts[0].split("x"))
        tm, tn = (int(v) for v in parts[1].split("x"))
        split = int(parts[2][1:]) if len(parts) > 2 else 0
        return cls(bm, bn, bk, tm, tn, split)

    def __str__(self) -> str:
        return f"{self.bm}x{self.bn}x{self.bk}/{self.tm}x{self.tn}/s{self.split}"


# Batch-1 convs have few output tiles: with one block per tile an SM held 2-4 warps and the
# kernel was latency-bound (H200: about 2.5 us per K chunk, whatever the tile). Splitting K
# until the GPU holds about this many threads, at least MIN_CHUNKS chunks per split, is the fix.
BUSY_THREADS = SMS * 16 * 32
MIN_CHUNKS = 4


def split_for(t: Tile, tiles: int, chunks: int) -> int:
    want = -(-BUSY_THREADS // (tiles * t.threads))
    return max(1, min(want, chunks // MIN_CHUNKS))


def _check(t: Tile) -> None:
    nt = t.threads
    ok = (
        t.bm % t.tm == 0
        and t.bn % t.tn == 0
        and nt % t.bk == 0
        and t.bm % (nt // t.bk) == 0
        and t.bn % (nt // t.bk) == 0
        and nt <= 1024
    )
    if not ok:
        raise ValueError(f"conv tile {t}: needs BM%TM, BN%TN, threads%BK, BM and BN % (threads/BK)")


def implicit_conv(
    node: Node, x: str, w: str, out: str, pattern: dict | None, tile: Tile | None = None
) -> KernelCall:
    """The one-kernel conv group writing ``out``; ``pattern`` as templates.gemm.library_epilogue
    gives (tensor names of bias and residual, act). A split call's ``launch`` grid is (tiles x,
    tiles y, split) and its last two arguments, workspace and counters, are the caller's to add."""
    xv, y = node.inputs[0], node.outputs[0]
    n_, h, wd, c = xv.shape
    _, oh, ow, co = y.shape
    (kh, kw), (sh, sw) = node.attrs["kernel_shape"], node.attrs["strides"]
    dh, dw = node.attrs["dilations"]
    pt, pl = node.attrs["pads"][0], node.attrs["pads"][1]
    m, k = n_ * oh * ow, kh * kw * c
    t = tile or Tile()
    _check(t)
    fast = c % t.bk == 0
    nk = kh * kw * (c // t.bk) if fast else -(-k // t.bk)
    split = t.split or split_for(t, -(-m // t.bm) * -(-co // t.bn), nk)
    per = -(-nk // split)
    t = Tile(t.bm, t.bn, t.bk, t.tm, t.tn, -(-nk // per))  # no empty split
    pat = pattern or {"bias": None, "residual": None, "act": None}
    const = dict(
        M=m, CO=co, K=k, H=h, W=wd, C=c, OH=oh, OW=ow, OHW=oh * ow, KH=kh, KW=kw,
        SH=sh, SW=sw, PT=pt, PL=pl, DH=dh, DW=dw, CB=max(c // t.bk, 1),
    )  # fmt: skip
    names = [("x", x), ("w", w), ("y", out), ("bias", pat["bias"]), ("res", pat["residual"])]
    names = [(p, v) for p, v in names if v]
    params = [p for p, _ in names] + (["ws", "cnt"] if t.split > 1 else [])
    consts = "".join(f"{k_} = {v}\n" for k_, v in const.items())
    cuda_src = _cuda_source(t, nk, per, fast, pat, params, consts)
    cpu_src = _cpu_source(pat, params, consts)
    key = hashlib.sha1(cpu_src.encode() + cuda_src.encode()).hexdigest()[:16]
    call = KernelCall(cpu_src, cuda_src, key, m * co, [("t", v) for _, v in names])
    call.label = f"{'+'.join(['Conv'] + [p for p, v in names[3:]])} {node.name} implicit {t}"
    call.launch = ((-(-m // t.bm), -(-co // t.bn), t.split), t.threads)
    call.writes = [out]
    return call


def workspace_floats(call: KernelCall) -> int:
    """Floats of partial tiles a split call needs (0 unsplit)."""
    (gx, gy, split), _ = call.launch
    return 0 if split == 1 else gx * gy * split * _tile_of(call).bm * _tile_of(call).bn


def _tile_of(call: KernelCall) -> Tile:
    return Tile.parse(call.label.rsplit(" ", 1)[1])


def _epilogue(pat: dict, v: str, at: str, col: str) -> list[str]:
    lines = []
    if pat["bias"]:
        lines.append(f"{v} = {v} + bias[{col}]")
    if pat["residual"]:
        lines.append(f"{v} = {v} + res[{at}]")
    if pat["act"] == "relu":
        lines.append(f"{v} = max({v}, f32(0.0))")
    return lines


def _cpu_source(pat: dict, params: list[str], consts: str) -> str:
    """A plain correct loop over outputs (the cpu target does not pick this kernel by default)."""
    body = [
        "co = i % CO",
        "m = i // CO",
        "img = m // OHW",
        "p = m - img * OHW",
        "oh = p // OW",
        "ow = p - oh * OW",
        "acc = f32(0.0)",
        "for ky in range(KH):",
        "    ih = oh * SH - PT + ky * DH",
        "    if ih >= 0 and ih < H:",
        "        for kx in range(KW):",
        "            iw = ow * SW - PL + kx * DW",
        "            if iw >= 0 and iw < W:",
        "                xb = ((img * H + ih) * W + iw) * C",
        "                wb = co * K + (ky * KW + kx) * C",
        "                for c in range(C):",
        "                    acc += x[xb + c] * w[wb + c]",
        *_epilogue(pat, "acc", "i", "co"),
        "y[i] = acc",
    ]
    return (
        HEADER
        + "from numba import njit, prange\n\n"
        + consts
        + f"\n\n@njit(parallel=True, cache=True, nogil=True)\ndef kernel(n, {', '.join(params)}):\n"
        + "    for i in prange(n):\n"
        + "".join(f"        {ln}\n" for ln in body)
    )


def _cuda_source(
    t: Tile, nk: int, per: int, fast: bool, pat: dict, params: list[str], consts: str
) -> str:
    nt, bk = t.threads, t.bk
    ra = nt // bk  # rows of a tile one pass of the block loads
    la, lb = t.bm // ra, t.bn // ra  # loads per thread per chunk, of x and of w
    sa, sb = t.bm + 1, t.bn + 1  # padded rows of the shared tiles
    tx_n = t.bn // t.tn
    bmt, bnt = t.bm // t.tm, t.bn // t.tn
    L: list[str] = []
    e = L.append
    e("tid = cuda.threadIdx.x")
    e(f"m0 = cuda.blockIdx.x * {t.bm}")
    e(f"n0 = cuda.blockIdx.y * {t.bn}")
    e("z = cuda.blockIdx.z")
    e(f"sa = cuda.shared.array({bk * sa}, f32)")
    e(f"sb = cuda.shared.array({bk * sb}, f32)")
    e(f"kc = tid % {bk}")
    e(f"ar = tid // {bk}")
    # the pixels this thread gathers, decoded once per block: no division in the K loop
    for r in range(la):
        e(f"m = m0 + ar + {r * ra}")
        e("img = m // OHW")
        e("p = m - img * OHW")
        e("oh = p // OW")
        e(f"xb{r} = img * (H * W * C)")
        e(f"ih{r} = oh * SH - PT if m < M else -(1 << 24)")  # out of range at every tap
        e(f"iw{r} = (p - oh * OW) * SW - PL")
    for r in range(lb):
        e(f"cb{r} = n0 + ar + {r * ra}")
        e(f"wb{r} = cb{r} * K")
    for r in range(la):
        e(f"ga{r} = f32(0.0)")
    for r in range(lb):
        e(f"gb{r} = f32(0.0)")
    e(f"kt0 = z * {per}")
    e(f"kt1 = min(kt0 + {per}, {nk})")
    if fast:  # C % BK == 0: a chunk is one tap (ky, kx) and channels c0..c0+BK
        e("tap = kt0 // CB")
        e(f"c0 = (kt0 - tap * CB) * {bk}")
        e("ky = tap // KW")
        e("kx = tap - ky * KW")

    def gather(ind: int, chunk: str) -> None:
        p = "    " * ind
        if fast:
            e(p + "dy = ky * DH")
            e(p + "dx = kx * DW")
            e(p + "cc = c0 + kc")
            e(p + "kk = (ky * KW + kx) * C + cc")
            kok = ""
        else:
            e(p + f"kk = ({chunk}) * {bk} + kc")
            e(p + "tap = kk // C")
            e(p + "cc = kk - tap * C")
            e(p + "ky = tap // KW")
            e(p + "dy = ky * DH")
            e(p + "dx = (tap - ky * KW) * DW")
            kok = " and kk < K"
        for r in range(la):
            e(p + f"ih = ih{r} + dy")
            e(p + f"iw = iw{r} + dx")
            e(
                p + f"ga{r} = x[xb{r} + (ih * W + iw) * C + cc] "
                f"if ih >= 0 and ih < H and iw >= 0 and iw < W{kok} else f32(0.0)"
            )
        for r in range(lb):
            e(p + f"gb{r} = w[wb{r} + kk] if cb{r} < CO{kok} else f32(0.0)")
        if fast:  # step to the next chunk
            e(p + f"c0 += {bk}")
            e(p + "if c0 == C:")
            e(p + "    c0 = 0")
            e(p + "    kx += 1")
            e(p + "    if kx == KW:")
            e(p + "        kx = 0")
            e(p + "        ky += 1")

    def stage(ind: int) -> None:
        p = "    " * ind
        for r in range(la):
            e(p + f"sa[kc * {sa} + ar + {r * ra}] = ga{r}")
        for r in range(lb):
            e(p + f"sb[kc * {sb} + ar + {r * ra}] = gb{r}")

    gather(0, "kt0")
    stage(0)
    e("cuda.syncthreads()")
    e(f"ty = tid // {tx_n}")
    e(f"tx = tid - ty * {tx_n}")
    for i in range(t.tm):
        for j in range(t.tn):
            e(f"acc{i}_{j} = f32(0.0)")
    e("for kt in range(kt0, kt1):")
    e("    more = kt + 1 < kt1")
    e("    if more:")
    gather(2, "kt + 1")
    for q in range(bk):  # unrolled: every shared offset is the thread's base plus a constant
        for i in range(t.tm):
            e(f"    a{i} = sa[ty + {q * sa + i * bmt}]")
        for j in range(t.tn):
            e(f"    b{j} = sb[tx + {q * sb + j * bnt}]")
        for i in range(t.tm):
            for j in range(t.tn):
                e(f"    acc{i}_{j} += a{i} * b{j}")
    e("    cuda.syncthreads()")
    e("    if more:")
    stage(2)
    e("    cuda.syncthreads()")

    def store(ind: int, value) -> None:
        p = "    " * ind
        for i in range(t.tm):
            e(p + f"m = m0 + ty + {i * bmt}")
            for j in range(t.tn):
                e(p + f"col = n0 + tx + {j * bnt}")
                e(p + "if m < M and col < CO:")
                e(p + f"    v = {value(i, j)}")
                for ln in _epilogue(pat, "v", "m * CO + col", "col"):
                    e(p + "    " + ln)
                e(p + "    y[m * CO + col] = v")

    if t.split == 1:
        store(0, lambda i, j: f"acc{i}_{j}")
    else:
        # partial tile to the workspace; the block that completes the tile sums all of them
        tile_size = t.bm * t.bn
        e("tile = cuda.blockIdx.y * cuda.gridDim.x + cuda.blockIdx.x")
        e(f"wsb = tile * {t.split * tile_size}")
        for i in range(t.tm):
            for j in range(t.tn):
                at = f"(ty + {i * bmt}) * {t.bn} + tx + {j * bnt}"
                e(f"ws[wsb + z * {tile_size} + {at}] = acc{i}_{j}")
        e("cuda.threadfence()")
        e("cuda.syncthreads()")
        e("last = cuda.shared.array(1, i32)")
        e("if tid == 0:")
        e(f"    last[0] = 1 if cuda.atomic.add(cnt, tile, 1) == {t.split - 1} else 0")
        e("cuda.syncthreads()")
        e("if last[0] == 1:")
        e("    cuda.threadfence()")
        for i in range(t.tm):
            for j in range(t.tn):
                at = f"(ty + {i * bmt}) * {t.bn} + tx + {j * bnt}"
                e(f"    s{i}_{j} = ws[wsb + {at}]")
                e(f"    for zz in range(1, {t.split}):")
                e(f"        s{i}_{j} += ws[wsb + zz * {tile_size} + {at}]")
        store(1, lambda i, j: f"s{i}_{j}")
        e("    if tid == 0:")
        e("        cnt[tile] = 0")  # ready for the next run (graph replay)
    return (
        HEADER
        + "from numba import cuda\n\n"
        + consts
        + f"\n\n@cuda.jit(cache=True)\ndef kernel(n, {', '.join(params)}):\n"
        + "".join(f"    {ln}\n" for ln in L)
    )
