"""Expansions: an op that pyforge computes as a subgraph of ops it already has.

A rule receives a :class:`Builder` in place of the node and emits ONNX nodes through it; each
emitted node is imported at once (constant-folded, normalised, shape-inferred), so a rule sees
the static shapes and folded constants of what it built so far, and may emit ops that are
themselves expanded. Three sources of rules, tried in this order:

1. ``@expands(op, domain=...)`` rules in ``pyforge/frontend/expansions/`` (contrib ops, RNNs,
   control flow, ops whose ONNX function would be slower than a direct form);
2. a function of the model itself (``ModelProto.functions``, as torch's dynamo exporter writes);
3. the function body that ONNX's own schema gives the op (``Swish``, ``Attention``,
   ``SoftmaxCrossEntropyLoss``...), context-dependent ones built for the node's input types.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import BadAttributeError, ShapeError, UnsupportedOperatorError

if TYPE_CHECKING:
    from ..ir import Value

# emitted ONNX-domain nodes are read in this opset's forms, whatever the model's opset
EXPAND_OPSET = 21

Rule = Callable[["Builder"], None]
EXPAND: dict[tuple[str, str], Rule] = {}


def expands(*ops: str, domain: str = "") -> Callable[[Rule], Rule]:
    """Register the decorated function as the expansion of ``ops`` in ``domain``."""

    def add(rule: Rule) -> Rule:
        for op in ops:
            if (domain, op) in EXPAND:
                raise ValueError(f"expansion of {domain or 'ai.onnx'}.{op} registered twice")
            EXPAND[(domain, op)] = rule
        return rule

    return add


def domain_of(node: onnx.NodeProto) -> str:
    return "" if node.domain in ("", "ai.onnx") else node.domain


class Builder:
    """What an expansion rule sees of its node, and how it emits the nodes that replace it."""

    def __init__(self, importer: Any, node: onnx.NodeProto, name: str, attrs: dict, opset: int):
        self._imp = importer
        self.node = node
        self.name = name
        self.op_type = node.op_type
        self.domain = domain_of(node)
        self.attrs = attrs
        self.opset = opset
        self.n_inputs = len(node.input)
        self.n_outputs = len(node.output)

    def input(self, k: int) -> str | None:
        """The name of input ``k``; None where it is absent (an omitted optional input)."""
        return self.node.input[k] if k < len(self.node.input) and self.node.input[k] else None

    def output(self, k: int) -> str:
        """The name of output ``k``; "" where the model leaves it unused."""
        return self.node.output[k] if k < len(self.node.output) else ""

    def used(self, k: int) -> bool:
        """Whether output ``k`` is read by a later node or is a graph output."""
        return bool(self.output(k)) and self.output(k) in self._imp.used

    def value(self, name: str) -> Value:
        try:
            return self._imp.values[name]
        except KeyError:
            raise ShapeError(self.op_type, self.name, f"tensor {name!r} is never defined") from None

    def graph_attr(self, name: str) -> onnx.GraphProto:
        for a in self.node.attribute:
            if a.name == name and a.type == onnx.AttributeProto.GRAPH:
                return a.g
        self.bad(f"missing graph attribute {name!r}")

    def fresh(self, hint: str = "t") -> str:
        while True:
            name = f"{self.name}/{hint}_{next(self._imp.serial)}"
            if name not in self._imp.values and name not in self._imp.names:
                return name

    def op(
        self,
        op_type: str,
        inputs: list[str | None],
        outputs: list[str] | None = None,
        n_outputs: int = 1,
        domain: str = "",
        opset: int | None = None,
        **attrs: Any,
    ) -> str | list[str]:
        """Emit one node and import it; its output name, or names when it has several."""
        outs = (
            list(outputs)
            if outputs is not None
            else [self.fresh(op_type) for _ in range(n_outputs)]
        )
        attrs = {
            k: numpy_helper.from_array(np.asarray(v)) if isinstance(v, np.ndarray) else v
            for k, v in attrs.items()
            if v is not None
        }
        proto = helper.make_node(
            op_type,
            [i or "" for i in inputs],
            outs,
            name=self.fresh(op_type),
            domain=domain,
            **attrs,
        )
        if opset is None:
            opset = EXPAND_OPSET if domain in ("", "ai.onnx") else self._imp.opsets.get(domain, 1)
        self._imp.node(proto, opset)
        return outs[0] if len(outs) == 1 else outs

    def const(self, array: Any, dtype: Any = None) -> str:
        """A constant tensor; its name."""
        from .importer import _const  # the importer imports this module

        name = self.fresh("c")
        arr = np.asarray(array, dtype=dtype)
        self._imp.values[name] = _const(name, arr, self.op_type, self.name, self.opset)
        return name

    def fail(self, detail: str) -> None:
        raise UnsupportedOperatorError(self.op_type, self.name, self.opset, detail)

    def bad(self, detail: str) -> None:
        raise BadAttributeError(self.op_type, self.name, detail)


def run_rule(rule: Rule, b: Builder) -> None:
    """Run an expansion and check that it wrote every output the model reads."""
    rule(b)
    for k in range(b.n_outputs):
        if b.used(k) and b.output(k) not in b._imp.values:
            b.fail(f"its output {k} ({b.output(k)!r}), which the expansion does not compute")


# --- functions: the model's own, and ONNX's schema bodies ---------------------------------------


def schema_function(node: onnx.NodeProto, opset: int, types: list[onnx.TypeProto | None]):
    """The FunctionProto ONNX's schema gives ``node`` at ``opset``, or None."""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, domain_of(node))
    except onnx.defs.SchemaError:
        return None
    fn = onnx.FunctionProto()
    plain = [v for v in schema.function_opset_versions if v <= opset]
    if plain:
        fn.ParseFromString(schema.get_function_with_opset_version(max(plain)))
        return fn
    ctx = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    if not ctx or any(t is None for t in types):
        return None
    body = schema.get_context_dependent_function_with_opset_version(
        max(ctx), node.SerializeToString(), [t.SerializeToString() for t in types]
    )
    if not body:
        return None
    fn.ParseFromString(body)
    return fn if fn.node else None


