"""Wide-head prefill attention on cuda (issue 19): the prefill kernel (K/V tiles shared by 16 query
rows) against the per-row kernel it replaces, parity vs ORT, alternated in one process.

    python benchmarks/prefill_attention.py [--rounds 5] [--calls 10]

Cases: Gemma 3 270M's attention at prompts 128 and 1024 (4 heads of 256, 1 KV head, a causal
Where mask, its local layers' window of 512), and 8 heads of 128 over 2 KV heads, batch 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyforge
from benchmarks.attention import prefill_kernel
from tests.helpers import run_ort
from tests.lower_numba.test_attention_cuda import _cache_model

# (b, h, hk, sq, d, window)
CASES = {
    "gemma_128_causal": (1, 4, 1, 128, 256, 128),
    "gemma_1024_causal": (1, 4, 1, 1024, 256, 1024),
    "gemma_1024_window512": (1, 4, 1, 1024, 256, 512),
    "d128_gqa_b2_300": (2, 8, 2, 300, 128, 300),
}


def case_model(name: str, rng=None):
    """(model, feeds) of case ``name`` (of CASES, or "tiny")."""
    rng = rng or np.random.default_rng(0)
    b, h, hk, sq, d, w = CASES.get(name, (1, 4, 1, 24, 256, 10))
    model = _cache_model(b, h, hk, sq, sq, d, float("-inf"))
    pos, key = np.arange(sq)[:, None], np.arange(sq)[None, :]
    feeds = {t: rng.standard_normal((b, hk, sq, d)).astype(np.float32) for t in "kv"}
    feeds["q"] = rng.standard_normal((b, h, sq, d)).astype(np.float32)
    feeds["cond"] = np.broadcast_to((key <= pos) & (key > pos - w), (b, 1, sq, sq)).copy()
    return model, feeds


def main() -> None:
    from numba import cuda

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--tiny", action="store_true", help="one 24-row case (the CUDA simulator)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    for name in ["tiny"] if args.tiny else CASES:
        model, feeds = case_model(name, rng)
        want = run_ort(model, feeds)[0]
        dev = {k: cuda.to_device(a) for k, a in feeds.items()}
        runs = {}
        for pre in (True, False):
            with prefill_kernel(pre):
                c = pyforge.compile(model, target="cuda")
            err = float(np.max(np.abs(c.predict(feeds) - want)))
            runs["prefill" if pre else "per-row"] = (c, err, [])
        for _ in range(args.rounds):
            for c, _, ts in runs.values():
                t = time.perf_counter()
                for _ in range(args.calls):
                    c.predict(dev)
                cuda.synchronize()
                ts.append((time.perf_counter() - t) / args.calls * 1e3)
        for label, (_, err, ts) in runs.items():
            print(f"{name:22s} {label:8s} {np.median(ts):8.3f} ms [{min(ts):.3f}-{max(ts):.3f}] "
                  f"max err {err:.1e}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
