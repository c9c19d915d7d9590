"""GPU check of the CUDA execution blocks: LtGemm (cuBLASLt) and CudaGraph.

Run on a machine with a GPU:  python3 benchmarks/gpu_check_exec.py
Checks LtGemm against numpy float64, finds how cuBLASLt orders the residual add and the
activation (RELU_BIAS with beta=1), captures kernels + a GEMM into a CUDA graph and replays it
on fresh inputs, and times host and GPU cost. Writes $OUT/gpu_check_exec.log when OUT is set.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
from numba import cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyforge.exec.cuda.cublaslt import LtGemm, lt
from pyforge.exec.cuda.graph import CudaGraph, raw_stream

LINES: list[str] = []
TABLE: list[tuple[str, str, str]] = []
FAILURES: list[str] = []
CACHE = tempfile.mkdtemp(prefix="pyforge_lt_")
WS_BYTES = 32 << 20
TOL = {"fp32": 1e-5, "tf32": 5e-3, "fp16": 5e-3}
rng = np.random.default_rng(1234)


def log(msg: str = "") -> None:
    print(msg, flush=True)
    LINES.append(msg)


def ptr(arr) -> int:
    return arr.__cuda_array_interface__["data"][0]


def view(flat: np.ndarray, off: int, rows: int, cols: int, ld: int) -> np.ndarray:
    """A (rows x cols) row-major matrix with leading dimension ld inside a flat buffer."""
    seg = flat[off : off + (rows - 1) * ld + cols]
    seg = np.concatenate([seg, np.full(rows * ld - seg.size, np.nan, flat.dtype)])
    return seg.reshape(rows, ld)[:, :cols]


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


ACTS = {None: lambda x: x, "relu": lambda x: np.maximum(x, 0.0), "gelu": gelu_tanh}


def make_case(m, n, k, *, trans_a=False, trans_b=False, batch=1, pad=0, **kw):
    """Random operands and the float64 pieces of the reference for one LtGemm configuration."""
    precision = kw.get("precision", "fp32")
    dtype = np.float16 if precision == "fp16" else np.float32
    a_rows, a_cols = (k, m) if trans_a else (m, k)
    b_rows, b_cols = (n, k) if trans_b else (k, n)
    lda, ldb, ldc, ldd = a_cols + pad, b_cols + pad, n + pad, n + pad
    sa = kw.pop("stride_a", a_rows * lda)
    sb, sc, sd = b_rows * ldb, m * ldc, m * ldd
    size = {
        "a": (batch - 1) * sa + a_rows * lda,
        "b": (batch - 1) * sb + b_rows * ldb,
        "c": (batch - 1) * sc + m * ldc,
        "d": (batch - 1) * sd + m * ldd,
    }
    host = {x: rng.uniform(-1, 1, size[x]).astype(dtype) for x in "abc"}
    bias_len = {"n": n, "m": m, None: 1}[kw.get("bias_axis")]
    host["bias"] = rng.uniform(-1, 1, bias_len).astype(dtype)
    gemm_kw = {
        "trans_a": trans_a,
        "trans_b": trans_b,
        "lda": lda,
        "ldb": ldb,
        "ldc": ldc,
        "ldd": ldd,
    }
    gemm_kw.update(batch=batch, stride_a=sa, stride_b=sb, stride_c=sc, stride_d=sd, **kw)
    parts = []
    for bi in range(batch):
        a = view(host["a"].astype(np.float64), bi * sa, a_rows, a_cols, lda)
        b = view(host["b"].astype(np.float64), bi * sb, b_rows, b_cols, ldb)
        c = view(host["c"].astype(np.float64), bi * sc, m, n, ldc)
        ab = (a.T if trans_a else a) @ (b.T if trans_b else b)
        bias = host["bias"].astype(np.float64)
        bias = {"n": bias[None, :], "m": bias[:, None], None: 0.0}[kw.get("bias_axis")]
        parts.append((ab, c, bias))
    return host, size, gemm_kw, parts, (m, n, ldd, sd)


def run_case(k, host, size, gemm_kw, dshape, inplace=False):
    """Build the LtGemm, run it once on poisoned D; return it, D's batches, build s, pad intact."""
    m, n, ldd, sd = dshape
    t0 = time.perf_counter()
    g = LtGemm(m, n, k, cache_dir=CACHE, **gemm_kw)
    build_s = time.perf_counter() - t0
    dev = {x: cuda.to_device(host[x]) for x in ("a", "b", "c", "bias")}
    d = cuda.to_device(np.full(size["d"], np.nan, host["a"].dtype))
    if inplace:
        d = cuda.to_device(host["c"])
    work = cuda.device_array(WS_BYTES, np.uint8)
    stream = cuda.stream()
    c_ptr = ptr(d) if inplace else ptr(dev["c"])
    g.run(
        ptr(dev["a"]), ptr(dev["b"]), c_ptr, ptr(d), ptr(dev["bias"]), ptr(work), raw_stream(stream)
    )
    stream.synchronize()
    flat = d.copy_to_host()
    out = [view(flat.astype(np.float64), bi * sd, m, n, ldd) for bi in range(g.batch)]
    pad_ok = True
    if ldd > n and not inplace:
        full = np.concatenate([flat, np.full(m * ldd, np.nan, flat.dtype)])
        for bi in range(g.batch):
            pad = full[bi * sd : bi * sd + m * ldd].reshape(m, ldd)[:, n:]
            pad_ok &= bool(np.isnan(pad).all())
    return g, out, build_s, pad_ok


