"""If, Loop and Scan as expansions: a subgraph is inlined once per use, its names made fresh.

Shapes are static and constants fold as nodes are imported, so a branch whose condition folds
is the only one inlined, and a Loop or Scan whose trip count is known unrolls into straight-line
code the passes then optimise like any other (fusion across iterations included).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...errors import DataDependentError
from ..expand import Builder, expands, renamed_graph

MAX_ITERATIONS = 4096  # unrolled iterations of one Loop or Scan; more is refused


def _inline(b: Builder, g: onnx.GraphProto, bound: dict[str, str]) -> list[str]:
    """Emit the nodes of subgraph ``g`` with its inputs bound to ``bound``; its output names.

    Every name ``g`` defines gets a fresh name, so the same body inlined twice never collides;
    names from outer scopes are kept, and a nested subgraph (an If in a Loop body) is given a
    copy whose references to renamed names follow the renaming."""
    if len(g.sparse_initializer):
        b.fail(f"subgraph {g.name!r} has sparse initializers")
    env = dict(bound)
    for t in g.initializer:
        env[t.name] = b.const(numpy_helper.to_array(t))
    for n in g.node:
        attrs = {}
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPHS:
                b.fail(f"node {n.name!r} ({n.op_type}) in subgraph {g.name!r} takes graph lists")
            value = helper.get_attribute_value(a)
            if a.type == onnx.AttributeProto.GRAPH:
                value = renamed_graph(value, env)
            if not (isinstance(value, list) and not value):  # an empty list has no ONNX type
                attrs[a.name] = value
        outs = [b.fresh(o) if o else "" for o in n.output]
        domain = "" if n.domain in ("", "ai.onnx") else n.domain
        inputs = [env.get(i, i) if i else "" for i in n.input]
        opset = b.opset if domain == "" else None  # a subgraph's nodes follow the model's opset
        b.op(n.op_type, inputs, outputs=outs, domain=domain, opset=opset, **attrs)
        env.update((o, new) for o, new in zip(n.output, outs) if o)
    return [env.get(o.name, o.name) for o in g.output]


def _write(b: Builder, names: list[str], first: int = 0) -> None:
    """Make results ``names`` the node's outputs ``first``, ``first + 1``..."""
    for k, name in enumerate(names, first):
        if b.output(k):
            b.op("Identity", [name], outputs=[b.output(k)])


def _stack(b: Builder, names: list[str], axis: int, k: int, what: str) -> None:
    """Write output ``k`` as the tensors ``names`` stacked along a new ``axis``."""
    if not b.output(k):
        return
    if not names:
        b.fail(f"{what} of zero iterations: the shape of its slices is never computed")
    rank = len(b.value(names[0]).shape) + 1
    if not -rank <= axis < rank:
        b.bad(f"{what}: axis {axis} is outside [-{rank}, {rank})")
    axes = b.const(np.array([axis % rank], np.int64))
    b.op("Concat", [b.op("Unsqueeze", [n, axes]) for n in names], outputs=[b.output(k)], axis=axis)


def _scalar(b: Builder, declared: onnx.ValueInfoProto, value, dtype) -> str:
    """A constant fed to a body input of rank 0 or 1 (the body declares which, ORT follows it)."""
    t = declared.type.tensor_type
    rank = len(t.shape.dim) if t.HasField("shape") else 0
    return b.const(np.full([1] * rank, value, dtype))


def _flag(b: Builder, name: str, what: str) -> bool | int:
    """The single element of a constant tensor, or a refusal naming what was not constant."""
    v = b.value(name)
    if v.const is None:  # compile() runs the model in stages where the name allows it
        detail = (
            f"its {what} {name!r} is computed at run time, and the outputs' shapes depend on it"
        )
        raise DataDependentError(b.op_type, b.name, b.opset, detail, [name])
    if v.const.size != 1:
        b.bad(f"its {what} {name!r} has {v.const.size} elements; it must have one")
    return v.const.reshape(()).item()


@expands("If")
def _if(b: Builder) -> None:
    """A constant condition inlines its branch alone. A run-time one inlines both branches and
    picks each output with Where: sound because an ONNX branch is a pure function of the values
    it reads (no state, no side effects), so computing the untaken one changes nothing but time.
    The cost is both branches on every call (cpu, x[64, 256]: a MatMul+Relu branch 0.12 ms, a
    MatMul+Tanh one 0.45 ms, the If 0.62 ms, their sum: the Where fuses into a GEMM epilogue).
    What it buys is a plan that stays straight-line (one CUDA graph replay, one arena plan,
    fusion across the If), where a sub-plan per branch would read the condition on the host (a
    device sync) and split the graph. Caveats: a run-time error the untaken branch would raise
    (a Gather index out of range) is raised too; a NaN it makes does not leak, as Where selects
    element by element. Branches whose outputs differ in shape or dtype are refused: the output
    shape would depend on data."""
    cond = b.value(b.input(0))
    if cond.const is not None:
        taken = "then_branch" if _flag(b, b.input(0), "condition") else "else_branch"
        _write(b, _inline(b, b.graph_attr(taken), {}))
        return
    if int(np.prod(cond.shape)) != 1:
        b.bad(f"its condition has shape {list(cond.shape)}; it must have one element")
    then = _inline(b, b.graph_attr("then_branch"), {})
    other = _inline(b, b.graph_attr("else_branch"), {})
    if len(then) != len(other) or len(then) < b.n_outputs:
        b.bad(f"its branches give {len(then)} and {len(other)} outputs for {b.n_outputs}")
    scalar = b.op("Reshape", [b.input(0), b.const(np.zeros(0, np.int64))])
    for k, (t, e) in enumerate(zip(then, other)):
        vt, ve = b.value(t), b.value(e)
        if (vt.shape, vt.dtype) != (ve.shape, ve.dtype):
            b.fail(
                f"output {k} is {vt.dtype}{list(vt.shape)} from then_branch and "
                f"{ve.dtype}{list(ve.shape)} from else_branch, and the condition is known only "
                "at run time: a data-dependent output shape"
            )
        if b.output(k):
            b.op("Where", [scalar, t, e], outputs=[b.output(k)])


