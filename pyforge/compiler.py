"""The compile pipeline: import -> passes -> lowering -> plan, each stage timed and reported."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from functools import partial
from typing import Any

from .errors import OptionError, ResourceError
from .exec.plan import ExecutionPlan
from .frontend import import_onnx, load_model
from .frontend.checks import check_declared_sizes
from .lower_numba.build_plan import build_plan
from .lower_numba.describe import describe
from .lower_numba.lower import lower_graph
from .opt.passes import PASSES, PassManager
from .opt.pipeline import pass_names
from .options import CompileOptions, Progress


@contextmanager
def _stage(name: str, seconds: dict[str, float], progress: Progress | None, total: int = 1):
    if progress is not None:
        progress(name, 0, total)
    t0 = time.perf_counter()
    yield
    seconds[name] = time.perf_counter() - t0
    if progress is not None:
        progress(name, total, total)


def _attention_pass(graph, max_rows: int):
    return PASSES["attention"](graph, max_rows=max_rows)  # looked up here: a benchmark swaps it


def compile_to_plan(
    model: Any,
    options: CompileOptions | None = None,
    *,
    progress: Progress | None = None,
    padding: Any = None,
    cache: Any = None,
    like: tuple[ExecutionPlan, ...] = (),
    **fields: Any,
) -> tuple[ExecutionPlan, dict]:
    """The target-independent part of compile(): ONNX -> ExecutionPlan, plus pass details.

    ``options``: resolved CompileOptions (``CompileOptions(...).resolve(target)``); or the
    fields as keywords, resolved with no target. ``cache``: an ``ir.ConstCache`` that every
    compile of this one proto shares (never mutate the proto while it is in use); ``like``:
    that proto's plans, whose weights array the new plan takes where the bytes are the same.

    >>> plan, details = compile_to_plan("mlp.onnx", specialize=True, layout="nhwc")
    """
    if options is None:
        options = CompileOptions(**fields).resolve(None)
    elif fields:
        raise TypeError("compile_to_plan takes options= or keyword fields, not both")
    o = options
    seconds: dict[str, float] = {}
    with _stage("import", seconds, progress):
        proto = load_model(model)
        limit = o.memory_limit or default_memory_limit()
        check_declared_sizes(proto, limit, o.input_shapes)  # before constant folding allocates
        graph = import_onnx(proto, o.input_shapes, padding, cache)  # padding: frontend/buckets.py
    names, bound, search = pass_names(o.layout, o.precision, o.fusion), {}, {}
    if o.attention_rows is not None:
        bound["attention"] = partial(_attention_pass, max_rows=o.attention_rows)
    if o.optimizer == "egraph":  # before fusion: it rewrites MatMul + Add pairs
        names.insert(len(names) - 1, "egraph")
        bound["egraph"] = _egraph_pass(search)
    # the stage's own end call reports the last pass
    on_pass = (lambda _, i, n: i < n and progress("passes", i, n)) if progress else None
    with _stage("passes", seconds, progress, len(names)):
        pm = PassManager(names, verify=o.verify, on_pass=on_pass, bound=bound)
        graph = pm.run(graph)
    with _stage("lowering", seconds, progress):
        mark_state(graph, o.state or {})
        prog = lower_graph(graph, o.specialize, o.conv, o.conv_tile)
    with _stage("plan", seconds, progress):
        plan = build_plan(prog, float16=o.precision == "fp16", state=o.state, like=like)
        lowering = {"specialize": o.specialize, "conv": o.conv, "conv_tile": o.conv_tile}
        plan.description = describe(graph, plan, lowering)  # what load regenerates it from
    if limit is not None and plan.arena_bytes + plan.weights.nbytes > limit:  # before bind
        need = plan.arena_bytes + plan.weights.nbytes
        what = f"the plan's arena ({plan.arena_bytes:,} bytes) and weights"
        raise ResourceError(f"{what} ({plan.weights.nbytes:,} bytes)", need, limit)
    plan.stats.update(
        ops_in=len(proto.graph.node),
        ops_out=len(graph.nodes),
        groups=sum(n.op == "Fused" for n in graph.nodes),
        fusion=o.fusion,
        layout=o.layout,
        conv=o.conv,
        precision=o.precision,
        specialize=o.specialize,
        optimizer=o.optimizer,
    )
    details = {
        "options": o,
        "stage_seconds": seconds,  # import, passes, lowering, plan
        "pass_ops": pm.op_counts,  # [(pass name, node count after it)]
        "pass_seconds": pm.timings,
        "graph": graph,  # the fused graph: each Fused node holds its group (ir.FusedGroup)
        "buffers": plan.buffers,  # [(tensor, bytes, first step, last step, arena offset)]
        "step_labels": plan.step_labels(),
        "egraph": search.get("report"),  # opt/egraph's regions, choices, costs and search log
    }
    return plan, details


def mark_state(graph, state: dict[str, str]) -> None:
    """Check each state output may alias its input and mark its ScatterND to write in place:
    the output made by a ScatterND into the input, nothing reading the input after it."""
    from .ops.registry import kind_of

    ins, outs = {v.name: v for v in graph.inputs}, {v.name for v in graph.outputs}
    ops = lambda n: "+".join(m.op for m in n.group.members) if n.op == "Fused" else n.op
    for out, inp in state.items():
        if out not in outs or inp not in ins:
            why = f"outputs {sorted(outs)}, inputs {sorted(ins)}"
            raise OptionError(
                "state", f"state {{{out!r}: {inp!r}}}: not an output and input ({why})"
            )
        k = next(k for k, n in enumerate(graph.nodes) if out in [o.name for o in n.outputs])
        node = graph.nodes[k]
        # the member that makes ``out``: scatters sharing indices share one kernel
        members = node.group.members if node.op == "Fused" else [node]
        a = next(m for m in members if out in [o.name for o in m.outputs])
        if a.op != "ScatterND" or a.inputs[0] is not ins[inp] or a.outputs[0].name != out:
            raise OptionError(
                "state",
                f"state output {out!r} is made by node {node.name!r} ({ops(node)}), not by a "
                f"ScatterND into {inp!r}: it cannot be written in place over that input",
            )
        aliases = {id(ins[inp])}
        for n in graph.nodes:  # a view of the input reads it too
            if kind_of(n.op) == "view" and id(n.inputs[0]) in aliases:
                aliases.add(id(n.outputs[0]))
        late = [n for n in graph.nodes[k + 1 :] if any(id(v) in aliases for v in n.inputs)]
        if late:
            raise OptionError(
                "state",
                f"node {late[0].name!r} ({ops(late[0])}) reads {inp!r} after node {node.name!r} "
                f"(ScatterND) writes {out!r} over it in place",
            )
        a.attrs["in_place"] = 1


def _egraph_pass(out: dict):
    """The e-graph pass with the cpu target's measured kernel costs; its report goes in ``out``."""
    import numba

    from .exec.cpu import CpuRuntime, own
    from .exec.cpu import blas as cblas
    from .lower_numba.costs import CostModel
    from .opt.egraph.impl import Backend
    from .opt.egraph.parallel_gemm import optimise

    def splits(m: int, n: int, k: int, on_own: bool) -> bool:  # the runtime's thread choice
        least = (
            own.SERIAL_WORK + 1 if on_own else cblas.GEMV_SPLIT_MIN if m == 1 else cblas.SPLIT_MIN
        )
        return numba.get_num_threads() > 1 and m * n * k >= least

    costs = CostModel("cpu", make_runtime=CpuRuntime)
    blas = Backend(own.takes, own.OPENBLAS, splits, own.SERIAL)

    def run(graph):
        graph, out["report"] = optimise(graph, costs.seconds, prefetch=costs.measure, backend=blas)
        return graph

    return run


def default_memory_limit() -> int | None:
    """75% of physical memory: room for the OS and the caller's own arrays; None where the OS
    does not tell (no check then)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 3 // 4
    except (AttributeError, ValueError, OSError):
        return None
