"""Op-by-op ONNX Runtime parity on small shapes, covering each op's attribute and opset forms."""

import numpy as np
import pytest
from onnx import helper, numpy_helper

from tests.helpers import check_against_ort, make_model

rng = np.random.default_rng(1234)


def rand(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def one_op(op, inputs, out_shape, attrs=None, consts=(), opset=17, out_dtype=np.float32):
    """A model with one node: ``inputs`` are arrays fed at run time, ``consts`` initializers."""
    names = [f"x{i}" for i in range(len(inputs))]
    cnames = [f"c{i}" for i in range(len(consts))]
    node = helper.make_node(op, names + cnames, ["y"], name=f"{op.lower()}0", **(attrs or {}))
    inits = [numpy_helper.from_array(c, n) for c, n in zip(consts, cnames)]
    model = make_model(
        [node],
        [(n, a.dtype, list(a.shape)) for n, a in zip(names, inputs)],
        [("y", out_dtype, out_shape)],
        inits,
        opset,
    )
    return model, dict(zip(names, inputs))


CONV_CASES = {
    "3x3_pad1": dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    "1x1": dict(kernel_shape=[1, 1]),
    "1x1_stride2": dict(kernel_shape=[1, 1], strides=[2, 2]),
    "5x5_stride2_asym": dict(kernel_shape=[5, 5], strides=[2, 2], pads=[2, 1, 2, 1]),
    "dilated": dict(kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 2, 2, 2]),
    "same_upper": dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
    "grouped": dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=2),
    "depthwise": dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=4),
}


@pytest.mark.parametrize("fusion", [True, False])
@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv(case, fusion):
    attrs = CONV_CASES[case]
    g = attrs.get("group", 1)
    x, w, b = (
        rand(2, 4, 9, 9),
        rand(6 if g != 4 else 4, 4 // g, *attrs["kernel_shape"]),
        rand(6 if g != 4 else 4),
    )
    model, feeds = one_op("Conv", [x], None, attrs, consts=[w, b])
    check_against_ort(model, feeds, fusion=fusion)


def test_conv1d():
    model, feeds = one_op(
        "Conv", [rand(1, 3, 16)], None, dict(kernel_shape=[3], pads=[1, 1]), consts=[rand(5, 3, 3)]
    )
    check_against_ort(model, feeds)


POOL_CASES = {
    "max_3x3_s2_p1": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    "max_ceil": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    "max_dilated": ("MaxPool", dict(kernel_shape=[2, 2], dilations=[2, 2])),
    "avg_pad_excl": ("AveragePool", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
    "avg_pad_incl": (
        "AveragePool",
        dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
    ),
    "avg_ceil": ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),
    "global_avg": ("GlobalAveragePool", {}),
    "global_max": ("GlobalMaxPool", {}),
}


@pytest.mark.parametrize("case", sorted(POOL_CASES))
def test_pool(case):
    op, attrs = POOL_CASES[case]
    model, feeds = one_op(op, [rand(2, 3, 9, 9)], None, attrs)
    check_against_ort(model, feeds)


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_axis_semantics_across_opsets(op, opset):
    model, feeds = one_op(op, [rand(2, 3, 5)], [2, 3, 5], dict(axis=1), opset=opset)
    check_against_ort(model, feeds)


def test_clip_attribute_form_opset6():
    model, feeds = one_op("Clip", [rand(3, 4)], [3, 4], dict(min=-0.5, max=0.5), opset=6)
    check_against_ort(model, feeds)


def test_clip_input_form_opset13():
    lo, hi = np.array(-0.3, np.float32), np.array(0.7, np.float32)
    model, feeds = one_op("Clip", [rand(3, 4)], [3, 4], consts=[lo, hi], opset=13)
    check_against_ort(model, feeds)


@pytest.mark.parametrize("target", [[3, -1], [0, 2, 2], [-1]])
def test_reshape(target):
    model, feeds = one_op("Reshape", [rand(3, 4)], None, consts=[np.array(target, np.int64)])
    check_against_ort(model, feeds)


def test_reshape_attribute_form_opset1():
    model, feeds = one_op("Reshape", [rand(3, 4)], [4, 3], dict(shape=[4, 3]), opset=1)
    check_against_ort(model, feeds)


@pytest.mark.parametrize("perm", [None, [0, 2, 1], [2, 0, 1]])
def test_transpose(perm):
    attrs = {} if perm is None else dict(perm=perm)
    model, feeds = one_op("Transpose", [rand(2, 3, 4)], None, attrs)
    check_against_ort(model, feeds)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    model, feeds = one_op(
        "Concat", [rand(2, 3, 4), rand(2, 3, 4), rand(2, 3, 4)], None, dict(axis=axis)
    )
    check_against_ort(model, feeds)


@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_gemm_transposes_alpha_beta(ta, tb):
    a = rand(5, 3) if ta else rand(3, 5)
    b = rand(4, 5) if tb else rand(5, 4)
    attrs = dict(transA=ta, transB=tb, alpha=0.7, beta=1.3)
    model, feeds = one_op("Gemm", [a], [3, 4], attrs, consts=[b, rand(4)])
    check_against_ort(model, feeds)


def test_gemm_runtime_c_full():
    model, feeds = one_op("Gemm", [rand(3, 5), rand(5, 4), rand(3, 4)], [3, 4], dict(beta=0.5))
    check_against_ort(model, feeds)


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((3, 5), (5, 4)),
        ((2, 3, 5), (5, 4)),
        ((2, 3, 5), (2, 5, 4)),
        ((3, 5), (2, 5, 4)),
        ((5,), (5, 4)),
        ((3, 5), (5,)),
    ],
)
def test_matmul(sa, sb):
    model, feeds = one_op("MatMul", [rand(*sa), rand(*sb)], None)
    check_against_ort(model, feeds)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min"])
