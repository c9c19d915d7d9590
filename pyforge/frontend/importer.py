"""ONNX ModelProto -> IR Graph, folding every node whose inputs are all constant on the way.

Shapes are static, so Shape/Gather/Concat chains that compute Reshape targets fold here, before
any op needs its "shape" input to be constant.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import DataDependentError, ModelLoadError, ShapeError, UnsupportedOperatorError
from ..ir import ConstCache, Graph, Node, Value
from ..ops import OPS, infer_node
from .buckets import VALID, Padding
from .checks import check_model, tensor_array
from .expand import (
    EXPAND,
    Builder,
    inline_function,
    run_rule,
    schema_attributes,
    schema_function,
    type_proto,
)
from .normalize import NORMALIZE
from .shapes import import_dims

# Ops never folded even with constant inputs (none yet; kept for ops with side effects later).
_NO_FOLD: set[str] = set()


# numpy's own dtypes; the ml_dtypes ones (bfloat16, float8, int4...) have no kernels
_DTYPES = {np.dtype(t) for t in (np.float16, np.float32, np.float64, np.bool_)}
_DTYPES |= {np.dtype(f"{k}{b}") for k in "iu" for b in (1, 2, 4, 8)}


def _const(name: str, arr: np.ndarray, op: str, node: str, opset: int | None) -> Value:
    """A constant Value; bfloat16/float8/int4 arrive as numpy void types, which no kernel has."""
    if arr.dtype not in _DTYPES:
        raise UnsupportedOperatorError(op, node, opset, f"constant {name!r} of type {arr.dtype}")
    return Value(name, tuple(arr.shape), arr.dtype, const=arr)


# attributes that hold an ONNX element type: numpy dtypes below the frontend
_DTYPE_ATTRS = {"Cast": ("to",), "EyeLike": ("dtype",)}


def onnx_dtype(elem_type: int) -> np.dtype:
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        dtype = None
    if dtype not in _DTYPES:
        name = (
            onnx.TensorProto.DataType.Name(elem_type)
            if elem_type in onnx.TensorProto.DataType.values()
            else elem_type
        )
        raise UnsupportedOperatorError(
            "(tensor type)", "-", None, f"element type {name}: not a numpy dtype or not a tensor"
        )
    return dtype


def load_model(model: str | os.PathLike | onnx.ModelProto | bytes) -> onnx.ModelProto:
    """Read and check a model; every failure is a ModelLoadError naming the file."""
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, bytes):
        proto = onnx.ModelProto()
        try:
            proto.ParseFromString(model)
        except Exception as e:  # noqa: BLE001  (protobuf raises assorted DecodeErrors)
            raise ModelLoadError(f"bytes given are not an ONNX model: {e}") from None
        return proto
    path = os.fspath(model)
    if not os.path.isfile(path):
        raise ModelLoadError(f"model file not found: {path}")
    try:
        proto = onnx.load(path)
    except Exception as e:  # noqa: BLE001  (any failure to parse is the same user error)
        raise ModelLoadError(
            f"{path} is not a readable ONNX model ({type(e).__name__}: {e})"
        ) from None
    if not proto.graph.node and not proto.graph.output:
        raise ModelLoadError(f"{path} holds no ONNX graph (empty, truncated or not ONNX)")
    return proto


def _attr_value(attr: onnx.AttributeProto) -> Any:
    value = helper.get_attribute_value(attr)
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode() for v in value]
    return value


def _schema_defaults(op: str, opset: int) -> dict[str, Any]:
    """The attribute defaults of ``op`` at ``opset``, from ONNX's schemas: the one source of them.

    An attribute that a later version added comes with the default that keeps the older meaning
    (TopK-1 always took the largest, ``largest=1`` since TopK-11), so the newest schema's
    defaults fill what the model's own version does not define."""
    key = (op, opset)
    if key not in _DEFAULTS:
        found: dict[str, Any] = {}
        for version in (onnx.defs.onnx_opset_version(), opset):
            try:
                schema = onnx.defs.get_schema(op, version, "")
            except onnx.defs.SchemaError:
                continue
            found.update(
                (name, _attr_value(a.default_value))
                for name, a in schema.attributes.items()
                if a.default_value.type != onnx.AttributeProto.UNDEFINED
            )
        _DEFAULTS[key] = found
    return _DEFAULTS[key]


_DEFAULTS: dict[tuple[str, int], dict[str, Any]] = {}


def _fill_defaults(op: str, opset: int, attrs: dict[str, Any]) -> None:
    for name, value in _schema_defaults(op, opset).items():
        attrs.setdefault(name, value)


