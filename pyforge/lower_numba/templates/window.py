"""Pools: each output element reduces its window (max, average, Lp) or its whole plane (global)."""

from __future__ import annotations

import numpy as np

from ...ir import Node
from ..emit import KernelBuilder, type_name
from ..registry import lowering
from ..scalar import lit, nan_max
from .geometry import nc_oh_ow, spatial2d, window2d


@lowering("MaxPool", "AveragePool", "LpPool", form="element")
def pool_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    x = node.inputs[0]
    c_, h, w = x.shape[1], *spatial2d(x.shape)
    n, c, oh, ow = nc_oh_ow(coords)
    H, W, C = kb.int_param(h, "H"), kb.int_param(w, "W"), kb.int_param(c_, "C")
    base = kb.tmp("b")
    kb.emit(f"{base} = ({n} * {C} + {c}) * {H} * {W}")
    return window_pool(node, kb, oh, ow, H, W, lambda ih, iw: f"{base} + {ih} * {W} + {iw}")


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
    clamp = (
        is_max
        and [dh, dw] == [1, 1]
        and not node.attrs.get("ceil_mode", 0)
        and max(pads[0], pads[2]) < kh
        and max(pads[1], pads[3]) < kw
    )
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
        # a tap outside the image reads the nearest edge element instead: with dilation 1, no
        # ceil mode and pads under the kernel size, every window starts and ends on the image,
        # so that element is in the same window and the max is unchanged; the window loops
        # then have no branch (ResNet-50's pool: 1.34 -> 1.17 ms on the cpu, log row 39).
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


def global_reduce(node: Node, kb: KernelBuilder, hw: str, at) -> str:
    """Max or mean over the ``hw`` spatial positions ``at(j)`` of one output (both layouts)."""
    t = type_name(node.inputs[0].dtype)
    acc, j = kb.tmp("acc"), kb.tmp("j")
    is_max = node.op.startswith("GlobalMaxPool")
    kb.emit(f"{acc} = {lit(-np.inf, t) if is_max else lit(0, t)}")
    kb.emit(f"for {j} in range({hw}):")
    # any NaN makes the max NaN, as in the reference (np.max) and ORT for an all-NaN plane
    kb.emit(f"{acc} = {nan_max(acc, at(j))}" if is_max else f"{acc} += {at(j)}", 1)
    if not is_max:
        kb.emit(f"{acc} = {acc} / {t}({hw})")
    return acc


@lowering("GlobalAveragePool", "GlobalMaxPool", form="element")
def global_pool_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    x = node.inputs[0]
    src = kb.tensor(x.name)
    hw = int(np.prod(x.shape[2:]))
    HW, C = kb.int_param(hw, "HW"), kb.int_param(x.shape[1], "C")
    base = kb.tmp("b")
    kb.emit(f"{base} = ({coords[0]} * {C} + {coords[1]}) * {HW}")
    return global_reduce(node, kb, HW, lambda j: f"{src}[{base} + {j}]")
