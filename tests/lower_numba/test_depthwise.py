"""Depthwise and grouped convolutions (templates/depthwise.py) against ONNX Runtime: kernel sizes,
strides, pads, dilations, group widths (unrolled taps and the looped form), each fused epilogue,
both layouts, fusion on and off."""

import os

import numpy as np
import pytest
from onnx import helper, numpy_helper

import pyforge
from tests.helpers import check_against_ort, make_model, run_in_simulator

rng = np.random.default_rng(17)
INSIDE = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"  # the simulator subprocess
outside = pytest.mark.skipif(INSIDE, reason="cpu case: not rerun in the simulator")

# an activation after Conv + bias, as the exporters write it: (nodes on "y", output name)
EPILOGUES = {
    "bias": lambda: ([], "y"),
    "relu6": lambda: ([helper.make_node("Clip", ["y", "lo", "hi"], ["z"])], "z"),
    "hardswish": lambda: ([helper.make_node("HardSwish", ["y"], ["z"])], "z"),
    "sigmoid": lambda: ([helper.make_node("Sigmoid", ["y"], ["z"])], "z"),
    "silu": lambda: (
        [helper.make_node("Sigmoid", ["y"], ["s"]), helper.make_node("Mul", ["y", "s"], ["z"])],
        "z",
    ),
}


def _model(shape, cout, group, epilogue="bias", bias=True, **attrs):
    cin, k = shape[1], attrs["kernel_shape"]
    w = rng.standard_normal((cout, cin // group, *k)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")]
    inits += [numpy_helper.from_array(np.float32(v), n) for v, n in ((0.0, "lo"), (6.0, "hi"))]
    ins = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "b"))
        ins.append("b")
    conv = helper.make_node("Conv", ins, ["y"], name="dwconv", group=group, **attrs)
    tail, out = EPILOGUES[epilogue]()
    model = make_model(
        [conv, *tail], [("x", np.float32, list(shape))], [(out, np.float32, None)], inits
    )
    x = (2.0 * rng.standard_normal(shape)).astype(np.float32)
    return model, {"x": x}


GEOMETRY = [
    # (input shape, cout, group, attrs): depthwise first, then multipliers and wider groups
    ((1, 8, 12, 12), 8, 8, dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
    ((2, 8, 13, 11), 8, 8, dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((1, 6, 14, 14), 6, 6, dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1])),
    ((1, 4, 9, 9), 4, 4, dict(kernel_shape=[1, 1])),
    ((1, 4, 15, 17), 4, 4, dict(kernel_shape=[5, 5], pads=[2, 2, 2, 2])),
    ((1, 4, 16, 16), 4, 4, dict(kernel_shape=[5, 5], strides=[2, 2], pads=[1, 2, 2, 1])),
    ((1, 3, 17, 19), 3, 3, dict(kernel_shape=[5, 4], strides=[3, 3], pads=[2, 4, 1, 3])),
    ((1, 3, 16, 16), 3, 3, dict(kernel_shape=[7, 7], pads=[3, 3, 3, 3])),
    ((1, 4, 12, 12), 4, 4, dict(kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 2, 2, 2])),
    ((1, 4, 12, 10), 4, 4, dict(kernel_shape=[3, 5], dilations=[1, 2], pads=[0, 3, 1, 1])),
    ((1, 4, 10, 10), 8, 4, dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),  # multiplier 2
    ((1, 8, 10, 10), 8, 4, dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),  # 2 channels a group
    ((1, 16, 9, 9), 8, 4, dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((1, 32, 8, 8), 32, 2, dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),  # 144 taps: looped
    ((2, 6, 20), 6, 6, dict(kernel_shape=[5], pads=[2, 2])),  # 1-d
    ((1, 4, 30), 8, 2, dict(kernel_shape=[3], strides=[2], dilations=[2], pads=[1, 3])),
]


@outside
@pytest.mark.parametrize("case", range(len(GEOMETRY)))
def test_geometry_against_ort(case):
    shape, cout, group, attrs = GEOMETRY[case]
    model, feeds = _model(shape, cout, group, "relu6", **attrs)
    check_against_ort(model, feeds)


