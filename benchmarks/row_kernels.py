"""Row kernels on the cpu (issue 17 item 1): pyforge against ORT (2 threads), alternated in one run.

    python benchmarks/row_kernels.py [--rounds 7] [--calls 30]

Models: a 4-layer BERT-like encoder (hidden 256, 4 heads, FFN 1024, seq 128), a LayerNorm alone
over [128, 768], and an affine ``x * s + b`` over the same [128, 768] (the same bytes in and out
as the LayerNorm: the load-independent yardstick is LayerNorm time / affine time, one run).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import pyforge

SEQ, H, HEADS, FFN, LAYERS, LN_H = 128, 256, 4, 1024, 4, 768


def _model(nodes, inputs, outputs, w):
    vi = helper.make_tensor_value_info
    g = helper.make_graph(
        nodes,
        "bench",
        [vi(k, T.FLOAT, s) for k, s in inputs],
        [vi(k, T.FLOAT, s) for k, s in outputs],
        [numpy_helper.from_array(a, k) for k, a in w.items()],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def encoder():
    rng = np.random.default_rng(0)
    w, n = {}, []

    def p(name, *shape, scale=0.05):
        w[name] = (rng.standard_normal(shape) * scale).astype(np.float32)
        return name

    def op(kind, ins, out, **attrs):
        n.append(helper.make_node(kind, ins, [out], **attrs))
        return out

    w["hs"] = np.array([1, SEQ, HEADS, H // HEADS], np.int64)
    w["flat"] = np.array([1, SEQ, H], np.int64)
    w["sq"] = np.array(np.sqrt(H // HEADS), np.float32)
    w["gk"] = np.array(1.702, np.float32)
    x = "x"
    for i in range(LAYERS):
        lin = lambda a, k, m, name: op(
            "Add", [op("MatMul", [a, p(f"{name}w", k, m)], name + "m"), p(f"{name}b", m)], name
        )
        heads = [op("Reshape", [lin(x, H, H, f"l{i}{t}"), "hs"], f"l{i}{t}r") for t in "qkv"]
        q = op("Transpose", [heads[0]], f"l{i}qt", perm=[0, 2, 1, 3])
        k = op("Transpose", [heads[1]], f"l{i}kt", perm=[0, 2, 3, 1])
        v = op("Transpose", [heads[2]], f"l{i}vt", perm=[0, 2, 1, 3])
        s = op("Div", [op("MatMul", [q, k], f"l{i}qk"), "sq"], f"l{i}s")
        prob = op("Softmax", [op("Add", [s, "mask"], f"l{i}sm")], f"l{i}p", axis=-1)
        ctx = op("Transpose", [op("MatMul", [prob, v], f"l{i}c")], f"l{i}ct", perm=[0, 2, 1, 3])
        ctx = op("Reshape", [ctx, "flat"], f"l{i}cr")
        a = op("Add", [x, lin(ctx, H, H, f"l{i}o")], f"l{i}r1")
        a = op("LayerNormalization", [a, p(f"l{i}g1", H), p(f"l{i}b1", H)], f"l{i}a", axis=-1)
        f = lin(a, H, FFN, f"l{i}f1")
        f = op("Mul", [f, op("Sigmoid", [op("Mul", [f, "gk"], f"l{i}fk")], f"l{i}fs")], f"l{i}ge")
        r = op("Add", [a, lin(f, FFN, H, f"l{i}f2")], f"l{i}r2")
        x = op("LayerNormalization", [r, p(f"l{i}g2", H), p(f"l{i}b2", H)], f"l{i}h", axis=-1)
    n.append(helper.make_node("Identity", [x], ["y"]))
    model = _model(n, [("x", [1, SEQ, H]), ("mask", [1, 1, 1, SEQ])], [("y", [1, SEQ, H])], w)
    mask = np.zeros((1, 1, 1, SEQ), np.float32)
    mask[..., SEQ - 9 :] = -1e4
    return model, {"x": rng.standard_normal((1, SEQ, H)).astype(np.float32), "mask": mask}


def row_model(kind: str):
    rng = np.random.default_rng(1)
    w = {"g": rng.standard_normal(LN_H).astype(np.float32)}
    w["b"] = rng.standard_normal(LN_H).astype(np.float32)
    if kind == "layernorm":
        nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)]
    elif kind == "softmax":
        nodes, w = [helper.make_node("Softmax", ["x"], ["y"], axis=-1)], {}
    else:
        nodes = [
            helper.make_node("Mul", ["x", "g"], ["m"]),
            helper.make_node("Add", ["m", "b"], ["y"]),
        ]
    model = _model(nodes, [("x", [SEQ, LN_H])], [("y", [SEQ, LN_H])], w)
    return model, {"x": (rng.standard_normal((SEQ, LN_H)) * 3 + 1).astype(np.float32)}


def _median_ms(fn, calls: int) -> tuple[float, float]:
    """Median wall and process-cpu milliseconds of one call: the cpu time (every thread's,
    spinning included) does not grow while the process waits for a core, the wall time does."""
    wall, cpu = [], []
    for _ in range(calls):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return float(np.median(wall) * 1e3), float(np.median(cpu) * 1e3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=30)
    args = ap.parse_args()
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    runners = {}
    for name, (model, feeds) in {
        "encoder": encoder(),
        "layernorm": row_model("layernorm"),
        "softmax": row_model("softmax"),
        "affine": row_model("affine"),
    }.items():
        pf = pyforge.compile(model, target="cpu")
        sess = ort.InferenceSession(
            model.SerializeToString(), so, providers=["CPUExecutionProvider"]
        )
        want = sess.run(None, feeds)[0]
        err = float(np.abs(pf.predict(feeds) - want).max())
        print(f"{name:10s} max abs error vs ORT {err:.2e}")
        runners[name] = (
            lambda pf=pf, f=feeds: pf.predict(f),
            lambda s=sess, f=feeds: s.run(None, f),
        )
    res = {k: ([], []) for k in runners}  # per round: (wall, cpu) of pyforge, of ORT
    for _ in range(args.rounds):
        for name, (pf, rt) in runners.items():
            pf(), rt()  # warm
            res[name][0].append(_median_ms(pf, args.calls))
            res[name][1].append(_median_ms(rt, args.calls))

    def spread(a):
        return f"{np.median(a):8.3f} [{np.min(a):.3f}-{np.max(a):.3f}]"

    for k, what in enumerate(("wall ms", "cpu ms")):
        print(f"-- {what} per call: median of {args.rounds} round medians [min-max]")
        for name, (p, o) in res.items():
            p, o = np.array(p)[:, k], np.array(o)[:, k]
            print(f"{name:10s} pyforge {spread(p)}  ORT {spread(o)}  ratio {spread(p / o)}")
        for name in ("layernorm", "softmax"):
            rel = np.array(res[name][0])[:, k] / np.array(res["affine"][0])[:, k]
            print(f"pyforge {name} / pyforge affine (same bytes): {spread(rel)}")


if __name__ == "__main__":
    main()
