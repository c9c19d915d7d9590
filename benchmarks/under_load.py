"""The cpu target with one of its cores taken by another process (issue 14, item 6).

    python benchmarks/under_load.py [--cores 0,1] [--models resnet50,encoder,mlp] [--rounds 6]
    python benchmarks/under_load.py --steps 12 --models resnet50   # where the busy time goes

The script pins itself to ``--cores``; "busy" is a child process spinning (``while True: pass``)
pinned to the last of them. Per model, quiet and busy blocks alternate in one process (the
spinner started before and killed after each busy block), and within each block pyforge's
``predict`` and ONNX Runtime (CPU provider, ``intra_op_num_threads`` = the number of cores)
alternate call by call, so both see the same drift. Prints each median and the busy / quiet
ratios; the goal is pyforge's ratio <= 1.5 and no worse than ORT's. ``--steps K`` times each
step of pyforge's plan alone instead (same alternation, ``runtime.calls`` one by one) and prints
the K steps that lose most under load, then the quiet and busy totals per kind of step.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def encoder(layers: int = 6, hidden: int = 384, heads: int = 12, ffn: int = 1536, seq: int = 128):
    """A MiniLM-L6-sized BERT encoder (no embeddings): per layer self-attention and a Gelu MLP,
    each followed by a residual Add and LayerNormalization. Seeded random weights."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    hd = hidden // heads

    def const(name, array):
        inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def w(name, shape):
        return const(name, (rng.standard_normal(shape) * shape[0] ** -0.5).astype(np.float32))

    def op(kind, inputs, name, **attrs):
        nodes.append(helper.make_node(kind, inputs, [name], name=name, **attrs))
        return name

    def dense(x, name, cin, cout):
        y = op("MatMul", [x, w(f"{name}.w", (cin, cout))], f"{name}.mm")
        return op(
            "Add", [y, const(f"{name}.b", rng.standard_normal(cout).astype(np.float32) * 0.1)], name
        )

    def norm(x, name):  # LayerNormalization as exported before opset 17
        g = const(f"{name}.g", 1 + rng.standard_normal(hidden).astype(np.float32) * 0.1)
        b = const(f"{name}.beta", rng.standard_normal(hidden).astype(np.float32) * 0.1)
        d = op("Sub", [x, op("ReduceMean", [x], f"{name}.mean", axes=[-1])], f"{name}.d")
        v = op("ReduceMean", [op("Mul", [d, d], f"{name}.d2")], f"{name}.var", axes=[-1])
        s = op(
            "Sqrt",
            [op("Add", [v, const(f"{name}.eps", np.float32(1e-12))], f"{name}.ve")],
            f"{name}.sd",
        )
        return op("Add", [op("Mul", [op("Div", [d, s], f"{name}.n"), g], f"{name}.ng"), b], name)

    split = const("split_shape", np.array([1, seq, heads, hd], np.int64))
    merge = const("merge_shape", np.array([1, seq, hidden], np.int64))
    scale = const("scale", np.array(hd**-0.5, np.float32))
    half, one, rs2 = (
        const(n, np.array(v, np.float32))
        for n, v in (("half", 0.5), ("one", 1.0), ("rs2", 2**-0.5))
    )
    x = "x"
    for i in range(layers):
        p = f"l{i}"
        qkv = []
        for t in "qkv":
            r = op("Reshape", [dense(x, f"{p}.{t}", hidden, hidden), split], f"{p}.{t}.split")
            perm = [0, 2, 3, 1] if t == "k" else [0, 2, 1, 3]
            qkv.append(op("Transpose", [r], f"{p}.{t}.t", perm=perm))
        s = op("Mul", [op("MatMul", qkv[:2], f"{p}.qk"), scale], f"{p}.scaled")
        a = op("MatMul", [op("Softmax", [s], f"{p}.softmax", axis=-1), qkv[2]], f"{p}.av")
        a = op(
            "Reshape", [op("Transpose", [a], f"{p}.av.t", perm=[0, 2, 1, 3]), merge], f"{p}.merge"
        )
        x = norm(op("Add", [dense(a, f"{p}.o", hidden, hidden), x], f"{p}.res1"), f"{p}.ln1")
        h = dense(x, f"{p}.ff1", hidden, ffn)
        e = op("Add", [op("Erf", [op("Mul", [h, rs2], f"{p}.hs")], f"{p}.erf"), one], f"{p}.erf1")
        h = op("Mul", [op("Mul", [h, half], f"{p}.hh"), e], f"{p}.gelu")
        x = norm(op("Add", [dense(h, f"{p}.ff2", ffn, hidden), x], f"{p}.res2"), f"{p}.ln2")
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(
        nodes, "encoder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, hidden])],
        initializer=inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def kernels() -> onnx.ModelProto:
    """Only generated kernels, no GEMM: SiLU over [1, 64, 112, 112], a 3x3 stride-2 MaxPool,
    then a Softmax over rows of 3,136 and a LayerNormalization over the channels."""
    rng = np.random.default_rng(1)
    g, b = (rng.standard_normal(3136).astype(np.float32) for _ in range(2))
    nodes = [
        helper.make_node("Sigmoid", ["x"], ["s"]),
        helper.make_node("Mul", ["x", "s"], ["silu"]),
        helper.make_node("MaxPool", ["silu"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["p", "rows"], ["r"]),
        helper.make_node("Softmax", ["r"], ["sm"], axis=-1),
        helper.make_node("LayerNormalization", ["sm", "g", "b"], ["y"], axis=-1),
    ]  # fmt: skip
    inits = [numpy_helper.from_array(np.array([64, 3136], np.int64), "rows")]
    inits += [numpy_helper.from_array(g, "g"), numpy_helper.from_array(b, "b")]
    graph = helper.make_graph(
        nodes, "kernels",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 112, 112])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 3136])],
        initializer=inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def spinner(core: int) -> subprocess.Popen:
    code = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True:\n    pass\n"
    return subprocess.Popen([sys.executable, "-c", code])


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def alternate(runs: dict, cores: list[int], rounds: int, calls: int) -> dict:
    """{(who, "quiet"|"busy"): [seconds]}: quiet and busy blocks alternate (the spinner pinned to
    the last core during busy ones), and within a block every contender runs call by call."""
    times = {(who, cond): [] for who in runs for cond in ("quiet", "busy")}
    for r in range(rounds):
        for cond in ("quiet", "busy") if r % 2 == 0 else ("busy", "quiet"):
            child = spinner(cores[-1]) if cond == "busy" else None
            time.sleep(0.3 if child else 0.0)
            try:
                for _ in range(calls):
                    for who, fn in runs.items():
                        times[who, cond].append(timed(fn))
            finally:
                if child:
                    child.kill()
                    child.wait()
    return times


