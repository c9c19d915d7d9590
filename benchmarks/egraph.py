"""Greedy against the e-graph optimiser (issue 16) on the cpu: the regions it found, what it
chose and predicted (simulated region time from the measured kernel costs), the measured
predict time of both plans (runs alternated in one process, the order reversed every round):
medians, mins and the paired statistic (the median of each round's egraph/greedy ratio with a
95% bootstrap interval; with --control, the same for a second greedy plan, the noise floor),
the load average around each model's runs, the search time with a warm cost cache, each
plan's largest difference from ONNX Runtime, a markdown table, and the correlation of
predicted and measured savings over the models.

    PYTHONPATH=. python benchmarks/egraph.py --runs 100 resnet18 mobilenet_v2 minilm_l6:16
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

import numpy as np
import onnx

import pyforge
from pyforge import models
from pyforge.lower_numba.costs import load_class

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


def bench(
    spec: str, runs: int, ab_epilogue: bool = False, control: bool = False, ab_threads: bool = False
) -> tuple:
    """Prints the model's figures; returns (predicted, measured) saving in ms and a table row
    (measured: the paired median ratio's saving of greedy's median). ``control``: a second
    greedy plan alternated too, the noise floor.
    ``ab_epilogue``: the e-graph plan with the epilogue-apart alternative (off by default) and
    without it ("fused"), both run alternated with greedy's."""
    model, shapes, feeds = load(spec)
    kw = {"input_shapes": shapes} if shapes else {}
    t0 = time.perf_counter()
    greedy = pyforge.compile(model, target="cpu", **kw)
    greedy_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    klass = load_class()  # which of the cost table's two load classes the e-graph compiles use
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
    if ab_threads:  # the e-graph plan without the one-thread alternative, alternated too
        from pyforge.opt.egraph import parallel_gemm

        saved, parallel_gemm.serial_rules = parallel_gemm.serial_rules, lambda splits: []
        try:
            plans.append(("split", pyforge.compile(model, target="cpu", optimizer="egraph", **kw)))
        finally:
            parallel_gemm.serial_rules = saved
    if control:  # a second, independent greedy plan: the noise floor of identical plans
        plans.append(("greedy again", pyforge.compile(model, target="cpu", **kw)))
    times, loads = alternate(plans, feeds, runs)
    g_med, e_med = (statistics.median(times[k]) * 1e3 for k in ("greedy", "egraph"))
    g_min, e_min = (min(times[k]) * 1e3 for k in ("greedy", "egraph"))
    ratio, lo, hi = paired(times["egraph"], times["greedy"])
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
    verdict = "faster" if hi < 1 else "slower" if lo > 1 else "within noise"
    print(
        f"  paired (egraph/greedy of each alternated pair, {runs} pairs): median "
        f"{100 * (ratio - 1):+.1f}%, 95% bootstrap interval [{100 * (lo - 1):+.1f}%, "
        f"{100 * (hi - 1):+.1f}%]: {verdict}; load average {loads[0]:.1f} -> {loads[1]:.1f}"
    )
    if control:
        c, c_lo, c_hi = paired(times["greedy again"], times["greedy"])
        print(
            f"  control (a second greedy plan / greedy): median {100 * (c - 1):+.1f}%, interval "
            f"[{100 * (c_lo - 1):+.1f}%, {100 * (c_hi - 1):+.1f}%]"
        )
    if ab_threads:
        t, t_lo, t_hi = paired(times["split"], times["greedy"])
        srep = dict(plans)["split"].details["egraph"]
        print(
            f"  without the one-thread alternative: simulated {srep.predicted[1] * 1e3:.3f} ms, "
            f"paired /greedy {100 * (t - 1):+.1f}% [{100 * (t_lo - 1):+.1f}%, "
            f"{100 * (t_hi - 1):+.1f}%]"
        )
    if ab_epilogue:
        f_med, f_min = statistics.median(times["fused"]) * 1e3, min(times["fused"]) * 1e3
        frep = fused.details["egraph"]
        f, f_lo, f_hi = paired(times["egraph"], times["fused"])
        print(
            f"  epilogues all fused (no epilogue-apart alternative): simulated "
            f"{frep.predicted[1] * 1e3:.3f} ms, measured median {f_med:.3f} min {f_min:.3f} ms; "
            f"egraph with it {100 * (e_med / f_med - 1):+.1f}% median, "
            f"{100 * (e_min / f_min - 1):+.1f}% min, paired {100 * (f - 1):+.1f}% "
            f"[{100 * (f_lo - 1):+.1f}%, {100 * (f_hi - 1):+.1f}%]"
        )
    line = rep.search_line() if rep.searches else "no regions, no search"
    print(
        f"  search (warm cost cache) {rep.seconds * 1e3:.1f} ms: {line}; whole compile "
        f"{compile_s:.2f} s (first, measuring what the cost table lacked: {cold_s:.2f} s; greedy "
        f"{greedy_s:.2f} s); costs of the {klass} class",
        flush=True,
    )
    row = (
        f"| {spec} | {merged}/{len(rep.regions)} merged, {blas}/{len(rep.groups)} OpenBLAS | "
        f"{sim_g:.2f} -> {sim_e:.2f} | {g_med:.2f} -> {e_med:.2f} ({100 * (e_med / g_med - 1):+.1f}%)"
        f" | {g_min:.2f} -> {e_min:.2f} | {100 * (ratio - 1):+.1f}% [{100 * (lo - 1):+.1f}, "
        f"{100 * (hi - 1):+.1f}] {verdict} | {loads[0]:.1f}-{loads[1]:.1f} ({klass}) | "
        f"{rep.seconds * 1e3:.0f} ms |"
    )
    return sim_g - sim_e, (1 - ratio) * g_med, row