@outside
@pytest.mark.parametrize("epilogue", sorted(EPILOGUES))
@pytest.mark.parametrize("fusion", [True, False])
def test_epilogues_against_ort(epilogue, fusion):
    model, feeds = _model(
        (1, 16, 14, 14), 16, 16, epilogue, kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4
    )
    check_against_ort(model, feeds, fusion=fusion)


@outside
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_inverted_residual_both_layouts(layout):
    """1x1 expand, depthwise 3x3 + Relu6, 1x1 project: the dense convs around it in each layout."""
    c, e = 8, 24
    w1 = rng.standard_normal((e, c, 1, 1)).astype(np.float32)
    wd = rng.standard_normal((e, 1, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((c, e, 1, 1)).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (wd, "wd"), (w2, "w2"))]
    inits += [numpy_helper.from_array(np.float32(v), n) for v, n in ((0.0, "lo"), (6.0, "hi"))]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], kernel_shape=[1, 1]),
        helper.make_node("Clip", ["a", "lo", "hi"], ["ar"]),
        helper.make_node("Conv", ["ar", "wd"], ["d"], kernel_shape=[3, 3], pads=[1] * 4, group=e),
        helper.make_node("Clip", ["d", "lo", "hi"], ["dr"]),
        helper.make_node("Conv", ["dr", "w2"], ["p"], kernel_shape=[1, 1]),
        helper.make_node("Add", ["p", "x"], ["y"]),
    ]
    model = make_model(nodes, [("x", np.float32, [1, c, 10, 10])], [("y", np.float32, None)], inits)
    feeds = {"x": rng.standard_normal((1, c, 10, 10)).astype(np.float32)}
    check_against_ort(model, feeds, layout=layout)


@outside
def test_no_bias_and_nan_propagate():
    model, feeds = _model((1, 4, 8, 8), 4, 4, bias=False, kernel_shape=[3, 3], pads=[1] * 4)
    feeds["x"][0, 1, 3, 3] = np.nan
    got = pyforge.compile(model, target="cpu").predict(feeds)
    # a NaN reaches exactly its 3x3 neighbourhood of channel 1, nothing else
    assert np.isnan(got[0, 1, 2:5, 2:5]).all()
    assert np.isnan(got).sum() == 9


@outside
def test_3d_grouped_conv_matches_ort():
    # once refused by name; a 3-d Conv with constant weights now runs as 2-d convs per depth
    # tap (frontend/expansions/conv3d.py), groups kept
    model, feeds = _model((1, 4, 4, 4, 4), 4, 4, kernel_shape=[3, 3, 3], pads=[1] * 6)
    check_against_ort(model, feeds)


@outside
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_cuda_kernels_compile_to_ptx(precision, tmp_path):
    """The cuda form types as the GPU would (sm_90 PTX), without float16 arithmetic under fp16."""
    from tests.lower_numba.test_ptx import _kernels, _ptx_available, _ptx_of

    if not _ptx_available():
        pytest.skip("no numba-cuda with NVVM/NVRTC ([cuda] extra) to compile PTX")
    from pyforge.compiler import compile_to_plan

    model, _ = _model((1, 8, 9, 9), 16, 4, "hardswish", kernel_shape=[3, 3], pads=[1] * 4)
    plan, _ = compile_to_plan(model, specialize=True, layout="nhwc", precision=precision)
    steps = [s for s in _kernels(plan) if "Conv" in s.label]
    assert steps
    for step in steps:
        assert "__half" not in _ptx_of(plan, step, tmp_path), step.label


@pytest.mark.sim
@outside
def test_cuda_form_in_simulator():
    run_in_simulator(__file__, timeout=900)


SIM_CASES = [GEOMETRY[i] for i in (1, 9, 11, 14)]  # stride 2, multiplier 2, 4 per group, 1-d


@pytest.mark.skipif(not INSIDE, reason="runs inside the simulator subprocess")
@pytest.mark.parametrize("case", range(len(SIM_CASES)))
def test_cuda_form_against_ort(case):
    shape, cout, group, attrs = SIM_CASES[case]
    model, feeds = _model(shape, cout, group, "silu", **attrs)
    check_against_ort(model, feeds, target="cuda")
