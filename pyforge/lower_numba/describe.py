"""A plan's description: the optimised graph that lowering consumed, as plain JSON without the
weights, and its strict reading back. ``pyforge.load`` lowers a saved plan's description again
with this emitter, so the only kernel code a load imports is what pyforge writes for it.

    desc = describe(graph, plan, {"specialize": False, "conv": "im2col", "conv_tile": None})
    steps, kernels = regenerate(desc, plan)    # ModelLoadError on anything not strictly typed

Every string that reaches the description is checked on the way in and out: names against
``_NAME``, string attributes against ``_WORD`` (modes, einsum terms), ops against the op table.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..errors import ModelLoadError
from ..exec.plan import ExecutionPlan
from ..ir import FusedGroup, Graph, Node, Value
from ..ops.registry import OPS, infer_node
from .build_plan import typed_steps
from .lower import lower_graph
from .scalar import TYPE_NAMES

_NAME = re.compile(r"[A-Za-z0-9_.:/@#+\[\] -]{1,256}")
_WORD = re.compile(r"[A-Za-z0-9_.,>-]{0,64}")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")  # op and attribute names
_TILE = re.compile(r"[0-9xs/]{1,32}")
INLINE = 64  # constants up to this size are written out; larger ones are read from weights.bin
_DEPTH = 4  # nesting of lists in an attribute
_DTYPES = frozenset(t.str for t in TYPE_NAMES)  # the dtypes kernels are written for


class _Bad(Exception):
    """A field that is not strictly typed; ``ModelLoadError`` (load) or a refused save."""


def _check(pattern: re.Pattern, s: Any, what: str) -> str:
    if not isinstance(s, str) or not pattern.fullmatch(s):
        raise _Bad(f"{what}: {str(s)[:80]!r} is not an allowed string")
    return s


def describe(graph: Graph, plan: ExecutionPlan, options: dict[str, Any]) -> dict[str, Any]:
    """The graph as JSON; a graph that cannot be described strictly gives {"refused": why}, which
    ``ExecutionPlan.save`` reports (the plan still runs in this process)."""
    values: dict[str, Any] = {}

    def ref(v: Value | None) -> str | None:
        if v is not None and v.name not in values:
            values[_check(_NAME, v.name, "value name")] = _value(v, plan)
        return None if v is None else v.name

    def node(n: Node) -> dict[str, Any]:
        where = f"node {n.name!r} ({n.op})"
        d = {
            "op": n.op,
            "name": _check(_NAME, n.name, where) if n.name else "",
            "opset": n.opset,
            "attrs": {
                _check(_KEY, k, where): _enc(a, f"{where} attribute {k!r}")
                for k, a in n.attrs.items()
            },
            "inputs": [ref(v) for v in n.inputs],
            "outputs": [ref(v) for v in n.outputs],
        }
        if n.group is not None:
            members = [node(m) for m in n.group.members]
            d["group"] = {"anchored": n.group.anchor is not None, "members": members}
        return d

    try:
        return {
            "options": options,
            "inputs": [ref(v) for v in graph.inputs],
            "nodes": [node(n) for n in graph.nodes],
            "outputs": [ref(v) for v in graph.outputs],
            "values": values,
        }
    except _Bad as e:
        return {"refused": str(e)}


def _value(v: Value, plan: ExecutionPlan) -> dict[str, Any]:
    d: dict[str, Any] = {"shape": [int(s) for s in v.shape], "dtype": np.dtype(v.dtype).str}
    if v.const is not None:
        slot = plan.slots.get(v.name)
        stored = slot is not None and slot.region == "weights" and slot.dtype == d["dtype"]
        if v.size > INLINE and stored and v.const.dtype == v.dtype and v.const.shape == v.shape:
            d["const"] = "weights"
        else:
            d["const"] = {"dtype": v.const.dtype.str, "values": v.const.ravel().tolist()}
    return d


def _enc(v: Any, where: str) -> Any:
    if v is None or type(v) in (bool, int, float):
        return v
    if isinstance(v, str):
        return _check(_WORD, v, where)
    if isinstance(v, np.dtype):
        return {"dtype": v.str}
    if isinstance(v, np.generic):
        return {"dtype": v.dtype.str, "scalar": v.item()}
    if isinstance(v, tuple | list):
        items = [_enc(x, where) for x in v]
        return {"tuple": items} if isinstance(v, tuple) else items
    if isinstance(v, dict):
        return {"dict": [[_check(_WORD, k, where), _enc(x, where)] for k, x in v.items()]}
    raise _Bad(f"{where}: a {type(v).__name__} is not describable")


def _dtype(s: Any, where: str) -> np.dtype:
    if not isinstance(s, str) or s not in _DTYPES:
        raise _Bad(f"{where}: {str(s)[:40]!r} is not a known dtype")
    return np.dtype(s)


def _dec(v: Any, where: str, depth: int = 0) -> Any:
    """An attribute read back: an int, float, bool, allowed string, dtype, or lists of them."""
    if depth > _DEPTH:
        raise _Bad(f"{where}: nested too deep")
    if v is None or type(v) in (bool, int, float):
        return v
    if type(v) is str:
        return _check(_WORD, v, where)
    if type(v) is list:
        return [_dec(x, where, depth + 1) for x in v]
    keys = set(v) if type(v) is dict else None
    if keys == {"dtype"}:
        return _dtype(v["dtype"], where)
    if keys == {"dtype", "scalar"} and type(v["scalar"]) in (bool, int, float):
        return _dtype(v["dtype"], where).type(v["scalar"])
    if keys == {"tuple"} and type(v["tuple"]) is list:
        return tuple(_dec(x, where, depth + 1) for x in v["tuple"])
    if keys == {"dict"} and type(v["dict"]) is list and all(_pair(p) for p in v["dict"]):
        return {_check(_WORD, k, where): _dec(x, where, depth + 1) for k, x in v["dict"]}
    raise _Bad(f"{where}: {str(v)[:80]!r} is not an int, float, bool, allowed string or list")


def _is_count(v: Any) -> bool:
    return type(v) is int and v >= 0


def _pair(p: Any) -> bool:
    return type(p) is list and len(p) == 2


def _fields(d: Any, where: str, required: set[str], optional: frozenset = frozenset()) -> dict:
    if type(d) is not dict or not required <= set(d) <= required | optional:
        raise _Bad(f"{where}: not an object with the fields {sorted(required)}")
    return d


def _read_value(name: Any, d: Any, plan: ExecutionPlan) -> Value:
    where = f"value {_check(_NAME, name, 'value name')!r}"
    _fields(d, where, {"shape", "dtype"}, frozenset({"const"}))
    shape = d["shape"]
    if type(shape) is not list or len(shape) > 16 or not all(_is_count(s) for s in shape):
        raise _Bad(f"{where}, field 'shape': {str(shape)[:80]} is not a list of sizes")
    dtype, const, slot = _dtype(d["dtype"], where), d.get("const"), plan.slots.get(name)
    if slot is not None and (tuple(slot.shape) != tuple(shape) or np.dtype(slot.dtype) != dtype):
        raise _Bad(
            f"{where}: {shape} x {dtype} is not its slot's {list(slot.shape)} x {slot.dtype}"
        )
    if const == "weights":
        if slot is None or slot.region != "weights":
            raise _Bad(f"{where}, field 'const': no weights slot holds it")
        const = plan.weights[slot.offset : slot.offset + slot.nbytes].view(dtype).reshape(shape)
    elif const is not None:
        const = _fields(const, f"{where}, field 'const'", {"dtype", "values"})
        kind, values = _dtype(const["dtype"], where).kind, const["values"]
        ok = {"b": (bool,), "i": (int,), "u": (int,), "f": (int, float)}.get(kind, ())
        if type(values) is not list or not all(type(x) in ok for x in values):
            raise _Bad(f"{where}, field 'const': not a list of {kind!r} numbers")
        if len(values) != int(np.prod(shape, dtype=np.int64)):
            raise _Bad(f"{where}, field 'const': {len(values)} values for shape {shape}")
        const = np.array(values, const["dtype"]).reshape(shape)
    return Value(name, tuple(shape), dtype, const)


def _read_node(d: Any, values: dict[str, Value], top: bool) -> Node:
    where = f"node {str(d.get('name') if type(d) is dict else d)[:80]!r}"
    d = _fields(d, where, {"op", "name", "opset", "attrs", "inputs", "outputs"}, {"group"})
    op, name = _check(_KEY, d["op"], f"{where}, field 'op'"), d["name"]
    where = f"node {_check(_NAME, name, where) if name else ''!r} ({op})"
    if not (op in OPS or (op == "Fused" and top)) or ("group" in d) != (op == "Fused"):
        raise _Bad(f"{where}, field 'op': not an op this pyforge lowers there")
    if not _is_count(d["opset"]) or type(d["attrs"]) is not dict:
        raise _Bad(f"{where}: field 'opset' or 'attrs' malformed")
    attrs = {
        _check(_KEY, k, where): _dec(a, f"{where} attribute {k!r}") for k, a in d["attrs"].items()
    }
    ins, outs = d["inputs"], d["outputs"]
    if type(ins) is not list or type(outs) is not list or not outs:
        raise _Bad(f"{where}: field 'inputs' or 'outputs' malformed")
    unknown = [v for v in ins + outs if v is not None and (type(v) is not str or v not in values)]
    if unknown or None in outs:
        raise _Bad(f"{where}: {str(unknown[:1])[:80]} is not a described value")
    node = Node(op, [None if v is None else values[v] for v in ins], [values[v] for v in outs])
    node.attrs, node.name, node.opset = attrs, name, d["opset"]
    if op == "Fused":
        g = _fields(d["group"], f"{where}, field 'group'", {"anchored", "members"})
        members = g["members"]
        if type(g["anchored"]) is not bool or type(members) is not list or not members:
            raise _Bad(f"{where}, field 'group' malformed")
        members = [_read_node(m, values, False) for m in members]
        node.group = FusedGroup(members, members[0] if g["anchored"] else None)
    elif OPS[op].infer is not None:  # shapes a kernel indexes by must be the op's own
        got = [(tuple(s), np.dtype(t)) for s, t in infer_node(node)][: len(outs)]
        if got != [(v.shape, np.dtype(v.dtype)) for v in node.outputs]:
            raise _Bad(f"{where}: outputs {node.outputs} are not the op's shapes {got}")
    return node


def read_graph(desc: Any, plan: ExecutionPlan) -> tuple[Graph, dict[str, Any]]:
    """The graph and lowering options a description holds, every field strictly checked."""
    desc = _fields(desc, "description", {"options", "inputs", "nodes", "outputs", "values"})
    opts = _fields(desc["options"], "options", {"specialize", "conv", "conv_tile"})
    tile = opts["conv_tile"]
    if type(opts["specialize"]) is not bool or opts["conv"] not in ("im2col", "implicit"):
        raise _Bad("options: 'specialize' or 'conv' is not allowed")
    if tile is not None:
        _check(_TILE, tile, "options 'conv_tile'")
    if type(desc["values"]) is not dict or type(desc["nodes"]) is not list:
        raise _Bad("field 'values' or 'nodes' malformed")
    values = {k: _read_value(k, v, plan) for k, v in desc["values"].items()}
    graph = Graph()
    for field in ("inputs", "outputs"):
        names = desc[field]
        if type(names) is not list or not all(type(n) is str and n in values for n in names):
            raise _Bad(f"field {field!r}: not a list of described values")
        setattr(graph, field, [values[n] for n in names])
    for d in desc["nodes"]:
        graph.add_node(_read_node(d, values, True))
    graph.verify()  # SSA, order, groups reading only what precedes them
    return graph, dict(opts)


def regenerate(desc: Any, plan: ExecutionPlan) -> tuple[list, dict[str, dict[str, str]]]:
    """The steps and kernel sources this pyforge lowers the description to."""
    try:
        graph, options = read_graph(desc, plan)
        return typed_steps(lower_graph(graph, **options))
    except _Bad as e:
        raise ModelLoadError(f"plan.json: field 'description', {e}") from None
    except Exception as e:  # noqa: BLE001  (well-typed but inconsistent data: still refused)
        why = f"{type(e).__name__}: {e}"
        raise ModelLoadError(f"plan.json: field 'description' does not lower ({why})") from None
