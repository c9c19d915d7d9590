"""Normalizations: LayerNorm, RMSNorm, GroupNorm and InstanceNorm compute each row's statistics
once (two passes at the row loop's level); LRN and MeanVarianceNormalization per element."""

from __future__ import annotations

import numpy as np

from ...ir import Node
from ..emit import KernelBuilder, broadcast_strides, contiguous_strides, type_name
from ..registry import lowering
from ..scalar import lit


def moments(kb: KernelBuilder, src: str, base: str, L: str, eps: float, centred: bool = True):
    """Emit, once per row, (shift, mean - shift, 1/sqrt(var + eps)) of src[base:+L]: two passes,
    x - mean being (x - shift) - (mean - shift). Not ``centred`` (RMSNorm): shift and mean are 0.

    The statistics are of the row shifted by its first element: a constant row is then exactly
    0 (an unshifted float32 mean is off by a rounding, which 1/sqrt(eps) magnifies), and a row
    far from 0 loses no digits to cancellation."""
    k, m, s, inv = kb.tmp("k"), kb.tmp("mu"), kb.tmp("ssq"), kb.tmp("rstd")
    zero, at, row = lit(0, "f32"), f"{src}[{base} + ", f"{base}v"
    with kb.at_row():
        kb.emit(f"{k} = f32({src}[{base}])" if centred else f"{k} = {zero}")
        kb.lines.append((f"{row} = {src}[{base}:]", None))  # cpu: the row as a view (row_reduce)
    if centred:
        kb.row_reduce(m, zero, "{a} + {v}", f"(f32({{v}}) - {k})", L, at, at_cpu=f"{row}[")
    with kb.at_row():
        kb.emit(f"{m} = {m} / f32({L})" if centred else f"{m} = {zero}")
    d = f"(f32({{v}}) - {k} - {m})"
    kb.row_reduce(s, zero, "{a} + {v}", f"{d} * {d}", L, at, at_cpu=f"{row}[")
    with kb.at_row():
        kb.emit(f"{inv} = {lit(1, 'f32')} / math.sqrt({s} / f32({L}) + {lit(eps, 'f32')})")
    return k, m, inv


@lowering(
    "LayerNormalization", "RMSNormalization", form="element", rows=lambda node: node.attrs["axis"]
)
def norm_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    x = node.inputs[0]
    a, part = node.attrs["axis"], node.attrs.get("output", 0)
    t = type_name(node.outputs[0].dtype)  # a float16 x (reads_half) is widened as it is read
    length = int(np.prod(x.shape[a:]))
    src = kb.tensor(x.name)
    L = kb.int_param(length, "L")
    base = kb.tmp("rb")
    lead = kb.offset(contiguous_strides(x.shape[:a]), coords[:a]) if a else "0"
    with kb.at_row():
        kb.emit(f"{base} = ({lead}) * {L}")
    k, m, inv = moments(kb, src, base, L, node.attrs["epsilon"], node.op == "LayerNormalization")
    if part == 1:
        return f"({k} + {m})"
    if part == 2:
        return inv
    inner = coords[a:]
    off = kb.offset(contiguous_strides(x.shape[a:]), inner)
    y = kb.tmp("y")
    scale = node.inputs[1]
    soff = kb.offset(broadcast_strides(scale.shape, x.shape), coords)  # per row: qk's heads
    x_c = f"({{}} - {k} - {m})" if x.dtype == node.outputs[0].dtype else f"(f32({{}}) - {k} - {m})"
    line = f"{y} = {t}({x_c} * {inv}) * {kb.tensor(scale.name)}[{soff}]"
    kb.emit(line.format(f"{base}v[{off}]"), cuda=line.format(f"{src}[{base} + {off}]"))
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        b = node.inputs[2]
        boff = kb.offset(broadcast_strides(b.shape, x.shape[a:]), inner)
        kb.emit(f"{y} = {y} + {kb.tensor(b.name)}[{boff}]")
    return y