def test_binary_broadcast(op):
    model, feeds = one_op(op, [rand(2, 3, 4), rand(3, 1) + 2.0], [2, 3, 4])
    check_against_ort(model, feeds)


@pytest.mark.parametrize(
    "op,attrs",
    [
        ("Relu", {}),
        ("Sigmoid", {}),
        ("Tanh", {}),
        ("Exp", {}),
        ("Neg", {}),
        ("Abs", {}),
        ("LeakyRelu", dict(alpha=0.2)),
        ("HardSigmoid", {}),
        ("HardSwish", {}),
        ("Erf", {}),
        ("Gelu", {}),
    ],
)
def test_unary(op, attrs):
    opset = 20 if op == "Gelu" else 17
    model, feeds = one_op(op, [rand(3, 7)], [3, 7], attrs, opset=opset)
    check_against_ort(model, feeds)


def test_batchnorm_without_conv():
    c = 3
    consts = [rand(c) + 2, rand(c), rand(c), np.abs(rand(c)) + 0.5]
    model, feeds = one_op(
        "BatchNormalization", [rand(2, c, 4, 4)], [2, c, 4, 4], dict(epsilon=1e-3), consts=consts
    )
    check_against_ort(model, feeds)


def test_flatten_identity_view_chain():
    nodes = [
        helper.make_node("Flatten", ["x"], ["f"], axis=2, name="flat"),
        helper.make_node("Identity", ["f"], ["i"], name="ident"),
        helper.make_node("Relu", ["i"], ["y"], name="relu"),
    ]
    model = make_model(nodes, [("x", np.float32, [2, 3, 4])], [("y", np.float32, [6, 4])])
    check_against_ort(model, {"x": rand(2, 3, 4)})


@pytest.mark.parametrize("group", [1, 2])
def test_conv_with_runtime_weight_and_bias(group):
    """Weights and bias fed at run time (not initializers) must still be used, bias included."""
    x, w, b = rand(1, 4, 7, 7), rand(6, 4 // group, 3, 3), rand(6) + 3.0
    model, feeds = one_op("Conv", [x, w, b], None, dict(kernel_shape=[3, 3], group=group))
    check_against_ort(model, feeds)


def test_scalar_output_keeps_its_shape():
    model, feeds = one_op("Size", [rand(3, 4, 5)], [], out_dtype=np.int64)
    compiled, _ = check_against_ort(model, feeds)
    assert compiled.predict(feeds).shape == ()
