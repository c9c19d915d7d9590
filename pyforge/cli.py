"""The ``pyforge`` command line: compile, run, bench and explain ONNX models.

    pyforge compile MODEL.onnx -o DIR [--target cpu|cuda] [--no-fusion] [--precision P]
                                      [--shape NAME=1x3x224x224 ...]
    pyforge run DIR|MODEL [--input x.npy | --random SEED] [-o out.npy]
    pyforge bench DIR|MODEL [--runs N]
    pyforge explain MODEL [--html OUT.html]

MODEL is a path to an .onnx file or one of the built-in test models (mlp, ew, resnet50).
Every command takes ``--shape NAME=DIMS`` (repeatable): ``pyforge.compile``'s input_shapes;
a symbolic dim left free is compiled as 1 (random inputs come in the plan's shapes).
Compiling shows its stages on stderr (pyforge.compile's progress callback). Errors are one
line on stderr with exit code 1 (a wrong or inapplicable option too); usage errors exit with 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

BUILTIN = ("mlp", "ew", "resnet50")


class CliError(Exception):
    """A user-facing failure: printed as one line, exit code 1."""


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


STAGES = ("import", "passes", "lowering", "plan", "bind", "jit")


def stderr_progress(label: str) -> Callable[[str, int, int], None]:
    """A ``pyforge.compile`` progress callback printing one line per stage on stderr, and in
    bind and jit the steps done so far (at most one line a second, and the last)."""
    t0 = time.perf_counter()
    shown = [0.0]

    def show(stage: str, done: int, total: int) -> None:
        so_far = time.perf_counter() - t0
        if done == 0:
            what = f"{label} ({total} passes)" if stage == "passes" else label
            k = STAGES.index(stage) + 1 if stage in STAGES else "?"
            _progress(f"[{k}/{len(STAGES)}] {stage:<9} {what} ({so_far:.2f} s so far)")
        elif stage in ("bind", "jit") and (done == total or so_far - shown[0] >= 1.0):
            shown[0] = so_far
            what = "bound (kernels loaded)" if stage == "bind" else "JIT-compiled (run once)"
            _progress(f"      {stage}: {done}/{total} steps {what} ({so_far:.2f} s so far)")

    return show


def _resolve(spec: str) -> tuple[str, str]:
    """(kind, path): kind is "plan" for a saved plan directory, else "onnx"."""
    if os.path.isdir(spec):
        if not os.path.isfile(os.path.join(spec, "plan.json")):
            raise CliError(f"{spec} is a directory but not a saved plan (no plan.json)")
        return "plan", spec
    if os.path.isfile(spec):
        return "onnx", spec
    if spec in BUILTIN:
        from .models import cached_model

        return "onnx", cached_model(spec)
    raise CliError(f"{spec}: no such file or directory, and not a built-in model {list(BUILTIN)}")


def _check_target(target: str | None) -> None:
    from . import default_target

    simulated = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
    if target == "cuda" and not simulated and default_target() != "cuda":
        raise CliError("--target cuda needs a usable CUDA GPU and driver (none found); try cpu")


# the CLI flag behind each compile option it sets, for errors about a saved plan
FLAGS = {"fusion": "--no-fusion", "precision": "--precision", "input_shapes": "--shape"}


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME=1x3x224x224`` as (name, shape); ``NAME=`` is a scalar. The name may hold '='
    (split at the last one)."""
    name, sep, dims = text.rpartition("=")
    try:
        shape = tuple(int(d) for d in dims.split("x")) if dims else ()
    except ValueError:
        shape = None
    if not sep or not name or shape is None or any(d < 0 for d in shape):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give NAME=DIMS with DIMS sizes joined by 'x', e.g. input=1x3x224x224"
        )
    return name, shape


def _compile_options(args: argparse.Namespace) -> dict[str, Any]:
    """The compile options the flags set (only those given: the rest take the target's)."""
    options: dict[str, Any] = {}
    if args.no_fusion:
        options["fusion"] = False
    if args.precision is not None:
        options["precision"] = args.precision
    if args.shape:
        shapes = dict(args.shape)
        if len(shapes) < len(args.shape):
            raise CliError("--shape names one input twice")
        options["input_shapes"] = shapes
    return options


def _compile(path: str, args: argparse.Namespace, verbose: bool = True) -> Any:
    """pyforge.compile (which JIT-compiles every kernel as it binds) with progress on stderr."""
    import pyforge

    _check_target(args.target)
    progress = stderr_progress(path) if verbose else None
    model = pyforge.compile(path, args.target, progress=progress, **_compile_options(args))
    if verbose:
        prev = None
        for name, count in model.details["pass_ops"]:
            change = "" if prev is None or prev == count else f" ({count - prev:+d})"
            _progress(f"      {name:<14} {count:5d} ops{change}")
            prev = count
        stages = "  ".join(f"{k} {v:.2f}" for k, v in model.stats["stage_seconds"].items())
        _progress(f"      done in {model.stats['compile_seconds']:.2f} s ({stages})")
    return model


