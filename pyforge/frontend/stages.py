"""A model cut in two around a node that needs run-time data (``DataDependentError``).

The first stage computes every node imported before it (what it needs among them), and every
value of its own that the rest reads;
between the stages the node runs on the host when its output shape depends on its data
(NonZero, NonMaxSuppression...), and the tensors it needs as constants (a shape, pads, k) are
read; the second stage is then an ordinary model with static shapes, built for each run's
shapes and values, and cut again if it too needs run-time data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import DataDependentError
from .checks import outer_names


def node_reads(node: onnx.NodeProto) -> list[str]:
    return [n for n in [*node.input, *outer_names(node)] if n]


_DRAWS = ("Random", "Bernoulli", "Multinomial")  # a copy would draw other numbers
_GRAPH_KINDS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


def _has_body(node: onnx.NodeProto) -> bool:
    return any(a.type in _GRAPH_KINDS for a in node.attribute)


def _static(g: onnx.GraphProto, inits: set[str], reads: list[list[str]]) -> set[int]:
    """The nodes computed from constants alone: both stages compute them, so a constant the
    first stage reads stays a constant of the second (a Slice's axes, say)."""
    known, found = set(inits), set()
    for i, n in enumerate(g.node):
        pure = (
            not _has_body(n)
            and not n.op_type.startswith(_DRAWS)
            and (n.input or n.op_type == "Constant")
        )
        if pure and all(r in known for r in reads[i]):
            found.add(i)
            known.update(n.output)
    return found


@dataclass
class Cut:
    first: onnx.ModelProto | None  # None: the graph inputs already hold what the node needs
    first_inputs: list[str]
    first_outputs: list[str]
    host: onnx.NodeProto | None  # run on the host between the stages
    constants: list[str]  # tensors the second stage takes as constants of this run's values
    rest_inputs: list[str]  # what the second stage reads from the run so far
    outputs: list[str]  # the model's outputs, in order
    _proto: onnx.ModelProto = field(repr=False)
    _rest_nodes: list[onnx.NodeProto] = field(repr=False)
    _rest_reads: set[str] = field(repr=False, default_factory=set)

    def rest(self, arrays: dict[str, np.ndarray]) -> onnx.ModelProto:
        """The second stage for one run: ``constants`` as initializers holding their values,
        the other inputs typed as this run's arrays."""
        g = self._proto.graph
        made = {o for n in self._rest_nodes for o in n.output}
        inputs = [
            helper.make_tensor_value_info(
                n, helper.np_dtype_to_tensor_dtype(arrays[n].dtype), list(arrays[n].shape)
            )
            for n in self.rest_inputs
        ]
        inits = [
            numpy_helper.from_array(np.asarray(arrays[n], order="C"), n) for n in self.constants
        ]
        used = self._rest_reads
        inits += [t for t in g.initializer if t.name in used and t.name not in self.constants]
        outs = [o for o in g.output if o.name in made]
        graph = helper.make_graph(self._rest_nodes, g.name or "rest", inputs, outs, inits)
        return _model(self._proto, graph)


def _model(like: onnx.ModelProto, graph: onnx.GraphProto) -> onnx.ModelProto:
    m = helper.make_model(graph, opset_imports=list(like.opset_import))
    m.ir_version = like.ir_version
    m.functions.extend(like.functions)
    return m


def cut(proto: onnx.ModelProto, err: DataDependentError) -> Cut:
    """Cut ``proto`` at the node ``err`` names (its index ``err.top``). Where what it needs is
    made inside its own If, Loop or Scan body, the whole node runs on the host; ``err`` again
    when the values are not tensors of the model's own graph (made inside a function body)."""
    g = proto.graph
    node = g.node[err.top]
    made_by = {o: i for i, n in enumerate(g.node) for o in n.output if o}
    inits = {t.name for t in g.initializer}
    graph_inputs = [i.name for i in g.input if i.name not in inits]
    top = made_by.keys() | inits | set(graph_inputs)
    host = None if err.values else node
    if any(n not in top for n in err.values) and _has_body(node):
        host = node  # made inside an If or Loop body: the whole node runs on the host
    needs = node_reads(node) if host is not None else list(err.values)
    if any(n not in top for n in needs):
        raise err
    # the first stage: every node the importer took before this one (so the rest, imported
    # again, starts here rather than re-importing the nodes that no later cut needs)
    taken = set(err.taken)
    reads = [node_reads(n) for n in g.node]  # once: each cut of ssdlite walks ~900 nodes often
    static = _static(g, inits, reads)
    first_nodes = [n for i, n in enumerate(g.node) if i in taken]
    # the rest computes again the constant-only nodes it reads (so they stay constants there)
    wanted = {o.name for o in g.output} | set(node_reads(host) if host is not None else ())
    wanted.update(r for i in range(len(g.node)) if i not in taken for r in reads[i])
    for i in reversed([i for i in err.taken if i in static]):
        if wanted.intersection(g.node[i].output):
            wanted.update(reads[i])
        else:
            static.discard(i)
    rest_at = [i for i, n in enumerate(g.node) if (i not in taken or i in static) and n is not host]
    rest_nodes = [g.node[i] for i in rest_at]
    made_first = {o for n in first_nodes for o in n.output if o}
    early = made_first - {o for i in static for o in g.node[i].output}
    read = [r for i in rest_at for r in reads[i]] + [o.name for o in g.output]
    read += node_reads(host) if host is not None else []
    first_outputs = list(
        dict.fromkeys([n for n in needs if n in made_first] + [r for r in read if r in early])
    )
    first_reads = {r for i in sorted(taken) for r in reads[i]}
    first_inputs = [n for n in graph_inputs if n in first_reads]
    constants = [n for n in needs if host is None and n not in inits]
    later = set(host.output) if host is not None else set()
    rest_inputs = list(
        dict.fromkeys(
            r
            for r in read
            if (r in early or r in graph_inputs or r in later) and r not in constants
        )
    )
    first = None
    if first_nodes:
        ins = [i for i in g.input if i.name in first_inputs]
        outs = [onnx.ValueInfoProto(name=n) for n in first_outputs]
        used_inits = [t for t in g.initializer if t.name in first_reads]
        first = _model(proto, helper.make_graph(first_nodes, "first", ins, outs, used_inits))
    return Cut(
        first,
        first_inputs,
        first_outputs,
        host,
        constants,
        rest_inputs,
        [o.name for o in g.output],
        proto,
        rest_nodes,
        {r for i in rest_at for r in reads[i]},
    )


def host_eval(like: onnx.ModelProto, node: onnx.NodeProto, arrays: dict[str, np.ndarray]):
    """Run one node on the host: imported with its inputs as constants, so it folds."""
    from .importer import import_onnx

    names = list(dict.fromkeys(node_reads(node)))
    inits = [
        numpy_helper.from_array(np.asarray(arrays[n], order="C"), n) for n in names if n in arrays
    ]
    inits += [t for t in like.graph.initializer if t.name in names and t.name not in arrays]
    outs = [onnx.ValueInfoProto(name=o) for o in node.output if o]
    graph = import_onnx(_model(like, helper.make_graph([node], "host", [], outs, inits)))
    return {v.name: v.const for v in graph.outputs}
