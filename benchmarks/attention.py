"""Fused attention (issue 17 item 3): pyforge with the attention pass on and off, beside ORT (cpu)
or torch's scaled_dot_product_attention in a CUDA graph (cuda), alternated in one process.

    python benchmarks/attention.py [--target cpu|cuda] [--rounds 7] [--calls 20] [--only NAME,...]

Workloads (seeded random weights, batch 1, additive (B, 1, 1, S) padding mask):
``minilm`` a MiniLM-L6-sized encoder (6 layers, hidden 384, 12 heads, FFN 1536, seq 128);
``bert_layer`` one BERT-base-sized layer (hidden 768, 12 heads, FFN 3072, seq 128);
``attn`` attention alone on q/k/v (1, 12, 128, 64); ``decode`` one query against 512 keys;
``prefill_d256`` (only by --only) Gemma 3's prefill of 1024 tokens (4 heads of 256; on cuda also
the fused kernel with the prefill kernel off: the per-row kernel); ``gemma_dec256``,
``gemma_dec256_short`` and ``gemma_dec1216`` (only by --only) Gemma 3's decode step against a
static cache of max_context 256 / 1216 (4 query heads on 1 KV head of 256, a Where mask keeping the
first 133 / 9 / 1088 keys).
Per round each contender runs ``--calls`` predicts; a figure is the median of the round
medians, [min-max] over rounds. On cuda, inputs and outputs stay on the device (pyforge takes
Numba device arrays) and torch (when installed) runs the same q/k/v through SDPA captured in a
CUDA graph (attention workloads only). The table is printed last.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import numpy as np
from onnx import TensorProto as T
from onnx import helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyforge
from pyforge.opt import passes, pipeline  # noqa: F401  (pipeline registers the passes)

WORKLOADS = {
    "minilm": dict(layers=6, hidden=384, heads=12, ffn=1536, seq=128),
    "bert_layer": dict(layers=1, hidden=768, heads=12, ffn=3072, seq=128),
    "attn": dict(heads=12, sq=128, sk=128, d=64),
    "decode": dict(heads=12, sq=1, sk=512, d=64),
    "prefill_d256": dict(heads=4, sq=1024, sk=1024, d=256),
    "gemma_dec256": dict(heads=4, kv=1, sk=256, d=256, valid=133),
    "gemma_dec256_short": dict(heads=4, kv=1, sk=256, d=256, valid=9),
    "gemma_dec1216": dict(heads=4, kv=1, sk=1216, d=256, valid=1088),
    "gemma_dec1216_short": dict(heads=4, kv=1, sk=1216, d=256, valid=9),
    "gemma_dec1216_window": dict(heads=4, kv=1, sk=1216, d=256, valid=512),
}
OPT_IN = (
    "prefill_d256",
    "gemma_dec256",
    "gemma_dec256_short",
    "gemma_dec1216",
    "gemma_dec1216_short",
    "gemma_dec1216_window",
)


def _model(nodes, inputs, outputs, w):
    vi = helper.make_tensor_value_info
    g = helper.make_graph(
        nodes,
        "bench",
        [vi(k, T.FLOAT, s) for k, s in inputs],
        [vi(k, T.FLOAT, s) for k, s in outputs],
        [numpy_helper.from_array(a, k) for k, a in w.items()],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _mask(seq: int) -> np.ndarray:
    m = np.zeros((1, 1, 1, seq), np.float32)
    m[..., seq - seq // 8 :] = -1e4  # the last eighth padding
    return m


def encoder(layers, hidden, heads, ffn, seq):
    """BERT as torch exports it: heads split by Reshape + Transpose (K to (B, H, D, S)), Div by
    sqrt(D), Add mask, Softmax, context Transpose + Reshape, erf GELU, LayerNormalization."""
    rng = np.random.default_rng(0)
    w, n, d = {}, [], hidden // heads

    def p(name, *shape):
        w[name] = (rng.standard_normal(shape) * shape[0] ** -0.5).astype(np.float32)
        return name

    def op(kind, ins, out, **attrs):
        n.append(helper.make_node(kind, ins, [out], **attrs))
        return out

    def lin(a, k, m, name):
        return op(
            "Add", [op("MatMul", [a, p(f"{name}w", k, m)], name + "m"), p(f"{name}b", m)], name
        )

    w["hs"] = np.array([1, seq, heads, d], np.int64)
    w["flat"] = np.array([1, seq, hidden], np.int64)
    w["sq"], w["rs2"] = np.array(np.sqrt(d), np.float32), np.array(2**-0.5, np.float32)
    w["one"], w["half"] = np.array(1, np.float32), np.array(0.5, np.float32)
    x = "x"
    for i in range(layers):
        r = [op("Reshape", [lin(x, hidden, hidden, f"l{i}{t}"), "hs"], f"l{i}{t}r") for t in "qkv"]
        q = op("Transpose", [r[0]], f"l{i}qt", perm=[0, 2, 1, 3])
        k = op("Transpose", [r[1]], f"l{i}kt", perm=[0, 2, 3, 1])
        v = op("Transpose", [r[2]], f"l{i}vt", perm=[0, 2, 1, 3])
        s = op("Div", [op("MatMul", [q, k], f"l{i}qk"), "sq"], f"l{i}s")
        prob = op("Softmax", [op("Add", [s, "mask"], f"l{i}sm")], f"l{i}p", axis=-1)
        ctx = op("Transpose", [op("MatMul", [prob, v], f"l{i}c")], f"l{i}ct", perm=[0, 2, 1, 3])
        ctx = op("Reshape", [ctx, "flat"], f"l{i}cr")
        a = op("Add", [x, lin(ctx, hidden, hidden, f"l{i}o")], f"l{i}r1")
        a = op("LayerNormalization", [a, p(f"l{i}g1", hidden), p(f"l{i}b1", hidden)], f"l{i}a")
        f = lin(a, hidden, ffn, f"l{i}f1")
        e = op("Add", [op("Erf", [op("Mul", [f, "rs2"], f"l{i}fs")], f"l{i}fe"), "one"], f"l{i}f1e")
        f = op("Mul", [op("Mul", [f, "half"], f"l{i}fh"), e], f"l{i}ge")
        r2 = op("Add", [a, lin(f, ffn, hidden, f"l{i}f2")], f"l{i}r2")
        x = op("LayerNormalization", [r2, p(f"l{i}g2", hidden), p(f"l{i}b2", hidden)], f"l{i}h")
    n.append(helper.make_node("Identity", [x], ["y"]))
    shapes = [("x", [1, seq, hidden]), ("mask", [1, 1, 1, seq])]
    model = _model(n, shapes, [("y", [1, seq, hidden])], w)
    return model, {
        "x": rng.standard_normal((1, seq, hidden)).astype(np.float32),
        "mask": _mask(seq),
    }


def attention(heads, sq, sk, d):
    """softmax(q kᵀ / sqrt(d) + mask) v on q (1, H, Sq, d), k and v (1, H, Sk, d)."""
    rng = np.random.default_rng(1)
    n = helper.make_node
    nodes = [
        n("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        n("MatMul", ["q", "kt"], ["s"]),
        n("Div", ["s", "sq"], ["s1"]),
        n("Add", ["s1", "mask"], ["s2"]),
        n("Softmax", ["s2"], ["p"], axis=-1),
        n("MatMul", ["p", "v"], ["y"]),
    ]
    shapes = [("q", [1, heads, sq, d]), ("k", [1, heads, sk, d]), ("v", [1, heads, sk, d])]
    model = _model(
        nodes, shapes + [("mask", [1, 1, 1, sk])], [("y", [1, heads, sq, d])],
        {"sq": np.array(np.sqrt(d), np.float32)},
    )  # fmt: skip
    feeds = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes}
    return model, {**feeds, "mask": _mask(sk)}


def cache_attention(heads, kv, sk, d, valid):
    """One query row per head against a static KV cache (1, kv, sk, d), each KV head repeated
    heads // kv times (Unsqueeze, Expand, Reshape), the first ``valid`` keys kept by a Where."""
    rng = np.random.default_rng(2)
    n, c = helper.make_node, numpy_helper.from_array
    g, fill = heads // kv, np.float32(np.finfo(np.float32).min)
    w = {"sd": np.float32(np.sqrt(d)), "fill": fill, "ax2": np.array([2])}
    w.update(rep=np.array([1, kv, g, sk, d]), flat=np.array([1, heads, sk, d]))
    nodes = []
    for t in "kv":
        nodes += [n("Unsqueeze", [t, "ax2"], [f"{t}u"]), n("Expand", [f"{t}u", "rep"], [f"{t}e"])]
        nodes.append(n("Reshape", [f"{t}e", "flat"], [f"{t}r"]))
    nodes += [n("Transpose", ["kr"], ["kt"], perm=[0, 1, 3, 2]), n("MatMul", ["q", "kt"], ["s0"])]
    nodes += [n("Div", ["s0", "sd"], ["s1"]), n("Where", ["cond", "s1", "fill"], ["s2"])]
    nodes += [n("Softmax", ["s2"], ["p"], axis=-1), n("MatMul", ["p", "vr"], ["y"])]
    vi = helper.make_tensor_value_info
    shapes = [("q", [1, heads, 1, d]), ("k", [1, kv, sk, d]), ("v", [1, kv, sk, d])]
    inputs = [vi(k, T.FLOAT, s) for k, s in shapes] + [vi("cond", T.BOOL, [1, 1, 1, sk])]
    out = [vi("y", T.FLOAT, [1, heads, 1, d])]
    graph = helper.make_graph(nodes, "cache", inputs, out, [c(a, k) for k, a in w.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    feeds = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes}
    feeds["cond"] = np.arange(sk)[None, None, None, :] < valid
    return model, feeds


def launch_us(compiled, reps: int = 50) -> float:
    """cuda: device time of one FusedAttention launch, ``reps`` of them in a CUDA graph of their
    own timed by events (no host gaps), or nan where the plan has none."""
    from numba import cuda

    from pyforge.exec.cuda.graph import CudaGraph

    rt = compiled.runtime.first
    label = lambda s: getattr(s, "label", "") or ""
    calls = [c for s, c in zip(rt.plan.steps, rt.calls) if "FusedAttention" in label(s)]
    if not calls:
        return float("nan")
    g, t0, t1 = CudaGraph(rt.stream), cuda.event(), cuda.event()
    g.capture(lambda: [calls[0]() for _ in range(reps)])
    g.replay()
    best = float("inf")
    for _ in range(5):
        t0.record(rt.stream)
        g.replay()
        t1.record(rt.stream)
        t1.synchronize()
        best = min(best, cuda.event_elapsed_time(t0, t1) * 1e3 / reps)
    g.close()
    return best


@contextlib.contextmanager
def prefill_kernel(on: bool):
    """cuda: the wide-head prefill kernel, or (off) the per-row kernel in its place."""
    from pyforge.lower_numba.templates import attention as lowering

    saved = lowering.prefill
    if not on:
        lowering.prefill = lambda sq, d, dv: False
    try:
        yield
    finally:
        lowering.prefill = saved


@contextlib.contextmanager
def attention_pass(on: bool):
    """The pipeline with the attention pass replaced by a no-op while off."""
    saved = passes.PASSES["attention"]
    if not on:
        passes.PASSES["attention"] = lambda graph, **_: graph
    try:
        yield
    finally:
        passes.PASSES["attention"] = saved


def torch_sdpa(feeds: dict, calls: int):
    """torch's scaled_dot_product_attention on the same q/k/v/mask in a CUDA graph, or None."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    q, k, v = (torch.from_numpy(feeds[t]).cuda() for t in ("q", "k", "v"))
    m = torch.from_numpy(feeds["mask" if "mask" in feeds else "cond"]).cuda()
    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    for _ in range(3):
        F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    def run():
        for _ in range(calls):
            graph.replay()
        torch.cuda.synchronize()

    return run


def contenders(name: str, target: str, calls: int) -> tuple[dict, dict, object]:
    spec = WORKLOADS[name]
    build = encoder if "layers" in spec else cache_attention if "kv" in spec else attention
    model, feeds = build(**spec)
    runs, info = {}, {}
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(model.SerializeToString(), opts, ["CPUExecutionProvider"])
    want = sess.run(None, feeds)[0]  # the parity reference on both targets
    if target == "cpu":
        runs["ORT"] = lambda: [sess.run(None, feeds) for _ in range(calls)]
    configs = [(True, True, "fused"), (False, True, "unfused")]
    if target == "cuda" and spec.get("d", 0) >= 128 and spec.get("sq", 0) > 16:
        configs.append((True, False, "fused per-row"))
    for on, pre, name_ in configs:
        with attention_pass(on), prefill_kernel(pre):
            # "fused": every query length (cuda's default attention_rows leaves long ones unfused)
            compiled = pyforge.compile(model, target=target, attention_rows=1 << 30)
        label = f"pyforge {name_}"
        got = compiled.predict(feeds)
        info[label] = compiled.stats["launches"]
        if want is not None:
            info[label + " err"] = float(np.max(np.abs(got - want)))
        if target == "cuda":
            info[label + " us"] = launch_us(compiled)
            from numba import cuda

            dev = {k: cuda.to_device(a) for k, a in feeds.items()}

            def run(c=compiled, dev=dev):
                for _ in range(calls):
                    c.predict(dev)
                cuda.synchronize()

            runs[label] = run
        else:
            runs[label] = lambda c=compiled: [c.predict(feeds) for _ in range(calls)]
    if target == "cuda" and "q" in feeds:
        sdpa = torch_sdpa(feeds, calls)
        if sdpa is not None:
            runs["torch SDPA graph"] = sdpa
    return runs, info, model


def variants(names: list[str], kinds: list[str]) -> None:
    """cuda: each decode kernel candidate (PYFORGE_DECODE_ATTN, read at lowering) per launch on
    each workload (a ``prefill_`` name: pyforge's prefill kernel on that case of
    prefill_attention.py), with its parity against ORT; a table last."""
    from benchmarks.prefill_attention import case_model
    from tests.helpers import run_ort

    rows = []
    for name in names:
        pre = name.startswith("prefill_")
        model, feeds = case_model(name[8:]) if pre else cache_attention(**WORKLOADS[name])
        want = run_ort(model, feeds)[0]
        for kind in ["row"] if pre else kinds:
            os.environ["PYFORGE_DECODE_ATTN"] = kind
            t = time.perf_counter()
            compiled = pyforge.compile(model, target="cuda")
            err = float(np.max(np.abs(compiled.predict(feeds) - want)))
            built = time.perf_counter() - t
            rows.append((name, kind, launch_us(compiled), err, built))
            print(*rows[-1], flush=True)
    os.environ.pop("PYFORGE_DECODE_ATTN")
    print(f"\n{'workload':22s} {'kernel':6s} {'us/launch':>9s} {'max err':>8s} {'build s':>7s}")
    for name, kind, us, err, built in rows:
        print(f"{name:22s} {kind:6s} {us:9.2f} {err:8.1e} {built:7.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="", help="cuda: time these decode kernels (row,w4,...)")
    ap.add_argument("--target", choices=["cpu", "cuda"], default=None)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20)
    default = [w for w in WORKLOADS if w not in OPT_IN]
    ap.add_argument("--only", default=",".join(default))
    args = ap.parse_args()
    target = args.target or pyforge.default_target()
    if args.variants:
        return variants(args.only.split(","), args.variants.split(","))
    rows = []
    for name in args.only.split(","):
        runs, info, _ = contenders(name, target, args.calls)
        times: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(args.rounds):
            for label, fn in runs.items():  # alternated: every contender sees the same drift
                t = time.perf_counter()
                fn()
                times[label].append((time.perf_counter() - t) / args.calls * 1e3)
        for label, ts in times.items():
            med = float(np.median(ts))
            print(f"{name:11s} {label:18s} {med:9.3f} ms [{min(ts):.3f}-{max(ts):.3f}]", flush=True)
            got = [info.get(label + x) for x in ("", " err", " us")]
            rows.append((name, label, med, min(ts), max(ts), *got))
    print(f"\n== fused attention, target {target}, {args.rounds} rounds x {args.calls} calls")
    print(
        f"{'workload':11s} {'contender':18s} {'median ms':>10s} {'[min-max]':>19s} {'launches':>9s} {'max err':>9s} {'attn us':>8s}"
    )  # attn us: one FusedAttention launch's device time, min of 5 graphs of 50 launches
    for name, label, med, lo, hi, launches, err, us in rows:
        span = f"[{lo:.3f}-{hi:.3f}]"
        err_s = f"{err:.1e}" if err is not None else "-"
        us_s = f"{us:.2f}" if us is not None else "-"
        print(
            f"{name:11s} {label:18s} {med:10.3f} {span:>19s} {launches or '-':>9} {err_s:>9s} {us_s:>8s}"
        )


if __name__ == "__main__":
    main()
