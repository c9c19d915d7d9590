"""Greedy against the e-graph optimiser (issue 16) on the cpu: the regions it found, what it
chose and predicted (simulated region time from the measured kernel costs), the measured
predict time of both plans (runs alternated in one process), the search time with a warm cost
cache, each plan's largest difference from ONNX Runtime, and the correlation of predicted and
measured savings over the models.

    PYTHONPATH=. python benchmarks/egraph.py --runs 100 resnet18 mobilenet_v2 minilm_l6:16
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import onnx

import pyforge
from pyforge import models

CORPUS = os.path.expanduser("~/.cache/pyforge-corpus")


def load(spec: str):
    """'mlp' / 'resnet50' (pyforge.models), 'NAME' (an image model of the corpus cache) or
    'NAME:SEQ' (a text model of the corpus cache at batch 1, SEQ tokens)."""
    name, _, seq = spec.partition(":")
    path = os.path.join(CORPUS, f"{name}.onnx")
    if not seq and not os.path.exists(path):
        proto = getattr(models, name)()
        x = proto.graph.input[0]
        shape = [d.dim_value for d in x.type.tensor_type.shape.dim]
        feeds = {x.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
        return proto, None, feeds
    if not seq:
        return path, None, models.random_inputs(path, seed=0)
    n, rng = int(seq), np.random.default_rng(0)
    names = {i.name for i in onnx.load(path, load_external_data=False).graph.input}
    feeds = {
        "input_ids": rng.integers(1, 30000, (1, n)),
        "attention_mask": np.ones((1, n), np.int64),
        "token_type_ids": np.zeros((1, n), np.int64),
    }
    feeds = {k: v for k, v in feeds.items() if k in names}
    return path, {k: v.shape for k, v in feeds.items()}, feeds


def first(out):
    return next(iter(out.values())) if isinstance(out, dict) else out


def ort_error(model, feeds, *plans) -> list[float]:
    """Each plan's max |difference| from ONNX Runtime's first output (the reference)."""
    import onnxruntime as ort

    src = model if isinstance(model, str) else model.SerializeToString()
    sess = ort.InferenceSession(src, providers=["CPUExecutionProvider"])
    ref = sess.run(None, feeds)[0]
    return [float(np.max(np.abs(first(p.predict(feeds)) - ref))) for p in plans]


def bench(spec: str, runs: int) -> tuple[float, float]:
    """Prints the model's figures; returns (predicted, measured median) saving in ms."""
    model, shapes, feeds = load(spec)
    kw = {"input_shapes": shapes} if shapes else {}
    greedy = pyforge.compile(model, target="cpu", **kw)
    pyforge.compile(model, target="cpu", optimizer="egraph", **kw)  # fills the cost cache
    t0 = time.perf_counter()
    eg = pyforge.compile(model, target="cpu", optimizer="egraph", **kw)
    compile_s = time.perf_counter() - t0
    rep = eg.details["egraph"]
    err_g, err_e = ort_error(model, feeds, greedy, eg)
    times = {"greedy": [], "egraph": []}
    for _ in range(runs):  # alternated, so both see the same load
        for name, m in (("greedy", greedy), ("egraph", eg)):
            t = time.perf_counter()
            m.predict(feeds)
            times[name].append(time.perf_counter() - t)
    g_med, e_med = (statistics.median(times[k]) * 1e3 for k in ("greedy", "egraph"))
    g_min, e_min = (min(times[k]) * 1e3 for k in ("greedy", "egraph"))
    sim_g, sim_e = (t * 1e3 for t in rep.predicted)
    merged = sum(r.chosen == "merged" for r in rep.regions)
    blas = sum(g.chosen == "openblas" for g in rep.groups)
    print(
        f"{spec}: {len(rep.regions)} shared-input regions (QKV, 1x1 branches), {merged} merged; {len(rep.groups)} other GEMM "
        f"groups, {blas} on OpenBLAS; launches {greedy.stats['launches']} -> "
        f"{eg.stats['launches']}; max |diff| vs ORT greedy {err_g:.3g} egraph {err_e:.3g}"
    )
    print(
        f"  simulated GEMMs    greedy {sim_g:.3f} ms  egraph {sim_e:.3f} ms  "
        f"({sim_g - sim_e:+.3f} ms predicted saving)"
    )
    print(
        f"  measured predict   greedy median {g_med:.3f} min {g_min:.3f} ms   egraph median "
        f"{e_med:.3f} min {e_min:.3f} ms   ({g_med - e_med:+.3f} ms median "
        f"{100 * (e_med / g_med - 1):+.1f}%, {g_min - e_min:+.3f} ms min)"
    )
    line = rep.search_line() if rep.searches else "no regions, no search"
    print(
        f"  search (warm cost cache) {rep.seconds * 1e3:.1f} ms: {line}; whole compile "
        f"{compile_s:.2f} s; load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    return sim_g - sim_e, g_med - e_med


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=["mlp", "resnet50", "minilm_l6:16"])
    ap.add_argument("--runs", type=int, default=100)
    args = ap.parse_args(argv)
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    pairs = [bench(spec, args.runs) for spec in args.models]
    if len(pairs) > 2:
        r = float(np.corrcoef(np.array(pairs).T)[0, 1])
        print(f"correlation of predicted and measured (median) savings over {len(pairs)}: {r:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
