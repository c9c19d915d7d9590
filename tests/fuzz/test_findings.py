"""One-node ORT-parity tests for the fuzzer's fixed findings (FINDINGS.md): NaN in the max
pools and TopK, pool shapes under SAME padding with dilations and ceil mode, float Range."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

import pyforge
from tests.helpers import check_against_ort, make_model

from .run import differ, run_ort, run_reference

NAN, INF = np.float32(np.nan), np.float32(np.inf)


def _pool_model(op: str, shape, nhwc: bool = False, **attrs):
    """``op`` on x; with ``nhwc`` behind a 1x1 one-channel identity Conv, so the NHWC layout
    pass gives the pool its channels-last twin."""
    nodes, inits, src = [], [], "x"
    if nhwc:
        inits.append(numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "w"))
        nodes.append(helper.make_node("Conv", ["x", "w"], ["xc"], name="conv"))
        src = "xc"
    nodes.append(helper.make_node(op, [src], ["y"], name="pool", **attrs))
    return make_model(nodes, [("x", np.float32, shape)], [("y", np.float32, None)], inits, 18)


def _with_nan(rng, shape, where):
    x = rng.uniform(-2, 2, shape).astype(np.float32)
    x.reshape(-1)[list(where)] = NAN
    return x


# (op, shape, NaN positions (flat), attrs): each output ORT and onnx.reference agree on; a
# NaN dropped at stride 1 is one ORT's vector max drops too (the first tap of its window)
POOL_NAN = {
    "global_all_nan_plane": ("GlobalMaxPool", (2, 2, 5, 1), range(10, 15), {}),
    "global_nan_last": ("GlobalMaxPool", (1, 3, 2, 2), [3, 7], {}),
    "max_all_nan_window": ("MaxPool", (1, 1, 4, 4), [0, 1, 4, 5], dict(kernel_shape=[2, 2])),
    "max_nan_dropped": ("MaxPool", (1, 1, 4, 4), [0], dict(kernel_shape=[2, 2])),
    "max_nan_first_strided": (
        "MaxPool",
        (1, 1, 5, 2),
        [4, 5],
        dict(kernel_shape=[2, 1], strides=[2, 2]),
    ),
    "max_nan_first_dilated": (
        "MaxPool",
        (1, 2, 6),
        [0, 7],
        dict(kernel_shape=[2], dilations=[2]),
    ),
}


@pytest.mark.parametrize("nhwc", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("case", sorted(POOL_NAN))
def test_max_pool_nan(case, nhwc):
    op, shape, where, attrs = POOL_NAN[case]
    if nhwc and len(shape) != 4:
        pytest.skip("the NHWC twins are 2-d")
    if nhwc:
        shape = (shape[0] * shape[1], 1, *shape[2:])  # one channel: the identity Conv
    x = _with_nan(np.random.default_rng(len(case)), shape, where)
    model = _pool_model(op, shape, nhwc, **attrs)
    want = run_ort(model, {"x": x})["y"]
    assert np.isnan(want).any() == (case != "max_nan_dropped")
    if case != "max_all_nan_window":  # the reference cannot reduce an all-NaN window
        got = run_reference(model, {"x": x})["y"]
        np.testing.assert_array_equal(got, want)  # a case ORT and the reference agree on
    compiled, _ = check_against_ort(model, {"x": x}, layout="nhwc" if nhwc else "nchw")
    assert nhwc == any(f"{op}NHWC" in step.label for step in compiled.plan.steps)


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("axis", [-1, 0])
def test_topk_nan(largest, axis):
    """NaN ranks above +inf (first when largest, last when smallest), ties by index."""
    rng = np.random.default_rng(4962 + largest)
    x = rng.integers(-3, 3, (6, 5)).astype(np.float32) / 2  # ties
    x.reshape(-1)[rng.choice(30, 9, replace=False)] = [NAN, NAN, NAN, INF, -INF, NAN, 0, 0, INF]
    for k in (1, 3, x.shape[axis]):
        k_init = numpy_helper.from_array(np.array([k], np.int64), "k")
        node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)
        model = make_model(
            [node],
            [("x", np.float32, x.shape)],
            [("v", np.float32, None), ("i", np.int64, None)],
            [k_init],
            18,
        )
        check_against_ort(model, {"x": x})


def test_topk_nan_smallest_seed4962():
    """The fuzzer's case: k=1 smallest of [0.62, 0.51, 1.04, nan] is 0.51, not NaN."""
    x = np.array([[0.62], [0.51], [1.04], [NAN]], np.float32)
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=-2, largest=0)
    k = numpy_helper.from_array(np.array([1], np.int64), "k")
    model = make_model(
        [node], [("x", np.float32, x.shape)], [("v", np.float32, None), ("i", np.int64, None)], [k]
    )
    check_against_ort(model, {"x": x})


