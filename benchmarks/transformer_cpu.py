"""Transformers on the cpu against ONNX Runtime (issue 17): batch 1, seq 128.

    python benchmarks/transformer_cpu.py [--models all_minilm_l6_v2,minilm_l6,block,bert_base,encoder]
                                         [--rounds 20] [--steps K] [--seq 128]

pyforge's ``predict`` and ORT (CPU provider, 2 intra-op threads) alternate call by call in one
process, so both see the same drift; prints each median, the ratio, max |err| and the load
average. The corpus models come from benchmarks/corpus.py's cache (built there once); "encoder"
is benchmarks/under_load.py's MiniLM-sized encoder. ``--steps K`` times each step of pyforge's
plan alone (``runtime.calls`` one by one, in plan order each round) and prints the K slowest steps and the
total per kind of step.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnx

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODELS = "all_minilm_l6_v2,minilm_l6,block,bert_base,encoder"


def model_and_feeds(name: str, seq: int) -> tuple[str, dict]:
    if name == "encoder":
        from benchmarks.under_load import encoder

        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"pyforge_encoder_s{seq}_v1.onnx")
        if not os.path.exists(path):
            onnx.save(encoder(seq=seq), path)
        x = np.random.default_rng(0).standard_normal((1, seq, 384)).astype(np.float32)
        return path, {"x": x}
    from benchmarks import corpus

    entry = corpus.ENTRIES[name]
    path = corpus.model_path(entry)
    entry = dataclasses.replace(entry, dims=({"batch": 1, "seq": seq},) * 2)
    return str(path), corpus.make_feeds(path, entry, 0, seed=1)


def alternate(runs: dict, rounds: int) -> dict:
    times = {k: [] for k in runs}
    for _ in range(rounds):
        for k, fn in runs.items():
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return times


def session(path: str):
    """ORT as cnn_cpu.py runs it: calls alternate one by one here, and a spinning ORT thread
    would take a core from the pyforge call after it (all_minilm_l6_v2: 71 ms with spinning
    against 36 without, ORT itself 28 either way)."""
    from benchmarks.cnn_cpu import session as cpu_session

    return cpu_session(path)


def measure(name: str, seq: int, rounds: int) -> None:
    import pyforge

    path, feeds = model_and_feeds(name, seq)
    sess = session(path)
    model = pyforge.compile(path, target="cpu")
    ref = sess.run(None, feeds)
    out = model.predict(feeds)
    got = list(out.values()) if isinstance(out, dict) else [out]
    err = max(float(np.abs(np.asarray(g) - r).max()) for g, r in zip(got, ref))
    runs = {"pyforge": lambda: model.predict(feeds), "ort": lambda: sess.run(None, feeds)}
    alternate(runs, 3)
    med = {k: float(np.median(v)) * 1e3 for k, v in alternate(runs, rounds).items()}
    print(
        f"{name:17s} seq {seq}: pyforge {med['pyforge']:8.2f} ms  ORT {med['ort']:8.2f} ms"
        f"  {med['pyforge'] / med['ort']:5.2f}x  max|err| {err:.1e}  load {os.getloadavg()[0]:.2f}",
        flush=True,
    )


def steps(name: str, seq: int, rounds: int, top: int) -> None:
    import pyforge

    path, feeds = model_and_feeds(name, seq)
    model = pyforge.compile(path, target="cpu")
    model.predict(feeds)
    rt, plan = model.runtime, model.plan.steps
    times: list[list[float]] = [[] for _ in rt.calls]
    for _ in range(rounds):  # the steps in plan order on freshly staged inputs (the arena reuses
        for k, arr in feeds.items():  # an input's slot after its last reader)
            rt.views[k][:] = np.ravel(arr)
        for i, call in enumerate(rt.calls):
            t = time.perf_counter()
            call()
            times[i].append(time.perf_counter() - t)
    med = [float(np.median(t)) * 1e3 for t in times]
    low = [min(t) * 1e3 for t in times]  # on a loaded machine the nearer to a quiet figure

    def kind(i: int) -> str:
        return rt.gemm_impls.get(i) or f"kernel {plan[i].label.split()[0]}"

    print(f"{name} seq {seq}: the {top} slowest of {len(med)} steps (median, min ms)")
    for i in sorted(range(len(med)), key=lambda i: -med[i])[:top]:
        print(f"  {i:4d} {kind(i):28s} {plan[i].label[:50]:50s} {med[i]:8.3f} {low[i]:8.3f}")
    kinds: dict[str, list] = {}
    for i in range(len(med)):
        k = kinds.setdefault(kind(i), [0.0, 0.0, 0])
        k[0], k[1], k[2] = k[0] + med[i], k[1] + low[i], k[2] + 1
    for k, (t, lo, n) in sorted(kinds.items(), key=lambda kv: -kv[1][0]):
        print(f"  {n:4d} x {k:28s} {t:8.3f} {lo:8.3f} ms")
    print(f"  all steps {sum(med):.3f} (min {sum(low):.3f}) ms  load {os.getloadavg()[0]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=0, help="profile each step; print the top K")
    args = ap.parse_args()
    for name in args.models.split(","):
        if args.steps:
            steps(name, args.seq, args.rounds, args.steps)
        else:
            measure(name, args.seq, args.rounds)


if __name__ == "__main__":
    main()
