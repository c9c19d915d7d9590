"""Index-map kernels (each output element reads one input element at computed coordinates) and
per-row selections (TopK, Hardmax, CumSum) written as element templates with an inner loop."""

from __future__ import annotations

from ...ir import Node
from ..emit import KernelBuilder, broadcast_strides, contiguous_strides, type_name
from ..registry import lowering
from ..scalar import lit


def _load(kb: KernelBuilder, name: str, shape, coords: list[str]) -> str:
    v = kb.tmp()
    kb.emit(f"{v} = {kb.tensor(name)}[{kb.offset(contiguous_strides(shape), coords)}]")
    return v


def _shifted(kb: KernelBuilder, c: str, scale: int, shift: int) -> str:
    """The expression c * scale + shift with both as run-time ints (kept out of the source)."""
    expr = c if scale == 1 else f"{c} * {kb.int_param(scale, 'mul')}"
    return expr if shift == 0 else f"({expr} + {kb.int_param(shift, 'o')})"


@lowering("Expand", form="element")
def expand_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    x = node.inputs[0]
    v = kb.tmp()
    strides = broadcast_strides(x.shape, tuple(node.outputs[0].shape))
    kb.emit(f"{v} = {kb.tensor(x.name)}[{kb.offset(strides, coords)}]")
    return v


@lowering("Tile", form="element")
def tile_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    x = node.inputs[0]
    src = [f"({c} % {kb.int_param(d, 'd')})" for c, d in zip(coords, x.shape)]
    return _load(kb, x.name, x.shape, src)


@lowering("Slice", form="element")
def slice_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    x = node.inputs[0]
    a = node.attrs
    start, step = [0] * len(x.shape), [1] * len(x.shape)
    axes = a.get("axes") or list(range(len(a["starts"])))
    steps = a.get("steps") or [1] * len(a["starts"])
    for s, e, ax, st in zip(a["starts"], a["ends"], axes, steps):
        ax = int(ax) % len(x.shape)
        start[ax], _, step[ax] = slice(int(s), int(e), int(st)).indices(x.shape[ax])
    src = [_shifted(kb, c, st, s0) for c, st, s0 in zip(coords, step, start)]
    return _load(kb, x.name, x.shape, src)


@lowering("Split", form="element")
def split_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    x, axis, k = node.inputs[0], node.attrs["axis"], node.attrs.get("output", 0)
    src = list(coords)
    src[axis] = _shifted(kb, coords[axis], 1, sum(node.attrs["split"][:k]))
    return _load(kb, x.name, x.shape, src)


@lowering("Pad", form="element")
def pad_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    x = node.inputs[0]
    t = type_name(x.dtype)
    mode, pads = node.attrs["mode"], node.attrs["pads"]
    v, inside = kb.tmp(), kb.tmp("ok")
    kb.emit(f"{inside} = True")
    src = []
    for ax, (c, d) in enumerate(zip(coords, x.shape)):
        q = kb.tmp("q")
        D = kb.int_param(d, "d")
        kb.emit(f"{q} = {c} - {kb.int_param(pads[ax], 'p')}")
        if mode == "constant":
            kb.emit(f"if {q} < 0 or {q} >= {D}:")
            kb.emit(f"{inside} = False", 1)
        elif mode == "edge":
            kb.emit(f"{q} = min(max({q}, 0), {D} - 1)")
        elif mode == "wrap":
            kb.emit(f"{q} = {q} % {D}")
        else:  # reflect, mirrored about the edge elements
            kb.emit(f"if {D} > 1:")
            kb.emit(f"{q} = {q} % (2 * {D} - 2)", 1)
            kb.emit(f"if {q} >= {D}:", 1)
            kb.emit(f"{q} = 2 * {D} - 2 - {q}", 2)
            kb.emit("else:")
            kb.emit(f"{q} = 0", 1)
        src.append(q)
    kb.emit(f"{v} = {lit(node.attrs['value'], t)}")
    kb.emit(f"if {inside}:")
    off = kb.offset(contiguous_strides(x.shape), src)
    kb.emit(f"{v} = {kb.tensor(x.name)}[{off}]", 1)
    return v


def _range_message(what: str, dim: str) -> str:
    return f'"{what}: an index is out of range [-" + str({dim}) + ", " + str({dim}) + ")"'


