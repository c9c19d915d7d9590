"""Depthwise CNNs on the cpu target against ONNX Runtime (issue 17), batch 1, fp32.

    python benchmarks/cnn_cpu.py [--models squeezenet1_1,mobilenet_v2] [--rounds 5] [--calls 10]
    python benchmarks/cnn_cpu.py --steps 12 --models mobilenet_v2   # where pyforge's time goes

Each model comes from the corpus cache (benchmarks/corpus.py builds it with torchvision when it
is absent). pyforge (``pyforge.compile(path, target="cpu")``) and ORT (CPU provider, as many
intra-op threads as Numba's ``NUMBA_NUM_THREADS``, spinning off) run call by call in one
process, so drift hits both alike; prints each median, the ratio of medians, the [min-max] of the per-round ratios, the max abs error
against ORT and the load average. ``--steps K`` times each step of pyforge's plan alone
(``runtime.calls`` alternated one by one) and prints the K slowest, then totals per kind.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODELS = "squeezenet1_1,mobilenet_v2,mobilenet_v3_small,shufflenet_v2_x1_0,efficientnet_b0"
MODELS += ",regnet_y_400mf"


def model_file(name: str) -> str:
    """A corpus model's file, or pyforge.models' seeded ResNet-50 for "resnet50"."""
    if name == "resnet50":
        from pyforge.models import cached_model

        return cached_model("resnet50")
    from benchmarks import corpus

    return str(corpus.model_path(corpus.ENTRIES[name]))


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def alternate(runs: dict, rounds: int, calls: int) -> dict:
    """{who: [[seconds of round 0], ...]}: every contender call by call, in alternating order."""
    times = {who: [[] for _ in range(rounds)] for who in runs}
    order = list(runs)
    for r in range(rounds):
        for _ in range(calls):
            for who in order if r % 2 == 0 else order[::-1]:
                times[who][r].append(timed(runs[who]))
    return times


def session(path: str):
    import numba
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = numba.get_num_threads()  # as many threads as pyforge's
    opts.inter_op_num_threads = 1
    # a spinning ORT thread takes the core from the pyforge call that follows it
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def measure(name: str, rounds: int, calls: int) -> dict:
    import pyforge
    from pyforge.models import random_inputs

    path = model_file(name)
    feeds = random_inputs(path, seed=0)
    model, sess = pyforge.compile(path, target="cpu"), session(path)
    ref = sess.run(None, feeds)[0]
    out = model.predict(feeds)
    out = out if isinstance(out, np.ndarray) else next(iter(out.values()))
    err = float(np.abs(out - ref).max())
    runs = {"pyforge": lambda: model.predict(feeds), "ort": lambda: sess.run(None, feeds)}
    alternate(runs, 1, 3)
    times = alternate(runs, rounds, calls)
    med = {w: float(np.median(np.concatenate(t))) * 1e3 for w, t in times.items()}
    per = [np.median(p) / np.median(o) for p, o in zip(times["pyforge"], times["ort"])]
    row = dict(model=name, pyforge=med["pyforge"], ort=med["ort"], err=err, load=os.getloadavg()[0])
    row.update(ratio=med["pyforge"] / med["ort"], lo=min(per), hi=max(per))
    print(
        f"| {name} | {row['pyforge']:.2f} | {row['ort']:.2f} | **{row['ratio']:.2f}x**"
        f" [{row['lo']:.2f}-{row['hi']:.2f}] | {err:.1e} | {row['load']:.1f} |",
        flush=True,
    )
    return row


def step_profile(name: str, rounds: int, calls: int, top: int) -> None:
    import pyforge
    from pyforge.models import random_inputs

    path = model_file(name)
    model = pyforge.compile(path, target="cpu")
    model.predict(random_inputs(path, seed=0))
    rt, steps = model.runtime, model.plan.steps
    times = alternate(dict(enumerate(rt.calls)), rounds, calls)
    med = [float(np.median(np.concatenate(times[i]))) * 1e3 for i in range(len(steps))]

    def kind(i: int) -> str:
        return rt.gemm_impls.get(i) or f"kernel {(steps[i].label or '?').split()[0]}"

    print(f"{name}: the {top} slowest of {len(steps)} steps (median ms)")
    for i in sorted(range(len(steps)), key=lambda i: -med[i])[:top]:
        print(f"  {i:4d} {kind(i):24s} {(steps[i].label or '')[:60]:60s} {med[i]:8.3f}")
    kinds: dict[str, list] = {}
    for i, m in enumerate(med):
        k = kinds.setdefault(kind(i), [0.0, 0])
        k[0], k[1] = k[0] + m, k[1] + 1
    for k, (t, n) in sorted(kinds.items(), key=lambda kv: -kv[1][0]):
        print(f"  {n:4d} x {k:32s} {t:8.3f} ms ({100 * t / sum(med):4.1f}%)")
    print(f"  all steps {sum(med):.3f} ms, load average {os.getloadavg()[0]:.1f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=10, help="calls of each contender per round")
    ap.add_argument("--steps", type=int, default=0, help="profile each step; print the top K")
    args = ap.parse_args()
    if args.steps:
        for name in args.models.split(","):
            step_profile(name, args.rounds, args.calls, args.steps)
        return
    print("| model | pyforge ms | ORT ms | pyforge/ORT [per-round range] | max err | load |")
    print("|---|---|---|---|---|---|")
    rows = [measure(name, args.rounds, args.calls) for name in args.models.split(",")]
    geo = float(np.exp(np.mean([np.log(r["ratio"]) for r in rows])))
    print(f"geometric mean of the ratios: {geo:.2f}x over {len(rows)} models")


if __name__ == "__main__":
    main()
