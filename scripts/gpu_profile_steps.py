"""GPU time of every step of a plan, each captured alone in a CUDA graph and replayed.

    python scripts/gpu_profile_steps.py [--model resnet50] [--precision fp32]

Prints the total by step kind and the slowest steps; the sum approximates one graph replay.
"""

from __future__ import annotations

import argparse
import collections
import time

import pyforge
from pyforge.exec.cuda.graph import CudaGraph
from pyforge.exec.steps import GemmStep
from pyforge.models import cached_model, random_inputs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    path = cached_model(args.model)
    x = random_inputs(path, seed=0)
    model = pyforge.compile(path, target="cuda", precision=args.precision)
    model.predict(x)
    rt = model.runtime
    rows = []
    for step, call in zip(rt.plan.steps, rt.calls):
        g = CudaGraph(rt.stream)
        g.capture(call)
        for _ in range(3):
            g.replay()
        rt.stream.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.reps):
            g.replay()
        rt.stream.synchronize()
        us = (time.perf_counter() - t0) / args.reps * 1e6
        gemm = isinstance(step, GemmStep)
        kind = "gemm" if gemm else "kernel"
        if gemm and (step.prologue or step.epilogue):
            kind += "+" + "+".join(p for p in ("prologue", "epilogue") if getattr(step, p))
        label = step.label
        shape = f"m{step.m} n{step.n} k{step.k} b{step.batch}" if gemm else f"n={step.n}"
        rows.append((us, kind, label, shape))
        g.close()
    total = collections.Counter()
    for us, kind, _, _ in rows:
        total[kind] += us
    t0 = time.perf_counter()
    for _ in range(args.reps):
        rt.graph.replay()
    rt.stream.synchronize()
    whole = (time.perf_counter() - t0) / args.reps * 1e6
    print(
        f"whole graph replay: {whole:.1f} us; sum of steps alone: {sum(r[0] for r in rows):.1f} us"
    )
    for kind, us in total.most_common():
        print(f"  {kind:28s} {us:8.1f} us")
    print("slowest steps:")
    for us, kind, label, shape in sorted(rows, reverse=True)[:25]:
        print(f"  {us:7.1f} us  {kind:24s} {label[:40]:40s} {shape}")


if __name__ == "__main__":
    main()
