"""Kernel durations inside one ResNet-50 graph replay (CUPTI through torch.profiler), against the
replay's wall time: how much of a replay is kernels and how much the gaps between them.

    python scripts/gpu_kernel_times.py [--precision tf32] [--conv implicit]
"""

from __future__ import annotations

import argparse
import collections
import time

import pyforge
from pyforge.models import cached_model, random_inputs


def main() -> None:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--conv", default=None)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    path = cached_model(args.model)
    opts = {"precision": args.precision}
    if args.conv:
        opts["conv"] = args.conv
    model = pyforge.compile(path, target="cuda", **opts)
    model.predict(random_inputs(path, seed=0))
    rt = model.runtime
    for _ in range(20):
        rt.graph.replay()
    rt.stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        rt.graph.replay()
    rt.stream.synchronize()
    wall = (time.perf_counter() - t0) / 200 * 1e6
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(args.reps):
            rt.graph.replay()
        rt.stream.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict[str, list[float]] = collections.defaultdict(list)
    for e in kernels:
        by_name[e.name].append(e.device_time)
    per_replay = sum(sum(v) for v in by_name.values()) / args.reps
    count = len(kernels) / args.reps
    span = []
    starts = sorted((e.time_range.start, e.time_range.end) for e in kernels)
    if starts:
        span = (starts[-1][1] - starts[0][0]) / args.reps
    print(
        f"{args.model} {args.precision} conv={args.conv or 'default'}: launches "
        f"{model.stats['launches']}, kernels per replay {count:.0f}, replay wall {wall:.1f} us, "
        f"kernel time {per_replay:.1f} us, profiled span {span:.1f} us, "
        f"gaps {wall - per_replay:.1f} us"
    )
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:12]
    for name, ts in top:
        print(f"  {sum(ts) / args.reps:8.1f} us  x{len(ts) / args.reps:4.0f}  {name[:90]}")


if __name__ == "__main__":
    main()
