"""The RMSNorm rewrite (opt/norms.py): which spellings become one RMSNormalization, which stay as
they are, and ORT parity of either on the cpu target."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from pyforge.compiler import compile_to_plan
from tests.helpers import check_against_ort, make_model

F32 = np.float32
N = helper.make_node


def _c(name: str, a) -> object:
    return numpy_helper.from_array(np.asarray(a), name)


def rms_model(square="mul", rstd="div", weight="row", axes=(-1,), shape=(2, 3, 16), extra=None):
    """y = x / sqrt(mean(x², axes) + eps) [* w], spelled as ``square`` (mul|pow) and ``rstd``
    (div|reciprocal|one_over); ``extra``: a value of the pattern also made a graph output."""
    rng = np.random.default_rng(7)
    inits = [_c("eps", np.asarray(1e-6, F32)), _c("axes", np.asarray(axes, np.int64))]
    nodes = []
    if square == "mul":
        nodes.append(N("Mul", ["x", "x"], ["sq"]))
    else:
        inits.append(_c("two", np.asarray(2.0, F32)))
        nodes.append(N("Pow", ["x", "two"], ["sq"]))
    nodes += [
        N("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
        N("Add", ["ms", "eps"], ["mse"]),
        N("Sqrt", ["mse"], ["rms"]),
    ]
    if rstd == "div":
        nodes.append(N("Div", ["x", "rms"], ["nx"]))
    elif rstd == "reciprocal":
        nodes += [N("Reciprocal", ["rms"], ["inv"]), N("Mul", ["inv", "x"], ["nx"])]
    else:
        inits.append(_c("one", np.asarray(1.0, F32)))
        nodes += [N("Div", ["one", "rms"], ["inv"]), N("Mul", ["x", "inv"], ["nx"])]
    out = "nx"
    if weight:
        w = rng.standard_normal(shape[-1]).astype(F32) + 1
        inits.append(_c("w", w if weight == "row" else w.reshape(1, 1, -1)))
        nodes.append(N("Mul", ["nx", "w"], ["y"]))
        out = "y"
    outputs = [(out, F32, list(shape))]
    if extra:
        outputs.append((extra, F32, None))
    model = make_model(nodes, [("x", F32, list(shape))], outputs, inits, opset=18)
    feeds = {"x": (rng.standard_normal(shape) * 3 + 0.5).astype(F32)}
    return model, feeds


def graph_ops(model) -> list[str]:
    _, details = compile_to_plan(model)
    return [
        m.op
        for node in details["graph"].nodes
        for m in (node.group.members if node.group else [node])
    ]


FIRING = {
    "div_weight": dict(),
    "pow_reciprocal": dict(square="pow", rstd="reciprocal"),
    "one_over_weight_3d": dict(rstd="one_over", weight="3d"),
    "no_weight": dict(weight=None),
    "two_trailing_axes": dict(axes=(1, 2)),
}


@pytest.mark.parametrize("case", sorted(FIRING))
def test_rms_norm_becomes_one_node_and_matches_ort(case):
    model, feeds = rms_model(**FIRING[case])
    ops = graph_ops(model)
    assert ops.count("RMSNormalization") == 1
    assert not {"ReduceMean", "Sqrt", "Div", "Reciprocal"} & set(ops)
    check_against_ort(model, feeds)
    check_against_ort(model, feeds, fusion=False)


NOT_FIRING = {
    "leading_axis": dict(axes=(1,)),  # not trailing
    "intermediate_is_an_output": dict(extra="ms"),
}


@pytest.mark.parametrize("case", sorted(NOT_FIRING))
def test_rms_norm_left_alone_where_it_is_not_exact(case):
    model, feeds = rms_model(**NOT_FIRING[case])
    assert "RMSNormalization" not in graph_ops(model)
    check_against_ort(model, feeds)


@pytest.mark.parametrize("shape", [(1, 3, 1), (3, 16)])
def test_a_weight_per_row_is_the_norms_scale(shape):
    """A weight over the rows' axes too (a decoder's q and k heads normed as one) is swallowed."""
    model, feeds = rms_model(weight=None)
    g = model.graph
    w = np.linspace(0.5, 1.5, int(np.prod(shape)), dtype=F32).reshape(shape)
    g.initializer.append(_c("wc", w))
    g.node.append(N("Mul", ["nx", "wc"], ["y"]))
    g.output[0].CopyFrom(helper.make_tensor_value_info("y", 1, [2, 3, 16]))
    ops = graph_ops(model)
    assert ops == ["RMSNormalization"]
    check_against_ort(model, feeds)


def test_weight_that_adds_dims_is_not_swallowed():
    model, feeds = rms_model(weight=None)
    g = model.graph
    w = np.linspace(0.5, 1.5, 16, dtype=F32).reshape(1, 1, 1, 16)
    g.initializer.append(_c("w4", w))
    g.node.append(N("Mul", ["nx", "w4"], ["y"]))
    g.output[0].CopyFrom(helper.make_tensor_value_info("y", 1, [1, 2, 3, 16]))
    ops = graph_ops(model)
    assert ops.count("RMSNormalization") == 1 and "Mul" in ops
    check_against_ort(model, feeds)


def junction_model(shape=(2, 3, 16), outputs=("y", "h"), n1_shared=False):
    """h = r + RMSNorm(x) * w1, y = RMSNorm(h) * w2 (a decoder layer's junction), both written
    out in elementwise ops; ``n1_shared``: the first norm's result is also an output."""
    rng = np.random.default_rng(11)
    inits = [_c("eps", np.asarray(1e-6, F32)), _c("axes", np.asarray([-1], np.int64))]
    nodes = []
    for k, (src, dst) in enumerate((("x", "n1"), ("h", "y")), start=1):
        inits.append(_c(f"w{k}", (rng.standard_normal(shape[-1]) + 1).astype(F32)))
        nodes += [
            N("Mul", [src, src], [f"sq{k}"]),
            N("ReduceMean", [f"sq{k}", "axes"], [f"ms{k}"], keepdims=1),
            N("Add", [f"ms{k}", "eps"], [f"mse{k}"]),
            N("Sqrt", [f"mse{k}"], [f"rms{k}"]),
            N("Div", [src, f"rms{k}"], [f"nx{k}"]),
            N("Mul", [f"nx{k}", f"w{k}"], [dst]),
        ]
        if k == 1:
            nodes.append(N("Add", ["r", "n1"], ["h"]))
    outs = list(outputs) + (["n1"] if n1_shared else [])
    model = make_model(
        nodes,
        [("x", F32, list(shape)), ("r", F32, list(shape))],
        [(o, F32, list(shape)) for o in outs],
        inits,
        opset=18,
    )
    feeds = {n: (rng.standard_normal(shape) * 3 + 0.5).astype(F32) for n in ("x", "r")}
    return model, feeds


@pytest.mark.parametrize(
    "shape,outputs", [((2, 3, 16), ("y", "h")), ((1, 1, 640), ("y", "h")), ((4, 300), ("y",))]
)
def test_residual_junction_is_one_kernel_and_matches_ort(shape, outputs):
    """Both norms and the Add become one ResidualRMSNorm row kernel (h written even when only y
    is read), equal to ORT for both outputs; rows of 16 and of 640 (more than ROW_UNROLL folds)."""
    model, feeds = junction_model(shape, outputs)
    ops = graph_ops(model)
    assert ops == ["ResidualRMSNorm"], ops
    check_against_ort(model, feeds)


def test_residual_junction_left_alone_when_the_first_norm_is_read_elsewhere():
    model, feeds = junction_model(n1_shared=True)
    ops = graph_ops(model)
    assert "ResidualRMSNorm" not in ops and ops.count("RMSNormalization") == 2
    check_against_ort(model, feeds)
