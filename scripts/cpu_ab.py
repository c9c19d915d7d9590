"""A/B on the cpu target in one process: two runtimes of one ResNet-50 plan, alternated.

    python scripts/cpu_ab.py --flag own_gemm [--pairs 30] [--model resnet50]

The flag (a boolean keyword of CpuRuntime) is True for runtime A and False for runtime B; both
then run alternately, so this VM's drifting speed hits both alike. Prints per-pair ratios.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import pyforge
from pyforge.exec.cpu import CpuRuntime
from pyforge.models import cached_model, random_inputs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flag", required=True)
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--model", default="resnet50")
    args = ap.parse_args()
    attr = args.flag
    path = cached_model(args.model)
    feeds = random_inputs(path, seed=0)
    plan = pyforge.compile(path, target="cpu").runtime.plan
    runtimes = {}
    for value in (True, False):
        runtimes[value] = CpuRuntime(plan, **{attr: value})
    outs = {v: r.run(feeds) for v, r in runtimes.items()}
    for name in outs[True]:
        a, b = outs[True][name], outs[False][name]
        print(f"{name}: max |A-B| = {np.abs(a - b).max():.2e} (scale {np.abs(b).max():.2e})")
    times = {True: [], False: []}
    for i in range(args.pairs):
        order = (True, False) if i % 2 == 0 else (False, True)
        for v in order:
            t = time.perf_counter()
            runtimes[v].run(feeds)
            times[v].append(time.perf_counter() - t)
    a, b = np.array(times[True]), np.array(times[False])
    ratio = a / b
    print(f"A ({attr}=True)  median {np.median(a) * 1e3:.1f} ms, min {a.min() * 1e3:.1f}")
    print(f"B ({attr}=False) median {np.median(b) * 1e3:.1f} ms, min {b.min() * 1e3:.1f}")
    print(
        f"per-pair A/B: median {np.median(ratio):.3f}, quartiles "
        f"{np.percentile(ratio, 25):.3f}-{np.percentile(ratio, 75):.3f}"
    )


if __name__ == "__main__":
    main()