def rel_err(out, ref) -> tuple[float, float]:
    num = math.sqrt(sum(float(np.sum((o - r) ** 2)) for o, r in zip(out, ref, strict=True)))
    den = math.sqrt(sum(float(np.sum(r**2)) for r in ref))
    worst = max(float(np.max(np.abs(o - r))) for o, r in zip(out, ref, strict=True))
    if any(not np.isfinite(o).all() for o in out):
        return float("nan"), float("nan")
    return num / den, worst


def check(name, m, n, k, *, inplace=False, **kw):
    """Run one configuration; compare with act(alpha*AB + beta*C + bias) in float64."""
    precision = kw.get("precision", "fp32")
    act, alpha, beta = kw.get("act"), kw.get("alpha", 1.0), kw.get("beta", 0.0)
    host, size, gemm_kw, parts, dshape = make_case(m, n, k, **kw)
    try:
        g, out, build_s, pad_ok = run_case(k, host, size, gemm_kw, dshape, inplace)
    except NotImplementedError as e:
        log(f"  {name}: NotImplementedError ({str(e)[:80]}...)")
        TABLE.append((name, precision, "NotImplementedError (caller falls back)"))
        return None
    f = ACTS[act]
    pre = [f(alpha * ab + beta * c + bias) for ab, c, bias in parts]
    post = [f(alpha * ab + bias) + beta * c for ab, c, bias in parts]
    err, worst = rel_err(out, pre)
    err_post, _ = rel_err(out, post)
    ok = err <= TOL[precision] and pad_ok
    if not ok:
        FAILURES.append(name)
    t = f"{g.algo_time_us:.1f} us" if g.algo_time_us is not None else "-"
    log(
        f"  {name}: rel={err:.2e} max_abs={worst:.2e} pad_ok={pad_ok} algo_gpu={t} "
        f"build={build_s * 1e3:.0f} ms {'OK' if ok else 'FAIL'}"
    )
    TABLE.append((name, precision, f"rel {err:.1e} {'ok' if ok else 'FAIL'}"))
    return err, err_post


def section_correctness() -> None:
    log("== (a) LtGemm vs numpy float64 ==")
    conv = {"batch": 2, "stride_a": 0}  # NCHW: W[64,576] shared by both images' col[576,3136]
    res_relu = {"act": "relu", "beta": 1.0}
    fused = {"bias_axis": "n", "act": "relu", "beta": 1.0}
    cases = [
        ("nchw conv 64x576@576x3136 b2 sA=0", (64, 3136, 576), conv),
        ("nchw conv b2 sA=0 tf32", (64, 3136, 576), {**conv, "precision": "tf32"}),
        ("nchw conv b2 sA=0 relu+res", (64, 3136, 576), {**conv, **res_relu}),
        ("nchw conv b2 sA=0 bias_m", (64, 3136, 576), {**conv, "bias_axis": "m"}),
        ("fc 1x2048@(1000x2048)^T bias_n", (1, 1000, 2048), {"trans_b": True, "bias_axis": "n"}),
        ("fc bias_n tf32", (1, 1000, 2048),
         {"trans_b": True, "bias_axis": "n", "precision": "tf32"}),
        ("nhwc 3136x576@576x64 bias_n relu", (3136, 64, 576), {"bias_axis": "n", "act": "relu"}),
        ("nhwc bias_n relu+res", (3136, 64, 576), fused),
        ("nhwc W^T bias_n relu+res", (3136, 64, 576), {**fused, "trans_b": True}),
        ("nhwc bias_n relu+res C==D inplace", (3136, 64, 576), {**fused, "inplace": True}),
        ("batched b3 120x90x40 trans_b bias_n", (120, 90, 40),
         {"batch": 3, "trans_b": True, "bias_axis": "n"}),
        ("gelu(tanh) bias_n 256x512x128", (256, 512, 128), {"bias_axis": "n", "act": "gelu"}),
        ("fp16 256x512x128 bias_n relu", (256, 512, 128),
         {"bias_axis": "n", "act": "relu", "precision": "fp16"}),
    ]  # fmt: skip
    for ta in (False, True):
        for tb in (False, True):
            cases.append(
                (
                    f"trans_a={ta:d} trans_b={tb:d} 100x70x50 pad3 a=.5 b=2",
                    (100, 70, 50),
                    {"trans_a": ta, "trans_b": tb, "pad": 3, "alpha": 0.5, "beta": 2.0},
                )
            )
    for name, (m, n, k), kw in cases:
        check(name, m, n, k, **kw)