def measure(name: str, path: str, cores: list[int], rounds: int, calls: int) -> dict:
    import onnxruntime as ort

    import pyforge
    from pyforge.models import random_inputs

    feeds = random_inputs(path, seed=0)
    model = pyforge.compile(path, target="cpu")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = len(cores)
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    ref = sess.run(None, feeds)[0]
    out = model.predict(feeds)
    out = out if isinstance(out, np.ndarray) else next(iter(out.values()))
    err = float(np.abs(out - ref).max())
    runs = {"pyforge": lambda: model.predict(feeds), "ort": lambda: sess.run(None, feeds)}
    for _ in range(3):
        for fn in runs.values():
            fn()
    times = alternate(runs, cores, rounds, calls)
    med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    p90 = {k: float(np.percentile(v, 90)) * 1e3 for k, v in times.items()}
    row = {"model": name, "err": err, "med": med, "p90": p90}
    pf = med["pyforge", "busy"] / med["pyforge", "quiet"]
    ot = med["ort", "busy"] / med["ort", "quiet"]
    print(
        f"{name:9s} pyforge quiet {med['pyforge', 'quiet']:8.3f} busy {med['pyforge', 'busy']:8.3f}"
        f" ms ({pf:.2f}x, p90 {p90['pyforge', 'busy']:.3f})   ORT quiet {med['ort', 'quiet']:8.3f}"
        f" busy {med['ort', 'busy']:8.3f} ms ({ot:.2f}x, p90 {p90['ort', 'busy']:.3f})"
        f"   max|err| {err:.1e}",
        flush=True,
    )
    return row


def step_profile(name: str, path: str, cores: list[int], rounds: int, calls: int, top: int):
    import pyforge
    from pyforge.models import random_inputs

    model = pyforge.compile(path, target="cpu")
    model.predict(random_inputs(path, seed=0))
    rt, steps = model.runtime, model.plan.steps
    times = alternate(dict(enumerate(rt.calls)), cores, rounds, calls)
    med = {
        c: [float(np.median(times[i, c])) * 1e3 for i in range(len(rt.calls))]
        for c in ("quiet", "busy")
    }

    def kind(i: int) -> str:
        impl = rt.gemm_impls.get(i)
        return impl or f"kernel {steps[i].label.split()[0]}"

    order = sorted(range(len(steps)), key=lambda i: med["quiet"][i] - med["busy"][i])
    print(f"{name}: the {top} steps that lose most under load (median ms quiet -> busy)")
    for i in order[:top]:
        q, b = med["quiet"][i], med["busy"][i]
        print(
            f"  {i:4d} {kind(i):28s} {steps[i].label[:40]:40s} {q:8.3f} -> {b:8.3f} ({b / q:.2f}x)"
        )
    kinds: dict[str, list[float]] = {}
    for i in range(len(steps)):
        k = kinds.setdefault(kind(i), [0.0, 0.0, 0])
        k[0], k[1], k[2] = k[0] + med["quiet"][i], k[1] + med["busy"][i], k[2] + 1
    for k, (q, b, n) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
        print(f"  {n:4d} x {k:28s} {q:8.3f} -> {b:8.3f} ms ({b / q:.2f}x)")
    q, b = sum(med["quiet"]), sum(med["busy"])
    print(f"  all steps {q:.3f} -> {b:.3f} ms ({b / q:.2f}x)", flush=True)