def schema_attributes(node: onnx.NodeProto, opset: int) -> dict[str, onnx.AttributeProto]:
    """The node's attributes, with the schema's defaults for those it leaves out."""
    found = {a.name: a for a in node.attribute}
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, domain_of(node))
    except onnx.defs.SchemaError:
        return found
    for name, a in schema.attributes.items():
        if name not in found and a.default_value.type != onnx.AttributeProto.UNDEFINED:
            found[name] = a.default_value
    return found


def renamed_graph(g: onnx.GraphProto, rename: dict[str, str]) -> onnx.GraphProto:
    """A copy of subgraph ``g`` whose references to outer names follow ``rename``."""
    g2 = onnx.GraphProto()
    g2.CopyFrom(g)
    inner = {i.name for i in g2.input} | {t.name for t in g2.initializer}
    inner |= {o for n in g2.node for o in n.output}
    outer = {k: v for k, v in rename.items() if k not in inner}
    for n in g2.node:
        n.input[:] = [outer.get(i, i) for i in n.input]
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                a.g.CopyFrom(renamed_graph(a.g, outer))
    for o in g2.output:
        o.name = outer.get(o.name, o.name)
    return g2


def inline_function(
    b: Builder, fn: onnx.FunctionProto, attributes: dict[str, onnx.AttributeProto]
) -> None:
    """Emit ``fn``'s body in place of the node: formal names bound to the node's, every inner
    name made fresh, attribute references (``ref_attr_name``) filled from ``attributes``."""
    rename: dict[str, str] = {}
    for k, formal in enumerate(fn.input):
        rename[formal] = b.input(k) or ""
    for k, formal in enumerate(fn.output):
        rename[formal] = b.output(k) or b.fresh(formal)
    defaults = {a.name: a for a in fn.attribute_proto}
    opsets = {
        (imp.domain if imp.domain != "ai.onnx" else ""): imp.version for imp in fn.opset_import
    }
    for n in fn.node:
        new = onnx.NodeProto()
        new.CopyFrom(n)
        new.input[:] = [rename.get(i, i) if i else "" for i in n.input]
        for o in n.output:
            if o and o not in rename:
                rename[o] = b.fresh(o)
        new.output[:] = [rename.get(o, "") if o else "" for o in n.output]
        del new.attribute[:]
        for a in n.attribute:
            if a.ref_attr_name:
                src = attributes.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
                if src is None:
                    continue  # an optional attribute the node leaves out
                a2 = onnx.AttributeProto()
                a2.CopyFrom(src)
                a2.name = a.name
                new.attribute.append(a2)
            elif a.type == onnx.AttributeProto.GRAPH:
                a2 = onnx.AttributeProto()
                a2.CopyFrom(a)
                a2.g.CopyFrom(renamed_graph(a.g, rename))
                new.attribute.append(a2)
            else:
                new.attribute.append(a)
        new.name = b.fresh(n.op_type)
        dom = domain_of(new)
        b._imp.node(new, opsets.get(dom, EXPAND_OPSET if dom == "" else b._imp.opsets.get(dom, 1)))


def type_proto(v: Value | None) -> onnx.TypeProto | None:
    if v is None:
        return None
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(v.dtype))
    return helper.make_tensor_type_proto(elem, list(v.shape))


def _load_rules() -> None:
    from . import expansions

    for info in pkgutil.iter_modules(expansions.__path__):
        importlib.import_module(f"{expansions.__name__}.{info.name}")


_load_rules()