def _index_value(kb: KernelBuilder, node: Node, coords, axis: int) -> str:
    data, idx = node.inputs
    q = _load(kb, idx.name, idx.shape, coords)
    r = kb.tmp("ix")
    D = kb.int_param(data.shape[axis], "d")
    kb.emit(f"{r} = {q} + {D} if {q} < 0 else {q}")
    message = _range_message(f"{node.op} axis {axis}", D)
    kb.check_range(kb.tensor(idx.name), idx.size, D, message)
    kb.guard_index(r, D)
    return r


@lowering("Gather", form="element")
def gather_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    data, idx = node.inputs
    a, r = node.attrs["axis"], len(idx.shape)
    iv = _index_value(kb, node, coords[a : a + r], a)
    return _load(kb, data.name, data.shape, coords[:a] + [iv] + coords[a + r :])


@lowering("GatherElements", form="element")
def gather_elements_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    data = node.inputs[0]
    a = node.attrs["axis"]
    iv = _index_value(kb, node, coords, a)
    return _load(kb, data.name, data.shape, coords[:a] + [iv] + coords[a + 1 :])


@lowering("DepthToSpace", "SpaceToDepth", form="element")
def depth_space_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    x = node.inputs[0]
    n, c, y, w = coords
    B = kb.int_param(node.attrs["blocksize"], "B")
    if node.op == "SpaceToDepth":
        C = kb.int_param(x.shape[1], "C")
        if node.attrs.get("mode", "DCR") == "CRD":  # out channel = (c, by, bx)
            BB = kb.int_param(node.attrs["blocksize"] ** 2, "BB")
            q, cin = f"({c} % {BB})", f"({c} // {BB})"
        else:  # out channel = (by, bx, c)
            q, cin = f"({c} // {C})", f"({c} % {C})"
        src = [n, cin, f"({y} * {B} + {q} // {B})", f"({w} * {B} + {q} % {B})"]
    else:
        by, bx = f"({y} % {B})", f"({w} % {B})"
        if node.attrs["mode"] == "DCR":
            CO = kb.int_param(x.shape[1] // node.attrs["blocksize"] ** 2, "C")
            ch = f"(({by} * {B} + {bx}) * {CO} + {c})"
        else:
            ch = f"(({c} * {B} + {by}) * {B} + {bx})"
        src = [n, ch, f"({y} // {B})", f"({w} // {B})"]
    return _load(kb, x.name, x.shape, src)


@lowering("Trilu", form="element")
def trilu_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    x = node.inputs[0]
    t = type_name(x.dtype)
    v = _load(kb, x.name, x.shape, coords)
    i, j, k = coords[-2], coords[-1], kb.int_param(node.attrs["k"], "k")
    keep = f"{j} - {i} >= {k}" if node.attrs["upper"] else f"{j} - {i} <= {k}"
    kb.emit(f"if not ({keep}):")
    kb.emit(f"{v} = {lit(0, t)}", 1)
    return v


@lowering("OneHot", form="element")
def onehot_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    idx, a = node.inputs[0], node.attrs["axis"]
    t = type_name(node.attrs["dtype"])
    depth = node.attrs["depth"]
    q = _load(kb, idx.name, idx.shape, coords[:a] + coords[a + 1 :])
    r, v = kb.tmp("ix"), kb.tmp()
    D = kb.int_param(depth, "d")
    kb.emit(f"{r} = i64({q})")
    kb.emit(f"{r} = {r} + {D} if {r} < 0 else {r}")
    on, off = lit(node.attrs["on"], t), lit(node.attrs["off"], t)
    kb.emit(f"{v} = {on} if {r} == {coords[a]} else {off}")
    return v


def _row(node: Node, kb: KernelBuilder, coords: list[str], axis: int):
    """(base offset of the row through ``coords``, stride along ``axis``, row length)."""
    x = node.inputs[0]
    strides = contiguous_strides(x.shape)
    others = [c if i != axis else "0" for i, c in enumerate(coords)]
    base = kb.tmp("b")
    kb.emit(f"{base} = {kb.offset(strides, others)}")
    return base, kb.int_param(strides[axis], "s"), kb.int_param(x.shape[axis], "L")


@lowering("CumSum", form="element")
def cumsum_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    x = node.inputs[0]
    a = node.attrs["axis"]
    t = type_name(x.dtype)
    base, S, L = _row(node, kb, coords, a)
    acc, j = kb.tmp("acc"), kb.tmp("j")
    c = coords[a]
    if node.attrs["reverse"]:
        lo, hi = (f"{c} + 1", L) if node.attrs["exclusive"] else (c, L)
    else:
        lo, hi = ("0", c) if node.attrs["exclusive"] else ("0", f"{c} + 1")
    kb.emit(f"{acc} = {lit(0, t)}")
    kb.emit(f"for {j} in range({lo}, {hi}):")
    kb.emit(f"{acc} += {kb.tensor(x.name)}[{base} + {j} * {S}]", 1)
    return acc


@lowering("TopK", form="element")
def topk_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    """The element of rank coords[axis]. cpu: a quickselect over a per-thread copy of the row
    (O(L) per output; counting each element's rank was O(L^2), 0.4 s an output over
    ssdlite's 3,234 scores); cuda: rank = how many row elements come before it."""
    x = node.inputs[0]
    a = node.attrs["axis"]
    base, S, L = _row(node, kb, coords, a)
    src = kb.tensor(x.name)
    t = type_name(x.dtype)
    j, m, rank, vj, vm = (kb.tmp(p) for p in ("j", "mm", "rank", "vj", "vm"))
    val, pos = kb.tmp(), kb.tmp("pos")
    floats = x.dtype.kind == "f"

    def before(u: str, iu: str, w: str, iw: str) -> str:
        """u (at row index iu) comes before w: NaN ranks above +inf, ties go to the lower index
        (as ORT and the reference order them)."""
        big, small = (u, w) if node.attrs["largest"] else (w, u)
        first = f"{big} > {small}"
        tie = f"{u} == {w}"
        if floats:
            first += f" or ({big} != {big} and {small} == {small})"
            tie = f"({tie} or ({u} != {u} and {w} != {w}))"
        return f"({first} or ({tie} and {iu} < {iw}))"

    # cuda (no per-thread scratch row): the rank count
    cuda = [
        f"{val} = {src}[{base}]",
        f"{pos} = 0",
        f"for {j} in range({L}):",
        f"    {vj} = {src}[{base} + {j} * {S}]",
        f"    {rank} = 0",
        f"    for {m} in range({L}):",
        f"        {vm} = {src}[{base} + {m} * {S}]",
        f"        if {before(vm, m, vj, j)}:",
        f"            {rank} += 1",
        f"    if {rank} == {coords[a]}:",
        f"        {val} = {vj}",
        f"        {pos} = {j}",
    ]
    sv, si = kb.tmp("sv"), kb.tmp("si")
    kb.setup += [f"{sv} = np.empty(max({L}, 1), {t})", f"{si} = np.empty(max({L}, 1), i64)"]
    lo, hi, r, pm, pv, pi, st, q, tv, ti = (
        kb.tmp(p) for p in ("lo", "hi", "r", "pm", "pv", "pi", "st", "q", "tv", "ti")
    )

    def swap(u: str, w: str) -> list[str]:
        return [
            f"{tv} = {sv}[{u}]",
            f"{ti} = {si}[{u}]",
            f"{sv}[{u}] = {sv}[{w}]",
            f"{si}[{u}] = {si}[{w}]",
            f"{sv}[{w}] = {tv}",
            f"{si}[{w}] = {ti}",
        ]

    cpu = [
        f"for {j} in range({L}):",
        f"    {sv}[{j}] = {src}[{base} + {j} * {S}]",
        f"    {si}[{j}] = {j}",
        f"{r} = {coords[a]}",
        f"{lo} = 0",
        f"{hi} = {L} - 1",
        f"while {lo} < {hi}:",
        f"    {pm} = ({lo} + {hi}) // 2",
        *("    " + ln for ln in swap(pm, hi)),
        f"    {pv} = {sv}[{hi}]",
        f"    {pi} = {si}[{hi}]",
        f"    {st} = {lo}",
        f"    for {q} in range({lo}, {hi}):",
        f"        if {before(f'{sv}[{q}]', f'{si}[{q}]', pv, pi)}:",
        *("            " + ln for ln in swap(q, st)),
        f"            {st} += 1",
        *("    " + ln for ln in swap(st, hi)),
        f"    if {st} == {r}:",
        "        break",
        f"    if {st} < {r}:",
        f"        {lo} = {st} + 1",
        "    else:",
        f"        {hi} = {st} - 1",
        f"{val} = {sv}[{r}]",
        f"{pos} = {si}[{r}]",
    ]
    kb.lines += [(ln, None) for ln in cpu] + [(None, ln) for ln in cuda]
    return pos if node.attrs.get("output", 0) == 1 else val


@lowering("Hardmax", form="element")
def hardmax_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    x = node.inputs[0]
    a = node.attrs["axis"]
    t = type_name(x.dtype)
    base, S, L = _row(node, kb, coords, a)
    src = kb.tensor(x.name)
    j, best, pos, v = kb.tmp("j"), kb.tmp("best"), kb.tmp("pos"), kb.tmp()
    kb.emit(f"{best} = {src}[{base}]")
    kb.emit(f"{pos} = 0")
    kb.emit(f"for {j} in range(1, {L}):")
    kb.emit(f"if {src}[{base} + {j} * {S}] > {best}:", 1)
    kb.emit(f"{best} = {src}[{base} + {j} * {S}]", 2)
    kb.emit(f"{pos} = {j}", 2)
    kb.emit(f"{v} = {lit(1, t)} if {pos} == {coords[a]} else {lit(0, t)}")
    return v


@lowering("GatherND", form="element")
def gathernd_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    """The index tuple at the element's leading coordinates, then the trailing slice offset."""
    data, ind = node.inputs
    b, r = node.attrs["batch_dims"], ind.shape[-1]
    q = len(ind.shape) - 1  # output dims that walk the index tuples
    row = kb.offset(contiguous_strides(ind.shape[:-1]), coords[:q])
    strides = contiguous_strides(data.shape)
    off, v = kb.tmp("go"), kb.tmp("g")
    kb.emit(f"{off} = {kb.offset(strides[:b], coords[:b])}")
    kb.emit(f"{off} += {kb.offset(strides[b + r :], coords[q:])}")
    src = kb.tensor(ind.name)
    for j in range(r):
        k, dim = kb.tmp("gk"), kb.int_param(data.shape[b + j], "D")
        q = kb.tmp("gq")
        kb.emit(f"{q} = {src}[({row}) * {kb.int_param(r, 'R')} + {j}]")
        kb.emit(f"{k} = {q} + {dim} if {q} < 0 else {q}")
        message = _range_message(f"GatherND index column {j}", dim)
        kb.check_range(src, ind.size // r, dim, message, step=r, start=j)
        kb.guard_index(k, dim)
        kb.emit(f"{off} += {k} * {kb.int_param(strides[b + j], 's')}")
    kb.emit(f"{v} = {kb.tensor(data.name)}[{off}]")
    return v


@lowering("Transpose", form="element")
def transpose_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    x = node.inputs[0]
    in_strides = contiguous_strides(x.shape)
    strides = [in_strides[p] for p in node.attrs["perm"]]
    v = kb.tmp()
    kb.emit(f"{v} = {kb.tensor(x.name)}[{kb.offset(strides, coords)}]")
    return v


@lowering("Concat", form="element")
def concat_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    axis = node.attrs["axis"]
    v, start = kb.tmp(), 0
    if len(node.inputs) == 1:
        x = node.inputs[0]
        kb.emit(f"{v} = {kb.tensor(x.name)}[{kb.offset(contiguous_strides(x.shape), coords)}]")
        return v
    for j, x in enumerate(node.inputs):
        local = list(coords)
        if start:
            local[axis] = f"({coords[axis]} - {kb.int_param(start, 'o')})"
        end = start + x.shape[axis]
        cond = "if" if j == 0 else "elif"
        if j == len(node.inputs) - 1:
            kb.emit("else:")
        else:
            kb.emit(f"{cond} {coords[axis]} < {kb.int_param(end, 'o')}:")
        kb.emit(f"{v} = {kb.tensor(x.name)}[{kb.offset(contiguous_strides(x.shape), local)}]", 1)
        start = end
    return v
