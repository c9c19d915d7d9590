"""Differential fuzzing: each generated graph through pyforge (fused, unfused) and ONNX Runtime.

    python -m tests.fuzz.run --seeds 0:500 [--jobs 16] [--out summary.json] [--cases DIR]

A disagreement with ORT (rtol 1e-4, atol 1e-5, NaN at the same places) is judged by
``onnx.reference.ReferenceEvaluator``: when ORT and the reference agree it is a pyforge bug
("mismatch"); when they disagree with each other it is a "dispute", counted and listed apart
and not blamed on pyforge (nor is a reference that fails on NaN/Inf input); when they agree but
the graph widened to float64 agrees with pyforge, both share a float32 rounding: a dispute too.
``--jobs N`` runs N
worker processes, each with NUMBA_NUM_THREADS=1 and its own PYFORGE_CACHE; the run prints the
rate, the counts and each finding's seed and minimised ops, and ``--out X.json`` holds the same.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import re
import signal
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

os.environ.setdefault(
    "PYFORGE_CACHE", os.path.join(os.path.dirname(__file__), "..", "..", ".cache")
)

RTOL, ATOL = 1e-4, 1e-5
VARIANTS = ("fused", "unfused")
# classes that fail the test: pyforge crashed, or gave an answer ORT and the reference both reject
BUGS = ("crash", "mismatch")
# ORT and onnx.reference disagree with each other (or the reference fails on NaN/Inf): no verdict
DISPUTE = "dispute"


@dataclass
class Result:
    cls: str  # ok | refusal | crash | mismatch | dispute | ort-error
    op: str = ""  # the op named by a refusal; for a finding, the ops of its minimised graph
    detail: str = ""
    variants: tuple[str, ...] = ()  # which pyforge variants showed it
    signature: str = ""  # what must stay the same while minimising
    extra: dict = field(default_factory=dict)


def run_ort(model: onnx.ModelProto, feeds: dict, optimize: bool = True) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if not optimize:  # ORT's kernels alone, none of its graph rewrites
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    return dict(zip(names, sess.run(names, feeds)))


def run_reference(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    names = [o.name for o in model.graph.output]
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        outs = ReferenceEvaluator(model).run(None, feeds)
    return {n: np.asarray(o) for n, o in zip(names, outs)}


def run_pyforge(model: onnx.ModelProto, feeds: dict, fusion: bool) -> dict[str, np.ndarray]:
    import pyforge

    compiled = pyforge.compile(model, target="cpu", fusion=fusion)
    with np.errstate(all="ignore"):
        got = compiled.predict(dict(feeds))
    if not isinstance(got, dict):
        got = {compiled.output_names[0]: got}
    return {k: np.asarray(v).copy() for k, v in got.items()}


def differ(got: dict, want: dict) -> str:
    """'' when every output agrees, else what differs first."""
    for name, ref in want.items():
        if name not in got:
            return f"{name}: missing"
        out = got[name]
        ref = np.asarray(ref)
        if out.shape != ref.shape:
            return f"{name}: shape {out.shape} vs {ref.shape}"
        if out.dtype != ref.dtype:
            return f"{name}: dtype {out.dtype} vs {ref.dtype}"
        if out.dtype.kind == "f":
            nan_o, nan_r = np.isnan(out), np.isnan(ref)
            if (nan_o != nan_r).any():
                k = int(np.argmax(nan_o != nan_r))
                return f"{name}: NaN at different places (flat {k}: {out.flat[k]} vs {ref.flat[k]})"
            with np.errstate(all="ignore"):
                ok = np.isclose(out, ref, rtol=RTOL, atol=ATOL, equal_nan=True)
        else:
            ok = out == ref
        if not ok.all():
            k = int(np.argmin(ok.reshape(-1)))
            return (
                f"{name}: {int((~ok).sum())}/{ok.size} differ, flat {k}: "
                f"{out.reshape(-1)[k]!r} vs {ref.reshape(-1)[k]!r}"
            )
    return ""


def _where(exc: BaseException) -> str:
    """The innermost pyforge frame of a traceback: a crash's stable part."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "pyforge" in f.filename]
    if not frames:
        return "?"
    f = frames[-1]
    return f"{os.path.basename(f.filename)}:{f.name}"


