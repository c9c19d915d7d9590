"""compile(): import, optimise, lower, plan memory, and bind a runtime."""

from __future__ import annotations

import time
from typing import Any

from .exec.plan import ExecutionPlan
from .frontend import import_onnx, load_model
from .lower_numba.build_plan import build_plan
from .lower_numba.lower import lower_graph
from .opt import canonicalize, fusion, simplify  # noqa: F401  (register passes)
from .opt import layout as _layout  # noqa: F401  (registers nhwc_layout)
from .opt import precision as _precision  # noqa: F401  (registers fp16)
from .opt.passes import PassManager

PIPELINE = ["const_fold", "drop_identity", "bn_fold", "split_bias", "const_fold", "dce"]


def compile_to_plan(
    model: Any,
    fusion_on: bool = True,
    verify: bool = True,
    specialize: bool = False,
    layout: str = "nchw",
    conv: str = "im2col",
    conv_tile: str | None = None,
    precision: str = "fp32",
) -> tuple[ExecutionPlan, dict]:
    """The target-independent part of compile(): ONNX -> ExecutionPlan, plus pass details.

    ``precision="fp16"`` stores activations and weights as float16 where safe (opt.precision)."""
    t0 = time.perf_counter()
    proto = load_model(model)
    graph = import_onnx(proto)
    passes = PIPELINE + (["nhwc_layout", "dce"] if layout == "nhwc" else [])
    passes += ["fp16"] if precision == "fp16" else []
    pm = PassManager(passes + ["fuse" if fusion_on else "no_fuse"], verify=verify)
    graph = pm.run(graph)
    groups = [n for n in graph.nodes if n.op == "Fused"]
    prog = lower_graph(graph, specialize, conv, conv_tile, precision == "fp16")
    plan = build_plan(prog)
    plan.stats.update(
        ops_in=len(proto.graph.node),
        ops_out=len(graph.nodes),
        groups=len(groups),
        fusion=fusion_on,
        layout=layout,
        conv=conv,
        precision=precision,
        compile_seconds_frontend=time.perf_counter() - t0,
    )
    details = {
        "pass_ops": pm.op_counts,  # [(pass name, node count after it)]
        "pass_seconds": pm.timings,
        "graph": graph,  # the fused graph: Fused nodes hold attrs["members"], attrs["anchor"]
        "buffers": plan.buffers,  # [(tensor, bytes, first step, last step, arena offset)]
        "step_labels": plan.step_labels(),
    }
    return plan, details