def section_semantics() -> None:
    log("== (b) epilogue order with beta=1: act(AB + C + bias) or act(AB + bias) + C ==")
    cases = [
        ("RELU_BIAS beta1 bias_n", {"bias_axis": "n", "act": "relu"}),
        ("RELU beta1", {"act": "relu"}),
        ("GELU_BIAS beta1 bias_n", {"bias_axis": "n", "act": "gelu"}),
        ("RELU_BIAS beta1 bias_m", {"bias_axis": "m", "act": "relu"}),
    ]
    for name, kw in cases:
        res = check(name, 96, 160, 64, beta=1.0, **kw)
        if res is None:
            continue
        pre, post = res
        verdict = "act(AB+C+bias): residual BEFORE act" if pre < post else "act(AB+bias)+C"
        log(f"    rel vs act(AB+C+bias)={pre:.2e}  vs act(AB+bias)+C={post:.2e} -> {verdict}")
        TABLE.append((f"semantics {name}", "fp32", verdict))


@cuda.jit
def affine(x, y, a, b):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = x[i] * a + b


def section_graph() -> dict:
    log("== (c) CudaGraph: kernel -> LtGemm(bias_n, relu) -> kernel, replayed on fresh inputs ==")
    m, k, n = 128, 256, 512
    stream = cuda.stream()
    s = raw_stream(stream)
    w_host = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    bias_host = rng.uniform(-1, 1, n).astype(np.float32)
    x_in = cuda.to_device(rng.uniform(-1, 1, m * k).astype(np.float32))  # for the warm-up run
    a_buf = cuda.device_array(m * k, np.float32)
    d_buf = cuda.device_array(m * n, np.float32)
    out = cuda.device_array(m * n, np.float32)
    w, bias = cuda.to_device(w_host), cuda.to_device(bias_host)
    work = cuda.device_array(WS_BYTES, np.uint8)
    g = LtGemm(m, n, k, bias_axis="n", act="relu", cache_dir=CACHE)
    ptrs = (ptr(a_buf), ptr(w), 0, ptr(d_buf), ptr(bias), ptr(work), s)

    def pipeline() -> None:
        affine[(m * k + 255) // 256, 256, stream](x_in, a_buf, 2.0, 1.0)
        g.run(*ptrs)
        affine[(m * n + 255) // 256, 256, stream](d_buf, out, 0.5, -1.0)

    graph = CudaGraph(stream)
    mode = "thread_local"
    try:
        graph.capture(pipeline, mode=mode)
    except RuntimeError:
        log("  thread_local capture failed:\n" + traceback.format_exc())
        mode = "relaxed"
        graph.capture(pipeline, mode=mode)
    log(f"  captured in {mode} mode, n_nodes={graph.n_nodes}")
    worst = 0.0
    for rep in range(3):
        x_host = rng.uniform(-1, 1, m * k).astype(np.float32)
        x_in.copy_to_device(x_host, stream=stream)
        out.copy_to_device(np.full(m * n, np.nan, np.float32), stream=stream)
        graph.replay()
        got = out.copy_to_host(stream=stream)
        stream.synchronize()
        a = 2.0 * x_host.astype(np.float64).reshape(m, k) + 1.0
        ref = 0.5 * np.maximum(a @ w_host + bias_host, 0.0) - 1.0
        err = float(np.linalg.norm(got.reshape(m, n) - ref) / np.linalg.norm(ref))
        worst = max(worst, err if np.isfinite(got).all() else float("inf"))
        log(f"  replay {rep}: rel={err:.2e}")
    ok = worst <= 1e-5
    if not ok:
        FAILURES.append("graph replay")
    TABLE.append(
        ("graph k+gemm+k replay x3", "fp32", f"rel {worst:.1e} nodes={graph.n_nodes} {mode}")
    )
    # The graph holds raw pointers only: every buffer it touches must outlive it.
    keep = (x_in, a_buf, d_buf, out, w, bias, work, g)
    return {"stream": stream, "graph": graph, "pipeline": pipeline, "x_in": x_in, "keep": keep}


def host_us(fn, calls: int, rounds: int = 5) -> float:
    """Median host microseconds per call of fn(), without synchronising inside the loop."""
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t0) / calls * 1e6)
        cuda.synchronize()
    return statistics.median(per)


