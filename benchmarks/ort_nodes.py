"""pyforge's steps against ONNX Runtime's nodes, anchor by anchor, on the cpu (issue 17).

    python benchmarks/ort_nodes.py MODEL [--rounds 30] [--top 25]

MODEL is a corpus name (benchmarks/corpus.py's cache) or an .onnx path. Each round runs pyforge's
plan step by step (``runtime.calls`` timed one by one) and one ORT inference with its profiler on
(2 intra-op threads, spinning off), 20 ms apart. Both sides' times are charged to an *anchor*:
the Conv, MatMul or Gemm a fused node chain starts from (an elementwise node is walked back
through its first input to one), so a step "Conv+Add+Clip" and ORT's fused NCHWc conv land on the
same row whatever either named it. Prints the sum of per-node minimum times on each side, totals
per anchor kind (depthwise, 1x1, kxk, strided, MatMul, ...), then the anchors with the largest
pyforge time. ORT's kernel times exclude its scheduling; pyforge's include the step's call.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ANCHORS = {"Conv", "MatMul", "Gemm", "ConvTranspose"}


def _model(name: str) -> tuple[str, dict]:
    if name.endswith(".onnx"):
        model = onnx.load(name, load_external_data=False)
        rng = np.random.default_rng(0)
        feeds = {}
        for i in model.graph.input:
            shape = [d.dim_value or 1 for d in i.type.tensor_type.shape.dim]
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
        return name, feeds
    from benchmarks.transformer_cpu import model_and_feeds

    return model_and_feeds(name, 128)


def _kind(node: onnx.NodeProto, graph: onnx.GraphProto) -> str:
    if node.op_type != "Conv":
        return node.op_type
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    kernel = attrs.get("kernel_shape")
    if kernel is None:  # from the weight's shape
        weights = {t.name: list(t.dims) for t in graph.initializer}
        kernel = weights.get(node.input[1], [0, 0, 0])[2:]
    kind = "depthwise" if attrs.get("group", 1) > 1 else "x".join(map(str, kernel))
    return kind + (" strided" if max(attrs.get("strides", [1])) > 1 else "")


def anchors(graph: onnx.GraphProto) -> tuple[dict[str, str], dict[str, str]]:
    """(node or tensor name -> its anchor's node name, anchor -> its kind)."""
    producer = {out: n for n in graph.node for out in n.output}
    of: dict[str, str] = {}
    kinds: dict[str, str] = {}
    for n in graph.node:
        at = n
        for _ in range(8):  # back through an elementwise chain to a Conv / MatMul / Gemm
            if at.op_type in ANCHORS or not at.input or at.input[0] not in producer:
                break
            at = producer[at.input[0]]
        name = at.name if at.op_type in ANCHORS else n.name
        of[n.name] = name
        for out in n.output:
            of[out] = name
        kinds.setdefault(name, _kind(at, graph) if at.op_type in ANCHORS else n.op_type)
    return of, kinds


def _ort_anchor(name: str, of: dict[str, str]) -> str:
    for suffix in ("_kernel_time", "_nchwc", ""):
        name = name.removesuffix(suffix)
        if name in of:
            return of[name]
    return name


def main() -> None:
    import onnxruntime as ort

    import pyforge

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    path, feeds = _model(args.model)
    graph = onnx.load(path, load_external_data=False).graph
    of, kinds = anchors(graph)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = 2, 1
    opts.enable_profiling = True
    opts.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ort")
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    model = pyforge.compile(path, target="cpu")
    model.predict(feeds)
    rt, plan = model.runtime, model.plan.steps
    times: list[list[float]] = [[] for _ in rt.calls]
    for _ in range(args.rounds):
        for k, arr in feeds.items():  # freshly staged inputs (the arena reuses their slots)
            rt.views[k][:] = np.ravel(arr)
        for i, call in enumerate(rt.calls):
            t = time.perf_counter()
            call()
            times[i].append(time.perf_counter() - t)
        time.sleep(0.02)
        sess.run(None, feeds)
        time.sleep(0.02)
    ort_times: dict[str, list[float]] = collections.defaultdict(list)
    for event in json.loads(Path(sess.end_profiling()).read_text()):
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            ort_times[event["name"]].append(event["dur"] / 1e3)
    ours: dict[str, float] = collections.defaultdict(float)
    labels: dict[str, str] = {}
    for i, step in enumerate(plan):
        node = step.label.split(" ", 1)[-1].split()[0] if " " in step.label else step.label
        key = of.get(node, node)
        ours[key] += min(times[i]) * 1e3
        labels.setdefault(key, step.label.split(" ", 1)[0])
    theirs: dict[str, float] = collections.defaultdict(float)
    for name, ts in ort_times.items():
        theirs[_ort_anchor(name, of)] += min(ts)
    print(f"{args.model}: sum of per-node minima, pyforge {sum(ours.values()):.3f} ms, ORT "
          f"{sum(theirs.values()):.3f} ms ({args.rounds} rounds)")  # fmt: skip
    per_kind: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for key in set(ours) | set(theirs):
        row = per_kind[kinds.get(key, "other")]
        row[0], row[1], row[2] = (
            row[0] + ours.get(key, 0.0),
            row[1] + theirs.get(key, 0.0),
            row[2] + 1,
        )
    print(f"  {'kind':18s} {'n':>4s} {'pyforge':>9s} {'ORT':>9s}")
    for kind, (p, o, n) in sorted(per_kind.items(), key=lambda kv: -kv[1][0]):
        print(f"  {kind:18s} {n:4d} {p:9.3f} {o:9.3f}  {p / o if o else float('nan'):5.2f}x")
    print(f"  {'pyforge ms':>10s} {'ORT ms':>8s}  kind               anchor (pyforge step)")
    for key in sorted(ours, key=lambda k: -ours[k])[: args.top]:
        print(f"  {ours[key]:10.3f} {theirs.get(key, 0.0):8.3f}  {kinds.get(key, 'other'):18s} "
              f"{key[-48:]} ({labels[key]})")  # fmt: skip


if __name__ == "__main__":
    main()
