"""Where a QDQ model's evaluations part: every (Dynamic)QuantizeLinear output of pyforge against ORT with
its graph optimisations off (which runs the QDQ graph as written), the first one that differs,
and at each element where it differs the exact (float64) value of x / scale beside both.

    python scripts/qdq_divergence.py minilm_l6_qstatic|minilm_l6_qdyn [--run 0|1]

A float32 sum in another order moves x / scale by about 1e-6 steps; where that is a rounding
tie (k + 0.5) the two round apart by one step, and every later layer re-quantises the
difference, so one flip grows into many. Models come from benchmarks/corpus.py's cache.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyforge
from benchmarks import corpus

DYNAMIC = "DynamicQuantizeLinear"  # scale and zero point are outputs, computed from x


def _values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    got = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute[0].name == "value":
            got[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return got


def _matmul_before(model: onnx.ModelProto, q: onnx.NodeProto) -> onnx.NodeProto | None:
    src = next((n for n in model.graph.node if q.input[0] in n.output), None)
    return src if src is not None and src.op_type == "MatMul" else None


def _exact(model, q: onnx.NodeProto, ref: dict) -> np.ndarray | None:
    """The float64 product of the MatMul a QuantizeLinear reads, from ORT's float32 operands
    (pyforge's equal them while the quantised tensors before agree); None for other ops."""
    src = _matmul_before(model, q)
    if src is None or any(i not in ref for i in src.input):
        return None
    a, b = (ref[i].astype(np.float64) for i in src.input)
    return a @ b


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a corpus model name (benchmarks/corpus.py --list)")
    ap.add_argument("--run", type=int, default=0, choices=(0, 1), help="which corpus shape")
    args = ap.parse_args()
    entry = corpus.ENTRIES[args.model]
    path = corpus.model_path(entry)
    feeds = corpus.make_feeds(path, entry, args.run, seed=args.run + 1)
    model = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    info = {v.name: v for v in model.graph.value_info}
    quants = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", DYNAMIC)]
    outs = {o.name for o in model.graph.output}
    mms = [m for m in (_matmul_before(model, q) for q in quants) if m is not None]
    for name in [x for q in quants for x in (q.input[0], *q.output)] + [
        i for m in mms for i in m.input
    ]:
        if name not in outs and name in info:
            model.graph.output.append(info[name])
            outs.add(name)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    got = pyforge.compile(model, target="cpu").predict(feeds)
    consts, first = _values(model), None
    for q in quants:
        a, b = np.asarray(got[q.output[0]]).astype(int), ref[q.output[0]].astype(int)
        diff = np.argwhere(a != b)
        if len(diff):
            print(f"{q.output[0]}: {len(diff)} of {a.size} differ, by up to {np.abs(a - b).max()}")
            first = first or (q, diff)
    if first is None:
        print("every QuantizeLinear output equals ORT's (optimisations off)")
        return 0
    q, diff = first
    if q.op_type == DYNAMIC:  # each side's own scale and zero point (outputs of the node)
        sides = [(src, float(src[q.output[1]]), float(src[q.output[2]])) for src in (got, ref)]
    else:
        sides = [(src, float(consts[q.input[1]].reshape(())), 0.0) for src in (got, ref)]
    exact = _exact(model, q, ref) if q.op_type != DYNAMIC else None
    print(f"first: {q.name} (scale pyforge {sides[0][1]:.9g}, ORT {sides[1][1]:.9g})")
    for at in (tuple(int(i) for i in d) for d in diff[:8]):
        x = "" if exact is None else f"exact {exact[at] / sides[1][1]:.9f}  "
        pf, rt = ((float(np.asarray(src[q.input[0]])[at]) / sc + zp) for src, sc, zp in sides)
        print(f"  {at}: x/scale + zero point {x}pyforge {pf:.9f}  ORT {rt:.9f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
