"""conv="implicit": each channels-last conv group that needs im2col is one implicit-GEMM kernel.

The cuda kernel runs in Numba's CUDA simulator (re-run of this file in a subprocess with
NUMBA_ENABLE_CUDASIM=1, as in test_cuda_sim); the cpu source of the same step runs in-process.
"""

import os

import numpy as np
import pytest
from onnx import helper, numpy_helper

from pyforge.exec.steps import GemmStep
from tests.frontend.test_ops import rand
from tests.helpers import check_against_ort, make_model, run_in_simulator

INSIDE = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
TARGET = "cuda" if INSIDE else "cpu"


def _conv_model(attrs, cin=4, cout=8, size=6, residual=False, relu=True):
    """Conv (with bias) [+ Add(x)] [+ Relu]: the shapes of a ResNet block, tiny."""
    k = attrs["kernel_shape"]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", **attrs)]
    last = "c"
    if residual:
        nodes.append(helper.make_node("Add", [last, "x"], ["s"], name="add"))
        last = "s"
    if relu:
        nodes.append(helper.make_node("Relu", [last], ["r"], name="relu"))
        last = "r"
    nodes.append(helper.make_node("Identity", [last], ["y"], name="out"))
    inits = [
        numpy_helper.from_array(rand(cout, cin, *k), "w"),
        numpy_helper.from_array(rand(cout), "b"),
    ]
    model = make_model(nodes, [("x", np.float32, [1, cin, size, size])], [("y", np.float32, None)])
    model.graph.initializer.extend(inits)
    return model, {"x": rand(1, cin, size, size)}


CASES = {
    "3x3_pad1_relu": (dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), {}, None),
    "3x3_stride2": (dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]), {}, None),
    "7x7_stride2_stem": (
        dict(kernel_shape=[7, 7], pads=[3, 3, 3, 3], strides=[2, 2]),
        dict(cin=3, size=8),
        None,
    ),
    "1x1_stride2": (dict(kernel_shape=[1, 1], strides=[2, 2]), {}, None),
    "5x5_asym_pads": (dict(kernel_shape=[5, 5], strides=[2, 2], pads=[2, 1, 2, 1]), {}, None),
    "dilated": (dict(kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 2, 2, 2]), {}, None),
    "residual_relu": (
        dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        dict(cin=8, cout=8, residual=True),
        None,
    ),
    "bias_only": (dict(kernel_shape=[3, 3]), dict(relu=False), None),
    # C % BK == 0: the chunk-per-tap path; split K: partial tiles summed by the last block
    "channels16_split3": (
        dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        dict(cin=16, cout=8),
        "32x32x16/4x4/s3",
    ),
    "tile64_256threads": (
        dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        dict(cin=16, cout=8, residual=False),
        "64x64x16/4x4",
    ),
    "tile_partial_n": (dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), dict(cout=40), "32x32x8/2x2"),
}


@pytest.mark.sim
@pytest.mark.skipif(INSIDE, reason="this is the launcher")
def test_implicit_conv_in_simulator():
    run_in_simulator(__file__, timeout=900)


@pytest.mark.parametrize("fusion", [True, False])
@pytest.mark.parametrize("case", sorted(CASES))
def test_implicit_conv_matches_ort(case, fusion):
    attrs, kw, tile = CASES[case]
    model, feeds = _conv_model(attrs, **kw)
    compiled, _ = check_against_ort(
        model, feeds, target=TARGET, fusion=fusion, layout="nhwc", conv="implicit", conv_tile=tile
    )
    convs = [s for s in compiled.plan.steps if "implicit" in s.label]
    assert len(convs) == 1 and convs[0].launch is not None
    assert not any(isinstance(s, GemmStep) for s in compiled.plan.steps)
    if fusion:  # bias, residual and Relu run inside the conv kernel
        assert compiled.stats["launches"] == 3  # to NHWC, conv, to NCHW


@pytest.mark.skipif(INSIDE, reason="cpu only")
def test_launch_shape_survives_save_and_load(tmp_path):
    import pyforge

    model, feeds = _conv_model(dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), cin=16)
    compiled = pyforge.compile(
        model, target="cpu", layout="nhwc", conv="implicit", conv_tile="32x32x16/4x4/s3"
    )
    compiled.save(tmp_path)
    loaded = pyforge.load(tmp_path, target="cpu")
    conv = [s for s in loaded.plan.steps if getattr(s, "launch", None)]
    assert conv and conv[0].launch == ((2, 1, 3), 64)
    np.testing.assert_array_equal(loaded.predict(feeds), compiled.predict(feeds))


@pytest.mark.skipif(INSIDE, reason="cpu only")
def test_conv_option_default_and_refusal():
    import pyforge

    model, _ = _conv_model(dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
    plain = pyforge.compile(model, target="cpu", layout="nhwc")
    assert any(isinstance(s, GemmStep) and s.prologue for s in plain.plan.steps)
    with pytest.raises(ValueError, match="conv="):
        pyforge.compile(model, target="cpu", conv="winograd")