def _load(spec: str, args: argparse.Namespace) -> Any:
    """(model, ONNX path or None): a saved plan is loaded, an ONNX model compiled."""
    import pyforge
    from pyforge.errors import OptionError

    kind, path = _resolve(spec)
    if kind == "onnx":
        return _compile(path, args), path
    _check_target(args.target)
    try:
        return pyforge.load(path, target=args.target, **_compile_options(args)), None
    except OptionError as e:
        if e.option not in FLAGS:
            raise
        raise CliError(f"{FLAGS[e.option]} does not apply to a saved plan (DIR): {e}") from None


def _random_feeds(model: Any, seed: int) -> dict[str, np.ndarray]:
    """Seeded standard-normal inputs in the current plan's shapes, in the same order and dtype
    as models.random_inputs."""
    rng = np.random.default_rng(seed)
    specs = model.plan.signature(model.input_names)
    return {name: rng.standard_normal(shape).astype(dtype) for name, shape, dtype in specs}


def _summary_stats(model: Any) -> str:
    s = model.stats
    return (
        f"{s.get('ops_in', '?')} ONNX ops -> {s.get('ops_out', '?')} nodes, "
        f"{s['launches']} launches ({s.get('kernels', '?')} kernels + {s.get('gemms', '?')} "
        f"GEMMs), arena {s['arena_bytes'] / 2**20:.2f} MiB, target {model.target}"
    )


# -- commands ---------------------------------------------------------------------------------


def cmd_compile(args: argparse.Namespace) -> int:
    kind, path = _resolve(args.model)
    if kind == "plan":
        raise CliError(f"{args.model} is already a compiled plan; compile takes an .onnx model")
    model = _compile(path, args)
    model.save(args.output)
    print(f"compiled  {_summary_stats(model)}")
    print(f"saved     {args.output}/plan.json, weights.bin, kernels/ ({len(model.plan.kernels)})")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    model, _ = _load(args.model, args)
    if args.input:
        try:
            x = np.load(args.input)
        except (OSError, ValueError) as e:
            raise CliError(f"cannot read {args.input}: {e}") from None
        feeds = dict(x) if isinstance(x, np.lib.npyio.NpzFile) else {model.input_names[0]: x}
        source = args.input
    else:
        feeds = _random_feeds(model, args.random)
        source = f"random, seed {args.random}"
    t0 = time.perf_counter()
    y = model.predict(feeds)
    dt = time.perf_counter() - t0
    outs = y if isinstance(y, dict) else {model.output_names[0]: y}
    for name, v in feeds.items():
        print(f"input     {name}: {v.dtype}{list(v.shape)} ({source})")
    for name, v in outs.items():
        print(
            f"output    {name}: {v.dtype}{list(v.shape)} min {v.min():.4g} max {v.max():.4g} "
            f"mean {v.mean():.4g}; first {np.array2string(v.ravel()[:4], precision=4)}"
        )
    print(f"time      {dt * 1e3:.2f} ms (first call; kernels JIT-compiled at bind)")
    if args.output:
        if len(outs) == 1:
            np.save(args.output, next(iter(outs.values())))
        else:
            np.savez(args.output, **outs)
        print(f"saved     {args.output}")
    return 0


def _time(fn: Any, runs: int, warmup: int) -> np.ndarray:
    for _ in range(warmup):
        fn()
    times = np.empty(runs)
    for i in range(runs):
        t0 = time.perf_counter()
        fn()
        times[i] = time.perf_counter() - t0
    return times * 1e3


def _latency(times: np.ndarray) -> str:
    return (
        f"median {np.median(times):8.3f} ms   p99 {np.percentile(times, 99):8.3f} ms   "
        f"min {times.min():8.3f} ms"
    )


