"""pyforge beside its peers, in one run on one machine: PyTorch (eager, CUDA graph, torch.compile)
and ONNX Runtime, on ResNet-50 and the MLP at batch 1 and 32.

    python benchmarks/peers.py [--models resnet50,mlp] [--batches 1,32] [--runs 200] [--out FILE]
    python benchmarks/peers.py --corpus [--models a,b] [--target cpu|cuda] [--budget S] [--md F]

--corpus: every torch-built corpus model at batch 1 (benchmarks/peers_corpus.py says how).

Peers that are not installed (or have no GPU) are skipped, not faked. Prints a markdown table
with date, machine and versions; that is the table BENCHMARKS.md quotes.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import pyforge
from pyforge.models import cached_model, random_inputs


def measure(fn: Callable[[], object], runs: int, warmup: int = 10) -> dict[str, float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    t = np.array(times) * 1e3
    return {"median_ms": float(np.median(t)), "p99_ms": float(np.percentile(t, 99))}


def torch_module(name: str, path: str):
    """The same network in PyTorch, with the ONNX file's weights (names match torchvision)."""
    import onnx
    import torch
    from onnx import numpy_helper

    weights = {
        t.name: torch.from_numpy(numpy_helper.to_array(t).copy())
        for t in onnx.load(path).graph.initializer
    }
    if name == "resnet50":
        import torchvision

        net = torchvision.models.resnet50()
        state = {}
        for key in net.state_dict():
            base, _, leaf = key.rpartition(".")
            src = {"running_mean": "mean", "running_var": "var"}.get(leaf, leaf)
            if leaf == "num_batches_tracked":
                continue
            for cand in (key, f"{base}.{src}"):
                if cand in weights:
                    state[key] = weights[cand]
                    break
        missing = net.load_state_dict(state, strict=False).missing_keys
        missing = [k for k in missing if not k.endswith("num_batches_tracked")]
        if missing:
            raise RuntimeError(f"weights not mapped: {missing[:5]}")
        return net.eval()
    # mlp: fc1 and fc3 are Gemm(transB=1) with torch's [out, in] layout; fc2 is MatMul [in, out]
    net = torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )
    with torch.no_grad():
        for layer, prefix, transpose in (
            (net[0], "fc1", False),
            (net[2], "fc2", True),
            (net[4], "fc3", False),
        ):
            w = weights[f"{prefix}.weight"]
            layer.weight.copy_(w.T if transpose else w)
            layer.bias.copy_(weights[f"{prefix}.bias"])
    return net.eval()


def torch_peers(name: str, path: str, x: np.ndarray, runs: int) -> dict[str, dict]:
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    net = torch_module(name, path)
    if net is None:
        return {}
    net = net.cuda()
    xt = torch.from_numpy(x).cuda()
    out: dict[str, dict] = {}
    with torch.inference_mode():

        def eager():
            net(xt)
            torch.cuda.synchronize()

        out["PyTorch eager (fp32, TF32 off)"] = measure(eager, runs)
        out["PyTorch CUDA graph (fp32)"] = measure(_graphed(torch, net, xt), runs)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        out["PyTorch CUDA graph (TF32)"] = measure(_graphed(torch, net, xt), runs)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        half = torch_module(name, path).cuda().half()
        out["PyTorch CUDA graph (fp16)"] = measure(_graphed(torch, half, xt.half()), runs)
        try:
            t0 = time.perf_counter()
            comp = torch.compile(net, mode="reduce-overhead")
            for _ in range(3):
                comp(xt)
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0

            def compiled():
                comp(xt)
                torch.cuda.synchronize()

            out["torch.compile reduce-overhead"] = dict(
                measure(compiled, runs), compile_s=compile_s
            )
        except Exception as e:  # noqa: BLE001  (a peer that fails to build is reported, not faked)
            print(f"torch.compile failed: {type(e).__name__}: {e}", file=sys.stderr)
    return out


def _graphed(torch, net, x) -> Callable[[], None]:
    """``net(x)`` captured once in a CUDA graph (after warm-up on a side stream); the returned
    function replays it and waits."""
    static_x = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            net(static_x)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        net(static_x)

    def replay():
        g.replay()
        torch.cuda.synchronize()

    return replay