def gpu_us(fn, stream, calls: int = 100, rounds: int = 7) -> float:
    """Median GPU microseconds per call between CUDA events on stream."""
    start, stop = cuda.event(), cuda.event()
    fn()
    stream.synchronize()
    per = []
    for _ in range(rounds):
        start.record(stream)
        for _ in range(calls):
            fn()
        stop.record(stream)
        stop.synchronize()
        per.append(start.elapsed_time(stop) * 1e3 / calls)
    return statistics.median(per)


def gemm_runner(m, n, k, stream, **kw):
    """An LtGemm on random buffers, and the argument tuple for its run()."""
    kw.setdefault("cache_dir", CACHE)
    g = LtGemm(m, n, k, **kw)
    bufs = [rng.uniform(-1, 1, size).astype(np.float32) for size in (m * k, k * n, m * n, m * n)]
    bufs.append(rng.uniform(-1, 1, max(m, n)).astype(np.float32))
    dev = [cuda.to_device(x) for x in bufs] + [cuda.device_array(WS_BYTES, np.uint8)]
    return g, (*(ptr(x) for x in dev), raw_stream(stream)), dev


def graph_gpu_us(fn, stream, reps: int = 20, rounds: int = 5) -> float:
    """Median GPU microseconds per fn() call, from replays of a graph of `reps` calls."""
    graph = CudaGraph(stream)
    graph.capture(lambda: [fn() for _ in range(reps)])
    start, stop = cuda.event(), cuda.event()
    per = []
    for _ in range(rounds):
        start.record(stream)
        graph.replay()
        stop.record(stream)
        stop.synchronize()
        per.append(start.elapsed_time(stop) * 1e3 / reps)
    graph.close()
    return statistics.median(per)


