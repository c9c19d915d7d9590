"""RoiAlign and GridSample (their kernels and their numpy references) against ORT."""

import numpy as np
import pytest
from onnx import helper, numpy_helper

import pyforge
from pyforge.errors import BadAttributeError, ShapeError, UnsupportedOperatorError
from tests.helpers import check_against_ort, make_model

X_SHAPE = (2, 3, 10, 9)


def _boxes(rng, n: int) -> np.ndarray:
    """Boxes partly outside the 9 x 10 image (at scale 0.5: coordinates up to 22), x0 < x1."""
    corners = rng.uniform(-4, 22, (n, 2, 2))
    return np.concatenate([corners.min(1), corners.max(1)], 1).astype(np.float32)


def _roi_model(opset, folded=False, **attrs):
    node = helper.make_node("RoiAlign", ["x", "r", "b"], ["a"], name="roi", **attrs)
    add = helper.make_node("Add", ["a", "z"], ["y"], name="add")
    rng = np.random.default_rng(5)
    feeds = {
        "x": rng.standard_normal(X_SHAPE).astype(np.float32),
        "r": _boxes(rng, 5),
        "b": rng.integers(0, 2, 5),
        "z": rng.standard_normal((5, 3, 1, 1)).astype(np.float32),
    }
    types = {"x": (np.float32, X_SHAPE), "r": (np.float32, (5, 4)), "b": (np.int64, (5,))}
    types["z"] = (np.float32, (5, 3, 1, 1))
    consts = ("x", "r", "b") if folded else ()
    inits = [numpy_helper.from_array(feeds.pop(n), n) for n in consts]
    inputs = [(n, dt, list(s)) for n, (dt, s) in types.items() if n not in consts]
    return make_model([node, add], inputs, [("y", np.float32, None)], inits, opset), feeds


ROI_CASES = {
    "avg_half_pixel_adaptive": (16, dict()),
    "max_half_pixel_adaptive": (16, dict(mode="max")),
    "avg_output_half_pixel_ratio2": (
        16,
        dict(coordinate_transformation_mode="output_half_pixel", sampling_ratio=2),
    ),
    "max_half_pixel_ratio1_4x3": (
        16,
        dict(mode="max", sampling_ratio=1, output_height=4, output_width=3),
    ),
    "opset10_avg_scale": (10, dict(spatial_scale=0.5, output_height=3, output_width=2)),
    "opset10_max_ratio3": (10, dict(mode="max", sampling_ratio=3, spatial_scale=0.5)),
}


@pytest.mark.parametrize("case", sorted(ROI_CASES))
@pytest.mark.parametrize("folded", [False, True])
def test_roi_align_matches_ort(case, folded):
    opset, attrs = ROI_CASES[case]
    attrs = {"spatial_scale": 0.5, **attrs} if opset >= 16 else attrs
    check_against_ort(*_roi_model(opset, folded, **attrs))


def _grid_model(mode, padding, align, opset, x_shape=(2, 3, 5, 6), out=(4, 3), folded=False):
    node = helper.make_node(
        "GridSample",
        ["x", "g"],
        ["s"],
        name="gs",
        mode=mode,
        padding_mode=padding,
        align_corners=align,
    )
    g_shape = [x_shape[0], *out, len(x_shape) - 2]
    rng = np.random.default_rng(6)
    y_shape = [*x_shape[:2], *out]
    feeds = {
        "x": rng.standard_normal(x_shape).astype(np.float32),
        "g": rng.uniform(-1.4, 1.4, g_shape).astype(np.float32),  # a quarter of points outside
        "z": rng.standard_normal(y_shape).astype(np.float32),
    }
    inits = [numpy_helper.from_array(feeds.pop(n), n) for n in ("x", "g")] if folded else []
    inputs = [] if folded else [("x", np.float32, list(x_shape)), ("g", np.float32, g_shape)]
    nodes = [node, helper.make_node("Add", ["s", "z"], ["y"], name="add")]
    inputs.append(("z", np.float32, y_shape))
    return make_model(nodes, inputs, [("y", np.float32, y_shape)], inits, opset), feeds


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_matches_ort(mode, padding, align):
    check_against_ort(*_grid_model(mode, padding, align, 16))


@pytest.mark.parametrize(
    "mode, padding, align, x_shape, out",
    [
        ("cubic", "border", 0, (1, 2, 4, 7), (3, 5)),
        ("linear", "reflection", 1, (1, 2, 3, 4, 5), (2, 3, 4)),
        ("nearest", "zeros", 0, (2, 1, 3, 4, 5), (2, 2, 3)),
        ("linear", "border", 0, (1, 2, 4, 3, 2), (3, 1, 2)),
    ],
)
@pytest.mark.parametrize("folded", [False, True])
def test_grid_sample_opset20_matches_ort(mode, padding, align, x_shape, out, folded):
    check_against_ort(*_grid_model(mode, padding, align, 20, x_shape, out, folded))


def test_sample_ops_refuse_bad_models():
    with pytest.raises(BadAttributeError, match="roi.*mode 'mean'"):
        pyforge.compile(_roi_model(16, mode="mean")[0], target="cpu")
    with pytest.raises(ShapeError, match="gs.*grid must be"):
        node = helper.make_node("GridSample", ["x", "g"], ["y"], name="gs")
        inputs = [("x", np.float32, [1, 2, 4, 4]), ("g", np.float32, [1, 3, 3, 3])]
        pyforge.compile(make_model([node], inputs, [("y", np.float32, None)], opset=16))
    with pytest.raises(UnsupportedOperatorError, match="cubic mode on a volumetric"):
        pyforge.compile(_grid_model("cubic", "zeros", 0, 20, (1, 1, 2, 3, 4), (2, 2, 2))[0])


def test_roi_align_batch_index_out_of_range_is_an_error():
    model, feeds = _roi_model(16)
    feeds["b"] = np.array([0, 1, 2, 0, 1], np.int64)
    with pytest.raises(pyforge.errors.IndexRangeError, match="batch_indices"):
        pyforge.compile(model, target="cpu").predict(feeds)


@pytest.mark.parametrize(
    "make",
    [
        lambda: _roi_model(16, mode="max", spatial_scale=0.5),
        lambda: _roi_model(10),
        lambda: _grid_model("bicubic", "reflection", 0, 16),
        lambda: _grid_model("nearest", "border", 1, 20, (1, 2, 3, 4, 5), (2, 3, 4)),
        lambda: _grid_model("linear", "zeros", 0, 20),
    ],
)
def test_cuda_kernels_compile_to_ptx(make, tmp_path):
    """The kernels typed as the GPU types them (sm_90 PTX), which the simulator does not do."""
    from pyforge.compiler import compile_to_plan
    from tests.lower_numba.test_ptx import _kernels, _ptx_available, _ptx_of

    if not _ptx_available():
        pytest.skip("no NVVM/NVRTC to compile PTX")
    plan, _ = compile_to_plan(make()[0], specialize=True)
    for step in _kernels(plan):
        assert _ptx_of(plan, step, tmp_path), step.label


@pytest.mark.parametrize(
    "make",
    [lambda: _roi_model(16, mode="max"), lambda: _grid_model("bilinear", "border", 0, 16)],
)
def test_unfused_matches_ort(make):
    check_against_ort(*make(), fusion=False)