def _pool_cases():
    for n in range(1, 7):
        for k, s, d in (
            (1, 1, 2),
            (2, 1, 2),
            (2, 2, 2),
            (3, 2, 2),
            (3, 3, 2),
            (3, 1, 1),
            (2, 2, 1),
        ):
            for pad in ("SAME_UPPER", "SAME_LOWER"):
                for ceil in (0, 1):
                    yield n, k, s, d, pad, ceil


def test_pool_same_dilated_lengths():
    """SAME pads of a dilated pool are sized by the undilated kernel (as ORT does), then the
    usual window count, 0 where the dilated window overhangs (seed 10509): pyforge matches
    every case where ORT and onnx.reference agree."""
    rng = np.random.default_rng(10509)
    agreed = 0
    for n, k, s, d, pad, ceil in _pool_cases():
        attrs = dict(kernel_shape=[k], strides=[s], dilations=[d], auto_pad=pad, ceil_mode=ceil)
        model = _pool_model("MaxPool", (1, 4, n), **attrs)
        x = rng.uniform(-2, 2, (1, 4, n)).astype(np.float32)
        try:
            want, ref = run_ort(model, {"x": x}), run_reference(model, {"x": x})
        except Exception:  # noqa: BLE001, S112  (a window that reads nothing: no verdict)
            continue
        if differ(want, ref):
            continue  # a dispute (C's rounding toward zero in ORT's window count, say)
        got = pyforge.compile(model, target="cpu").predict(x)
        assert not differ({"y": got}, want), (n, k, s, d, pad, ceil, differ({"y": got}, want))
        agreed += 1
    assert agreed >= 50  # of 84


def test_pool_same_pads_below_zero_refused():
    """A kernel shorter than the stride asks for negative SAME pads: ORT rounds them toward
    zero or refuses, the reference floors them; pyforge refuses, naming the node."""
    attrs = dict(kernel_shape=[1], strides=[3], dilations=[2], auto_pad="SAME_UPPER")
    model = _pool_model("MaxPool", (1, 4, 6), **attrs)
    with pytest.raises(pyforge.errors.UnsupportedOperatorError, match="pool.*below zero"):
        pyforge.compile(model, target="cpu")


def test_pool_seed10509_empty_output():
    attrs = dict(auto_pad="SAME_LOWER", ceil_mode=1, dilations=[2], kernel_shape=[3], strides=[2])
    model = _pool_model("MaxPool", (1, 4, 1), **attrs)
    x = np.random.default_rng(0).uniform(-2, 2, (1, 4, 1)).astype(np.float32)
    compiled, _ = check_against_ort(model, {"x": x})
    assert compiled.predict(x).shape == (1, 4, 0)