def _constant_value(node: onnx.NodeProto, attrs: dict) -> np.ndarray:
    for key, cast in (
        ("value", None),
        ("value_float", np.float32),
        ("value_floats", np.float32),
        ("value_int", np.int64),
        ("value_ints", np.int64),
    ):
        if key in attrs:
            return np.asarray(attrs[key], dtype=cast) if cast else np.asarray(attrs[key])
    raise UnsupportedOperatorError("Constant", node.name, None, f"attributes {sorted(attrs)}")


def _initializer(init: onnx.TensorProto, cache: ConstCache | None) -> np.ndarray:
    if cache is None:
        return tensor_array(init)
    arr = cache.initializers.get(init.name)
    if arr is None or arr.shape != tuple(init.dims):
        arr = cache.initializers[init.name] = tensor_array(init)
        arr.flags.writeable = False  # shared by every plan's import: folds key on it
    return arr


def _const_or_placeholder(v: Value) -> np.ndarray:
    return v.const if v.const is not None else np.empty(v.shape, v.dtype)


def import_onnx(
    model: str | os.PathLike | onnx.ModelProto | bytes,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    padding: Padding | None = None,
    cache: ConstCache | None = None,
) -> Graph:
    """Import an ONNX model into a verified IR graph with static shapes everywhere: each graph
    input takes its ``input_shapes`` entry, else the file's dims with every symbolic dim as 1
    (``frontend/shapes.py``). ``padding``: mask the padded positions of a length bucket
    (``frontend/buckets.py``). ``cache``: the model's ConstCache, shared by every import of
    this same, unchanged proto (its initializers are read once, read-only)."""
    proto = load_model(model)
    opset, nodes = check_model(proto)  # refuses a malformed graph; nodes producers first
    g = proto.graph
    imp = _Importer(proto, opset)
    if cache is not None:
        imp.graph.cache = cache
    for init in g.initializer:
        arr = _initializer(init, cache)
        imp.values[init.name] = _const(init.name, arr, "(initializer)", init.name, opset)
    for inp in g.input:
        if inp.name in imp.values:
            continue  # an initializer listed as input (opset < 9 style): a constant
        ttype = inp.type.tensor_type
        dims = import_dims(inp, input_shapes)
        v = Value(inp.name, tuple(dims), onnx_dtype(ttype.elem_type))
        imp.values[inp.name] = v
        imp.graph.inputs.append(v)
    if padding is not None:
        name, axis = next(iter(padding.inputs.items()))
        valid = Value(VALID, (imp.values[name].shape[axis],), np.dtype(bool))
        imp.values[VALID] = valid
        imp.graph.inputs.append(valid)
        imp.masks = padding.masks
    for k, (i, onode) in enumerate(nodes):
        try:
            imp.node(onode, opset, onode.name or f"{onode.op_type}_{i}")
        except DataDependentError as e:
            e.top = i  # where compile() cuts the model into stages
            e.taken = [j for j, _ in nodes[:k]]
            raise
    for out in g.output:
        v = imp.values.get(out.name)
        if v is None:
            raise ShapeError("Output", out.name, "graph output is never produced")
        imp.graph.outputs.append(v)
    imp.graph.verify()
    return imp.graph


