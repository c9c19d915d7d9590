"""Resize in every coordinate_transformation_mode x nearest_mode x mode against onnx.reference,
compiled and constant-folded; one model holds every combination."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import pyforge
from tests.helpers import check_against_ort, make_model, run_ort

F32 = np.float32
COORDS = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners"]
COORDS += ["asymmetric", "tf_crop_and_resize"]
NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
X_SHAPE = [1, 2, 4, 5]
# H up (4 -> 7), W down (5 -> 3): both directions in every node, by sizes and by scales
SIZES = np.array([1, 2, 7, 3], np.int64)
SCALES = np.array([1, 1, 1.7, 0.45], F32)  # 6.8 and 2.25 wide: not whole
ROI = np.array([0, 0, 0.1, 0.2, 1, 1, 0.8, 0.9], F32)


def _cases():
    for coord in COORDS:
        for nearest in NEAREST:
            yield {
                "mode": "nearest",
                "coordinate_transformation_mode": coord,
                "nearest_mode": nearest,
            }
        for mode in ("linear", "cubic"):
            yield {"mode": mode, "coordinate_transformation_mode": coord}


CASES = list(_cases())


def _model(x: np.ndarray, by: str, folded: bool):
    inits = [
        numpy_helper.from_array(ROI, "roi"),
        numpy_helper.from_array(np.array([], F32), "none"),
        numpy_helper.from_array(SIZES if by == "sizes" else SCALES, "geom"),
    ]
    if folded:
        inits.append(numpy_helper.from_array(x, "x"))
    ins = ["x", "roi", "none", "geom"] if by == "sizes" else ["x", "roi", "geom"]
    nodes = [
        helper.make_node("Resize", ins, [f"y{k}"], extrapolation_value=-3.5, **attrs)
        for k, attrs in enumerate(CASES)
    ]
    nodes.append(helper.make_node("Neg", ["z"], ["zn"]))  # a run-time input when all folds
    outs = [(f"y{k}", F32, None) for k in range(len(CASES))] + [("zn", F32, [1])]
    inputs = ([] if folded else [("x", F32, X_SHAPE)]) + [("z", F32, [1])]
    return make_model(nodes, inputs, outs, inits, opset=19)


@pytest.mark.parametrize(
    "by, folded", [("sizes", False), ("sizes", True), ("scales", True)], ids=["kernel", "f", "fs"]
)
def test_resize_modes_match_the_reference(by, folded):
    x = np.random.default_rng(7).standard_normal(X_SHAPE).astype(F32)
    model = _model(x, by, folded)
    feeds = {"z": np.array([1.0], F32), **({} if folded else {"x": x})}
    got = pyforge.compile(model, target="cpu").predict(feeds)
    want = ReferenceEvaluator(model).run(None, feeds)
    bad = []
    for k, attrs in enumerate(CASES):
        g, w = got[f"y{k}"], want[k]
        if g.shape != w.shape or not np.allclose(g, w, rtol=1e-4, atol=1e-5):
            bad.append(
                f"{attrs}: max error {np.max(np.abs(g - w)) if g.shape == w.shape else g.shape}"
            )
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_to_the_same_size_is_a_copy(mode):
    """A Resize whose sizes equal the input's has no axis to resize (it compiled to
    ``y += None * x`` for linear)."""
    sizes = numpy_helper.from_array(np.array(X_SHAPE, np.int64), "sizes")
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode=mode)
    model = make_model([node], [("x", F32, X_SHAPE)], [("y", F32, X_SHAPE)], [sizes], opset=19)
    x = np.random.default_rng(8).standard_normal(X_SHAPE).astype(F32)
    check_against_ort(model, {"x": x})


def test_nearest_near_an_exact_source_pixel_follows_the_reference():
    """10 -> 14 samples x = 10.5 / 1.4 - 0.5, 7.000000000000001 in float64, at output 10.
    onnx.reference places its window from x + 1 (= 8.0) and picks pixel 6 under floor and
    round_prefer_floor, 7 under ceil: pyforge follows it. ORT, in float32 (x = 7.0), picks 7
    under every mode: the ORT deviation is listed here and checked to still be there."""
    sizes = numpy_helper.from_array(np.array([14], np.int64), "sizes")
    nodes = []
    for coord in ("half_pixel", "pytorch_half_pixel", "half_pixel_symmetric"):
        for nearest in NEAREST:
            attrs = {"coordinate_transformation_mode": coord, "nearest_mode": nearest}
            nodes.append(
                helper.make_node("Resize", ["x", "", "", "sizes"], [f"y{len(nodes)}"], **attrs)
            )
    outs = [(f"y{k}", F32, [14]) for k in range(len(nodes))]
    model = make_model(nodes, [("x", F32, [10])], outs, [sizes], opset=19)
    feeds = {"x": np.arange(1, 11, dtype=F32)}
    got = pyforge.compile(model, target="cpu").predict(feeds)
    want = ReferenceEvaluator(model).run(None, feeds)
    ort = run_ort(model, feeds)
    for k in range(len(nodes)):
        np.testing.assert_array_equal(got[f"y{k}"], want[k], err_msg=f"y{k}")
    floor_like = [k for k in range(len(nodes)) if NEAREST[k % 4] in ("floor", "round_prefer_floor")]
    assert all(ort[k][10] == 8 and want[k][10] == 7 for k in floor_like)
