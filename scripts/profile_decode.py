"""Where a Gemma 3 270M decode step's time goes on cuda (random weights, fp32, greedy):
wall time per token, the host side (cProfile of the decode loop) and the device side (kernels
by total time through torch.profiler/CUPTI, the plan run step by step).

    python scripts/profile_decode.py [--ctx 256] [--new 24] [--top 25] [--cache concat]
    python scripts/profile_decode.py --tiny --device cpu    # host side only, no torch

The KV cache is kept in place by default (``--cache static``: one decode plan, one graph).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--new", type=int, default=24)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--cache", default="static", choices=["static", "concat"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args()
    import numpy as np

    import pyforge
    from pyforge.generate import gemma3

    c = gemma3.Gemma3Config.tiny() if args.tiny else gemma3.Gemma3Config()
    weights = gemma3.random_weights(c, 0)
    ids = [int(t) for t in np.random.default_rng(0).integers(3, c.vocab, 5)]
    rows, cuda = [], args.device == "cuda"
    for graph in (True, False) if cuda else (None,):
        t0 = time.perf_counter()
        gen = pyforge.TextGenerator.from_config(
            c, weights, None, args.device, args.ctx, cache=args.cache,
            **({"graph": graph} if cuda else {}),
        )  # fmt: skip
        gen.generate(ids, max_new_tokens=args.new)  # plans compiled and warm
        print(f"graph={graph}: compiled + first run {time.perf_counter() - t0:.1f} s", flush=True)
        gen.reset()
        r = gen.generate(ids, max_new_tokens=args.new)
        rows.append((graph, r.prefill_ms, float(np.median(r.decode_ms)), min(r.decode_ms)))
        st = gen.model.stats
        st = st() if callable(st) else st
        print({k: (v if len(repr(v)) < 200 else repr(v)[:200]) for k, v in st.items()}, flush=True)
        gen.reset()
        gen.generate(ids, max_new_tokens=2)
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(10):
            gen._step([ids[0]], 1)
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18)
        print(f"--- host, graph={graph}, 10 decode steps, by tottime\n" + s.getvalue()[-3500:])
        if not cuda:
            continue
        import torch
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                gen._step([ids[0]], 1)
            torch.cuda.synchronize()
        tot, cnt = defaultdict(float), defaultdict(int)
        for e in prof.events():
            if e.device_type.name == "CUDA":
                key = e.name[:90]
                tot[key] += e.device_time_total if hasattr(e, "device_time_total") else 0
                cnt[key] += 1
        allus = sum(tot.values())
        print(f"--- device, graph={graph}: {sum(cnt.values()) / 5:.0f} records/step, "
              f"{allus / 5:.0f} us/step of device time")  # fmt: skip
        for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"{v / 5:9.1f} us/step {cnt[k] / 5:6.1f}x  {k}")
        gen = None
    print(f"\n{args.cache} cache, {args.device}, max_context {args.ctx}")
    print("| mode | prefill ms | decode ms/token median | min |")
    for g, p, med, mn in rows:
        print(
            f"| {'cpu' if g is None else 'graph' if g else 'steps'} | {p:.1f} | {med:.2f} | {mn:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