class _Importer:
    """The graph being built and the Value of every tensor name so far."""

    def __init__(self, proto: onnx.ModelProto, opset: int):
        g = proto.graph
        self.graph = Graph(g.name or "model")
        self.values: dict[str, Value | None] = {"": None}
        self.opsets = {
            (o.domain if o.domain != "ai.onnx" else ""): o.version for o in proto.opset_import
        }
        self.opsets[""] = opset
        self.functions = {(f.domain, f.name): f for f in proto.functions}
        self.used = {o.name for o in g.output} | {n for node in _all_nodes(g) for n in node.input}
        self.names = {n for node in _all_nodes(g) for n in node.output} | {i.name for i in g.input}
        self.names |= {t.name for t in g.initializer}
        self.serial = itertools.count()  # names of emitted nodes: the same in every import
        self.masks: dict[str, list[tuple[int, int, float]]] = {}

    def node(self, onode: onnx.NodeProto, opset: int, name: str | None = None) -> None:
        """Import one node: folded, expanded or added to the graph."""
        name = name or onode.name or self.graph.fresh_name(onode.op_type)
        domain = "" if onode.domain in ("", "ai.onnx") else onode.domain
        attrs = {a.name: _attr_value(a) for a in onode.attribute}
        if domain == "":
            _fill_defaults(onode.op_type, opset, attrs)
        for key in _DTYPE_ATTRS.get(onode.op_type, ()):
            if key in attrs:
                attrs[key] = onnx_dtype(int(attrs[key]))
        if onode.op_type == "Constant" and domain == "":
            arr = _constant_value(onode, attrs)
            self.values[onode.output[0]] = _const(onode.output[0], arr, "Constant", name, opset)
            return
        if name in self.masks:
            onode = self._masked(onode, name, opset)
        opdef = OPS.get(onode.op_type) if domain == "" else None
        if opdef is None or _conv3d(onode, self.values):
            self._expand(onode, name, attrs, opset, domain)
            return
        try:
            inputs = [self.values[n] for n in onode.input]
        except KeyError as e:
            raise ShapeError(onode.op_type, name, f"input {e.args[0]!r} is never defined") from None
        node = Node(onode.op_type, inputs, [], attrs, name, opset)
        rule = NORMALIZE.get(onode.op_type)
        if rule is not None:
            rule(node)
        n_out = len(onode.output)
        live_inputs = [v for v in node.inputs if v is not None]
        foldable = opdef.shape_only or all(v.const is not None for v in live_inputs)
        if (live_inputs or opdef.shape_only) and foldable and node.op not in _NO_FOLD:
            arrays = [None if v is None else _const_or_placeholder(v) for v in node.inputs]
            results = opdef.evaluate(node, arrays)
            for out_name, arr in zip(onode.output, results):
                arr = np.asarray(arr, order="C")  # ascontiguousarray would make 0-d arrays 1-d
                self.values[out_name] = _const(out_name, arr, node.op, name, opset)
            return
        inferred = infer_node(node)
        outs = []
        for k, out_name in enumerate(onode.output[: len(inferred)]):
            shape, dtype = inferred[k]
            v = Value(out_name or self.graph.fresh_name(f"{name}_unused"), shape, np.dtype(dtype))
            self.values[out_name] = v
            outs.append(v)
        if n_out > len(inferred) and any(
            o in self.used for o in onode.output[len(inferred) :] if o
        ):
            raise UnsupportedOperatorError(node.op, name, opset, "its optional extra outputs")
        node.outputs = outs
        if opdef.split_outputs and len(outs) > 1:
            for k, out in enumerate(outs):
                part = Node(
                    node.op,
                    list(node.inputs),
                    [out],
                    dict(node.attrs, output=k),
                    f"{name}:{k}",
                    opset,
                )
                self.graph.add_node(part)
            return
        self.graph.add_node(node)

    def _masked(self, onode: onnx.NodeProto, name: str, opset: int) -> onnx.NodeProto:
        """``onode`` reading its inputs with the padded positions set to the fill each mask gives."""
        new = onnx.NodeProto()
        new.CopyFrom(onode)
        b = Builder(self, onode, name, {}, opset)
        for k, axis, fill in self.masks[name]:
            x = self.values[new.input[k]]
            shape = np.ones(len(x.shape), np.int64)
            shape[axis] = -1
            valid = b.op("Reshape", [VALID, b.const(shape)])
            if x.dtype.kind in "iu" and np.isinf(fill):
                fill = np.iinfo(x.dtype).max if fill > 0 else np.iinfo(x.dtype).min
            new.input[k] = b.op("Where", [valid, new.input[k], b.const(np.array(fill, x.dtype))])
        return new

    def _expand(
        self, onode: onnx.NodeProto, name: str, attrs: dict, opset: int, domain: str
    ) -> None:
        """An op pyforge has no kernel for, computed as the subgraph its rule or function gives."""
        op_opset = opset if domain == "" else self.opsets.get(domain, 1)
        b = Builder(self, onode, name, attrs, op_opset)
        for k in onode.input:
            if k not in self.values:
                raise ShapeError(onode.op_type, name, f"input {k!r} is never defined")
        rule = EXPAND.get((domain, onode.op_type))
        if rule is not None:
            run_rule(rule, b)
            return
        fn = self.functions.get((onode.domain, onode.op_type))
        if fn is None and domain == "":
            types = [type_proto(self.values[k]) if k else None for k in onode.input]
            fn = schema_function(onode, opset, types)
        if fn is None:
            detail = None if domain == "" else f"domain {onode.domain!r}"
            raise UnsupportedOperatorError(onode.op_type, name, op_opset, detail)
        attributes = (
            schema_attributes(onode, op_opset)
            if domain == ""
            else {a.name: a for a in onode.attribute}
        )
        run_rule(lambda b: inline_function(b, fn, attributes), b)


def _conv3d(onode: onnx.NodeProto, values: dict) -> bool:
    """A 3-d Conv: computed by its expansion (expansions/conv3d.py) as 2-d ones."""
    x = values.get(onode.input[0]) if onode.op_type == "Conv" and onode.input else None
    return x is not None and len(x.shape) == 5


def _all_nodes(g: onnx.GraphProto):
    """Every node of ``g`` and of its subgraphs (If/Loop/Scan bodies)."""
    for n in g.node:
        yield n
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(a.g)
            for sub in a.graphs:
                yield from _all_nodes(sub)
