"""Measured kernel costs for the e-graph search: each candidate kernel is built as a one-group
graph, lowered, bound to the target's runtime and timed; the figure is cached on disk by device,
kernel, shapes and dtype. Where nothing can be measured, an analytic estimate (the larger of
FLOPs over peak and bytes over bandwidth) is used and marked as such.

>>> costs = CostModel("cpu", make_runtime=lambda plan: CpuRuntime(plan))
>>> costs.seconds("gemm_bias", ((1, 128, 384), (384, 1152)), "float32")
(0.00041, 'measured')
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..ir import Graph, Node, Value
from ..opt.fusion import fuse_graph
from .build_plan import build_plan
from .lower import lower_graph

# analytic fallback for the cpu target: this 2-core AVX2 machine's order of magnitude
PEAK_FLOPS, BANDWIDTH = 60e9, 8e9


def device_name(target: str) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu
            )
    except OSError:
        pass
    return f"{target}:{cpu}:{os.cpu_count()} cores:{code_version(target)}"


_VERSIONS: dict[str, str] = {}


def code_version(target: str) -> str:
    """A fingerprint of the code a measured kernel ran: the lowering (this package) and the
    target's runtime (``exec/<target>``), every .py file's bytes. A cost measured before a
    change to either (a faster sgemm, a new micro-kernel) no longer matches and is remeasured:
    a cost table keyed by device and shape alone kept choosing OpenBLAS for GEMMs that own
    sgemm had since become faster at (eighth -> ninth session)."""
    if target not in _VERSIONS:
        here = os.path.dirname(os.path.abspath(__file__))
        h = hashlib.sha1()
        for root in (here, os.path.join(os.path.dirname(here), "exec", target)):
            for folder, dirs, files in sorted(os.walk(root)):
                dirs.sort()
                for name in sorted(f for f in files if f.endswith(".py")):
                    with open(os.path.join(folder, name), "rb") as f:
                        h.update(name.encode() + b"\0" + f.read())
        _VERSIONS[target] = h.hexdigest()[:12]
    return _VERSIONS[target]


def candidate_graph(kind: str, shapes: tuple, dtype: str) -> tuple[Graph, float, float]:
    """The one-kernel graph ``kind`` names, with its FLOPs and bytes moved (analytic terms)."""
    rng = np.random.default_rng(0)
    g, dt = Graph(kind), np.dtype(dtype)
    if kind == "group":  # a fused GEMM group as opt/egraph/impl.py describes it (``spec``)
        return _group_graph(g, shapes[0], rng)
    x = Value("x", tuple(shapes[0]), dt)
    g.inputs.append(x)
    if kind == "gemm_bias":  # MatMul + bias Add: one GEMM with its epilogue once fused
        k, n = shapes[1]
        w = g.constant(rng.standard_normal((k, n)).astype(dt), "w")
        b = g.constant(rng.standard_normal(n).astype(dt), "b")
        mm = Value("mm", x.shape[:-1] + (n,), dt)
        y = Value("y", mm.shape, dt)
        g.add_node(Node("MatMul", [x, w], [mm], name="mm"))
        g.add_node(Node("Add", [mm, b], [y], name="y"))
        g.outputs.append(y)
        rows = x.size // k
        return g, 2.0 * rows * k * n, float(x.nbytes + w.nbytes + 2 * y.nbytes)
    if kind == "split":  # the last axis cut into parts: one copy kernel per part
        parts = shapes[1]
        axis = shapes[2] if len(shapes) > 2 else len(x.shape) - 1
        for i, p in enumerate(parts):
            o = Value(f"y{i}", x.shape[:axis] + (p,) + x.shape[axis + 1 :], dt)
            attrs = {"axis": axis, "split": list(parts), "output": i}
            g.add_node(Node("Split", [x], [o], attrs, name=f"y{i}"))
            g.outputs.append(o)
        return g, 0.0, 2.0 * x.nbytes
    if kind == "step":  # two tiny kernels (a view between stops fusion): net, one step's cost
        v, y = Value("v", x.shape, dt), Value("y", x.shape, dt)
        r = Value("r", x.shape, dt)
        g.add_node(Node("Relu", [x], [r], name="r"))
        g.add_node(Node("Reshape", [r], [v], {"shape": list(x.shape)}, name="v"))
        g.add_node(Node("Relu", [v], [y], name="y"))
        g.outputs.append(y)
        return g, 0.0, 0.0
    if kind == "overhead":  # one tiny kernel: what a timed run costs beyond its kernels
        y = Value("y", x.shape, dt)
        g.add_node(Node("Relu", [x], [y], name="y"))
        g.outputs.append(y)
        return g, 0.0, 0.0
    raise ValueError(f"no candidate kernel {kind!r}")


def _group_graph(g: Graph, spec: list, rng) -> tuple[Graph, float, float]:
    """Members ``[op, attrs, refs, shape, dtype]`` in order; a ref is a member's index, None,
    ``["x", shape, dtype]`` (an input) or ``["c", shape, dtype(, values)]`` (a constant)."""
    made: list[Value] = []
    for i, (op, attrs, refs, shape, dtype) in enumerate(spec):
        ins: list[Value | None] = []
        for r in refs:
            if r is None or isinstance(r, int):
                ins.append(None if r is None else made[r])
            elif r[0] == "c":
                a = rng.standard_normal(r[1]) if len(r) == 3 else np.array(r[3]).reshape(r[1])
                ins.append(g.constant(a.astype(r[2]), "c"))
            else:
                ins.append(Value(f"x{len(g.inputs)}", tuple(r[1]), np.dtype(r[2])))
                g.inputs.append(ins[-1])
        made.append(Value(f"y{i}", tuple(shape), np.dtype(dtype)))
        g.add_node(Node(op, ins, [made[-1]], dict(attrs), name=f"n{i}"))
    g.outputs.append(made[-1])
    refs = spec[0][2]  # the anchor's weight: K = its size over the output channels
    w = refs[1] if len(refs) > 1 and isinstance(refs[1], (list, tuple)) else None
    k = int(np.prod(w[1])) // max(w[1][0 if spec[0][0] == "Conv" else -1], 1) if w else 1
    nbytes = sum(v.nbytes for v in g.inputs) + made[-1].nbytes
    return g, 2.0 * made[0].size * k, float(nbytes)


def time_graphs(
    graphs: list[Graph],
    make_runtime: Callable[..., Any],
    rounds: int = 30,
    options: list[dict] | None = None,
    stat: Callable[[list[float]], float] = min,
) -> list[float]:
    """``stat`` (least, by default) of the seconds of one run of each graph (fused, lowered,
    bound with its ``options``) on seeded random inputs, the graphs run in turn round after
    round, so that all see the same load."""
    rng, bound = np.random.default_rng(1), []
    for graph, opts in zip(graphs, options or [{}] * len(graphs)):
        rt = make_runtime(build_plan(lower_graph(fuse_graph(graph))), **opts)
        feeds = {v.name: rng.standard_normal(v.shape).astype(v.dtype) for v in graph.inputs}
        rt.run(feeds)
        bound.append((rt, feeds))
    times: list[list[float]] = [[] for _ in graphs]
    for _ in range(rounds):
        for i, (rt, feeds) in enumerate(bound):
            t0 = time.perf_counter()
            rt.run(feeds)
            times[i].append(time.perf_counter() - t0)
    return [stat(t) for t in times]


def load_class() -> str:
    """Whether the machine is "busy" (a load average above one runnable thread per core: more
    than a compile's own threads) or "idle": costs are medians at the load they were measured at
    (a split GEMM on a busy machine stalls; on an idle one it runs about twice as fast as on one
    thread), so each class keeps its own."""
    return "busy" if os.getloadavg()[0] > (os.cpu_count() or 1) else "idle"


def _base(kind: str) -> str:
    """The candidate a kind names: "group/blas@serial" is a "group" (bound for OpenBLAS, its
    GEMMs' names carrying the runtime's tag "@serial")."""
    return kind.split("@")[0].split("/")[0]


def _tagged(graph: Graph, kind: str) -> Graph:
    """``graph`` with ``kind``'s tag ("KIND@TAG") in each GEMM's name (its step's label)."""
    tag = kind.partition("@")[2]
    for n in graph.nodes if tag else []:
        if n.op in ("MatMul", "Gemm", "Conv"):
            n.name += f"@{tag}"
    return graph


class CostModel:
    """``seconds(kind, shapes, dtype)`` -> (seconds, "measured" | "cached" | "analytic")."""

    def __init__(self, target: str, make_runtime: Callable[[Any], Any] | None = None):
        self.target, self.make_runtime = target, make_runtime
        self.device, self.load = device_name(target), load_class()
        root = os.environ.get("PYFORGE_CACHE") or os.path.join(
            os.path.expanduser("~"), ".cache", "pyforge"
        )  # PYFORGE_COSTS: this table's file alone elsewhere (the kernel cache stays)
        self.path = os.environ.get("PYFORGE_COSTS") or os.path.join(root, "costs.json")
        self.log: list[tuple[str, float, str]] = []
        try:
            with open(self.path) as f:
                self.table: dict[str, float] = json.load(f)
        except (OSError, ValueError):
            self.table = {}
        # this device's costs measured by other code versions are dropped (saved without them)
        base = self.device.rsplit(":", 1)[0]
        self.table = {
            k: v
            for k, v in self.table.items()
            if k.startswith(self.device + "|") or not k.startswith((base + ":", base + "|"))
        }

    def _key(self, kind: str, shapes: tuple, dtype: str) -> str:
        return f"{self.device}|{self.load}|{kind}|{json.dumps(shapes)}|{dtype}"

    def seconds(self, kind: str, shapes: tuple, dtype: str) -> tuple[float, str]:
        key = self._key(kind, shapes, dtype)
        if key in self.table:
            out = (self.table[key], "cached")
        elif self.make_runtime is None:
            _, flops, nbytes = candidate_graph(_base(kind), shapes, dtype)
            out = (max(flops / PEAK_FLOPS, nbytes / BANDWIDTH), "analytic")
        else:
            self.measure([(kind, shapes, dtype)])
            out = (self.table[key], "measured")
        self.log.append((f"{kind} {shapes}", *out))
        return out

    def measure(self, kernels: list[tuple[str, tuple, str]]) -> None:
        """Time every kernel not in the table yet, alternated in one set of rounds, each net
        of a timed run's own overhead (a one-element kernel's run, timed in the same rounds).
        The figure is the median: what a run costs at the load the machine has (a GEMM split
        over threads that another process keeps off a core stalls: at load 10 on 2 cores
        MiniLM's GEMMs took 3x their least time, split, and 1.05x on one thread)."""
        todo = [k for k in dict.fromkeys(kernels) if self._key(*k) not in self.table]
        if not todo or self.make_runtime is None:
            return
        base = ("overhead", ((1,),), "float32")
        kinds = [base, *todo]  # "KIND/blas": bound with own_gemm=False (OpenBLAS runs it)
        graphs = [_tagged(candidate_graph(_base(k), s, d)[0], k) for k, s, d in kinds]
        opts = [{"own_gemm": False} if "/blas" in k else {} for k, _, _ in kinds]
        overhead, *times = time_graphs(
            graphs, self.make_runtime, options=opts, stat=statistics.median
        )
        for k, t in zip(todo, times):
            self.table[self._key(*k)] = max(t - overhead, 1e-7)
        self._save()

    def _save(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = f"{self.path}.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(self.table, f, indent=0, sort_keys=True)
        os.replace(tmp, self.path)
