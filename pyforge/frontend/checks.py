"""Checks of an ONNX model before import, so a malformed file fails with an error naming what is
wrong: its opset, unique tensor names, tensor data against dims, declared sizes against the memory
limit, and a stable topological order of its nodes (ONNX Runtime sorts them too)."""

from __future__ import annotations

import heapq
import math
import os
import warnings
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import ModelLoadError, ResourceError
from .shapes import import_dims

Order = list[tuple[int, onnx.NodeProto]]  # (index in the proto, node), producers first


def check_model(proto: onnx.ModelProto) -> tuple[int, Order]:
    """The default-domain opset and the nodes in a stable topological order, after refusing
    what ONNX Runtime refuses: duplicate tensor names, a cycle, an input made nowhere, tensor
    data that disagrees with its dims."""
    opset = default_opset(proto)
    g = proto.graph
    producers = _producers(g)
    for node_index, node in enumerate(g.node):
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                check_tensor(a.t, f"attribute {a.name!r} of node {label(node_index, node)}")
    return opset, topological_order(g, producers)


def label(index: int, node: onnx.NodeProto) -> str:
    """A node as errors name it: the importer's name for it (index-based if unnamed), and op."""
    return f"{node.name or f'{node.op_type}_{index}'!r} ({node.op_type})"


def default_opset(proto: onnx.ModelProto) -> int:
    newest = onnx.defs.onnx_opset_version()
    if not proto.opset_import:
        # ONNX Runtime refuses this too ("Missing opset in the model")
        raise ModelLoadError(
            "the model imports no opset: it must name the ONNX opset its nodes follow "
            f"(opset_import; this onnx {onnx.__version__} knows 1 to {newest})"
        )
    versions = [imp.version for imp in proto.opset_import if imp.domain in ("", "ai.onnx")]
    if not versions:
        # ONNX Runtime runs default-domain nodes of such a model at its newest opset (checked:
        # onnxruntime 1.32 runs a Relu model that imports only "com.foo"); pyforge does the same
        # with the newest opset the installed onnx knows, and says so
        if any(n.domain in ("", "ai.onnx") for n in proto.graph.node):
            warnings.warn(
                f"the model imports no opset of the default ONNX domain; its nodes are read "
                f"at opset {newest}, the newest this onnx knows (as ONNX Runtime does)",
                stacklevel=2,
            )
        return newest
    if not 1 <= versions[0] <= newest:
        raise ModelLoadError(
            f"the model imports opset {versions[0]} of the default ONNX domain; the newest "
            f"supported is {newest} (onnx {onnx.__version__}): re-export at opset {newest} or "
            "lower, or install a newer onnx"
        )
    return versions[0]


def _producers(g: onnx.GraphProto) -> dict[str, str]:
    """What produces each tensor name; a name produced twice is refused (ONNX is SSA)."""
    producers: dict[str, str] = {}

    def claim(name: str, who: str) -> None:
        if not name:  # an omitted optional output
            return
        if name in producers:
            raise ModelLoadError(
                f"tensor name {name!r} is produced twice: by {producers[name]} and by {who} "
                "(every tensor name in an ONNX graph must be unique)"
            )
        producers[name] = who

    for t in g.initializer:
        claim(t.name, f"initializer {t.name!r}")
    # an initializer may also be listed as a graph input (opset < 9 style, or an input's default)
    listed = {t.name for t in g.initializer}
    for k, inp in enumerate(g.input):
        if inp.name in listed:
            listed.discard(inp.name)
            continue
        claim(inp.name, f"graph input {k} {inp.name!r}")
    for i, node in enumerate(g.node):
        for out in node.output:
            claim(out, f"node {label(i, node)}")
    return producers


def topological_order(g: onnx.GraphProto, producers: Mapping[str, str]) -> Order:
    """Kahn's algorithm taking the lowest proto index first, so a sorted graph keeps its order."""
    made_by = {out: i for i, node in enumerate(g.node) for out in node.output if out}
    waiting = [0] * len(g.node)
    users: list[list[int]] = [[] for _ in g.node]
    for i, node in enumerate(g.node):
        for name in dict.fromkeys([*node.input, *outer_names(node)]):
            if not name:
                continue
            if name not in producers:
                raise ModelLoadError(
                    f"node {label(i, node)} takes tensor {name!r}, which no node, initializer "
                    "or graph input produces"
                )
            if name in made_by:
                waiting[i] += 1
                users[made_by[name]].append(i)
    ready = [i for i, n in enumerate(waiting) if n == 0]
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in users[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    if len(order) < len(g.node):
        raise ModelLoadError(_cycle(g, made_by, set(order)))
    return [(i, g.node[i]) for i in order]


def outer_names(node: onnx.NodeProto) -> list[str]:
    """The names a node's subgraphs (If/Loop/Scan bodies) read from the enclosing graph."""
    found: list[str] = []
    for a in node.attribute:
        for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs:
            inner = {i.name for i in sub.input} | {t.name for t in sub.initializer}
            for n in sub.node:
                found += [x for x in [*n.input, *outer_names(n)] if x and x not in inner]
                inner.update(n.output)
            found += [o.name for o in sub.output if o.name not in inner]
    return found


def _cycle(g: onnx.GraphProto, made_by: dict[str, int], placed: set[int]) -> str:
    """Walk from a node that never became ready, through its unplaced producers, into a loop."""
    i = next(k for k in range(len(g.node)) if k not in placed)
    path: list[tuple[int, str]] = []
    while i not in [k for k, _ in path]:
        name = next(n for n in g.node[i].input if made_by.get(n, -1) not in placed | {-1})
        path.append((i, name))
        i = made_by[name]
    loop = path[[k for k, _ in path].index(i) :]
    steps = ", ".join(f"node {label(k, g.node[k])} needs {n!r}" for k, n in loop)
    return f"the graph has a cycle: {steps}, which the first of them makes"


# bits per element of the packed types; every other type takes its numpy itemsize
_BITS = {
    getattr(TensorProto, name): bits
    for name, bits in (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2), ("UINT2", 2))
    if hasattr(TensorProto, name)
}
_COMPLEX = {TensorProto.COMPLEX64, TensorProto.COMPLEX128}


