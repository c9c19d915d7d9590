"""Pools: each output element reduces its window (max, average, Lp) or its whole plane (global)."""

from __future__ import annotations

import numpy as np

from ...ir import Node
from ..emit import ROW_UNROLL, KernelBuilder, type_name
from ..registry import lowering, register_lowering
from ..scalar import lit, nan_max
from .depthwise import padded_plane
from .depthwise_cuda import block_pool
from .geometry import nc_oh_ow, spatial2d, window2d


def pool_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    x = node.inputs[0]
    c_, h, w = x.shape[1], *spatial2d(x.shape)
    n, c, oh, ow = nc_oh_ow(coords)
    H, W, C = kb.int_param(h, "H"), kb.int_param(w, "W"), kb.int_param(c_, "C")
    base = kb.tmp("b")
    kb.emit(f"{base} = ({n} * {C} + {c}) * {H} * {W}")
    return window_pool(node, kb, oh, ow, H, W, lambda ih, iw: f"{base} + {ih} * {W} + {iw}")


def _by_planes(node: Node) -> bool:
    """A 2-d float32 MaxPool whose windows all touch the image: pooled a plane at a time on the
    cpu (NaN as window_pool has it: strided, a NaN first tap stays and later ones drop; at
    stride 1 a NaN tap drops unless every tap is NaN)."""
    _, _, d, _ = window2d(node)
    x = node.inputs[0]
    return (
        node.op == "MaxPool" and len(x.shape) == 4 and x.dtype == np.float32
        and len(node.outputs) == 1 and d == [1, 1] and _windows_touch(node)
    )  # fmt: skip


