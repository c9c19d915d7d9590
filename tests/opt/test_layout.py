"""The NHWC layout pass (the cuda default), checked on the cpu target against ONNX Runtime."""

import numpy as np
import pytest
from onnx import helper

from pyforge.models import cached_model, random_inputs
from tests.frontend.test_ops import CONV_CASES, POOL_CASES, one_op, rand
from tests.helpers import check_against_ort, make_model


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv_nhwc(case):
    attrs = CONV_CASES[case]
    g = attrs.get("group", 1)
    cout = 4 if g == 4 else 6
    model, feeds = one_op(
        "Conv",
        [rand(2, 4, 9, 9)],
        None,
        attrs,
        consts=[rand(cout, 4 // g, *attrs["kernel_shape"]), rand(cout)],
    )
    check_against_ort(model, feeds, layout="nhwc")


@pytest.mark.parametrize("case", sorted(POOL_CASES))
def test_pool_nhwc(case):
    op, attrs = POOL_CASES[case]
    model, feeds = one_op(op, [rand(2, 3, 9, 9)], None, attrs)
    check_against_ort(model, feeds, layout="nhwc")


def test_residual_block_nhwc_keeps_nchw_consumers():
    """conv -> relu feeds both a conv (stays NHWC) and a Softmax (needs NCHW back)."""
    w1, w2 = rand(4, 3, 3, 3), rand(4, 4, 1, 1)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1], name="c1"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w2"], ["b"], strides=[2, 2], name="c2"),
        helper.make_node("Softmax", ["r"], ["s"], axis=1, name="sm"),
        helper.make_node("GlobalAveragePool", ["b"], ["g"], name="gap"),
    ]
    from onnx import numpy_helper

    model = make_model(
        nodes,
        [("x", np.float32, [1, 3, 8, 8])],
        [("s", np.float32, [1, 4, 8, 8]), ("g", np.float32, [1, 4, 1, 1])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    compiled, _ = check_against_ort(model, {"x": rand(1, 3, 8, 8)}, layout="nhwc")
    assert any(
        n.op == "ConvNHWC"
        for g in compiled.details["graph"].nodes
        for n in (g.group.members if g.group else [])
    )


@pytest.mark.parametrize("fusion", [True, False])
def test_resnet50_nhwc(fusion):
    path = cached_model("resnet50")
    check_against_ort(path, random_inputs(path, seed=2), layout="nhwc", fusion=fusion)