def check_tensor(t: TensorProto, what: str) -> None:
    """Refuse tensor data that disagrees with the dims, or an external data file that is
    missing (looked for where onnx reads it for a ModelProto: the current directory; a model
    read from a path has its external data loaded already)."""
    if any(d < 0 for d in t.dims):
        raise ModelLoadError(f"{what} {t.name!r} has negative dims {list(t.dims)}")
    dtype, n = _type_name(t.data_type), math.prod(t.dims)
    bits = _BITS.get(t.data_type) or 8 * _itemsize(t.data_type, 0)
    if t.data_type == TensorProto.STRING or not bits:
        return  # no fixed size: refused later as a type no kernel has
    need = -(-n * bits // 8)
    if t.data_location == TensorProto.EXTERNAL:
        _check_external(t, what, need)
        return
    if t.HasField("raw_data"):
        if len(t.raw_data) != need:
            raise ModelLoadError(
                f"{what} {t.name!r}: dims {list(t.dims)} of {dtype} need {need} bytes of "
                f"raw_data, it holds {len(t.raw_data)}"
            )
        return
    field = helper.tensor_dtype_to_field(t.data_type)
    want = 2 * n if t.data_type in _COMPLEX else n
    have = len(getattr(t, field))
    if t.data_type not in _BITS and have != want:
        raise ModelLoadError(
            f"{what} {t.name!r}: dims {list(t.dims)} of {dtype} need {want} values in {field} "
            f"({need} bytes), it holds {have}"
        )


def _type_name(data_type: int) -> str:
    if data_type in TensorProto.DataType.values():
        return TensorProto.DataType.Name(data_type)
    return f"type {data_type}"


def _check_external(t: TensorProto, what: str, need: int) -> None:
    info = {e.key: e.value for e in t.external_data}
    location = info.get("location", "")
    if not location or not os.path.isfile(location):
        raise ModelLoadError(
            f"{what} {t.name!r}: its external data file {location!r} is missing (looked in the "
            "current directory: a ModelProto in memory carries no directory); keep it beside "
            "the model file and compile from the file's path"
        )
    offset, length = int(info.get("offset", 0)), int(info.get("length", need))
    size = os.path.getsize(location)
    if length != need or offset + length > size:
        raise ModelLoadError(
            f"{what} {t.name!r}: dims {list(t.dims)} of {_type_name(t.data_type)} need {need} "
            f"bytes from {location!r} at offset {offset}; it gives {length} of {size} bytes"
        )


def tensor_array(t: TensorProto, what: str = "initializer") -> np.ndarray:
    """The tensor's data as numpy after check_tensor; any failure of onnx's conversion becomes a
    ModelLoadError naming the tensor."""
    check_tensor(t, what)
    try:
        return numpy_helper.to_array(t)
    except (ValueError, TypeError, onnx.checker.ValidationError) as e:
        raise ModelLoadError(f"{what} {t.name!r} cannot be read: {e}") from None


def check_declared_sizes(
    proto: onnx.ModelProto, limit: int | None, input_shapes: Mapping | None = None
) -> None:
    """Refuse a model whose declared inputs and constants alone pass ``limit`` bytes, before
    constant folding allocates anything; each input at the dims the importer gives it."""
    if limit is None:
        return
    g = proto.graph
    sizes: list[tuple[int, str]] = []
    inits = {t.name for t in g.initializer}
    for inp in g.input:
        if inp.name not in inits:
            dims = import_dims(inp, input_shapes)
            size = math.prod(dims) * _itemsize(inp.type.tensor_type.elem_type)
            sizes.append((size, f"input {inp.name!r} {list(dims)}"))
    for t in g.initializer:
        sizes.append((math.prod(t.dims) * _itemsize(t.data_type), f"initializer {t.name!r}"))
    sizes += _folded_sizes(g)
    total = sum(s for s, _ in sizes)
    if total > limit:
        biggest = max(sizes)
        raise ResourceError(
            f"the model's inputs and constants (largest: {biggest[1]}, {biggest[0]:,} bytes)",
            total,
            limit,
        )


def _folded_sizes(g: onnx.GraphProto) -> list[tuple[int, str]]:
    """ConstantOfShape and Expand nodes whose target shape is a literal constant: folding them
    allocates that shape (counted at 1 byte an element for Expand: a lower bound)."""
    consts = {t.name: t for t in g.initializer}
    consts.update(
        (n.output[0], a.t)
        for n in g.node
        if n.op_type == "Constant"
        for a in n.attribute
        if a.name == "value"
    )
    sizes = []
    for i, n in enumerate(g.node):
        k = {"ConstantOfShape": 0, "Expand": 1}.get(n.op_type)
        if k is None or len(n.input) <= k or n.input[k] not in consts:
            continue
        shape = [max(int(d), 0) for d in tensor_array(consts[n.input[k]]).ravel()]
        value = [a.t.data_type for a in n.attribute if a.name == "value"]
        itemsize = _itemsize(value[0] if value else TensorProto.FLOAT) if k == 0 else 1
        sizes.append((math.prod(shape) * itemsize, f"the output of node {label(i, n)} {shape}"))
    return sizes


def _itemsize(data_type: int, unknown: int = 1) -> int:
    try:
        return helper.tensor_dtype_to_np_dtype(data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return unknown
