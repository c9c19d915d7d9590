"""The main job: build (if needed) and compile ResNet-50, check it against ONNX Runtime, time it.

python -m pyforge [--model resnet50|mlp|ew|PATH.onnx] [--target cpu|cuda] [--runs N]
                  [--shape NAME=1x3x224x224 ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    import onnxruntime as ort

    import pyforge
    from pyforge.cli import parse_shape, stderr_progress
    from pyforge.models import MODELS, cached_model

    ap = argparse.ArgumentParser(prog="python -m pyforge", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model", default="resnet50", help="mlp, ew, resnet50 or a path to an .onnx file"
    )
    ap.add_argument(
        "--target", choices=["cpu", "cuda"], default=None, help="default: cuda if usable"
    )
    ap.add_argument("--runs", type=int, default=20, help="timed runs after warm-up")
    ap.add_argument("--no-fusion", action="store_true")
    ap.add_argument(
        "--shape", action="append", type=parse_shape, metavar="NAME=DIMS", help="input_shapes"
    )
    args = ap.parse_args(argv)

    path = args.model if os.path.exists(args.model) else None
    if path is None:
        if args.model not in MODELS:
            print(
                f"error: {args.model!r} is neither a file nor one of {sorted(MODELS)}",
                file=sys.stderr,
            )
            return 2
        t0 = time.perf_counter()
        path = cached_model(args.model)
        print(f"model     {path} ({time.perf_counter() - t0:.1f} s to generate or find)")
    try:
        t0 = time.perf_counter()
        model = pyforge.compile(
            path,
            args.target,
            fusion=not args.no_fusion,
            input_shapes=dict(args.shape or ()),
            progress=stderr_progress(path),
        )
        rng = np.random.default_rng(0)  # the plan's shapes: symbolic dims bound
        sig = model.plan.signature(model.input_names)
        feeds = {n: rng.standard_normal(shape).astype(dtype) for n, shape, dtype in sig}
        y = model.predict(feeds)
        first = time.perf_counter() - t0
    except pyforge.errors.PyforgeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    s = model.stats
    print(f"target    {model.target}")
    print(
        f"compiled  {s['ops_in']} ONNX ops -> {s['ops_out']} nodes, {s['launches']} launches "
        f"per inference; {first:.1f} s to first result (kernel compilation included)"
    )
    print(
        f"arena     {s['arena_bytes'] / 2**20:.2f} MiB (one buffer per tensor: "
        f"{s['naive_bytes'] / 2**20:.2f} MiB; liveness bound {s['lower_bound_bytes'] / 2**20:.2f} MiB)"
    )
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    outs = y if isinstance(y, dict) else {model.output_names[0]: y}
    ok = True
    for name, r in zip(model.output_names, ref):
        err = float(np.max(np.abs(outs[name].astype(np.float64) - r)))
        good = np.allclose(outs[name], r, rtol=1e-4, atol=1e-5)
        ok &= good
        print(
            f"parity    {name}: max abs error vs ONNX Runtime {err:.3g} ({'ok' if good else 'MISMATCH'})"
        )
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        model.predict(feeds)
        times.append(time.perf_counter() - t0)
    print(
        f"latency   median {np.median(times) * 1e3:.2f} ms over {args.runs} runs "
        f"(p90 {np.percentile(times, 90) * 1e3:.2f} ms)"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