def _telling(msg: str) -> str:
    """The line of an exception message that says what went wrong (past Numba's preamble)."""
    skip = ("Failed in", "File ", "<source", "During:", "def ", "^")
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    return ([ln for ln in lines if not ln.startswith(skip)] or lines or [""])[0]


def _norm(msg: str) -> str:
    """The telling line, names, numbers and hashes blanked: a dedup key."""
    line = re.sub(r"'[^']*'", "'_'", _telling(msg))
    return re.sub(r"[0-9a-f]{6,}|\d+", "N", line)[:120]


class BrokenInstall(Exception):
    """pyforge itself does not import (a refactor in progress): no verdict on any graph."""


def classify_exception(exc: BaseException, variant: str) -> Result:
    from pyforge import errors

    if isinstance(exc, ImportError):
        raise BrokenInstall(str(exc)) from exc
    kind = type(exc).__name__
    # a PyforgeError is a refusal, except those that say the compiler itself is wrong
    compiler_bug = kind in ("IRVerificationError", "InternalError", "CompilerBug")
    if isinstance(exc, errors.PyforgeError) and not compiler_bug:
        op = getattr(exc, "op", "")
        cls = "refusal" if op else "refusal-unnamed"
        return Result(cls, op or kind, str(exc)[:300], (variant,), f"{cls}:{op or kind}")
    msg = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    sig = f"crash:{kind}:{_where(exc)}"
    detail = f"{kind}: {_telling(msg) if kind == 'TypingError' else msg[:400]}"
    return Result("crash", "", detail, (variant,), sig, {"norm": _norm(msg)})


def classify(model: onnx.ModelProto, feeds: dict, variants: tuple[str, ...] = VARIANTS) -> Result:
    """Run the case through ORT and the pyforge variants; the first finding, or ok."""
    try:
        want = run_ort(model, feeds)
    except Exception as e:  # noqa: BLE001  (ORT rejects the model: a generator bug)
        return Result("ort-error", "", f"{type(e).__name__}: {str(e)[:300]}", (), "ort-error")
    results = []
    for variant in variants:
        try:
            got = run_pyforge(model, feeds, fusion=variant == "fused")
        except Exception as e:  # noqa: BLE001  (every exception is classified)
            results.append(classify_exception(e, variant))
            continue
        diff = differ(got, want)
        if diff:
            results.append(_judge(model, feeds, got, want, diff, variant))
    if not results:
        return Result("ok")
    order = ("crash", "mismatch", DISPUTE, "refusal-unnamed", "refusal")
    results.sort(key=lambda r: order.index(r.cls))
    first = results[0]
    first.variants = tuple(v for r in results if r.signature == first.signature for v in r.variants)
    return first


def _judge(model, feeds, got, want, diff: str, variant: str) -> Result:
    try:
        ref = run_reference(model, feeds)
    except Exception as e:  # noqa: BLE001  (the reference lacks the op: ORT alone decides)
        detail = f"{diff} (reference failed: {e!s:.100})"
        if _non_finite(model, feeds):  # ORT alone is no judge of NaN and Inf (FINDINGS.md)
            return Result(DISPUTE, "", detail, (variant,), "disagree")
        if not differ(got, run_ort(model, feeds, optimize=False)):  # ORT's rewrite is off
            detail += "; ORT without its graph optimisations agrees with pyforge"
            return Result(DISPUTE, "", detail, (variant,), "disagree")
        return Result("mismatch", "", detail, (variant,), "mm")
    ort_vs_ref = differ(want, ref)
    if ort_vs_ref:
        pf_vs_ref = differ(got, ref)
        detail = f"pyforge vs ORT: {diff}; ORT vs reference: {ort_vs_ref}; " + (
            "pyforge agrees with the reference" if not pf_vs_ref else f"pyforge vs ref: {pf_vs_ref}"
        )
        return Result(DISPUTE, "", detail, (variant,), "disagree")
    exact = _float64_reference(model, feeds)  # both float32 answers may share one rounding
    if exact is not None and not differ(got, exact) and differ(want, exact):
        detail = f"pyforge vs ORT and reference: {diff}; the float64 reference agrees with pyforge"
        return Result(DISPUTE, "", detail, (variant,), "disagree")
    return Result("mismatch", "", f"pyforge vs ORT and reference: {diff}", (variant,), "mm")


