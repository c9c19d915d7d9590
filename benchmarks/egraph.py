"""Greedy against the e-graph optimiser (issue 16) on the cpu: the regions it found, what it
chose and predicted (simulated region time from the measured kernel costs), the measured
predict time of both plans (runs alternated in one process), the search time with a warm cost
cache, and the largest difference between the two plans' outputs.

    PYTHONPATH=. python benchmarks/egraph.py --runs 100 mlp resnet50 minilm_l6:4 minilm_l6:128
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

import pyforge
from pyforge import models

CORPUS = os.path.expanduser("~/.cache/pyforge-corpus")


def load(spec: str):
    """'mlp' / 'resnet50' (pyforge.models) or 'NAME:SEQ' (a text model of the corpus cache)."""
    name, _, seq = spec.partition(":")
    if not seq:
        proto = getattr(models, name)()
        x = proto.graph.input[0]
        shape = [d.dim_value for d in x.type.tensor_type.shape.dim]
        feeds = {x.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
        return proto, None, feeds
    path, n = os.path.join(CORPUS, f"{name}.onnx"), int(seq)
    rng = np.random.default_rng(0)
    feeds = {
        "input_ids": rng.integers(1, 30000, (1, n)),
        "attention_mask": np.ones((1, n), np.int64),
        "token_type_ids": np.zeros((1, n), np.int64),
    }
    return path, {k: v.shape for k, v in feeds.items()}, feeds


def first(out):
    return next(iter(out.values())) if isinstance(out, dict) else out


def bench(spec: str, runs: int) -> None:
    model, shapes, feeds = load(spec)
    kw = {"input_shapes": shapes} if shapes else {}
    greedy = pyforge.compile(model, target="cpu", **kw)
    pyforge.compile(model, target="cpu", optimizer="egraph", **kw)  # fills the cost cache
    t0 = time.perf_counter()
    eg = pyforge.compile(model, target="cpu", optimizer="egraph", **kw)
    compile_s = time.perf_counter() - t0
    rep = eg.details["egraph"]
    diff = float(np.max(np.abs(first(eg.predict(feeds)) - first(greedy.predict(feeds)))))
    times = {"greedy": [], "egraph": []}
    for _ in range(runs):  # alternated, so both see the same load
        for name, m in (("greedy", greedy), ("egraph", eg)):
            t = time.perf_counter()
            m.predict(feeds)
            times[name].append(time.perf_counter() - t)
    g_med, e_med = (statistics.median(times[k]) * 1e3 for k in ("greedy", "egraph"))
    g_min, e_min = (min(times[k]) * 1e3 for k in ("greedy", "egraph"))
    apart = sum(r.alternatives.get("apart", (0.0,))[0] for r in rep.regions) * 1e3
    chosen = sum(r.alternatives[r.chosen][0] for r in rep.regions) * 1e3
    merged = sum(r.chosen == "merged" for r in rep.regions)
    print(
        f"{spec}: {len(rep.regions)} regions, {merged} merged; launches "
        f"{greedy.stats['launches']} -> {eg.stats['launches']}; max |diff| {diff:.3g}"
    )
    print(
        f"  simulated regions  greedy {apart:.3f} ms  egraph {chosen:.3f} ms  "
        f"({apart - chosen:+.3f} ms predicted saving)"
    )
    print(
        f"  measured predict   greedy median {g_med:.3f} min {g_min:.3f} ms   egraph median "
        f"{e_med:.3f} min {e_min:.3f} ms   ({g_med - e_med:+.3f} ms median, "
        f"{g_min - e_min:+.3f} ms min)"
    )
    line = rep.search_line() if rep.searches else "no regions, no search"
    print(
        f"  search (warm cost cache) {rep.seconds * 1e3:.1f} ms: {line}; whole compile "
        f"{compile_s:.2f} s"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=["mlp", "resnet50", "minilm_l6:16"])
    ap.add_argument("--runs", type=int, default=100)
    args = ap.parse_args(argv)
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    for spec in args.models:
        bench(spec, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
