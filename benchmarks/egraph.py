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

CORPUS = os.environ.get("PYFORGE_CORPUS") or os.path.expanduser("~/.cache/pyforge-corpus")
# the symbolic dims of corpus models whose other inputs are not text (batch 1 everywhere)
DIMS = {"nudenet_320n": {"height": 320, "width": 320}}


def _feeds(path: str, value: int) -> tuple[dict, dict]:
    """Seeded inputs for every graph input of ``path``: a symbolic dim naming a batch is 1, one
    in DIMS its value there, any other ``value``; token ids random, masks ones, types zeros."""
    proto = onnx.load(path, load_external_data=False)
    name = os.path.basename(path)[: -len(".onnx")]
    inits = {t.name for t in proto.graph.initializer}
    rng, feeds, shapes = np.random.default_rng(0), {}, {}
    for vi in proto.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims = []
        for d in tt.shape.dim:
            sym = d.dim_param
            dims.append(
                d.dim_value
                if d.dim_value > 0
                else 1
                if "batch" in sym or not sym and not value
                else DIMS.get(name, {}).get(sym, value or 1)
            )
        dt = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if "mask" in vi.name:
            x = np.ones(dims, dt)
        elif "type" in vi.name:
            x = np.zeros(dims, dt)
        elif dt.kind in "iu":
            x = rng.integers(1, 250 if name == "magika" else 30000, dims).astype(dt)
        else:
            x = rng.standard_normal(dims).astype(dt)
        feeds[vi.name], shapes[vi.name] = x, x.shape
    return feeds, shapes


def load(spec: str):
    """'mlp' / 'resnet50' (pyforge.models), 'NAME' (a corpus model of the cache, $PYFORGE_CORPUS
    else ~/.cache/pyforge-corpus, batch 1) or 'NAME:SEQ' (a text model of the cache at batch 1,
    SEQ tokens)."""
    name, _, seq = spec.partition(":")
    path = os.path.join(CORPUS, f"{name}.onnx")
    if not os.path.exists(path):
        proto = getattr(models, name)()
        x = proto.graph.input[0]
        shape = [d.dim_value for d in x.type.tensor_type.shape.dim]
        feeds = {x.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
        return proto, None, feeds
    feeds, shapes = _feeds(path, int(seq or 0))
    return path, shapes, feeds


def ort_error(model, feeds, *plans) -> list[float]:
    """Each plan's max |difference| from ONNX Runtime (the reference) over every output."""
    import onnxruntime as ort

    src = model if isinstance(model, str) else model.SerializeToString()
    sess = ort.InferenceSession(src, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    refs = dict(zip(names, sess.run(None, feeds)))
    errs = []
    for p in plans:
        got = p.predict(feeds)
        got = got if isinstance(got, dict) else {names[0]: got}
        errs.append(
            max(
                float(np.max(np.abs(np.asarray(got[k], np.float64) - r))) if r.size else 0.0
                for k, r in refs.items()
                if k in got
            )
        )
    return errs


def bench(spec: str, runs: int, ab_epilogue: bool = False) -> tuple[float, float]:
    """Prints the model's figures; returns (predicted, measured median) saving in ms.
    ``ab_epilogue``: the e-graph plan with the epilogue-apart alternative (off by default) and
    without it ("fused"), both run alternated with greedy's."""
    model, shapes, feeds = load(spec)
    kw = {"input_shapes": shapes} if shapes else {}
    t0 = time.perf_counter()
    greedy = pyforge.compile(model, target="cpu", **kw)
    greedy_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    pyforge.compile(model, target="cpu", optimizer="egraph", **kw)  # fills the cost cache
    cold_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    eg = pyforge.compile(model, target="cpu", optimizer="egraph", **kw)
    compile_s = time.perf_counter() - t0
    rep = eg.details["egraph"]
    err_g, err_e = ort_error(model, feeds, greedy, eg)
    plans = [("greedy", greedy), ("egraph", eg)]
    if ab_epilogue:
        from pyforge.opt.egraph import parallel_gemm

        parallel_gemm.EPILOGUE_APART = False
        fused = pyforge.compile(model, target="cpu", optimizer="egraph", **kw)
        parallel_gemm.EPILOGUE_APART = True  # the "egraph" plan below: with it
        eg_apart = pyforge.compile(model, target="cpu", optimizer="egraph", **kw)
        eg_apart = pyforge.compile(model, target="cpu", optimizer="egraph", **kw)  # warm costs
        parallel_gemm.EPILOGUE_APART = False
        eg, rep = eg_apart, eg_apart.details["egraph"]  # "egraph" below: with the alternative
        err_e = ort_error(model, feeds, eg)[0]
        plans = [("greedy", greedy), ("egraph", eg), ("fused", fused)]
    times = {name: [] for name, _ in plans}
    for _ in range(runs):  # alternated, so all see the same load
        for name, m in plans:
            t = time.perf_counter()
            m.predict(feeds)
            times[name].append(time.perf_counter() - t)
    g_med, e_med = (statistics.median(times[k]) * 1e3 for k in ("greedy", "egraph"))
    g_min, e_min = (min(times[k]) * 1e3 for k in ("greedy", "egraph"))
    sim_g, sim_e = (t * 1e3 for t in rep.predicted)
    merged = sum(r.chosen == "merged" for r in rep.regions)
    blas = sum(g.chosen.startswith("openblas") for g in rep.groups)
    apart = sum(g.chosen.endswith("epilogue apart") for g in rep.groups)
    print(
        f"{spec}: {len(rep.regions)} shared-input regions (QKV, 1x1 branches), {merged} merged; {len(rep.groups)} other GEMM "
        f"groups, {blas} on OpenBLAS, {apart} with the epilogue apart; launches {greedy.stats['launches']} -> "
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
    if ab_epilogue:
        f_med, f_min = statistics.median(times["fused"]) * 1e3, min(times["fused"]) * 1e3
        frep = fused.details["egraph"]
        print(
            f"  epilogues all fused (no epilogue-apart alternative): simulated "
            f"{frep.predicted[1] * 1e3:.3f} ms, measured median {f_med:.3f} min {f_min:.3f} ms; "
            f"egraph with it {100 * (e_med / f_med - 1):+.1f}% median, "
            f"{100 * (e_min / f_min - 1):+.1f}% min"
        )
    line = rep.search_line() if rep.searches else "no regions, no search"
    print(
        f"  search (warm cost cache) {rep.seconds * 1e3:.1f} ms: {line}; whole compile "
        f"{compile_s:.2f} s (first, measuring what the cost table lacked: {cold_s:.2f} s; greedy "
        f"{greedy_s:.2f} s); load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    return sim_g - sim_e, g_med - e_med


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=["mlp", "resnet50", "minilm_l6:16"])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument(
        "--ab-epilogue",
        action="store_true",
        help="also run the e-graph plan without the epilogue-apart alternative, alternated",
    )
    args = ap.parse_args(argv)
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    pairs = [bench(spec, args.runs, args.ab_epilogue) for spec in args.models]
    if len(pairs) > 2:
        r = float(np.corrcoef(np.array(pairs).T)[0, 1])
        print(f"correlation of predicted and measured (median) savings over {len(pairs)}: {r:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
