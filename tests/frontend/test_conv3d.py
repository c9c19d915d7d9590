"""3-d Conv (r3d_18 and mc3_18 in the corpus): computed as 2-d convs, one per depth tap."""

import numpy as np
import pytest
from onnx import helper, numpy_helper

import pyforge
from pyforge.errors import UnsupportedOperatorError
from tests.helpers import check_against_ort, make_model

CASES = {
    "plain": dict(kernel=(3, 3, 3), attrs=dict(pads=[1, 1, 1, 1, 1, 1])),
    "stem_stride": dict(kernel=(3, 5, 5), attrs=dict(pads=[1, 2, 2, 1, 2, 2], strides=[1, 2, 2])),
    "depth_stride_dilation": dict(
        kernel=(2, 3, 3),
        attrs=dict(pads=[0, 1, 0, 1, 1, 0], strides=[2, 1, 1], dilations=[2, 1, 2]),
    ),
    "grouped_no_bias": dict(kernel=(1, 3, 3), attrs=dict(group=2), bias=False),
    "pointwise": dict(kernel=(1, 1, 1), attrs=dict(strides=[2, 2, 2])),
}


def _model(kernel, attrs, bias=True, batch="batch"):
    rng = np.random.default_rng(3)
    cin, cout, group = 4, 6, attrs.get("group", 1)
    w = rng.standard_normal((cout, cin // group, *kernel)).astype(np.float32) * 0.2
    inits = [numpy_helper.from_array(w, "w")]
    ins = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "b"))
        ins.append("b")
    conv = helper.make_node("Conv", ins, ["c"], name="conv3d", **attrs)
    relu = helper.make_node("Relu", ["c"], ["y"], name="relu")
    model = make_model([conv, relu], [("x", np.float32, [batch, cin, 7, 9, 8])],
                       [("y", np.float32, None)], inits)  # fmt: skip
    return model, rng


@pytest.mark.parametrize("case", list(CASES))
def test_conv3d_matches_ort(case):
    model, rng = _model(**CASES[case])
    for n in (1, 3) if case == "stem_stride" else (2,):
        x = rng.standard_normal((n, 4, 7, 9, 8)).astype(np.float32)
        _, err = check_against_ort(model, {"x": x})
        assert err < 1e-4


def test_conv3d_with_runtime_weights_is_refused_naming_the_node():
    rng = np.random.default_rng(4)
    conv = helper.make_node("Conv", ["x", "w"], ["y"], name="conv3d_rt", pads=[1] * 6)
    model = make_model([conv], [("x", np.float32, [1, 2, 4, 5, 5]),
                                ("w", np.float32, [3, 2, 3, 3, 3])], [("y", np.float32, None)])  # fmt: skip
    with pytest.raises(UnsupportedOperatorError, match="conv3d_rt.*constant weights"):
        pyforge.compile(model, target="cpu").predict(
            {
                "x": rng.standard_normal((1, 2, 4, 5, 5)).astype(np.float32),
                "w": rng.standard_normal((3, 2, 3, 3, 3)).astype(np.float32),
            }
        )
