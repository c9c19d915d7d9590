"""Where a Gemma 3 270M decode step's time goes on cuda (random weights, fp32, greedy):
wall time per token, the host side (cProfile of the decode loop) and the device side (kernels
by total time through torch.profiler/CUPTI, the plan run step by step).

    python scripts/profile_decode.py [--ctx 256] [--new 24] [--top 25]
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
    args = ap.parse_args()
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile

    import pyforge
    from pyforge.generate import gemma3

    c = gemma3.Gemma3Config.tiny() if args.tiny else gemma3.Gemma3Config()
    t0 = time.perf_counter()
    proto = gemma3.build_decoder(
        c, gemma3.random_weights(c, 0), logits="last", max_context=args.ctx
    )
    ids = [int(t) for t in np.random.default_rng(0).integers(3, c.vocab, 5)]
    print(f"decoder built {time.perf_counter() - t0:.1f} s", flush=True)
    rows = []
    for graph in (True, False):
        t0 = time.perf_counter()
        gen = pyforge.TextGenerator.from_onnx(
            proto, None, target="cuda", max_context=args.ctx, graph=graph
        )
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
    print("\n| mode | prefill ms | decode ms/token median | min |")
    for g, p, med, mn in rows:
        print(f"| {'graph' if g else 'steps'} | {p:.1f} | {med:.2f} | {mn:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