def ort_peer(path: str, feeds: dict, runs: int) -> dict[str, dict]:
    try:
        import onnxruntime as ort
    except ImportError:
        return {}
    out = {}
    for provider in ort.get_available_providers():
        if provider not in ("CPUExecutionProvider", "CUDAExecutionProvider"):
            continue
        sess = ort.InferenceSession(path, providers=[provider])
        out[f"ONNX Runtime {provider.replace('ExecutionProvider', '')}"] = measure(
            lambda sess=sess: sess.run(None, feeds), max(runs // 4, 10), warmup=3
        )
    return out


def _error_vs_ort(path: str, feeds: dict) -> Callable[[np.ndarray], str]:
    """Max abs error against ONNX Runtime (CPU EP), also relative to the output's largest value."""
    try:
        import onnxruntime as ort
    except ImportError:
        return lambda got: ""
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    scale = float(np.abs(ref).max()) or 1.0

    def error(got: np.ndarray) -> str:
        err = float(np.abs(np.asarray(got, np.float64) - ref).max())
        return f"{err:.1e} ({err / scale:.1e} rel)"

    return error


def pyforge_rows(path: str, feeds: dict, target: str, runs: int) -> dict[str, dict]:
    out = {}
    error = _error_vs_ort(path, feeds)
    variants = [("fp32", {})]
    if target == "cuda":
        variants += [("tf32", {"precision": "tf32"}), ("fp16", {"precision": "fp16"})]
    for label, opts in variants:
        t0 = time.perf_counter()
        model = pyforge.compile(path, target=target, **opts)
        got = model.predict(feeds)
        compile_s = time.perf_counter() - t0
        row = measure(lambda model=model: model.predict(feeds), runs)
        row.update(launches=model.stats["launches"], compile_s=compile_s, error=error(got))
        out[f"pyforge {target} {label} predict (numpy in/out)"] = row
        rt = model.runtime
        if target == "cuda":
            from numba import cuda

            # inputs already on the GPU, outputs left there: what the PyTorch rows measure
            dfeeds = {k: cuda.to_device(v) for k, v in feeds.items()}
            out[f"pyforge {target} {label} predict (device in/out)"] = dict(
                measure(lambda model=model, d=dfeeds: model.predict(d), runs),
                launches=model.stats["launches"],
            )
        if target == "cuda" and getattr(rt, "graph", None) is not None:

            def replay(rt=rt):
                rt.graph.replay()
                rt.stream.synchronize()

            out[f"pyforge {target} {label} graph replay (on device)"] = dict(
                measure(replay, runs), launches=model.stats["launches"]
            )
    return out


def interleaved_vs_ort(path: str, feeds: dict, runs: int, block: int = 6) -> str:
    """pyforge cpu and ORT's CPU EP in alternating blocks of ``block`` calls, so a noisy shared
    machine slows both alike. The first call of each block is not counted: the other system's
    threads may still be spinning then (calling them one by one doubled pyforge's time)."""
    import onnxruntime as ort

    model = pyforge.compile(path, target="cpu")
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    fns = [lambda: model.predict(feeds), lambda: sess.run(None, feeds)]
    times: list[list[float]] = [[], []]
    for _ in range(max(runs // (block - 1), 2)):
        for k, fn in enumerate(fns):
            for j in range(block):
                t0 = time.perf_counter()
                fn()
                if j:
                    times[k].append(time.perf_counter() - t0)
    ours, theirs = (float(np.median(t)) * 1e3 for t in times)
    return (
        f"alternating blocks of {block - 1} counted calls, {len(times[0])} each: pyforge cpu "
        f"median {ours:.1f} ms, ORT CPU median {theirs:.1f} ms, ratio {ours / theirs:.2f}x"
    )


def environment() -> str:
    parts = [
        datetime.date.today().isoformat(),
        platform.machine(),
        f"python {platform.python_version()}",
    ]
    try:
        import numba

        parts.append(f"numba {numba.__version__}")
    except ImportError:
        pass
    try:
        import torch

        parts.append(f"torch {torch.__version__}")
        if torch.cuda.is_available():
            parts.append(torch.cuda.get_device_name(0))
            parts.append(f"driver {torch.version.cuda} (cuda runtime)")
    except ImportError:
        pass
    try:
        import onnxruntime as ort

        parts.append(f"onnxruntime {ort.__version__}")
    except ImportError:
        pass
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--corpus" in argv:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from benchmarks import peers_corpus

        return peers_corpus.main(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,mlp")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--target", default=None)
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args(argv)
    target = args.target or pyforge.default_target()
    lines = [
        f"Measured {environment()}; target {target}; median and p99 of {args.runs} runs after warm-up.",
        "",
    ]
    lines.append(
        "| model | batch | system | median ms | p99 ms | items/s | launches | compile s "
        "| max error vs ORT |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|")
    notes: list[str] = []
    for name in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            path = cached_model(name, batch=batch)
            feeds = random_inputs(path, seed=0)
            x = next(iter(feeds.values()))
            rows = pyforge_rows(path, feeds, target, args.runs)
            if not args.no_torch:
                rows.update(torch_peers(name, path, x, args.runs))
            rows.update(ort_peer(path, feeds, args.runs))
            for system, r in rows.items():
                lines.append(
                    f"| {name} | {batch} | {system} | {r['median_ms']:.3f} | {r['p99_ms']:.3f} "
                    f"| {batch / r['median_ms'] * 1e3:,.0f} | {r.get('launches', '')} "
                    f"| {r['compile_s']:.1f} | {r.get('error', '')} |"
                    if "compile_s" in r
                    else f"| {name} | {batch} | {system} | {r['median_ms']:.3f} | {r['p99_ms']:.3f} "
                    f"| {batch / r['median_ms'] * 1e3:,.0f} | {r.get('launches', '')} | | |"
                )
            print("\n".join(lines[-len(rows) :]), flush=True)
            if target == "cpu":
                notes.append(f"{name} b{batch}: " + interleaved_vs_ort(path, feeds, args.runs))
                print(notes[-1], flush=True)
    print("\n" + "\n".join(lines + [""] + notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
