"""RoiAlign and GridSample: each output element loops over its own bin's samples or taps."""

from __future__ import annotations

from ...ir import Node
from ..emit import KernelBuilder, contiguous_strides, type_name
from ..registry import lowering


def _roi_axis(kb: KernelBuilder, a: dict, box: str, r: str, axis: int, t: str) -> tuple:
    """Emit a box's start, bin size and samples per bin along y (0) or x (1): ops' roi_box."""
    off = f"{t}(0.5)" if a["half"] else f"{t}(0.0)"
    st, en, size, step, grid = (kb.tmp(p) for p in ("st", "en", "sz", "bs", "gr"))
    for var, k in ((st, 1 - axis), (en, 3 - axis)):
        kb.emit(f"{var} = {t}({t}({box}[{r} * 4 + {k}]) * {t}({a['scale']!r})) - {off}")
    kb.emit(f"{size} = {t}({en} - {st})" if a["half"] else f"{size} = max({en} - {st}, {t}(1.0))")
    bins = f"{t}({(a['oh'], a['ow'])[axis]})"
    kb.emit(f"{step} = {t}({size} / {bins})")
    kb.emit(f"{grid} = {a['ratio'] or f'max(i64(math.ceil({size} / {bins})), 0)'}")
    return st, step, grid


def _roi_sample(kb, pos, s, box, length, t, indent) -> tuple[tuple[str, str], ...]:
    """Emit the s-th sample of bin ``pos``: (pixel, weight) low and high (weights 0 outside)."""
    start, step, grid = box
    p, lo, hi, fr, ok = (kb.tmp(q) for q in ("p", "lo", "hi", "fr", "ok"))
    q = f"{t}({t}({t}({s}) + {t}(0.5)) * {step})"
    kb.emit(f"{p} = {t}({t}({start} + {t}({pos}) * {step}) + {t}({q} / {t}({grid})))", indent)
    kb.emit(f"{ok} = {t}(1.0) if {p} >= {t}(-1.0) and {p} <= {t}({length}) else {t}(0.0)", indent)
    kb.emit(f"{p} = max({p}, {t}(0.0))", indent)
    kb.emit(f"{lo} = min(i64({p}), {length} - 1)", indent)
    kb.emit(f"{hi} = min({lo} + 1, {length} - 1)", indent)
    kb.emit(f"{fr} = {t}({p} - {t}({lo})) if {lo} < {length} - 1 else {t}(0.0)", indent)
    return (lo, f"{t}(({t}(1.0) - {fr}) * {ok})"), (hi, f"{t}({fr} * {ok})")


@lowering("RoiAlign", form="element")
def roi_align_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    (x, rois, batch), (r, c, ph, pw) = node.inputs, coords
    t = type_name(x.dtype)
    N, C = kb.int_param(x.shape[0], "N"), kb.int_param(x.shape[1], "C")
    H, W = kb.int_param(x.shape[2], "H"), kb.int_param(x.shape[3], "W")
    src, box, bt = kb.tensor(x.name), kb.tensor(rois.name), kb.tensor(batch.name)
    b, base, acc, iy, ix = (kb.tmp(q) for q in ("b", "base", "acc", "iy", "ix"))
    kb.emit(f"{b} = i64({bt}[{r}]) + ({N} if {bt}[{r}] < 0 else 0)")
    kb.guard_index(b, N)
    kb.check_range(bt, batch.size, N, f'"RoiAlign batch_indices: one is not below " + str({N})')
    kb.emit(f"{base} = ({b} * {C} + {c}) * {H} * {W}")
    ybox, xbox = (_roi_axis(kb, node.attrs, box, r, axis, t) for axis in (0, 1))
    is_max = node.attrs["mode"] == "max"
    kb.emit(f"{acc} = {t}(-np.inf)" if is_max else f"{acc} = {t}(0.0)")
    kb.emit(f"for {iy} in range({ybox[2]}):")
    ys = _roi_sample(kb, ph, iy, ybox, H, t, 1)
    kb.emit(f"for {ix} in range({xbox[2]}):", 1)
    xs = _roi_sample(kb, pw, ix, xbox, W, t, 2)
    terms = [
        f"{t}({wy} * {wx}) * {src}[{base} + {py} * {W} + {px}]" for py, wy in ys for px, wx in xs
    ]
    pairs = f"max(max({terms[0]}, {terms[1]}), max({terms[2]}, {terms[3]}))"
    kb.emit(f"{acc} = max({acc}, {pairs})" if is_max else f"{acc} += {' + '.join(terms)}", 2)
    out, count = kb.tmp(), f"{ybox[2]} * {xbox[2]}"
    done = f"{acc} if {count} > 0 else {t}(0.0)" if is_max else f"{acc} / {t}(max({count}, 1))"
    kb.emit(f"{out} = {t}({done})")
    return out


