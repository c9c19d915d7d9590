"""The compile pipeline: import -> passes -> lowering -> plan, each stage timed and reported."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any

from .exec.plan import ExecutionPlan
from .frontend import import_onnx, load_model
from .lower_numba.build_plan import build_plan
from .lower_numba.lower import lower_graph
from .opt.passes import PassManager
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


def compile_to_plan(
    model: Any,
    options: CompileOptions | None = None,
    *,
    progress: Progress | None = None,
    **fields: Any,
) -> tuple[ExecutionPlan, dict]:
    """The target-independent part of compile(): ONNX -> ExecutionPlan, plus pass details.

    ``options``: resolved CompileOptions (``CompileOptions(...).resolve(target)``); or the
    fields as keywords, resolved with no target.

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
        graph = import_onnx(proto, o.input_shapes)
    names = pass_names(o.layout, o.precision, o.fusion)
    # the stage's own end call reports the last pass
    on_pass = (lambda _, i, n: i < n and progress("passes", i, n)) if progress else None
    with _stage("passes", seconds, progress, len(names)):
        pm = PassManager(names, verify=o.verify, on_pass=on_pass)
        graph = pm.run(graph)
    with _stage("lowering", seconds, progress):
        prog = lower_graph(graph, o.specialize, o.conv, o.conv_tile)
    with _stage("plan", seconds, progress):
        plan = build_plan(prog, float16=o.precision == "fp16")
    plan.stats.update(
        ops_in=len(proto.graph.node),
        ops_out=len(graph.nodes),
        groups=sum(n.op == "Fused" for n in graph.nodes),
        fusion=o.fusion,
        layout=o.layout,
        conv=o.conv,
        precision=o.precision,
        specialize=o.specialize,
    )
    details = {
        "options": o,
        "stage_seconds": seconds,  # import, passes, lowering, plan
        "pass_ops": pm.op_counts,  # [(pass name, node count after it)]
        "pass_seconds": pm.timings,
        "graph": graph,  # the fused graph: each Fused node holds its group (ir.FusedGroup)
        "buffers": plan.buffers,  # [(tensor, bytes, first step, last step, arena offset)]
        "step_labels": plan.step_labels(),
    }
    return plan, details
