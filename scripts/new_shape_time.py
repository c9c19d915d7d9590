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


if __name__ == "__main__":
    main()