@lowering("GroupNormalization", "InstanceNormalization", form="element", rows=lambda node: 2)
def group_norm_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    """Group and instance norm: a row is one (n, c) channel; its statistics are its group's
    (n, group) slab (read once per channel of the group), then the affine part per element."""
    x, scale, bias = node.inputs
    t = type_name(x.dtype)
    c, groups = x.shape[1], node.attrs["groups"]
    spatial = int(np.prod(x.shape[2:]))
    src = kb.tensor(x.name)
    L, CG = kb.int_param(c // groups * spatial, "L"), kb.int_param(c // groups, "CG")
    C = kb.int_param(c, "C")
    base, y = kb.tmp("gb"), kb.tmp("y")
    with kb.at_row():
        kb.emit(f"{base} = (({coords[0]} * {C} + {coords[1]}) // {CG}) * {L}")
    k, m, inv = moments(kb, src, base, L, node.attrs["epsilon"])
    off = kb.offset(contiguous_strides(x.shape), coords)
    ch = f"({coords[1]} // {CG})" if node.attrs["per_group"] else coords[1]
    kb.emit(
        f"{y} = {t}(({src}[{off}] - {k} - {m}) * {inv}) * {kb.tensor(scale.name)}[{ch}]"
        f" + {kb.tensor(bias.name)}[{ch}]"
    )
    return y


@lowering("LRN", form="element")
def lrn_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    """x / (bias + alpha / size * sum of x^2 over the channel window) ^ beta."""
    x = node.inputs[0]
    a = node.attrs
    t = type_name(x.dtype)
    size = a["size"]
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    src = kb.tensor(x.name)
    C, S = kb.int_param(x.shape[1], "C"), kb.int_param(int(np.prod(x.shape[2:])), "S")
    sp = kb.offset(contiguous_strides(x.shape[2:]), coords[2:])
    n, c = coords[0], coords[1]
    base, acc, k, v, y = (kb.tmp(p) for p in ("lb", "acc", "k", "v", "y"))
    kb.emit(f"{base} = {n} * {C} * {S} + {sp}")
    kb.emit(f"{acc} = {lit(0, 'f32')}")
    lo_p, hi_p = kb.int_param(lo, "lo"), kb.int_param(hi + 1, "hi")
    kb.emit(f"for {k} in range(max({c} - {lo_p}, 0), min({c} + {hi_p}, {C})):")
    kb.emit(f"{v} = f32({src}[{base} + {k} * {S}])", 1)
    kb.emit(f"{acc} += {v} * {v}", 1)
    coef = lit(a["alpha"] / size, "f32")
    d = f"math.pow({lit(a['bias'], 'f32')} + {coef} * {acc}, {lit(a['beta'], 'f32')})"
    kb.emit(f"{y} = {t}({src}[{base} + {c} * {S}] / {d})")
    return y


@lowering("BatchNormalization", form="element")
def batch_norm_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    """(x - mean) / sqrt(var + eps) * scale + bias per channel, for statistics only known at run
    time (constant ones are folded into the conv before, or made Mul + Add, by bn_fold)."""
    x, scale, bias, mean, var = node.inputs
    t = type_name(x.dtype)
    c = coords[1]
    k, y = kb.tmp("k"), kb.tmp("y")
    s, b, m, v = (f"{kb.tensor(p.name)}[{c}]" for p in (scale, bias, mean, var))
    kb.emit(f"{k} = {s} / math.sqrt({v} + {lit(node.attrs['epsilon'], t)})")
    off = kb.offset(contiguous_strides(x.shape), coords)
    kb.emit(f"{y} = {t}(({kb.tensor(x.name)}[{off}] - {m}) * {k} + {b})")
    return y


@lowering("MeanVarianceNormalization", form="element")
def mvn_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    """(x - mean) / (std + 1e-9) over ``axes``, which need not be trailing ([0, 2, 3] by
    default): the reduced positions are walked by a flat index split per axis."""
    x = node.inputs[0]
    axes, strides = node.attrs["axes"], contiguous_strides(x.shape)
    src = kb.tensor(x.name)
    kept = [0 if a in axes else s for a, s in enumerate(strides)]
    base, j, r, off = kb.tmp("b"), kb.tmp("j"), kb.tmp("r"), kb.tmp("o")
    L = kb.int_param(int(np.prod([x.shape[a] for a in axes])), "L")
    kb.emit(f"{base} = {kb.offset(kept, coords)}")

    def walk(body: str) -> None:
        kb.emit(f"for {j} in range({L}):")
        kb.emit(f"{r} = {j}", 1)
        kb.emit(f"{off} = {base}", 1)
        for a in reversed(axes):
            d, st = kb.int_param(x.shape[a], "d"), kb.int_param(strides[a], "s")
            kb.emit(f"{off} += ({r} % {d}) * {st}", 1)
            kb.emit(f"{r} = {r} // {d}", 1)
        kb.emit(body, 1)

    # shifted by the first reduced element, as moments() and for the same reasons
    m, ssq, y, k = kb.tmp("mu"), kb.tmp("ssq"), kb.tmp("y"), kb.tmp("k")
    kb.emit(f"{k} = f32({src}[{base}])")
    kb.emit(f"{m} = {lit(0, 'f32')}")
    walk(f"{m} += {src}[{off}] - {k}")
    kb.emit(f"{m} = {m} / f32({L})")
    kb.emit(f"{ssq} = {lit(0, 'f32')}")
    walk(f"{ssq} += ({src}[{off}] - {k} - {m}) * ({src}[{off}] - {k} - {m})")
    at = kb.offset(strides, coords)
    std = f"math.sqrt({ssq} / f32({L}))"
    x_c = f"({src}[{at}] - {k} - {m})"
    kb.emit(f"{y} = {type_name(x.dtype)}({x_c} / ({std} + {lit(1e-9, 'f32')}))")
    return y


@lowering("ResidualRMSNorm", form="rows")
def residual_rms_norm_rows(node: Node, kb: KernelBuilder) -> int:
    """h = r + RMSNorm(x) * w1, y = RMSNorm(h) * w2: a row's two statistics, then both outputs.
    h is computed three times a row (in the second statistic, and at the store), each time by
    the same expression as the unfused RMSNorm + Add kernel, so h and y equal the two kernels'."""
    x, w1, r, w2 = node.inputs
    h, y = node.outputs
    c = kb.coords(tuple(h.shape), split=len(h.shape) - 1)[-1]
    L, base = kb.int_param(h.shape[-1], "L"), kb.tmp("rb")
    xs, ws1, rs, ws2 = (kb.tensor(v.name) for v in (x, w1, r, w2))
    with kb.at_row():
        kb.emit(f"{base} = o * {L}")
    k, m, inv = moments(kb, xs, base, L, node.attrs["epsilon"], centred=False)

    def h_of(xv: str, j: str, rv: str) -> str:  # as norm_element's line, then the Add
        return f"(f32((f32({xv}) - {k} - {m}) * {inv}) * {ws1}[{j}] + {rv})"

    hh = h_of("{v}", "{j}", f"{rs}[{base} + {{j}}]")
    ssq, inv2 = kb.tmp("ssq"), kb.tmp("rstd")
    kb.row_reduce(
        ssq, lit(0, "f32"), "{a} + {v}", f"{hh} * {hh}", L, f"{xs}[{base} + ", at_cpu=f"{base}v["
    )
    with kb.at_row():
        eps = lit(node.attrs["epsilon2"], "f32")
        kb.emit(f"{inv2} = {lit(1, 'f32')} / math.sqrt({ssq} / f32({L}) + {eps})")
    hv = kb.tmp("h")
    kb.emit(f"{hv} = {h_of(f'{xs}[i]', c, f'{rs}[i]')}")
    kb.emit(f"{kb.tensor(h.name)}[i] = {hv}")
    yv = f"f32(({hv} - {k} - {m}) * {inv2}) * {ws2}[{c}]"
    kb.emit(f"{kb.tensor(y.name)}[i] = {type_name(y.dtype)}({yv})")
    return int(np.prod(h.shape))