def torch_peer(m, n, k, tf32: bool) -> float | None:
    """GPU microseconds of torch.mm on the same shape, from a captured CUDA graph of 20."""
    try:
        import torch
    except ImportError:
        return None
    torch.backends.cuda.matmul.allow_tf32 = tf32
    a = torch.rand(m, k, device="cuda") - 0.5
    b = torch.rand(k, n, device="cuda") - 0.5
    out = torch.empty(m, n, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3):
            torch.mm(a, b, out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(20):
            torch.mm(a, b, out=out)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per = []
    for _ in range(5):
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        per.append(start.elapsed_time(stop) * 1e3 / 20)
    return statistics.median(per)


def section_timing(graph_state: dict) -> None:
    log("== (d) timings ==")
    stream = cuda.stream()
    g, args, _keep = gemm_runner(1, 1000, 2048, stream, trans_b=True, bias_axis="n")

    def call() -> None:
        g.run(*args)

    t = host_us(call, 500)
    handle, desc, alpha, beta, algo = g._run_args
    a, b, _, d, _, work, s = args
    bare = (handle, desc, alpha, b, g._la, a, g._lb, beta, d, g._lc, d, g._ld, algo, work)

    def bare_call() -> None:
        lt.matmul(*bare, WS_BYTES, s)

    t_bare = host_us(bare_call, 500)
    log(f"  LtGemm.run host time (fc): {t:.2f} us/call; bare nvmath lt.matmul {t_bare:.2f} us")
    TABLE.append(("LtGemm.run host time", "fp32", f"{t:.2f} us/call (bare lt.matmul {t_bare:.2f})"))
    t_ev, t_gr = gpu_us(call, stream), graph_gpu_us(call, stream)
    t_pt = torch_peer(1, 1000, 2048, False)
    t_pt = f"{t_pt:.2f}" if t_pt is not None else "n/a"
    summary = f"{t_gr:.2f} us graph, {t_ev:.2f} us stream, torch {t_pt}"
    TABLE.append(("fc 1x2048x1000 bias GPU", "fp32", summary))

    for prec in ("fp32", "tf32"):
        for label, (m, n, k), kw in (
            ("(3136x576)x(576x64)", (3136, 64, 576), {}),
            ("(64x576)x(576x3136)", (64, 3136, 576), {}),
            ("(3136x576)x(576x64) bias+res+relu", (3136, 64, 576),
             {"bias_axis": "n", "act": "relu", "beta": 1.0}),
        ):  # fmt: skip
            g, args, _keep = gemm_runner(m, n, k, stream, precision=prec, **kw)
            t = graph_gpu_us(lambda g=g, args=args: g.run(*args), stream)
            h = LtGemm(m, n, k, precision=prec, autotune=False, **kw)
            t_h = graph_gpu_us(lambda h=h, args=args: h.run(*args), stream)
            flops = 2 * m * n * k / (t * 1e-6) / 1e12
            cands = ", ".join(f"{c:.1f}" for c in g.candidates_us) or "cached"
            log(f"  {label} {prec}: candidates (us, heuristic order): {cands}")
            log(f"  {label} {prec}: {t:.2f} us autotuned ({flops:.1f} TFLOP/s), "
                f"{t_h:.2f} us heuristic top-1")  # fmt: skip
            TABLE.append((f"{label} GPU", prec, f"{t:.2f} us (heur top-1 {t_h:.2f})"))
        t_pt = torch_peer(3136, 64, 576, prec == "tf32")
        t_pt = f"{t_pt:.2f} us" if t_pt is not None else "n/a"
        TABLE.append(("torch.mm (3136x576)x(576x64) GPU", prec, t_pt))

    fresh = tempfile.mkdtemp(prefix="pyforge_lt32_")
    g32, args, _keep = gemm_runner(3136, 64, 576, stream, n_candidates=32, cache_dir=fresh)
    t = graph_gpu_us(lambda: g32.run(*args), stream)
    cands = ", ".join(f"{c:.1f}" for c in g32.candidates_us)
    log(f"  (3136x576)x(576x64) fp32 from 32 candidates: {t:.2f} us; candidates: {cands}")
    TABLE.append(("(3136x576)x(576x64) 32 candidates", "fp32", f"{t:.2f} us"))

    t0 = time.perf_counter()
    LtGemm(3136, 64, 576, cache_dir=CACHE)
    warm = time.perf_counter() - t0
    cold_dir = tempfile.mkdtemp(prefix="pyforge_lt_cold_")
    t0 = time.perf_counter()
    LtGemm(3136, 64, 576, cache_dir=cold_dir)
    cold = time.perf_counter() - t0
    TABLE.append(("LtGemm build cold/cached", "fp32", f"{cold * 1e3:.1f} / {warm * 1e3:.1f} ms"))

    graph, gstream = graph_state["graph"], graph_state["stream"]
    t = host_us(graph.replay, 200)
    TABLE.append(("graph replay host time", "fp32", f"{t:.2f} us ({graph.n_nodes} nodes)"))
    t_gpu = gpu_us(graph.replay, gstream, calls=200)
    t_seq = gpu_us(graph_state["pipeline"], gstream, calls=50)
    TABLE.append(("graph replay GPU time", "fp32", f"{t_gpu:.2f} us vs {t_seq:.2f} us eager"))
    t = host_us(graph_state["pipeline"], 100)
    TABLE.append(("eager k+gemm+k host time", "fp32", f"{t:.2f} us"))
    x = graph_state["x_in"]
    t = host_us(lambda: affine[64, 256, gstream](x, x, 1.0, 0.0), 200)
    TABLE.append(("numba kernel launch host", "fp32", f"{t:.2f} us"))


def main() -> int:
    dev = cuda.get_current_device()
    from cuda.bindings import driver

    _, drv_ver = driver.cuDriverGetVersion()
    log(f"GPU {dev.name} cc={dev.compute_capability} driver={drv_ver} cublasLt={lt.get_version()}")
    import numba_cuda
    import nvmath

    log(f"numba-cuda {numba_cuda.__version__} nvmath {nvmath.__version__} numpy {np.__version__}")
    graph_state = None
    for section in (section_correctness, section_semantics, section_graph):
        try:
            res = section()
            graph_state = res if isinstance(res, dict) else graph_state
        except Exception:  # noqa: BLE001 -- report every section, even after one breaks
            log(traceback.format_exc())
            FAILURES.append(section.__name__)
    try:
        if graph_state is not None:
            section_timing(graph_state)
    except Exception:  # noqa: BLE001
        log(traceback.format_exc())
        FAILURES.append("section_timing")
    width = max(len(r[0]) for r in TABLE) if TABLE else 10
    log("\n== summary ==")
    for name, prec, result in TABLE:
        log(f"{name:<{width}}  {prec:<5} {result}")
    log(f"failures: {FAILURES or 'none'}")
    out = os.environ.get("OUT")
    if out:
        Path(out, "gpu_check_exec.log").write_text("\n".join(LINES) + "\n")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
