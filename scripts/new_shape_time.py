"""Time the plan a new input signature compiles at predict, with a warm kernel cache.

    python scripts/new_shape_time.py [--model resnet50] [--target cpu] [--batches 1,2,4,8]

Compiles the model with a symbolic batch dim, predicts once at each batch (the first batch's
plan comes from compile()), then once more at each: the second pass reuses every plan. Prints
the seconds each first predict took, and the plans' weights objects (shared when identical).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import pyforge
from pyforge.models import MODELS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--target", default=None)
    ap.add_argument("--batches", default="1,2,4,8")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    proto = MODELS[args.model](batch="batch")
    used0 = _device_used(args.target)
    t0 = time.perf_counter()
    model = pyforge.compile(proto, target=args.target)
    print(f"compile (batch {batches[0]} plan): {time.perf_counter() - t0:.2f} s")
    shape = model.inputs[0].shape
    rng = np.random.default_rng(0)
    for rnd in ("first", "again"):
        for b in batches:
            x = rng.standard_normal((b, *shape[1:])).astype(np.float32)
            t0 = time.perf_counter()
            model.predict(x)
            print(f"{rnd:5s} predict at batch {b}: {time.perf_counter() - t0:.2f} s")
    print("plans held:", model.stats["plans"])
    if model.target == "cuda":  # one weights upload for every plan, plus one arena each
        bound = list(model._plans.values())
        weights = {id(b.plan.weights): b.plan.weights.nbytes for b in bound}
        arenas = sum(b.plan.arena_bytes for b in bound)
        used = _device_used("cuda") - used0
        print(
            f"device bytes in use: {used / 2**20:.1f} MiB; distinct weights arrays "
            f"{len(weights)} ({sum(weights.values()) / 2**20:.1f} MiB), arenas "
            f"{arenas / 2**20:.1f} MiB (one per plan and execution context)"
        )


def _device_used(target: str | None) -> int:
    if target != "cuda":
        return 0
    from numba import cuda

    free, total = cuda.current_context().get_memory_info()
    return total - free


if __name__ == "__main__":
    main()