def as_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same graph computed in float64: every float32 tensor type, initializer, Constant and
    Cast target widened (an arbiter for cancellation that float32 answers may share)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    f32, f64 = onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE

    def widen_tensor(t: onnx.TensorProto) -> None:
        if t.data_type == f32:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))

    def widen(g: onnx.GraphProto) -> None:
        for v in [*g.input, *g.output, *g.value_info]:
            if v.type.tensor_type.elem_type == f32:
                v.type.tensor_type.elem_type = f64
        for t in g.initializer:
            widen_tensor(t)
        for n in g.node:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    widen_tensor(a.t)
                elif a.type == onnx.AttributeProto.GRAPH:
                    widen(a.g)
                elif a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT and a.i == f32:
                    a.i = f64

    widen(m.graph)
    return m


def _float64_reference(model: onnx.ModelProto, feeds: dict) -> dict | None:
    """onnx.reference on the float64 graph, its float outputs rounded to float32; None when it
    cannot run (an op without a float64 kernel, say)."""
    wide = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in feeds.items()}
    try:
        outs = run_reference(as_float64(model), wide)
    except Exception:  # noqa: BLE001  (no arbiter: the mismatch stands)
        return None
    return {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in outs.items()}


def _non_finite(model: onnx.ModelProto, feeds: dict) -> bool:
    arrays = list(feeds.values()) + [numpy_helper.to_array(t) for t in model.graph.initializer]
    return any(a.dtype.kind == "f" and not np.isfinite(a).all() for a in arrays)


def ops_of(model: onnx.ModelProto) -> str:
    return "+".join(sorted({n.op_type for n in model.graph.node}))


def save_case(out_dir: str, stem: str, model: onnx.ModelProto, feeds: dict) -> None:
    os.makedirs(out_dir, exist_ok=True)
    onnx.save(model, os.path.join(out_dir, stem + ".onnx"))
    np.savez(os.path.join(out_dir, stem + ".npz"), **feeds)


class Tally:
    """Counts per class (and per class and op), the findings and disputes, the rate."""

    def __init__(self):
        self.graphs = 0
        self.by_class: collections.Counter = collections.Counter()
        self.by_class_op: collections.Counter = collections.Counter()
        self.findings: list[dict] = []  # crash and mismatch rows, in seed order at the end
        self.disputes: list[dict] = []
        self.t0 = time.perf_counter()

    def add(self, row: dict) -> None:
        self.graphs += 1
        self.by_class[row["cls"]] += 1
        if row["cls"] != "ok":
            self.by_class_op[(row["cls"], row["op"] or "?")] += 1
        if row["cls"] in BUGS:
            self.findings.append(row)
        elif row["cls"] == DISPUTE:
            self.disputes.append(row)

    def rate(self) -> tuple[float, float]:
        dt = time.perf_counter() - self.t0
        return dt, self.graphs / max(dt, 1e-9)

    def table(self) -> str:
        dt, rate = self.rate()
        n = self.by_class
        lines = [
            f"graphs {self.graphs} in {dt:.0f} s: {rate:.2f} graphs/s",
            f"crashes {n['crash']}  mismatches {n['mismatch']}  disputes {n[DISPUTE]}"
            + (f"  harness errors {n['harness-error']}" if n["harness-error"] else ""),
            "class              count",
        ]
        lines += [f"{c:18} {k}" for c, k in n.most_common()]
        lines.append("class              op                                   count")
        for (c, op), k in sorted(self.by_class_op.items(), key=lambda x: (x[0][0], -x[1])):
            lines.append(f"{c:18} {op[:36]:36} {k}")
        if self.findings:
            lines.append("findings (seed: class [minimised ops] variants)")
        for r in sorted(self.findings, key=lambda r: r["seed"]):
            lines.append(f"  {r['seed']}: {r['cls']} [{r['op']}] {'/'.join(r['variants'])}")
        return "\n".join(lines)

    def summary(self, seeds, jobs: int) -> dict:
        import numba
        import onnxruntime

        dt, rate = self.rate()
        return {
            "seeds": f"{seeds.start}:{seeds.stop}" if isinstance(seeds, range) else list(seeds),
            "graphs": self.graphs,
            "seconds": round(dt, 1),
            "graphs_per_s": round(rate, 3),
            "jobs": jobs,
            "counts": dict(self.by_class),
            "crashes": self.by_class["crash"],
            "mismatches": self.by_class["mismatch"],
            "disputes": self.by_class[DISPUTE],
            "by_class_op": [[c, op, k] for (c, op), k in sorted(self.by_class_op.items())],
            "findings": sorted(self.findings, key=lambda r: r["seed"]),
            "dispute_cases": sorted(self.disputes, key=lambda r: r["seed"]),
            "versions": {
                "python": sys.version.split()[0],
                "numpy": np.__version__,
                "numba": numba.__version__,
                "onnx": onnx.__version__,
                "onnxruntime": onnxruntime.__version__,
            },
        }


