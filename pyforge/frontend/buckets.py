"""Length buckets: pad a named dim up to the next bucket size, and make the padding exact.

``analyze`` imports the model at two lengths of the bucketed symbol; an axis whose size follows
the length is a position axis. It then walks the graph: ops that keep positions apart
(elementwise, views, GEMMs over other axes, rows over other axes) need nothing; each op that
mixes positions gets its inputs masked at the padded positions, so that no padded value
reaches a real one whatever the model's own attention mask says:

- Softmax / LogSoftmax over a position axis: padded scores become -inf (weight exactly 0);
- a MatMul / Gemm contracting over a position axis: both operands' padded rows become 0;
- ReduceSum / SumSquare / L1 / L2 / LogSum become 0, ReduceMax and ArgMax -inf, ReduceMin and
  ArgMin +inf, ReduceProd 1; CumSum forward runs as it is (a position sees only earlier ones).

Anything else that reads across positions (ReduceMean, LayerNormalization over positions, a
conv or pool along them, Gather of other than position 0, Slice or Pad along them, a position
axis merged with another dim) refuses the bucket, naming the node and op. The mask is an extra
graph input, ``pyforge::valid`` (bool, one per position), that ``predict`` fills.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import OptionError, PyforgeError
from ..ops import OPS

VALID = "pyforge::valid"

_ZERO = ("ReduceSum", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum")
_FILL = {**dict.fromkeys(_ZERO, 0.0), "ReduceProd": 1.0, "ReduceMax": -np.inf}
_FILL |= {"ArgMax": -np.inf, "ReduceMin": np.inf, "ArgMin": np.inf, "ReduceLogSumExp": -np.inf}


# ops that move or keep whole positions (Concat along them makes a dim refused above)
_POSITIONWISE = ("Transpose", "Expand", "Concat", "Tile", "Trilu", "OneHot", "BatchNormalization")
_POSITIONWISE += ("QuantizeLinear", "DequantizeLinear")


@dataclass
class Padding:
    symbol: str
    sizes: list[int]
    inputs: dict[str, int]  # input -> its axis of positions
    outputs: dict[str, list[int]]  # output -> its axes of positions
    masks: dict[str, list[tuple[int, int, float]]] = field(default_factory=dict)

    def bucket(self, length: int) -> int:
        for size in self.sizes:
            if length <= size:
                return size
        raise OptionError(
            "buckets",
            f"length {length} of {self.symbol!r} is over the largest bucket {self.sizes[-1]}",
        )


def analyze(proto, specs, symbol: str, sizes: list[int], fixed: dict) -> Padding:
    """What padding ``symbol`` up to ``sizes`` needs, or an OptionError saying why it is not exact."""
    from .importer import import_onnx

    inputs = {s.name: s.dims.index(symbol) for s in specs if s.dims and symbol in s.dims}
    if not inputs:
        raise OptionError("buckets", f"no input has a dim named {symbol!r}")
    lengths = (sizes[0], sizes[1] if len(sizes) > 1 else sizes[0] + 1)
    graphs = []
    for n in lengths:
        shapes = {}
        for s in specs:
            if s.dims is None:
                raise OptionError("buckets", f"input {s.name!r} has no shape in the file")
            dims = fixed.get(s.name) or [
                n if d == symbol else (d if isinstance(d, int) else 2) for d in s.dims
            ]
            shapes[s.name] = tuple(dims)
        try:
            graphs.append(import_onnx(proto, shapes))
        except PyforgeError as e:
            raise OptionError(
                "buckets", f"the model does not import at {symbol}={n}: {e}"
            ) from None
    g1, g2 = graphs

    def axes(v1, v2) -> tuple[list[int], bool]:
        moved = [a for a, (x, y) in enumerate(zip(v1.shape, v2.shape)) if x != y]
        return [a for a in moved if (v1.shape[a], v2.shape[a]) == lengths], any(
            (v1.shape[a], v2.shape[a]) != lengths for a in moved
        )

    pad = Padding(symbol, sorted(sizes), inputs, {})
    if [(n.name, n.op) for n in g1.nodes] != [(n.name, n.op) for n in g2.nodes]:
        raise OptionError("buckets", f"the graph's nodes differ with {symbol}'s length")
    for n1, n2 in zip(g1.nodes, g2.nodes):
        ins = [axes(a, b) if a is not None else ([], False) for a, b in zip(n1.inputs, n2.inputs)]
        if not any(a or d for a, d in ins):
            continue

        def refuse(why: str, n1=n1):
            raise OptionError(
                "buckets", f"padding {symbol!r} is not exact at node {n1.name!r} ({n1.op}): {why}"
            )

        masks = _rule(n1, ins, refuse)
        if masks:
            pad.masks[n1.name] = masks
    for v1, v2 in zip(g1.outputs, g2.outputs):
        exact, derived = axes(v1, v2)
        if derived:
            raise OptionError(
                "buckets", f"output {v1.name!r}: a dim follows {symbol} but is not its length"
            )
        pad.outputs[v1.name] = exact
    return pad


def _rule(node, ins, refuse) -> list[tuple[int, int, float]]:
    """The masks ``node`` needs on its inputs (index, axis, fill); refuse() where none is exact."""
    kind = OPS[node.op].kind if node.op in OPS else "opaque"
    if any(derived for _, derived in ins) and kind not in ("elementwise", "view"):
        refuse("a dim that follows the length without being it (merged or concatenated)")
    if kind in ("elementwise", "view") or node.op in _POSITIONWISE:
        return []
    if node.op in ("Einsum", "MatMulInteger", "QLinearMatMul", "TopK", "Hardmax"):
        refuse("pyforge does not mask this op's padded positions")
    x_axes = ins[0][0]
    if node.op == "Gather":
        if x_axes and node.attrs["axis"] in x_axes:
            idx = node.inputs[1].const
            if idx is None or np.any(np.asarray(idx) != 0):
                refuse("a Gather along the positions other than of position 0")
        return []
    if node.op == "MatMul":
        a, b = node.inputs[0].shape, node.inputs[1].shape
        ka, kb = len(a) - 1, max(len(b) - 2, 0)
        hit = ka in ins[0][0] or kb in ins[1][0]
        return [(0, ka, 0.0), (1, kb, 0.0)] if hit else []
    if node.op == "Gemm":
        ka, kb = int(node.attrs["transA"] == 0), int(node.attrs["transB"] != 0)
        hit = ka in ins[0][0] or kb in ins[1][0]
        return [(0, ka, 0.0), (1, kb, 0.0)] if hit else []
    if node.op in ("Softmax", "LogSoftmax"):
        axis = node.attrs["axis"]
        span = range(axis, len(node.inputs[0].shape)) if node.attrs.get("flatten") else [axis]
        hit = [a for a in span if a in x_axes]
        if hit and len(span) > 1:
            refuse("a pre-13 Softmax over several axes, positions among them")
        return [(0, axis, -np.inf)] if hit else []
    if node.op in _FILL:
        reduced = node.attrs.get("axes", [node.attrs.get("axis")])
        hit = [a for a in reduced if a in x_axes]
        return [(0, a, _FILL[node.op]) for a in hit]
    if node.op == "CumSum":
        if node.attrs["axis"] in x_axes and node.attrs["reverse"]:
            refuse("a reverse CumSum along the positions")
        return []
    if kind in ("rows", "reduce"):
        reduced = node.attrs.get("axes") or [node.attrs.get("axis")]
        if node.op in ("LayerNormalization", "RMSNormalization"):
            reduced = range(node.attrs["axis"], len(node.inputs[0].shape))
        if any(a in x_axes for a in reduced) or node.op in (
            "GroupNormalization",
            "InstanceNormalization",
        ):
            refuse("it reduces over the positions, and padding changes its count")
        return []
    if kind == "injective" and node.op in ("Slice", "Pad", "Split") and x_axes:
        moved = [a for a in x_axes if node.outputs[0].shape[a] != node.inputs[0].shape[a]]
        if moved:
            refuse("it cuts or pads along the positions")
        return []
    if kind == "gemm" and node.op == "Conv" or kind == "window":
        if any(a >= 1 for a in x_axes):
            refuse("a window or conv along the positions")
        return []
    refuse("pyforge does not know how this op treats positions")