def cmd_bench(args: argparse.Namespace) -> int:
    if args.runs < 1:
        raise CliError("--runs must be at least 1")
    if args.no_ort and _resolve(args.model)[0] == "plan":
        raise CliError(
            "--no-ort does not apply to a saved plan (DIR): ORT runs beside an ONNX model"
        )
    model, onnx_path = _load(args.model, args)
    feeds = _random_feeds(model, 0)
    t = _time(lambda: model.predict(feeds), args.runs, args.warmup)
    s = model.stats
    print(f"model     {args.model} ({args.runs} runs after {args.warmup} warm-up)")
    print(f"pyforge   {_latency(t)}   [{model.target}]")
    if onnx_path and not args.no_ort:
        import onnxruntime as ort

        sess = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
        r = _time(lambda: sess.run(None, feeds), args.runs, args.warmup)
        print(f"ORT cpu   {_latency(r)}   [CPUExecutionProvider]")
        print(f"speed-up  {np.median(r) / np.median(t):.3g}x (ORT median / pyforge median)")
    print(
        f"launches  {s['launches']} per inference ({s.get('kernels', '?')} kernels, "
        f"{s.get('gemms', '?')} GEMMs)"
    )
    print(
        f"arena     {s['arena_bytes']:,} B (one buffer per tensor {s['naive_bytes']:,} B; "
        f"liveness bound {s['lower_bound_bytes']:,} B)"
    )
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from . import explain

    kind, path = _resolve(args.model)
    if kind == "plan":
        raise CliError("explain needs the ONNX model (a saved plan keeps no pass details)")
    model = _compile(path, args, verbose=False)
    print(explain.report(model))
    if args.html:
        explain.write_html(model, args.html, title=f"pyforge explain: {args.model}")
        print(f"\nwrote {args.html}")
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    from . import dashboard

    dashboard.write_html(args.results, args.output)
    print(f"wrote {args.output}")
    return 0


# -- parser -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    ap = argparse.ArgumentParser(
        prog="pyforge",
        description="pyforge: compile ONNX models to fused Numba kernels, run, time and explain.",
        epilog="MODEL: an .onnx path or a built-in test model (mlp, ew, resnet50). "
        "DIR: a plan saved by `pyforge compile`.",
    )
    ap.add_argument("--version", action="version", version=f"pyforge {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--target", choices=["cpu", "cuda"], default=None, help="default: cuda if usable"
        )
        p.add_argument("--no-fusion", action="store_true", help="one kernel per op")
        p.add_argument(
            "--precision",
            choices=["fp32", "tf32", "fp16"],
            default=None,
            help="tf32 and fp16: cuda only (default fp32; a saved plan keeps its own)",
        )
        p.add_argument(
            "--shape",
            action="append",
            type=parse_shape,
            metavar="NAME=DIMS",
            help="fix an input's shape, e.g. input_ids=1x128 (repeatable; default: symbolic "
            "dims as 1)",
        )

    p = sub.add_parser("compile", help="compile an ONNX model and save the plan to a directory")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="plan directory")
    common(p)
    p.set_defaults(fn=cmd_compile)

    p = sub.add_parser("run", help="run one inference and write the output")
    p.add_argument("model", metavar="DIR|MODEL")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--input", metavar="X.npy", help="input array (.npz: one array per input)")
    g.add_argument("--random", type=int, default=0, metavar="SEED", help="seeded random input")
    p.add_argument("-o", "--output", metavar="OUT.npy", help="write the output here")
    common(p)
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("bench", help="time predict(), beside ONNX Runtime for an ONNX model")
    p.add_argument("model", metavar="DIR|MODEL")
    p.add_argument("--runs", type=int, default=50, help="timed runs (default 50)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs first (default 3)")
    p.add_argument("--no-ort", action="store_true", help="skip the ONNX Runtime comparison")
    common(p)
    p.set_defaults(fn=cmd_bench)

    p = sub.add_parser("explain", help="show passes, fused groups, kernels and the memory plan")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--html", metavar="OUT.html", help="also write a self-contained HTML page")
    common(p)
    p.set_defaults(fn=cmd_explain)

    p = sub.add_parser("dashboard", help="asv results as one self-contained HTML page")
    p.add_argument("results", metavar="ASV_DIR", help="asv's results folder, e.g. .asv")
    p.add_argument("-o", "--output", default="dash.html", metavar="OUT.html")
    p.set_defaults(fn=cmd_dashboard)
    # the text-generation and serving commands live beside their code (each imports its heavy
    # dependencies only when run)
    for name in ("pyforge.generate.export", "pyforge.generate.cli", "pyforge.serve.cli"):
        importlib.import_module(name).add_commands(sub)
    return ap


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``pyforge`` script; returns the exit code."""
    from .errors import PyforgeError

    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (CliError, PyforgeError) as e:
        print(f"pyforge {args.command}: error: {_one_line(e)}", file=sys.stderr)
    except OSError as e:
        print(f"pyforge {args.command}: error: {e.strerror or e}: {e.filename}", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"pyforge {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a compiler bug: still one line, the traceback on request
        if os.environ.get("PYFORGE_DEBUG"):
            raise
        print(
            f"pyforge {args.command}: internal error: {type(e).__name__}: {_one_line(e)} "
            "(set PYFORGE_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
    return 1


if __name__ == "__main__":
    sys.exit(main())