# GridSample's tap weights; cubic: Keys' kernel with a = -0.75 (ops/sample.py's cubic_weight)
_WEIGHT = {
    "nearest": "1.0",
    "linear": "1.0 - {f} if {k} == 0 else {f}",
    "cubic": "((1.25 * {s} - 2.25) * {s} * {s} + 1.0) if {s} <= 1.0"
    " else (((-0.75 * {s} + 3.75) * {s} - 6.0) * {s} + 3.0)",
}


@lowering("GridSample", form="element")
def grid_sample_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    """Nested loops over each spatial axis' taps; ORT's padding applied to every tap."""
    x, grid = node.inputs
    mode, pad, align = node.attrs["mode"], node.attrs["padding"], node.attrs["align"]
    dims, xs = x.shape[2:], contiguous_strides(x.shape)
    src, gt, g0, y = kb.tensor(x.name), kb.tensor(grid.name), kb.tmp("g"), kb.tmp("y")
    kb.emit(f"{g0} = {kb.offset(contiguous_strides(grid.shape)[:-1], [coords[0], *coords[2:]])}")
    kb.emit(f"{y} = 0.0")
    offset, taps = kb.offset(xs[:2], coords[:2]), {"nearest": 1, "linear": 2, "cubic": 4}[mode]
    weight, inside = "1.0", []
    for d, size in enumerate(dims):
        S = kb.int_param(size, "S")
        v, first, f, k, ix, w, s = (kb.tmp(p) for p in ("u", "i0", "fr", "tp", "ix", "w", "s"))
        g = f"f64({gt}[{g0} + {len(dims) - 1 - d}])"  # the grid's last axis lists x first
        at = f"({g} + 1.0) / 2.0 * ({S} - 1)" if align else f"(({g} + 1.0) * {S} - 1.0) / 2.0"
        kb.emit(f"{v} = f64(round({at}))" if mode == "nearest" else f"{v} = {at}", d)
        kb.emit(f"{first} = i64(math.floor({v})) - {int(mode == 'cubic')}", d)
        kb.emit(f"{f} = {v} - math.floor({v})", d)
        kb.emit(f"for {k} in range({taps}):", d)
        kb.emit(f"{ix} = {first} + {k}", d + 1)
        if mode == "cubic":
            kb.emit(f"{s} = abs({f} + 1.0 - {k})", d + 1)
        kb.emit(f"{w} = {weight} * ({_WEIGHT[mode].format(f=f, k=k, s=s)})", d + 1)
        if pad == "zeros":
            inside.append(f"{ix} >= 0 and {ix} < {S}")
        elif pad == "border":
            kb.emit(f"{ix} = min(max({ix}, 0), {S} - 1)", d + 1)
        else:  # reflection: ops/sample.py's triangle wave
            period = kb.int_param(max(2 * size - 2 * align, 1), "P")
            kb.emit(f"{ix} = {ix} % {period}", d + 1)
            kb.emit(f"{ix} = {ix} if {ix} < {S} else {period} - {1 - align} - {ix}", d + 1)
        offset, weight = f"{offset} + {ix} * {kb.int_param(xs[2 + d], 's')}", w
    kb.emit(f"if {' and '.join(inside) or 'True'}:", len(dims))
    kb.emit(f"{y} += {weight} * {src}[{offset}]", len(dims) + 1)
    out = kb.tmp()
    kb.emit(f"{out} = {type_name(x.dtype)}({y})")
    return out
