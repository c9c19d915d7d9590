"""Time the plan a new input signature compiles at predict, with a warm kernel cache.

    python scripts/new_shape_time.py [--model resnet50] [--target cpu] [--batches 1,2,4,8]
                                     [--fresh-cache] [--algos] [--runs N] [--reuse-algos]

Compiles the model with a symbolic batch dim, predicts once at each batch (the first batch's
plan comes from compile()), then once more at each: the second pass reuses every plan. Prints
the seconds each first predict took and where they went: the compile stages (import, passes,
lowering, plan), bind (kernel modules, cuBLASLt plans and their tuning, arena, graph capture),
jit (the warm-up run: Numba compiles or loads each kernel there), the Numba kernels compiled
from source (NVVM on cuda) and loaded from the disk cache, and the predict's own run.

``--fresh-cache``: PYFORGE_CACHE is a new directory, warmed at the first batch by a child
process (compile + predict), so the measured process starts with exactly the first shape's
kernels and cuBLASLt choices on disk. ``--algos`` (cuda, with --fresh-cache): after the run,
whether each GEMM's tuned cuBLASLt algorithm at the new batch sizes is the first batch's.
``--runs N``: then the median of N predicts at each batch (the plans' steady-state speed).
``--reuse-algos`` (an experiment, cuda): a GEMM shape not in the cuBLASLt cache takes the
algorithm tuned for that GEMM at another batch size, untimed (``_reuse_algos``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--target", default=None)
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--fresh-cache", action="store_true")
    ap.add_argument("--algos", action="store_true")
    ap.add_argument("--runs", type=int, default=0, help="then time N predicts at each batch")
    ap.add_argument("--reuse-algos", action="store_true")
    ap.add_argument("--warm-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.fresh_cache:
        os.environ["PYFORGE_CACHE"] = tempfile.mkdtemp(prefix="pyforge_new_shape_")
        t0 = time.perf_counter()
        warm = [sys.executable, __file__, "--model", args.model, "--batches", str(batches[0])]
        warm += ["--warm-only"] + (["--target", args.target] if args.target else [])
        subprocess.run(warm, check=True)
        print(f"cache {os.environ['PYFORGE_CACHE']} warmed at batch {batches[0]}: "
              f"{time.perf_counter() - t0:.1f} s (child process)")  # fmt: skip

    import pyforge
    from pyforge.models import MODELS

    if args.reuse_algos and not args.warm_only:
        _reuse_algos()

    proto = MODELS[args.model](batch="batch")
    used0 = _device_used(args.target)
    t0 = time.perf_counter()
    model = pyforge.compile(proto, target=args.target)
    _ = model.stats  # binds compile()'s plan, where compile left that to the first predict
    rng = np.random.default_rng(0)
    shape = model.inputs[0].shape
    if args.warm_only:
        model.predict(rng.standard_normal((batches[0], *shape[1:])).astype(np.float32))
        return
    loads = _kernel_loads()
    print(f"compile (batch {batches[0]} plan): {time.perf_counter() - t0:.2f} s")
    print("   " + _breakdown(model._current, loads, None))
    for rnd in ("first", "again"):
        for b in batches:
            x = rng.standard_normal((b, *shape[1:])).astype(np.float32)
            before, t0 = _kernel_loads(), time.perf_counter()
            model.predict(x)
            took = time.perf_counter() - t0
            print(f"{rnd:5s} predict at batch {b}: {took:.2f} s")
            if rnd == "first" and b != batches[0]:
                print("   " + _breakdown(model._current, _kernel_loads(before), took))
    for b in batches[1:]:  # a new batch's last row against that image alone (the first plan)
        x = rng.standard_normal((b, *shape[1:])).astype(np.float32)
        last, alone = _host(model.predict(x))[-1:], _host(model.predict(x[-1:]))
        print(f"batch {b}: last row vs that image at batch 1: max abs diff "
              f"{float(np.abs(last - alone).max()):.2e}")  # fmt: skip
    for b in batches if args.runs else ():  # steady state: the median of N calls
        x = rng.standard_normal((b, *shape[1:])).astype(np.float32)
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            model.predict(x)
            times.append(time.perf_counter() - t0)
        print(f"batch {b}: median {np.median(times) * 1e3:.3f} ms, min "
              f"{min(times) * 1e3:.3f} ms over {args.runs} predicts")  # fmt: skip
    print("plans held:", model.stats["plans"])
    if model.target == "cuda":  # one weights upload for every plan, plus one arena each
        bound = list(model._plans.values())
        weights = {id(b.plan.weights): b.plan.weights.nbytes for b in bound}
        arenas = sum(b.plan.arena_bytes for b in bound)
        used = _device_used("cuda") - used0
        print(
            f"device bytes in use: {used / 2**20:.1f} MiB; distinct weights arrays "
            f"{len(weights)} ({sum(weights.values()) / 2**20:.1f} MiB), arenas "
            f"{arenas / 2**20:.1f} MiB (one per plan and execution context)"
        )
        if args.algos:
            _algo_report(Path(os.environ.get("PYFORGE_CACHE", "")) / "cublaslt")


def _host(y):
    return y.copy_to_host() if hasattr(y, "copy_to_host") else np.asarray(y)


def _breakdown(bound, loads: tuple[int, int], took: float | None) -> str:
    """One line: the plan's stage seconds, bind's parts, kernels compiled / loaded, the run."""
    st, rt = bound.stats["stage_seconds"], bound.runtime
    parts = [f"{k} {v:.2f}" for k, v in st.items()]
    tune, tuned = getattr(rt, "tune_seconds", None), getattr(rt, "tuned", 0)
    if tune is not None:  # cuda: bind's share spent timing cuBLASLt candidates, and the capture
        parts.append(f"(of bind: cuBLASLt tuning {tune:.2f} for {tuned} GEMMs, "
                     f"capture {rt.capture_seconds:.2f})")  # fmt: skip
    parts.append(f"kernels compiled {loads[0]}, from disk {loads[1]}")
    if took is not None:
        parts.append(f"run {took - sum(st.values()):.2f}")
    return ", ".join(parts) + " s"


def _kernel_loads(since: tuple[int, int] = (0, 0)) -> tuple[int, int]:
    """(Numba compiles from source, disk-cache loads) over every kernel loaded so far."""
    from pyforge.exec.kernels import _LOADED

    misses = hits = 0
    for fn in list(_LOADED.values()):
        stats = getattr(fn, "stats", None)
        misses += sum(getattr(stats, "cache_misses", {}).values())
        hits += sum(getattr(stats, "cache_hits", {}).values())
    return misses - since[0], hits - since[1]


def _algo_report(cache: Path) -> None:
    """GEMMs grouped by all but their batch-dependent fields (m, batch, strides): does each new
    batch size's tuned algorithm equal the one tuned at the smallest m?"""
    groups: dict[str, list] = {}
    for f in sorted(cache.glob("*.json")):
        e = json.loads(f.read_text())
        key = {k: v for k, v in e["key"].items() if k not in ("m", "batch", "strides")}
        groups.setdefault(json.dumps(key, sort_keys=True), []).append(e)
    same = total = 0
    print(f"cuBLASLt choices in {cache}: {len(groups)} GEMM groups")
    for key, es in groups.items():
        es.sort(key=lambda e: (e["key"]["batch"], e["key"]["m"]))
        first = es[0]["algo"]
        same += sum(e["algo"] == first for e in es[1:])
        total += len(es) - 1
        k = json.loads(key)
        row = ", ".join(
            f"m={e['key']['m']}x{e['key']['batch']}: {e['algo'][:16]} {e['time_us']:.1f} us"
            + ("" if e["algo"] == first else " *")
            for e in es
        )
        print(f"  n={k['n']} k={k['k']} {k['precision']} act={k['act']}: {row}")
    print(f"new batch sizes tuned to the first size's algorithm: {same} of {total} (* differs)")


def _reuse_algos() -> None:
    """The experiment: a GEMM missing from the cuBLASLt cache takes the algorithm tuned for the
    same GEMM at another m / batch (all other fields equal) where cuBLASLt accepts it for this
    shape, instead of timing candidates."""
    from pyforge.exec.cuda import cublaslt

    tune = cublaslt.LtGemm._tune
    drop = ("m", "batch", "strides", "gpu", "cc", "lt")

    def reuse(self, results):
        mine = {k: v for k, v in self._key.items() if k not in drop}
        for f in sorted(cublaslt._default_cache_dir().glob("*.json")):
            e = json.loads(f.read_text())
            if {k: v for k, v in e["key"].items() if k not in drop} == mine:
                algo = np.frombuffer(bytes.fromhex(e["algo"]), np.uint64).copy()
                if self._algo_ok(algo):
                    self.reused = getattr(self, "reused", 0) + 1
                    return algo, float("nan")
        return tune(self, results)

    cublaslt.LtGemm._tune = reuse


def _device_used(target: str | None) -> int:
    if target != "cuda":
        return 0
    from numba import cuda

    free, total = cuda.current_context().get_memory_info()
    return total - free


if __name__ == "__main__":
    main()
