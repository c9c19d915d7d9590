"""ConvInteger, QLinearConv, LpNormalization and CumProd (expansions) against ORT."""

import numpy as np
import onnx.reference
import pytest
from onnx import helper, numpy_helper

import pyforge
from pyforge.errors import BadAttributeError, UnsupportedOperatorError
from tests.helpers import check_against_ort, make_model

U8, S8 = np.uint8, np.int8


def _ints(rng, dtype, shape, lo=None, hi=None):
    info = np.iinfo(dtype)
    return rng.integers(info.min if lo is None else lo, (info.max if hi is None else hi) + 1, shape)


def _conv_integer(xt, wt, cin, cout, k, xz, wz, w_const, w_range=(None, None), **attrs):
    rng = np.random.default_rng(7)
    x = _ints(rng, xt, (2, cin, 7, 6)).astype(xt)
    w = _ints(rng, wt, (cout, cin // attrs.get("group", 1), k, k), *w_range).astype(wt)
    inputs, feeds, inits = [("x", xt, list(x.shape))], {"x": x}, []
    if w_const:
        inits.append(numpy_helper.from_array(w, "w"))
    else:
        inputs.append(("w", wt, list(w.shape)))
        feeds["w"] = w
    names = ["x", "w", "" if xz is None else "xz", "" if wz is None else "wz"]
    for name, z, t in (("xz", xz, xt), ("wz", wz, wt)):
        if z is not None:
            inits.append(numpy_helper.from_array(np.array(z, t), name))
    node = helper.make_node("ConvInteger", names, ["y"], name="ci", kernel_shape=[k, k], **attrs)
    model = make_model([node], inputs, [("y", np.int32, None)], inits, opset=10)
    return model, feeds


# (x, w types, in and out channels, kernel size, x and w zero points, w constant, attributes)
CONV_INTEGER_CASES = {
    "u8u8_zero_points_pad": (U8, U8, 3, 4, 3, 128, 100, True, dict(pads=[1] * 4)),
    "u8s8_grouped_stride": (U8, S8, 4, 4, 3, 7, None, True, dict(group=2, strides=[2, 2])),
    "s8s8_runtime_w_dilated": (S8, S8, 2, 3, 2, -5, 3, False, dict(dilations=[2, 2])),
    "u8s8_same_upper": (U8, S8, 3, 2, 3, 0, None, True, dict(auto_pad="SAME_UPPER")),
    # K * 255 * 255 >= 2**24: float32 cannot hold the sums, so w (then x too) is split
    "k576_w_split": (U8, U8, 64, 8, 3, 0, 0, True, dict(pads=[1] * 4)),
    "k2700_runtime_w_both_split": (U8, U8, 300, 2, 3, 0, 0, False, dict(pads=[1, 0, 1, 0])),
}


@pytest.mark.parametrize("case", sorted(CONV_INTEGER_CASES))
def test_conv_integer_matches_ort_exactly(case):
    *args, attrs = CONV_INTEGER_CASES[case]
    check_against_ort(*_conv_integer(*args, **attrs), rtol=0, atol=0)


def test_conv_integer_per_channel_w_zero_point_matches_the_reference():
    """ONNX allows a zero point per output channel; ORT's ConvInteger refuses it, so
    onnx.reference is the check."""
    model, feeds = _conv_integer(
        np.uint8, np.uint8, 3, 3, 1, None, [1, 200, 31], True, pads=[1] * 4
    )
    want = onnx.reference.ReferenceEvaluator(model).run(None, feeds)[0]
    np.testing.assert_array_equal(pyforge.compile(model, target="cpu").predict(feeds), want)


def _qlinear_conv(xt, wt, yt, cin, cout, per_channel, bias, w_range=(None, None), **attrs):
    rng = np.random.default_rng(8)
    m = cout if per_channel else 1
    w = _ints(rng, wt, (cout, cin // attrs.get("group", 1), 3, 3), *w_range).astype(wt)
    consts = {
        "xs": np.array(0.02, np.float32),
        "xz": np.array(np.iinfo(xt).max // 2 - 3, xt),
        "w": w,
        "ws": rng.uniform(0.005, 0.02, m).astype(np.float32) if per_channel else np.float32(0.01),
        "wz": np.zeros(m, wt) if per_channel else np.array(0 if wt == np.int8 else 120, wt),
        "ys": np.array(0.3, np.float32),
        "yz": np.array(10 if yt == np.uint8 else -4, yt),
    }
    if bias:
        consts["b"] = rng.integers(-2000, 2000, cout).astype(np.int32)
    inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in consts.items()]
    names = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"] + (["b"] if bias else [])
    node = helper.make_node("QLinearConv", names, ["y"], name="qc", kernel_shape=[3, 3], **attrs)
    x = _ints(rng, xt, (1, cin, 6, 6)).astype(xt)
    model = make_model([node], [("x", xt, list(x.shape))], [("y", yt, None)], inits, opset=10)
    return model, {"x": x}


# (x, w, y types, in and out channels, per-channel w scale, bias, attributes). Weights of u8s8
# cases are 7-bit: ORT's u8s8 AVX2 kernel saturates pairs of products in int16 beyond that
# (the full-range case is checked against onnx.reference below)
W7 = (-64, 63)
QLINEAR_CASES = {
    "u8u8_per_tensor_bias_pad": (U8, U8, U8, 3, 4, False, True, dict(pads=[1] * 4)),
    "u8s8_per_channel_grouped": (U8, S8, U8, 4, 4, True, True, dict(group=2, w_range=W7)),
    "s8s8_to_s8_dilated": (S8, S8, S8, 2, 3, True, False, dict(dilations=[2, 2], pads=[2] * 4)),
    "u8s8_k576_per_channel": (U8, S8, U8, 64, 8, True, True, dict(w_range=W7, pads=[1] * 4)),
}


@pytest.mark.parametrize("case", sorted(QLINEAR_CASES))
def test_qlinear_conv_matches_ort_exactly(case):
    *args, attrs = QLINEAR_CASES[case]
    check_against_ort(*_qlinear_conv(*args, **attrs), rtol=0, atol=0)


def test_qlinear_conv_full_range_weights_match_the_exact_reference():
    """Where ORT's int16 saturation shows (full-range int8 weights, 576 terms), pyforge gives the
    exact int32 sum: onnx.reference's result, not ORT's."""
    model, feeds = _qlinear_conv(np.uint8, np.int8, np.uint8, 64, 8, True, True, pads=[1] * 4)
    want = onnx.reference.ReferenceEvaluator(model).run(None, feeds)[0]
    np.testing.assert_array_equal(pyforge.compile(model, target="cpu").predict(feeds), want)


@pytest.mark.parametrize("p, axis", [(1, -1), (2, -1), (2, 0), (1, 1)])
def test_lp_normalization_matches_ort(p, axis):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    x[1, :, 2], x[0, 1, :] = 0, 0  # zero norms along either axis: ORT gives 0
    node = helper.make_node("LpNormalization", ["x"], ["y"], name="lp", p=p, axis=axis)
    model = make_model([node], [("x", np.float32, [3, 4, 5])], [("y", np.float32, None)])
    check_against_ort(model, {"x": x})


def _cum_prod(axis, exclusive, reverse, dtype=np.float32, shape=(3, 7, 2)):
    rng = np.random.default_rng(10)
    if np.dtype(dtype).kind == "f":  # magnitudes near 1, both signs: the products stay finite
        x = rng.uniform(0.5, 1.5, shape) * rng.choice([-1, 1], shape)
    else:
        x = rng.integers(-3, 4, shape)
    node = helper.make_node(
        "CumProd", ["x", "a"], ["y"], name="cp", exclusive=exclusive, reverse=reverse
    )
    axis_init = numpy_helper.from_array(np.array(axis, np.int64), "a")
    model = make_model(
        [node], [("x", dtype, list(shape))], [("y", dtype, None)], [axis_init], opset=26
    )
    return model, {"x": x.astype(dtype)}


@pytest.mark.parametrize(
    "axis, exclusive, reverse, dtype",
    [
        (1, 0, 0, np.float32),
        (1, 1, 0, np.float32),
        (1, 0, 1, np.float32),
        (1, 1, 1, np.float32),
        (-1, 0, 0, np.float32),
        (0, 1, 1, np.float32),
        (1, 0, 0, np.int32),
        (1, 1, 1, np.int64),
    ],
)
def test_cum_prod_matches_ort(axis, exclusive, reverse, dtype):
    check_against_ort(*_cum_prod(axis, exclusive, reverse, dtype))


def test_cum_prod_with_a_run_time_axis_runs_in_stages():
    model, feeds = _cum_prod(1, 1, 0)
    model.graph.initializer.pop()
    model.graph.input.append(helper.make_tensor_value_info("a", onnx.TensorProto.INT64, []))
    check_against_ort(model, {**feeds, "a": np.array(-2, np.int64)})


def test_expansions_refuse_bad_models():
    with pytest.raises(BadAttributeError, match="cp.*axis 3 out of range"):
        pyforge.compile(_cum_prod(3, 0, 0)[0], target="cpu")
    node = helper.make_node("LpNormalization", ["x"], ["y"], name="lp", p=3)
    model = make_model([node], [("x", np.float32, [2, 3])], [("y", np.float32, None)])
    with pytest.raises(UnsupportedOperatorError, match="lp.*p=3"):
        pyforge.compile(model, target="cpu")
    model, _ = _conv_integer(np.uint8, np.uint8, 3, 2, 3, None, None, True)
    model.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.INT16
    with pytest.raises(UnsupportedOperatorError, match="ci.*int16"):
        pyforge.compile(model, target="cpu")
