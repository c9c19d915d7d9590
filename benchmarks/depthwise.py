"""Depthwise convolutions on the cpu: pyforge against ONNX Runtime (2 threads), alternating runs.

    python benchmarks/depthwise.py [--rounds 7] [--runs 20] [--onnx model.onnx]

Two models built with onnx.helper: one 3x3 depthwise layer (bias + Relu6), and a MobileNetV2-like
stack of inverted-residual blocks (1x1 expand, 3x3 depthwise stride 1 or 2, Relu6, 1x1 project;
112x112x32 down to 7x7x320). Prints per-round medians, their median and spread, and the depthwise
layer's GFLOP/s for both in the same rounds (a ratio the machine's load affects less).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

import pyforge

rng = np.random.default_rng(0)
# (expansion, output channels, repeats, first stride): MobileNetV2's blocks after the stem
BLOCKS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1)]
BLOCKS += [(6, 160, 3, 2), (6, 320, 1, 1)]


class _Builder:
    def __init__(self) -> None:
        self.nodes, self.inits, self.k = [], [], 0

    def conv(self, x: str, cin: int, cout: int, k: int, s: int, group: int, relu6: bool) -> str:
        self.k += 1
        w = rng.standard_normal((cout, cin // group, k, k)).astype(np.float32)
        w *= np.sqrt(2.0 / (cin // group * k * k))
        b = (0.1 * rng.standard_normal(cout)).astype(np.float32)
        names = [f"w{self.k}", f"b{self.k}"]
        self.inits += [numpy_helper.from_array(a, n) for a, n in zip((w, b), names)]
        y = f"y{self.k}"
        p = k // 2
        attrs = dict(kernel_shape=[k, k], strides=[s, s], pads=[p] * 4, group=group)
        self.nodes.append(helper.make_node("Conv", [x, *names], [y], **attrs))
        if not relu6:
            return y
        self.nodes.append(helper.make_node("Clip", [y, "lo", "hi"], [y + "r"]))
        return y + "r"

    def model(self, shape: tuple, out: str) -> onnx.ModelProto:
        self.inits += [numpy_helper.from_array(np.float32(v), n) for v, n in ((0, "lo"), (6, "hi"))]
        g = helper.make_graph(
            self.nodes,
            "g",
            [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(shape))],
            [helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, None)],
            self.inits,
        )
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def mobilenet_like() -> onnx.ModelProto:
    b, x, c = _Builder(), "x", 32
    for t, co, n, s in BLOCKS:
        for r in range(n):
            h = b.conv(x, c, c * t, 1, 1, 1, True) if t != 1 else x
            h = b.conv(h, c * t, c * t, 3, s if r == 0 else 1, c * t, True)
            h = b.conv(h, c * t, co, 1, 1, 1, False)
            if r and co == c:
                b.k += 1
                b.nodes.append(helper.make_node("Add", [h, x], [f"res{b.k}"]))
                h = f"res{b.k}"
            x, c = h, co
    return b.model((1, 32, 112, 112), x)


def depthwise_layer(c: int = 144, hw: int = 56, s: int = 1) -> tuple[onnx.ModelProto, float]:
    b = _Builder()
    y = b.conv("x", c, c, 3, s, c, True)
    out_hw = (hw - 1) // s + 1
    return b.model((1, c, hw, hw), y), 2.0 * 9 * c * out_hw * out_hw / 1e9


def _time(fn, runs: int) -> float:
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def compare(name: str, model: onnx.ModelProto, rounds: int, runs: int, gflop: float = 0.0):
    inp = model.graph.input[0]
    shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
    feeds = {inp.name: rng.standard_normal(shape).astype(np.float32)}
    pf = pyforge.compile(model, target="cpu")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)[0]
    err = float(np.max(np.abs(pf.predict(feeds) - want)))
    ours, theirs, kernel = [], [], []
    calls = pf.runtime.calls if len(pf.runtime.calls) == 1 else []  # one layer: its kernel alone
    for _ in range(rounds):  # alternate, so both see the same load
        ours.append(_time(lambda: pf.predict(feeds), runs))
        theirs.append(_time(lambda: sess.run(None, feeds), runs))
        kernel += [_time(calls[0], runs)] if calls else []
    a, b = np.array(ours) * 1e3, np.array(theirs) * 1e3
    ratio = a / b
    print(f"{name}: max abs err {err:.2g}")
    print(f"  pyforge ms median {np.median(a):.3f} (min {a.min():.3f} max {a.max():.3f})")
    print(f"  ORT     ms median {np.median(b):.3f} (min {b.min():.3f} max {b.max():.3f})")
    print(
        f"  pyforge/ORT per round: median {np.median(ratio):.2f}x spread "
        f"{ratio.min():.2f}-{ratio.max():.2f}x"
    )
    if gflop:
        k = np.median(kernel) * 1e3 if kernel else np.nan
        print(
            f"  GFLOP/s pyforge {gflop / np.median(a) * 1e3:.1f} (its kernel alone "
            f"{gflop / k * 1e3:.1f}, {k:.3f} ms), ORT {gflop / np.median(b) * 1e3:.1f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--onnx", help="time this model file instead (e.g. an exported mobilenet_v2)")
    args = ap.parse_args()
    if args.onnx:
        compare(args.onnx, onnx.load(args.onnx), args.rounds, args.runs)
        return
    for c, hw, s in ((144, 56, 1), (96, 112, 2), (576, 14, 1)):
        m, gflop = depthwise_layer(c, hw, s)
        compare(f"depthwise 3x3 s{s} {c}x{hw}x{hw}", m, args.rounds, args.runs, gflop)
    compare("MobileNetV2-like stack", mobilenet_like(), args.rounds, max(args.runs // 4, 3))


if __name__ == "__main__":
    main()
