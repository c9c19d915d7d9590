"""ScatterElements (and Scatter) and ScatterND: each iteration owns the output elements that no
other iteration's updates can reach, copies them from data, then applies its updates in index
order. Repeated indices under a reduction are thus combined sequentially on both targets (on
cuda too: one thread per owned set, no atomics), which is correct and deterministic, if not the
fastest where one set is large (ScatterND over whole rows: one iteration)."""

from __future__ import annotations

import numpy as np

from ...ir import Node
from ..emit import KernelBuilder, contiguous_strides
from ..registry import lowering

_COMBINE = {
    "none": "{u}",
    "add": "{o} + {u}",
    "mul": "{o} * {u}",
    "max": "max({o}, {u})",
    "min": "min({o}, {u})",
}


def _range_message(what: str, dim: str) -> str:
    return f'"{what}: an index is out of range [-" + str({dim}) + ", " + str({dim}) + ")"'


def _wrapped_index(kb: KernelBuilder, src: str, dim: str, indent: int) -> str:
    """The index read at ``src``, negatives wrapped; on cuda one out of range sets the error
    word and reads element 0 (cpu checked every index before the loop)."""
    q = kb.tmp("q")
    kb.emit(f"{q} = {src}", indent)
    kb.emit(f"if {q} < 0:", indent)
    kb.emit(f"{q} += {dim}", indent + 1)
    if not kb.error_word:
        kb.error_word = True
        kb.params.append("err")
        kb.args.append(("e", 0))
    kb.emit("#", indent, cuda=f"if {q} < 0 or {q} >= {dim}:")
    kb.emit("#", indent + 1, cuda="err[0] = 1")
    kb.emit("#", indent + 1, cuda=f"{q} = 0")
    return q


def _store(kb: KernelBuilder, node: Node, out: str, at: str, update: str, indent: int) -> None:
    combined = _COMBINE[node.attrs["reduction"]].format(o=f"{out}[{at}]", u=update)
    kb.emit(f"{out}[{at}] = {combined}", indent)


@lowering("ScatterElements", "Scatter", form="rows")
def scatter_elements_rows(node: Node, kb: KernelBuilder) -> int:
    """One iteration per line along the axis: copy data's line, then scatter the updates whose
    line it is (only they can land in it)."""
    data, idx, upd = node.inputs
    a = node.attrs["axis"]
    d_strides, u_strides = contiguous_strides(data.shape), contiguous_strides(idx.shape)
    lines = tuple(d for k, d in enumerate(data.shape) if k != a)
    w = kb.tmp("w")
    kb.emit(f"{w} = i")
    coords = kb.coords(lines, w) if lines else []
    keep = [k for k in range(len(data.shape)) if k != a]
    base, ubase, j, p = kb.tmp("b"), kb.tmp("ub"), kb.tmp("j"), kb.tmp("p")
    out, src = kb.tensor(node.outputs[0].name), kb.tensor(data.name)
    ix, up = kb.tensor(idx.name), kb.tensor(upd.name)
    D, SA = kb.int_param(data.shape[a], "D"), kb.int_param(d_strides[a], "SA")
    kb.emit(f"{base} = {kb.offset([d_strides[k] for k in keep], coords)}")
    kb.emit(f"for {j} in range({D}):")
    kb.emit(f"{out}[{base} + {j} * {SA}] = {src}[{base} + {j} * {SA}]", 1)
    inside = [
        f"{c} < {kb.int_param(idx.shape[k], 'U')}"
        for c, k in zip(coords, keep)
        if idx.shape[k] < data.shape[k]
    ]
    kb.emit(f"if {' and '.join(inside) or 'True'}:")
    kb.emit(f"{ubase} = {kb.offset([u_strides[k] for k in keep], coords)}", 1)
    USA = kb.int_param(u_strides[a], "USA")
    kb.emit(f"for {j} in range({kb.int_param(idx.shape[a], 'UA')}):", 1)
    q = _wrapped_index(kb, f"{ix}[{ubase} + {j} * {USA}]", D, 2)
    kb.emit(f"{p} = {base} + {q} * {SA}", 2)
    _store(kb, node, out, p, f"{up}[{ubase} + {j} * {USA}]", 2)
    kb.check_range(ix, idx.size, D, _range_message(f"{node.op} axis {a}", D))
    return int(np.prod(lines))