def fuzz(
    seeds, out_dir: str | None = None, minimize=True, log=print, jobs: int = 1, timeout: int = 600
) -> Tally:
    """Run every seed (in ``jobs`` worker processes when above 1); the Tally of the results.
    ``out_dir`` keeps each failing model (and its minimised form) and findings.jsonl; a graph
    past ``timeout`` seconds is a crash (TimeoutError)."""
    tally = Tally()
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    jsonl = open(os.path.join(out_dir, "findings.jsonl"), "a") if out_dir else None  # noqa: SIM115
    try:
        for row in _rows(seeds, out_dir, minimize, jobs, log, timeout):
            _report(row, tally, jsonl, log)
    except KeyboardInterrupt:  # a long run stopped by hand still reports what it found
        log("interrupted")
    if jsonl:
        jsonl.close()
    return tally


def _rows(seeds, out_dir, minimize, jobs, log, timeout):
    if jobs <= 1:
        seen: dict[str, str] = {}
        for seed in seeds:
            yield run_seed(seed, out_dir, minimize, seen, log, timeout)
        return
    import multiprocessing as mp

    # set before the workers import numpy, numba and ORT: one thread each, jobs processes; the
    # parent's own values come back after the pool (Numba refuses a thread count that changes
    # under threads it has launched, as in a test process that goes on compiling)
    names = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    saved = {var: os.environ.get(var) for var in names}
    os.environ.update(dict.fromkeys(names, "1"))
    ctx = mp.get_context("spawn")  # a fresh interpreter each: no forked ORT or Numba threads
    init = (_worker_init, (os.environ["PYFORGE_CACHE"], out_dir, minimize, timeout))
    try:
        # a new worker now and then: each graph's Numba kernels stay in memory
        with ctx.Pool(jobs, *init, maxtasksperchild=200) as pool:
            try:
                yield from pool.imap_unordered(_worker_seed, seeds, chunksize=1)
            except KeyboardInterrupt:
                pool.terminate()
                raise
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


_WORKER: dict = {}