@pytest.mark.parametrize(
    "start,limit,delta,dtype",
    [
        (0.7, 1.7, 0.5, np.float32),  # seed 2554: float32 limit - start rounds to 1.0 exactly
        (0.8, -1.2, -1.0, np.float32),
        (-2.9, -0.4, 0.5, np.float32),
        (0.3, 10.3, 2.0, np.float64),
        (3, 9, 3, np.int64),
        (10, 4, -2, np.int32),
    ],
)
def test_range_length(start, limit, delta, dtype):
    """ceil((limit - start) / delta) elements, reckoned on the values (as ORT and onnx.reference)."""
    inits = [
        numpy_helper.from_array(np.array(v, dtype), name)
        for v, name in ((start, "s"), (limit, "l"), (delta, "d"))
    ]
    node = helper.make_node("Range", ["s", "l", "d"], ["y"], name="range")
    model = make_model([node], [], [("y", dtype, None)], inits, 18)
    # one run-time input keeps the plan from being all constants
    add = helper.make_node("Add", ["y", "z"], ["out"], name="add")
    model.graph.node.append(add)
    model.graph.input.append(
        helper.make_tensor_value_info("z", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), [1])
    )
    model.graph.output[0].name = "out"
    z = np.array([1], dtype)
    want = run_reference(model, {"z": z})["out"]
    compiled, _ = check_against_ort(model, {"z": z})
    assert compiled.predict(z).shape == want.shape


def test_range_zero_delta_refused():
    inits = [
        numpy_helper.from_array(np.array(v, np.float32), name)
        for v, name in ((0.5, "s"), (2.0, "l"), (0.0, "d"))
    ]
    node = helper.make_node("Range", ["s", "l", "d"], ["y"], name="range0")
    model = make_model([node], [], [("y", np.float32, None)], inits, 18)
    with pytest.raises(pyforge.errors.ShapeError, match="range0.*delta is 0"):
        pyforge.compile(model, target="cpu")


# seeds 21938, 22175, 24064, 24896 (the 10,000-graph run at ced6ebf): a SAME-padded
# ConvTranspose whose kernel is smaller than its stride; the spec's in·stride would need negative
# pads, ORT keeps the unpadded size (onnx.reference fails on these)
@pytest.mark.parametrize(
    "shape, wshape, attrs",
    [
        ((1, 2, 3), (2, 2, 1), dict(auto_pad="SAME_LOWER", strides=[2], output_padding=[0])),
        ((5, 4, 5), (4, 1, 1), dict(auto_pad="SAME_LOWER", strides=[2], group=4)),
        ((1, 1, 2, 2), (1, 2, 3, 1), dict(auto_pad="SAME_UPPER", strides=[2, 2])),
        ((4, 3, 3), (3, 2, 3), dict(auto_pad="SAME_UPPER", strides=[2])),
    ],
)
def test_conv_transpose_same_kernel_below_stride(shape, wshape, attrs):
    rng = np.random.default_rng(24896)
    w = numpy_helper.from_array(rng.uniform(-1, 1, wshape).astype(np.float32), "w")
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="convt", **attrs)
    model = make_model([node], [("x", np.float32, shape)], [("y", np.float32, None)], [w], 18)
    x = rng.uniform(-2, 2, shape).astype(np.float32)
    check_against_ort(model, {"x": x})


# seed 33533 (the 10,000-graph run at daa71f8): AveragePool(count_include_pad=1) over an input
# shorter than its kernel; ORT keeps one window (C's rounding) and divides it by the kernel size
@pytest.mark.parametrize(
    "shape, attrs",
    [
        ((3, 4, 1), dict(count_include_pad=1, kernel_shape=[2], strides=[2])),
        ((1, 2, 1, 3), dict(count_include_pad=1, kernel_shape=[2, 2], strides=[2, 2])),
        ((1, 2, 3, 3), dict(count_include_pad=1, kernel_shape=[2, 2], pads=[1, 0, 0, 1])),
        ((1, 2, 5, 4), dict(count_include_pad=1, kernel_shape=[3, 2], strides=[2, 2], ceil_mode=1)),
        ((3, 4, 1), dict(count_include_pad=0, kernel_shape=[2], strides=[2])),
    ],
)
def test_average_pool_include_pad_input_below_kernel(shape, attrs):
    model = _pool_model("AveragePool", shape, **attrs)
    x = np.random.default_rng(33533).uniform(-2, 2, shape).astype(np.float32)
    check_against_ort(model, {"x": x})
    check_against_ort(model, {"x": x}, fusion=False)