@lowering("ScatterND", form="rows")
def scatter_nd_rows(node: Node, kb: KernelBuilder) -> int:
    """One iteration per element of a slice: copy that element of every slice of data (unless
    the output is data's own buffer, a state written in place), then apply every update
    tuple's element to the slice its index tuple names."""
    data, idx, upd = node.inputs
    k = idx.shape[-1]
    size, rows = int(np.prod(data.shape[k:])), int(np.prod(data.shape[:k]))
    tuples = int(np.prod(idx.shape[:-1]))
    out, src = kb.tensor(node.outputs[0].name), kb.tensor(data.name)
    ix, up = kb.tensor(idx.name), kb.tensor(upd.name)
    S, K = kb.int_param(size, "S"), kb.int_param(k, "K")
    r, u, p = kb.tmp("r"), kb.tmp("u"), kb.tmp("p")
    if node.attrs.get("in_place") and node.attrs["reduction"] == "none":
        return _scatter_nd_writes(node, kb, (out, ix, up), (S, K), tuples)
    if not node.attrs.get("in_place"):
        kb.emit(f"for {r} in range({kb.int_param(rows, 'R')}):")
        kb.emit(f"{out}[{r} * {S} + i] = {src}[{r} * {S} + i]", 1)
    kb.emit(f"for {u} in range({kb.int_param(tuples, 'T')}):")
    kb.emit(f"{p} = 0", 1)
    for c in range(k):
        D = kb.int_param(data.shape[c], "D")
        q = _wrapped_index(kb, f"{ix}[{u} * {K} + {c}]", D, 1)
        kb.emit(f"{p} = {p} * {D} + {q}", 1)
        message = _range_message(f"{node.op} index column {c}", D)
        kb.check_range(ix, tuples, D, message, step=k, start=c)
    update = f"{up}[{u} * {S} + i]"  # a float16 update (reads_half) widened as it is read
    update = update if upd.dtype == node.outputs[0].dtype else f"f32({update})"
    _store(kb, node, out, f"{p} * {S} + i", update, 1)
    return size


def _scatter_nd_writes(node: Node, kb: KernelBuilder, ts: tuple, ps: tuple, tuples: int) -> int:
    """An in-place ScatterND without reduction (a KV cache's new rows): nothing to copy and no
    combining order, so one iteration per element of every update (a 1024-token prefill's
    cache write was 1024 updates in series per element: 0.7 ms a layer on the H200)."""
    (out, ix, up), (S, K) = ts, ps
    data, idx = node.inputs[0], node.inputs[1]
    u, e, p = kb.tmp("u"), kb.tmp("e"), kb.tmp("p")
    kb.emit(f"{u} = i // {S}")
    kb.emit(f"{e} = i % {S}")
    kb.emit(f"{p} = 0")
    for c in range(idx.shape[-1]):
        D = kb.int_param(data.shape[c], "D")
        q = _wrapped_index(kb, f"{ix}[{u} * {K} + {c}]", D, 0)
        kb.emit(f"{p} = {p} * {D} + {q}")
        message = _range_message(f"{node.op} index column {c}", D)
        kb.check_range(ix, tuples, D, message, step=idx.shape[-1], start=c)
    update = f"{up}[i]"  # updates are (tuples, slice) in order: element i is update u's e
    update = update if node.inputs[2].dtype == node.outputs[0].dtype else f"f32({update})"
    kb.emit(f"{out}[{p} * {S} + {e}] = {update}")
    return tuples * int(np.prod(data.shape[idx.shape[-1] :]))