def _worker_init(base: str, out_dir, minimize: bool, timeout: int) -> None:
    """Each live worker holds its own kernel cache, kept across runs (warm the next time): the
    first of base/fuzz-workerK whose lock file no live worker holds."""
    import fcntl

    os.makedirs(base, exist_ok=True)
    for k in itertools.count():
        fd = os.open(os.path.join(base, f"fuzz-worker{k}.lock"), os.O_CREAT | os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when this process ends
        except OSError:
            os.close(fd)
            continue
        _WORKER["lock"] = fd
        os.environ["PYFORGE_CACHE"] = os.path.join(base, f"fuzz-worker{k}")
        break
    warnings.simplefilter("ignore")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the pool
    _WORKER.update(out_dir=out_dir, minimize=minimize, timeout=timeout, seen={})


def _worker_seed(seed: int) -> dict:
    w = _WORKER
    return run_seed(seed, w["out_dir"], w["minimize"], w["seen"], lambda msg: None, w["timeout"])


def _timeout(signum, frame):
    raise TimeoutError("graph took longer than --timeout")


def run_seed(seed: int, out_dir, minimize: bool, seen: dict, log, timeout: int = 600) -> dict:
    """Generate, classify and (for a finding or dispute) minimise one seed: its result row."""
    t0 = time.perf_counter()
    signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(timeout)
    try:
        row = _run_seed(seed, out_dir, minimize, seen, log)
    except Exception as e:  # noqa: BLE001  (the harness itself failed: count it, go on)
        detail = f"{type(e).__name__}: {e!s:.300} at {_where(e)}"
        row = dict(seed=seed, cls="harness-error", op="", variants=[], detail=detail, nodes=0)
    finally:
        signal.alarm(0)
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def _run_seed(seed: int, out_dir, minimize: bool, seen: dict, log) -> dict:
    from .gen import generate
    from .minimize import minimize as shrink

    case = generate(seed)
    res = _classify_waiting(case, log)
    small = case.model
    if res.cls in ("crash", "mismatch", DISPUTE, "ort-error"):
        key = f"{res.signature}:{res.extra.get('norm', '')}"
        if res.cls == "crash" and key in seen:
            res.op = seen[key]
        elif minimize and res.cls != "ort-error":
            small, small_feeds = shrink(case.model, case.feeds, res)
            res.op = ops_of(small)
            seen[key] = res.op
            if out_dir:
                save_case(out_dir, f"seed{seed}_min", small, small_feeds)
        else:
            res.op = ops_of(case.model)
        if out_dir:
            save_case(out_dir, f"seed{seed}", case.model, case.feeds)
    return dict(
        seed=seed,
        cls=res.cls,
        op=res.op,
        variants=list(res.variants),
        detail=res.detail[:600],
        nodes=len(small.graph.node),
    )


def _report(row: dict, tally: Tally, jsonl, log) -> None:
    tally.add(row)
    if row["cls"] not in ("ok", "refusal", "refusal-unnamed"):
        variants = "/".join(row["variants"])
        log(f"seed {row['seed']}: {row['cls']} [{row['op']}] {variants}: {row['detail'][:300]}")
        if jsonl:
            jsonl.write(json.dumps(row) + "\n")
            jsonl.flush()
    if tally.graphs % 100 == 0:
        log(tally.table().splitlines()[0])


def _classify_waiting(case, log, waits: int = 20) -> Result:
    """classify(), waiting out a pyforge that does not import (others mid-refactor)."""
    for _ in range(waits):
        try:
            return classify(case.model, case.feeds)
        except BrokenInstall as e:
            log(f"seed {case.seed}: pyforge does not import ({e}); retrying in 30 s")
            time.sleep(30)
    raise SystemExit("pyforge stayed broken for 10 minutes")


def parse_seeds(text: str) -> range:
    lo, _, hi = text.partition(":")
    return range(int(lo), int(hi)) if hi else range(int(lo), int(lo) + 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0:100", help="start:stop")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--out", default=None, help="the JSON summary (a path ending .json)")
    ap.add_argument("--cases", default=None, help="directory for failing models, findings.jsonl")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per graph (a crash past it)")
    ap.add_argument("--no-minimize", action="store_true")
    args = ap.parse_args(argv)
    if args.out and not args.out.endswith(".json"):
        ap.error("--out names the JSON summary (X.json); --cases DIR keeps the models")
    warnings.simplefilter("ignore")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # kill PID: stop, then report
    seeds = parse_seeds(args.seeds)
    tally = fuzz(seeds, args.cases, not args.no_minimize, _log, args.jobs, args.timeout)
    print(tally.table())
    if args.out:
        with open(args.out, "w") as f:
            json.dump(tally.summary(seeds, args.jobs), f, indent=1)
        print(f"summary {args.out}")
    return 1 if any(tally.by_class[c] for c in BUGS) else 0


def _log(msg: str) -> None:
    print(msg, flush=True)


if __name__ == "__main__":
    sys.exit(main())