@expands("Loop")
def _loop(b: Builder) -> None:
    """Unrolled: a constant trip count M and a condition that folds in every iteration (the
    iteration number and incoming condition are constants in each copy of the body), stopping
    where the condition turns false. Scan outputs are stacked along a new axis 0."""
    body = b.graph_attr("body")
    n = b.n_inputs - 2
    if len(body.input) != n + 2 or len(body.output) < n + 1:
        b.bad(
            f"its body takes {len(body.input)} inputs and gives {len(body.output)} outputs "
            f"for {n} carried values"
        )
    trip = None if b.input(0) is None else int(_flag(b, b.input(0), "trip count M"))
    keep = True if b.input(1) is None else bool(_flag(b, b.input(1), "condition"))
    if trip is None and b.input(1) is None:
        b.fail("it has neither a trip count nor a condition: it never ends")
    carried = [b.input(2 + k) for k in range(n)]
    scans: list[list[str]] = []
    i = 0
    while keep and (trip is None or i < trip):
        if i == MAX_ITERATIONS:
            b.fail(f"it runs more than {MAX_ITERATIONS} iterations, the most pyforge unrolls")
        feeds = [_scalar(b, body.input[0], i, np.int64), _scalar(b, body.input[1], keep, bool)]
        res = _inline(b, body, dict(zip([v.name for v in body.input], feeds + carried)))
        keep = bool(_flag(b, res[0], "condition (body output 0)"))
        carried, i = res[1 : n + 1], i + 1
        scans.append(res[n + 1 :])
    _write(b, carried)
    for j in range(len(body.output) - n - 1):
        _stack(b, [s[j] for s in scans], 0, n + j, f"scan output {j}")


@expands("Scan")
def _scan(b: Builder) -> None:
    """Unrolled over the scan axis: iteration i feeds slice i of each scan input (the last
    slice first where its direction is 1) and stacks its scan outputs along their axes."""
    if b.opset < 9:
        b.fail("opset 8's batched form (sequence_lens, a batch axis); opset 9+ Scan only")
    body, m = b.graph_attr("body"), int(b.attrs["num_scan_inputs"])
    n = b.n_inputs - m
    k = len(body.output) - n
    if n < 0 or len(body.input) != n + m or k < 0:
        b.bad(
            f"its body takes {len(body.input)} inputs and gives {len(body.output)} outputs "
            f"for {n} states and {m} scan inputs"
        )

    def ints(name: str, count: int) -> list[int]:
        got = list(b.attrs.get(name) or [0] * count)
        if len(got) != count:
            b.bad(f"{name} has {len(got)} entries for {count}")
        return got

    in_axes, in_dirs = ints("scan_input_axes", m), ints("scan_input_directions", m)
    out_axes, out_dirs = ints("scan_output_axes", k), ints("scan_output_directions", k)
    xs, lengths = [b.input(n + j) for j in range(m)], set()
    for j, x in enumerate(xs):
        r = len(b.value(x).shape)
        if not -r <= in_axes[j] < r:
            b.bad(f"scan_input_axes[{j}] = {in_axes[j]} is outside [-{r}, {r})")
        in_axes[j] %= r
        lengths.add(b.value(x).shape[in_axes[j]])
    if len(lengths) != 1:
        b.bad(f"its scan inputs have different lengths {sorted(lengths)} along their axes")
    length = lengths.pop()
    if length > MAX_ITERATIONS:
        b.fail(f"it scans {length} slices, more than the {MAX_ITERATIONS} pyforge unrolls")
    states = [b.input(j) for j in range(n)]
    outs: list[list[str]] = []
    for i in range(length):
        slices = [
            b.op("Gather", [x, b.const(np.array(length - 1 - i if d else i, np.int64))], axis=a)
            for x, a, d in zip(xs, in_axes, in_dirs)
        ]
        res = _inline(b, body, dict(zip([v.name for v in body.input], states + slices)))
        states = res[:n]
        outs.append(res[n:])
    _write(b, states)
    for j in range(k):
        col = [o[j] for o in (reversed(outs) if out_dirs[j] else outs)]
        _stack(b, col, out_axes[j], n + j, f"scan output {j}")
