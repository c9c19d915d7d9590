"""im2col + cuBLASLt against the implicit-GEMM conv kernel, on ResNet-50's im2col convs, batch 1.

    python scripts/gpu_conv_bench.py [--tiles auto,64x64x16/4x4,...] [--runs 200] [--no-model]

Each conv (with bias + Relu, as in ResNet after BN folding) is compiled both ways; its step alone
is captured in a CUDA graph and timed with CUDA events (median of --runs replays). Then the
whole ResNet-50 with each conv= option: launches and median predict / graph replay time.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from numba import cuda
from onnx import helper, numpy_helper

import pyforge
from pyforge.exec.cuda.graph import CudaGraph
from pyforge.models import cached_model, random_inputs

# name, input C, input H=W, output C, kernel, stride
SHAPES = [
    ("stem 7x7/2", 3, 224, 64, 7, 2),
    ("l1 3x3 56", 64, 56, 64, 3, 1),
    ("l2 3x3/2 56", 128, 56, 128, 3, 2),
    ("l2 3x3 28", 128, 28, 128, 3, 1),
    ("l3 3x3/2 28", 256, 28, 256, 3, 2),
    ("l3 3x3 14", 256, 14, 256, 3, 1),
    ("l4 3x3/2 14", 512, 14, 512, 3, 2),
    ("l4 3x3 7", 512, 7, 512, 3, 1),
    ("ds3 1x1/2 28", 512, 28, 1024, 1, 2),
    ("ds4 1x1/2 14", 1024, 14, 2048, 1, 2),
]


def conv_model(cin: int, hw: int, cout: int, k: int, s: int):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((cout, cin, k, k)) * (2 / (cin * k * k)) ** 0.5).astype(np.float32)
    b = (rng.standard_normal(cout) * 0.1).astype(np.float32)
    nodes = [
        helper.make_node(
            "Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], strides=[s, s], pads=[k // 2] * 4
        ),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", 1, [1, cin, hw, hw])],
        [helper.make_tensor_value_info("y", 1, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, rng.standard_normal((1, cin, hw, hw)).astype(np.float32)


def time_call(rt, call, runs: int, capture: bool = True) -> float:
    """Median microseconds of one call (captured alone in a CUDA graph), by CUDA events."""
    g = CudaGraph(rt.stream) if capture else None
    if g is not None:
        g.capture(call)
        call = g.replay
    e0, e1 = cuda.event(timing=True), cuda.event(timing=True)
    for _ in range(10):
        call()
    times = []
    for _ in range(runs):
        e0.record(rt.stream)
        call()
        e1.record(rt.stream)
        e1.synchronize()
        times.append(cuda.event_elapsed_time(e0, e1) * 1e3)
    if g is not None:
        g.close()
    return float(np.median(times))


def conv_step(model) -> int:
    labels = [s.label for s in model.plan.steps]
    return next(i for i, lb in enumerate(labels) if lb.lower().startswith("conv"))


def bench_convs(tiles: list[str], runs: int) -> None:
    print(f"{'conv':14s} {'im2col+Lt us':>12s}  " + "  ".join(f"{t:>18s}" for t in tiles))
    for name, cin, hw, cout, k, s in SHAPES:
        model, x = conv_model(cin, hw, cout, k, s)
        ref = pyforge.compile(model, target="cuda", conv="im2col")
        want = ref.predict(x)
        row = [time_call(ref.runtime, ref.runtime.calls[conv_step(ref)], runs)]
        cells = []
        for tile in tiles:
            m = pyforge.compile(
                model, target="cuda", conv="implicit", conv_tile=None if tile == "auto" else tile
            )
            got = m.predict(x)
            err = float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))
            i = conv_step(m)
            us = time_call(m.runtime, m.runtime.calls[i], runs)
            chosen = m.plan.steps[i].label.rsplit(" ", 1)[1] if tile == "auto" else ""
            cells.append(f"{us:7.1f}{' ' + chosen if chosen else ''}{' BAD' if err > 1e-4 else ''}")
            row.append(us)
        best = min(range(len(tiles)), key=lambda j: row[j + 1])
        print(
            f"{name:14s} {row[0]:12.1f}  "
            + "  ".join(f"{c:>18s}" for c in cells)
            + f"   best {tiles[best]} x{row[0] / row[best + 1]:.2f}",
            flush=True,
        )


def bench_model(modes: list[str], runs: int) -> None:
    path = cached_model("resnet50")
    x = random_inputs(path, seed=0)
    outs = {}
    for mode in modes:
        t0 = time.perf_counter()
        m = pyforge.compile(path, target="cuda", conv=mode)
        comp = time.perf_counter() - t0
        outs[mode] = m.predict(x)
        for _ in range(20):
            m.predict(x)
        t = []
        for _ in range(runs):
            t1 = time.perf_counter()
            m.predict(x)
            t.append(time.perf_counter() - t1)
        rt = m.runtime
        replay = time_call(rt, rt.graph.replay, runs, capture=False)
        diff = float(np.max(np.abs(outs[mode] - outs[modes[0]])))
        print(
            f"resnet50 conv={mode:8s} launches {m.stats['launches']:3d}  predict median "
            f"{np.median(t) * 1e3:.3f} ms  graph replay {replay / 1e3:.3f} ms  "
            f"max|diff| vs {modes[0]} {diff:.2e}  compile {comp:.0f} s",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiles", default="auto,32x32x32/4x4,64x32x16/4x4")
    ap.add_argument("--modes", default="im2col,implicit")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--no-convs", action="store_true")
    ap.add_argument("--no-model", action="store_true")
    args = ap.parse_args()
    dev = cuda.get_current_device()
    print(f"device {dev.name.decode() if isinstance(dev.name, bytes) else dev.name}")
    if not args.no_convs:
        bench_convs(args.tiles.split(","), args.runs)
    if not args.no_model:
        bench_model(args.modes.split(","), args.runs)


if __name__ == "__main__":
    main()