def micro(cores: list[int], rounds: int, calls: int, slow: int, n: int = 1 << 20) -> None:
    """One SiLU loop over ``n`` floats two ways, alternated call by call: Numba's static
    ``prange`` halves and the claimed tiles of the generated kernels (exec/cpu/tiles.py).
    ``slow`` > 1: the region's thread 1 computes each of its elements that many times, a
    straggler made by hand (the same on any machine, loaded or not); 2 or 4."""
    import math

    import numba
    from numba import njit, prange

    from pyforge.exec.cpu.runtime import usable_threads
    from pyforge.exec.cpu.tiles import claim, threads, tiling

    @njit(nogil=True, inline="always")
    def silu(v, reps):
        acc = np.float32(0)
        for r in range(reps):  # the same value each time (the tiny shift defeats CSE)
            w = v + np.float32(r * 1e-30)
            acc += w / (np.float32(1) + math.exp(-w))
        return acc / np.float32(reps)  # exact for reps 1, 2, 4

    @njit(parallel=True, nogil=True)
    def static(x, y, slow):  # one equal share per thread, as Numba schedules a prange
        parts = threads()
        per = -(-len(x) // parts)
        for p in prange(parts):
            reps = slow if numba.get_thread_id() == 1 else 1
            for i in range(p * per, min(len(x), p * per + per)):
                iu = numba.uint64(i)
                y[iu] = silu(x[iu], reps)

    @njit(parallel=True, nogil=True)
    def tiled(x, y, slow):
        parts = threads()
        per, tiles, nxt = tiling(len(x), parts)
        for _ in prange(parts):
            reps = slow if numba.get_thread_id() == 1 else 1
            t = claim(nxt)
            while t < tiles:
                for i in range(t * per, min(len(x), t * per + per)):
                    iu = numba.uint64(i)
                    y[iu] = silu(x[iu], reps)
                t = claim(nxt)

    numba.set_num_threads(usable_threads())
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    ys = {"static": np.empty_like(x), "tiled": np.empty_like(x)}
    runs = {
        "static": lambda: static(x, ys["static"], slow),
        "tiled": lambda: tiled(x, ys["tiled"], slow),
    }
    for fn in runs.values():
        fn()
    assert np.array_equal(ys["static"], ys["tiled"])
    times = alternate(runs, cores, rounds, calls)
    for who in runs:
        q, b = (float(np.median(times[who, c])) * 1e3 for c in ("quiet", "busy"))
        print(
            f"micro {who:6s} silu n={n} slow={slow}: quiet {q:.3f} busy {b:.3f} ms ({b / q:.2f}x)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cores", default="0,1")
    ap.add_argument("--models", default="resnet50,encoder,mlp")
    ap.add_argument("--rounds", type=int, default=6, help="quiet/busy blocks of each kind")
    ap.add_argument("--calls", type=int, default=0, help="calls per block (default per model)")
    ap.add_argument("--steps", type=int, default=0, help="profile each step; print the top K")
    ap.add_argument("--micro", action="store_true", help="static prange vs claimed tiles only")
    ap.add_argument("--slow", type=int, default=1, help="--micro: thread 1's work per element")
    args = ap.parse_args()
    cores = [int(c) for c in args.cores.split(",")]
    os.sched_setaffinity(0, cores)  # before any thread pool starts: its threads inherit it
    from pyforge.models import cached_model

    print(f"cores {cores}, spinner on core {cores[-1]}, {args.rounds} rounds; "
          f"NUMBA_NUM_THREADS={os.environ.get('NUMBA_NUM_THREADS', '(unset)')}")  # fmt: skip
    if args.micro:
        return micro(cores, args.rounds, args.calls or 100, args.slow)
    for name in args.models.split(","):
        if name in ("encoder", "kernels"):
            path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"pyforge_{name}_v1.onnx")
            if not os.path.exists(path):
                onnx.save(encoder() if name == "encoder" else kernels(), path)
        else:
            path = cached_model(name)
        calls = args.calls or {"resnet50": 5, "encoder": 10, "kernels": 20}.get(name, 200)
        if args.steps:
            step_profile(name, path, cores, args.rounds, calls, args.steps)
        else:
            measure(name, path, cores, args.rounds, calls)


if __name__ == "__main__":
    main()