def alternate(plans: list, feeds: dict, runs: int, warmup: int = 5) -> tuple[dict, tuple]:
    """Each plan's predict times over ``runs`` rounds, the plans in turn, round i starting at
    plan i (each plan follows each other one, and itself, alike), garbage collection off;
    ``warmup`` untimed rounds first. Returns (times, load average before/after)."""
    for _ in range(warmup):
        for _, m in plans:
            m.predict(feeds)
    times = {name: [] for name, _ in plans}
    load0 = os.getloadavg()[0]
    gc.collect()
    gc.disable()
    try:
        for i in range(runs):
            for name, m in plans[i % len(plans) :] + plans[: i % len(plans)]:
                t = time.perf_counter()
                m.predict(feeds)
                times[name].append(time.perf_counter() - t)
    finally:
        gc.enable()
    return times, (load0, os.getloadavg()[0])


def paired(a: list[float], b: list[float], resamples: int = 2000) -> tuple[float, float, float]:
    """The median of the per-round ratios a_i / b_i (runs alternated, so each pair saw the same
    load) and its 95% bootstrap interval (pairs resampled, seeded)."""
    r = np.asarray(a) / np.asarray(b)
    rng = np.random.default_rng(0)
    boot = np.median(r[rng.integers(0, len(r), (resamples, len(r)))], axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return float(np.median(r)), float(lo), float(hi)


HEADER = (
    "| model | decided | simulated greedy -> egraph (ms) | median (ms) | min (ms) | paired "
    "egraph/greedy [95% interval] | load | search (warm) |\n|---|---|---|---|---|---|---|---|"
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=["mlp", "resnet50", "minilm_l6:16"])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument(
        "--ab-epilogue",
        action="store_true",
        help="also run the e-graph plan without the epilogue-apart alternative, alternated",
    )
    ap.add_argument(
        "--control",
        action="store_true",
        help="also run a second greedy plan, alternated: the noise floor of identical plans",
    )
    ap.add_argument(
        "--ab-threads",
        action="store_true",
        help="also run the e-graph plan without the one-thread alternative, alternated",
    )
    args = ap.parse_args(argv)
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    ab = args.ab_epilogue, args.control, args.ab_threads
    out = [bench(spec, args.runs, *ab) for spec in args.models]
    print(HEADER, *(row for _, _, row in out), sep="\n")
    if len(out) > 2:
        r = float(np.corrcoef(np.array([o[:2] for o in out]).T)[0, 1])
        print(
            f"correlation of predicted and measured (paired median) savings over {len(out)}: {r:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
