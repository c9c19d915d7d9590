"""Write every generated kernel source and step label of the test models' plans to a folder,
so a refactor can be checked to leave the generated code byte-identical.

    python scripts/kernel_snapshot.py OUT_DIR        # then: diff -r BEFORE AFTER
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import pyforge
from pyforge.compiler import compile_to_plan
from pyforge.models import MODELS


def layernorm_model():
    """LayerNorm -> Relu -> ReduceSum -> Neg: the chain the op table lets fuse."""
    rng = np.random.default_rng(0)
    scale = numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "s")
    bias = numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "b")
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    nodes = [
        helper.make_node("LayerNormalization", ["x", "s", "b"], ["ln"], axis=-1),
        helper.make_node("Relu", ["ln"], ["r"]),
        helper.make_node("ReduceSum", ["r", "axes"], ["rs"], keepdims=1),
        helper.make_node("Neg", ["rs"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "ln",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16, 1])],
        [scale, bias, axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def main(out: str) -> None:
    models = {name: fn() for name, fn in MODELS.items()}
    models["layernorm"] = layernorm_model()
    summary = {}
    for name, model in models.items():
        for target in ("cpu", "cuda"):
            plan, _ = compile_to_plan(model, pyforge.CompileOptions().resolve(target))
            d = os.path.join(out, f"{name}.{target}")
            os.makedirs(d, exist_ok=True)
            for key, sources in sorted(plan.kernels.items()):
                if target not in sources:  # a GEMM's cuda-only fallback kernel, on cpu
                    continue
                src = sources[target]
                h = hashlib.sha1(src.encode()).hexdigest()[:12]
                with open(os.path.join(d, f"{h}.py"), "w") as f:
                    f.write(src)
            labels = [s.label for s in plan.steps]
            launches = plan.stats["kernels"] + plan.stats["gemms"]
            summary[f"{name}.{target}"] = {
                "steps": len(plan.steps),
                "kernels+gemms": launches,
                "arena_bytes": plan.stats["arena_bytes"],
                "labels": labels,
            }
            print(f"{name:10s} {target:5s} steps {len(plan.steps):4d} launches {launches:4d}")
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