@lowering("MaxPool", form="element", when=_by_planes, rows=lambda node: 2)
def pool_planes(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    """cpu, once per plane (image, channel): the plane copied into a buffer padded with its edge
    values (so every window reads as clamped taps do) and split into stride phases (so the taps
    of a row of outputs are consecutive), then each output row one select chain over the taps,
    which vectorises (every cpu index u64: a signed one costs a negative-index wrap, which kept
    the copy and the plane's reads scalar); cuda: the per-element window of ``window_pool``."""
    kb.row_block = False
    x, y = node.inputs[0], node.outputs[0]
    (kh, kw), (sh, sw), _, pads = window2d(node)
    (h, w), (oh_, ow_) = spatial2d(x.shape), spatial2d(y.shape)
    n, c, oh, ow = nc_oh_ow(coords)
    acc = _cuda_window(node, kb, coords)
    src, C = kb.tensor(x.name), kb.int_param(x.shape[1], "C")
    hp, wq = (oh_ - 1) * sh + kh, -(-((ow_ - 1) * sw + kw) // sw)
    H, W, OH, OW = (kb.int_param(v, k) for v, k in ((h, "H"), (w, "W"), (oh_, "OH"), (ow_, "OW")))
    HP, WQ, WR = (kb.int_param(v, k) for v, k in ((hp, "HP"), (wq, "WQ"), (wq * sw, "WR")))
    buf, out, r, sr, d, p, q, j = (kb.tmp(v) for v in ("pad", "out", "r", "sr", "d", "p", "q", "j"))
    kb.setup += [f"{buf} = np.empty({HP} * {WR}, f32)", f"{out} = np.empty({OH} * {OW}, f32)"]
    cpu = [
        f"for {r} in range({HP}):",
        f"    {sr} = (({n} * {C} + {c}) * {H} + min(max({r} - {pads[0]}, 0), {H} - 1)) * {W}",
    ]
    for phase in range(sw):  # padded column p * sw + phase at place p of its phase
        cpu += [
            f"    {d} = {buf}[{r} * {WR} + {phase} * {WQ}:]",
            f"    for {p} in range({WQ}):",
            f"        {d}[{p}] = {src}[u64({sr} + min(max({p} * {sw} + {phase - pads[1]}, 0), {W} - 1))]",
        ]
    cpu.append(f"for {q} in range({OH}):")
    views = {}
    for ky in range(kh):
        for kx in range(kw):
            if (ky, kx % sw) not in views:
                views[ky, kx % sw] = a = kb.tmp("a")
                cpu.append(f"    {a} = {buf}[({q} * {sh} + {ky}) * {WR} + {kx % sw} * {WQ}:]")
    m, v = kb.tmp("m"), kb.tmp("v")
    drop = f" or {m} != {m}" if (sh, sw) == (1, 1) else ""  # stride 1: a NaN so far is replaced
    cpu += [f"    for {j} in range({OW}):", f"        {m} = {views[0, 0]}[{j}]"]
    for ky in range(kh):
        for kx in range(kw):
            if ky or kx:
                cpu.append(f"        {v} = {views[ky, kx % sw]}[{j} + {kx // sw}]")
                cpu.append(f"        {m} = {v} if {v} > {m}{drop} else {m}")
    cpu.append(f"        {out}[u64({q} * {OW} + {j})] = {m}")
    with kb.at_row():
        kb.lines += [(ln, None) for ln in cpu]
    kb.lines.append((f"{acc} = {out}[u64({oh} * {OW} + {ow})]", None))
    return acc


register_lowering("MaxPool", "element", pool_element, lambda node: not _by_planes(node))


def _cuda_window(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    """``pool_element``'s per-element window as the cuda form only (a plane form writes the
    cpu lines): the name of its result."""
    start = len(kb.lines)
    acc = pool_element(node, kb, coords)
    kb.lines[start:] = [(None, ln if isinstance(ln, str) else ln[1]) for ln in kb.lines[start:]]
    return acc


def _avg_by_planes(node: Node) -> bool:
    """A 2-d float32 AveragePool of dilation 1 whose windows all lie within the padded image
    (no ceil-mode overhang past the pads): summed a plane at a time on the cpu."""
    x, y = node.inputs[0], node.outputs[0]
    if node.op != "AveragePool" or len(x.shape) != 4 or x.dtype != np.float32:
        return False
    (kh, kw), (sh, sw), d, pads = window2d(node)
    (h, w), (oh, ow) = spatial2d(x.shape), spatial2d(y.shape)
    rows_in = (oh - 1) * sh + kh <= h + pads[0] + pads[2]
    cols_in = (ow - 1) * sw + kw <= w + pads[1] + pads[3]
    return d == [1, 1] and len(node.outputs) == 1 and rows_in and cols_in


@lowering("AveragePool", form="element", when=_avg_by_planes, rows=lambda node: 2)
def avg_pool_planes(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    """cpu, once per plane (image, channel): the taps' sum over a zero-padded, stride-phased copy
    of the plane (depthwise.padded_plane, unweighted), then each output its sum over the count
    of its window: every tap with count_include_pad (no window here overhangs the pads), else the
    taps on the image, rows times columns. cuda: the per-element window of ``window_pool``.
    Inception-v3's 3 x 3 pools at 35 x 35 x 192: 0.99 -> 0.16 ms."""
    kb.row_block = False
    x = node.inputs[0]
    (kh, kw), (sh, sw), _, pads = window2d(node)
    (h, w), (oh_, _) = spatial2d(x.shape), spatial2d(node.outputs[0].shape)
    n, c, oh, ow = nc_oh_ow(coords)
    acc = _cuda_window(node, kb, coords)
    xs, plane = kb.tensor(x.name), kb.tmp("out")
    H, W, C = kb.int_param(h, "H"), kb.int_param(w, "W"), kb.int_param(x.shape[1], "C")
    with kb.at_row():
        dims = (H, W, C, kb.int_param(1, "OG"), kb.int_param(oh_, "OH"))
        pitch = padded_plane(
            kb,
            (xs, None, "f32", plane),
            (n, c),
            dims,
            (1, h, w),
            ((kh, kw), (sh, sw), (1, 1), pads),
        )
    total = f"{plane}[u64({oh} * {pitch} + {ow})]"
    if node.attrs["count_include_pad"]:
        kb.lines.append((f"{acc} = {total} / f32({kh * kw})", None))
        return acc
    ih, iw = f"{oh} * {sh} - {pads[0]}", f"{ow} * {sw} - {pads[1]}"
    rows = f"(min({ih} + {kh}, {H}) - max({ih}, 0))"
    cols = f"(min({iw} + {kw}, {W}) - max({iw}, 0))"
    kb.lines.append((f"{acc} = {total} / f32(max({rows} * {cols}, 1))", None))
    return acc


register_lowering("AveragePool", "element", pool_element, lambda node: not _avg_by_planes(node))
register_lowering("LpPool", "element", pool_element)


def _windows_touch(node: Node) -> bool:
    """Every window has a tap on the input: the first ends past its start, the last (ceil mode
    included) starts before its end."""
    (kh, kw), (sh, sw), _, pads = window2d(node)
    x, y = node.inputs[0].shape, node.outputs[0].shape
    (h, w), (oh, ow) = (x[1:3], y[1:3]) if node.op.endswith("NHWC") else map(spatial2d, (x, y))
    dims = ((pads[0], kh, oh, sh, h), (pads[1], kw, ow, sw, w))
    return all(p < k and (o - 1) * s - p < n for p, k, o, s, n in dims)


def window_pool(node: Node, kb: KernelBuilder, oh: str, ow: str, H: str, W: str, addr) -> str:
    """Max / average / Lp over one 2-d window; ``addr(ih, iw)`` indexes the input in any layout."""
    x = node.inputs[0]
    t = type_name(x.dtype)
    src = kb.tensor(x.name)
    op = node.op.removesuffix("NHWC")
    (kh, kw), (sh, sw), (dh, dw), pads = window2d(node)
    acc, cnt = kb.tmp("acc"), kb.tmp("cnt")
    ih0, iw0, ih, iw = kb.tmp("h"), kb.tmp("w"), kb.tmp("ih"), kb.tmp("iw")
    is_max = op == "MaxPool"
    clamp = is_max and [dh, dw] == [1, 1] and _windows_touch(node)
    kb.emit(f"{ih0} = {oh} * {kb.int_param(sh, 's')} - {kb.int_param(pads[0], 'p')}")
    kb.emit(f"{iw0} = {ow} * {kb.int_param(sw, 's')} - {kb.int_param(pads[1], 'p')}")
    # float16 is stored only: its taps are compared as float32
    tap = (lambda a: f"{t}({a})") if x.dtype == np.float16 else (lambda a: a)
    first = tap(f"{src}[{addr(f'min(max({ih0}, 0), {H} - 1)', f'min(max({iw0}, 0), {W} - 1)')}]")
    kb.emit(f"{acc} = {first if clamp else lit(np.nan if is_max else 0, t)}")
    kb.emit(f"{cnt} = 0")
    KH, KW = kb.int_param(kh, "KH"), kb.int_param(kw, "KW")
    DH, DW = kb.int_param(dh, "DH"), kb.int_param(dw, "DW")
    ky, kx, v = kb.tmp("ky"), kb.tmp("kx"), kb.tmp("v")
    # NaN as ORT and the reference agree: with stride and dilation 1 a NaN tap is dropped
    # (NaN only if every tap is); otherwise a NaN first tap stays, later ones are dropped
    unit = [sh, sw, dh, dw] == [1, 1, 1, 1]
    keep = f"{acc} != {acc}" if unit else f"{cnt} == 0"
    nan_max = f"{acc} = {v} if {v} > {acc} or {keep} else {acc}"
    kb.emit(f"for {ky} in range({KH}):")
    kb.emit(f"{ih} = {ih0} + {ky} * {DH}", 1)
    if op == "AveragePool" and node.attrs["count_include_pad"]:
        # padded positions count, the ceil-mode overhang past the explicit pads does not
        PB, PR = kb.int_param(pads[2], "p"), kb.int_param(pads[3], "p")
        kb.emit(f"for {kx} in range({KW}):", 1)
        kb.emit(f"{iw} = {iw0} + {kx} * {DW}", 2)
        # without ceil mode every tap counts, as ORT counts them also past the pads in its one
        # overhanging window (an input shorter than the kernel: fuzzer seed 33533)
        d = 3 if node.attrs.get("ceil_mode") else 2
        if d == 3:
            kb.emit(f"if {ih} < {H} + {PB} and {iw} < {W} + {PR}:", 2)
        kb.emit(f"{cnt} += 1", d)
        kb.emit(f"if {ih} >= 0 and {ih} < {H} and {iw} >= 0 and {iw} < {W}:", d)
        kb.emit(f"{acc} += {src}[{addr(ih, iw)}]", d + 1)
    elif clamp:
        # a tap outside the image reads the nearest edge element instead: with dilation 1 and
        # every window touching the image (_windows_touch, ceil mode included), that element is
        # in the same window and the max is unchanged; the window loops then have no branch (ResNet-50's pool: 1.34 -> 1.17 ms on the cpu, log row 39).
        def clamped(body: str, d: int) -> None:
            kb.emit(f"{ih} = min(max({ih0} + {ky}, 0), {H} - 1)", d + 1)
            kb.emit(f"for {kx} in range({KW}):", d + 1)
            kb.emit(f"{iw} = min(max({iw0} + {kx}, 0), {W} - 1)", d + 2)
            kb.emit(f"{v} = {tap(f'{src}[{addr(ih, iw)}]')}", d + 2)
            kb.emit(body, d + 2)

        clamped(f"{acc} = {v} if {v} > {acc} else {acc}", 0)  # from the first tap
        if unit:  # a NaN first tap at stride 1: the window again, dropping NaN
            kb.emit(f"if {acc} != {acc}:")
            kb.emit(f"for {ky} in range({KH}):", 1)
            clamped(nan_max, 1)
    else:
        kb.emit(f"if {ih} >= 0 and {ih} < {H}:", 1)
        kb.emit(f"for {kx} in range({KW}):", 2)
        kb.emit(f"{iw} = {iw0} + {kx} * {DW}", 3)
        kb.emit(f"if {iw} >= 0 and {iw} < {W}:", 3)
        kb.emit(f"{v} = {tap(f'{src}[{addr(ih, iw)}]')}", 4)
        if op == "LpPool":
            kb.emit(f"{v} = math.pow(abs({v}), {lit(node.attrs['p'], t)})", 4)
        kb.emit(nan_max if is_max else f"{acc} += {v}", 4)
        kb.emit(f"{cnt} += 1", 4)
    if op == "LpPool":
        kb.emit(f"{acc} = math.pow({acc}, {lit(1 / node.attrs['p'], t)})")
    elif not is_max:
        kb.emit(f"{acc} = {acc} / {t}(max({cnt}, 1))")
    return acc


def global_reduce(node: Node, kb: KernelBuilder, hw: str, at, at_cpu=None) -> str:
    """Max or mean over the ``hw`` spatial positions ``at(j)`` of one output (both layouts).
    A cpu mean reads ``at_cpu(j)`` (default ``at``) into ROW_UNROLL partial sums: one chain of
    adds waits out each add's latency, and LLVM may not reorder float adds into vectors."""
    t = type_name(node.inputs[0].dtype)
    acc, j = kb.tmp("acc"), kb.tmp("j")
    if node.op.startswith("GlobalMaxPool"):
        kb.emit(f"{acc} = {lit(-np.inf, t)}")
        kb.emit(f"for {j} in range({hw}):")
        # any NaN makes the max NaN, as in the reference (np.max) and ORT for an all-NaN plane
        kb.emit(f"{acc} = {nan_max(acc, at(j))}", 1)
        return acc
    at_cpu, U = at_cpu or at, ROW_UNROLL
    parts = [f"{acc}_{u}" for u in range(U)]
    cpu = [f"{', '.join(parts)} = {', '.join([lit(0, t)] * U)}"]
    cpu.append(f"for {j} in range(0, {hw} - {U - 1}, {U}):")
    cpu += [f"    {a} += {at_cpu(f'{j} + {u}' if u else j)}" for u, a in enumerate(parts)]
    cpu += [f"for {j} in range({hw} - {hw} % {U}, {hw}):", f"    {parts[0]} += {at_cpu(j)}"]
    while len(parts) > 1:
        parts = [f"({parts[k]} + {parts[k + 1]})" for k in range(0, len(parts), 2)]
    cpu.append(f"{acc} = {parts[0]}")
    cuda = [f"{acc} = {lit(0, t)}", f"for {j} in range({hw}):", f"    {acc} += {at(j)}"]
    kb.lines += [(ln, None) for ln in cpu] + [(None, ln) for ln in cuda]
    kb.emit(f"{acc} = {acc} / {t}({hw})")
    return acc


@lowering("GlobalAveragePool", "GlobalMaxPool", form="element", when=lambda n: not block_pool(n))
def global_pool_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    x = node.inputs[0]
    src = kb.tensor(x.name)
    hw = int(np.prod(x.shape[2:]))
    HW, C = kb.int_param(hw, "HW"), kb.int_param(x.shape[1], "C")
    base = kb.tmp("b")
    kb.emit(f"{base} = ({coords[0]} * {C} + {coords[1]}) * {HW}")
    at, at_cpu = (lambda j: f"{src}[{base} + {j}]"), (lambda j: f"{src}[u64({base} + {j})]")
    return global_reduce(node, kb, HW, at, at_cpu)  # unsigned on the cpu: no negative wrap
