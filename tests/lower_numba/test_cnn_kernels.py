"""The cpu kernels of depthwise CNNs (issue 17): the vectorisable float32 exp behind Exp, Sigmoid
and SiLU, against ONNX Runtime over exp's whole float32 range and its special values."""

import numpy as np
from onnx import helper

import pyforge
from tests.helpers import check_against_ort, make_model

rng = np.random.default_rng(8)


def _unary(ops: list[str], shape) -> object:
    nodes, x = [], "x"
    for k, op in enumerate(ops):
        nodes.append(helper.make_node(op, [x], [f"y{k}"]))
        x = f"y{k}"
    return make_model(nodes, [("x", np.float32, shape)], [(x, np.float32, shape)])


def _wide_range(n: int) -> np.ndarray:
    """Seeded values over all of exp's float32 range, the edges and the special values."""
    x = rng.uniform(-110, 95, n).astype(np.float32)
    edges = [88.72, 88.73, -87.33, -87.34, -103.9, -104.1, 0.0, -0.0, 1e-8, -1e-8]
    x[: len(edges) + 3] = [*edges, np.inf, -np.inf, np.nan]
    return x


def _sources(model: pyforge.CompiledModel) -> str:
    return "".join(open(p).read() for p in model.runtime.kernel_paths.values())


def test_exp_matches_ort_over_the_float32_range():
    x = _wide_range(40_000)
    ref = np.exp(x.astype(np.float64))
    compiled, _ = check_against_ort(_unary(["Exp"], [40_000]), {"x": x}, rtol=1e-6, atol=1e-44)
    assert "def fexp" in _sources(compiled)  # the vectorisable form, not math.exp
    got = compiled.predict({"x": x})
    normal = (ref > 1.2e-38) & (ref < 3.4e38)
    assert np.max(np.abs(got[normal] - ref[normal]) / ref[normal]) < 3e-7


def test_sigmoid_and_silu_match_ort():
    x = (rng.standard_normal((2, 24, 40, 40)) * 6).astype(np.float32)
    x.flat[:4] = [np.inf, -np.inf, np.nan, 50.0]
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])]
    model = make_model(
        nodes,
        [("x", np.float32, x.shape)],
        [("s", np.float32, x.shape), ("y", np.float32, x.shape)],
    )
    # ORT's own logistic is off the exact one by up to ~1e-7 absolute (times x in the SiLU)
    compiled, _ = check_against_ort(model, {"x": x})
    assert "def fexp" in _sources(compiled)
    with np.errstate(over="ignore"):
        exact = 1 / (1 + np.exp(-x.astype(np.float64)))
    got = compiled.predict({"x": x})
    np.testing.assert_allclose(got["s"], exact, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(got["y"], x * exact, rtol=2e-6, atol=1e-12)


def test_float64_exp_keeps_math_exp():
    x = rng.uniform(-700, 700, 1000)
    compiled, _ = check_against_ort(
        make_model(
            [helper.make_node("Exp", ["x"], ["y"])], [("x", np.float64, [1000])],
            [("y", np.float64, [1000])],
        ),
        {"x": x},
        rtol=1e-12,
        atol=0,
    )  # fmt: skip
    assert "def fexp" not in _sources(compiled)


# (shape, kernel, stride, pads, ceil_mode): SqueezeNet's ceil-mode pools, ResNet's and
# ShuffleNet's 3x3 s2 p1, a 2x2 s2, a 5x5 s3, uneven pads, batch 2
POOLS = [
    ((1, 64, 111, 111), 3, 2, [0, 0, 0, 0], 1),
    ((1, 16, 27, 27), 3, 2, [0, 0, 0, 0], 1),
    ((2, 24, 56, 56), 3, 2, [1, 1, 1, 1], 0),
    ((1, 8, 17, 18), 2, 2, [0, 0, 0, 0], 1),
    ((1, 3, 20, 20), 5, 3, [2, 1, 0, 2], 0),
    ((1, 12, 28, 28), 3, 1, [1, 1, 1, 1], 1),  # stride 1: GoogLeNet's branch pools
    ((1, 8, 20, 20), 5, 1, [2, 2, 2, 2], 0),  # YOLO's SPPF
]


def test_maxpool_by_planes_matches_ort():
    for shape, k, s, pads, ceil in POOLS:
        node = helper.make_node(
            "MaxPool", ["x"], ["y"], kernel_shape=[k, k], strides=[s, s], pads=pads, ceil_mode=ceil
        )
        model = make_model([node], [("x", np.float32, shape)], [("y", np.float32, None)])
        x = rng.standard_normal(shape).astype(np.float32)
        x.flat[::101] = np.inf
        x.flat[7::89] = -np.inf
        compiled, _ = check_against_ort(model, {"x": x}, rtol=0, atol=0)
        assert "np.empty(" in _sources(compiled), (shape, k, s)  # the plane buffers


# (shape, kernel, stride, pads, count_include_pad, ceil_mode): Inception-v3's 3x3 s1 p1 branch
# pools (torch counts the padding), a 2x2 s2 (DenseNet's transitions), a 5x5 s3 with uneven pads,
# a 3x2 window on a 1-row-short image, batch 2; the last one's ceil-mode window overhangs its pads
# and keeps the per-element kernel
AVG_POOLS = [
    ((1, 19, 35, 35), (3, 3), 1, [1, 1, 1, 1], 1, 0),
    ((2, 7, 17, 17), (3, 3), 1, [1, 1, 1, 1], 0, 0),
    ((1, 12, 28, 28), (2, 2), 2, [0, 0, 0, 0], 0, 0),
    ((1, 3, 20, 21), (5, 5), 3, [2, 1, 0, 2], 0, 0),
    ((1, 3, 20, 21), (5, 5), 3, [2, 1, 0, 2], 1, 0),
    ((1, 5, 9, 14), (3, 2), 2, [1, 0, 1, 1], 0, 0),
    ((1, 4, 16, 16), (3, 3), 2, [0, 0, 0, 0], 0, 1),
]


def test_average_pool_by_planes_matches_ort():
    for shape, k, s, pads, include, ceil in AVG_POOLS:
        node = helper.make_node(
            "AveragePool", ["x"], ["y"], kernel_shape=list(k), strides=[s, s], pads=pads,
            count_include_pad=include, ceil_mode=ceil,
        )  # fmt: skip
        model = make_model([node], [("x", np.float32, shape)], [("y", np.float32, None)])
        x = rng.standard_normal(shape).astype(np.float32)
        x.flat[5] = np.inf  # reaches only the windows holding it
        compiled, _ = check_against_ort(model, {"x": x}, rtol=1e-6, atol=1e-6)
        # the zero-padded plane buffer, but for the overhanging window
        assert ("np.zeros(" in _sources(compiled)) == (not ceil), (shape, k, s, include)


def test_global_average_pool_in_partial_sums_matches_ort():
    """The cpu mean's 8 partial sums: planes of 1, 7 (all remainder), 15, 49 and 3136 positions,
    a NaN and an inf reaching only their own channel's mean."""
    for h, w in ((1, 1), (1, 7), (3, 5), (7, 7), (56, 56)):
        x = (rng.standard_normal((2, 6, h, w)) + 3.0).astype(np.float32)
        x[0, 1, 0, -1], x[1, 4, -1, 0] = np.nan, np.inf
        model = make_model(
            [helper.make_node("GlobalAveragePool", ["x"], ["y"])], [("x", np.float32, x.shape)],
            [("y", np.float32, (2, 6, 1, 1))],
        )  # fmt: skip
        compiled, _ = check_against_ort(model, {"x": x})
        assert "_7 += " in _sources(compiled) or h * w < 8
        got = compiled.predict({"x": x}).reshape(2, 6)
        assert np.isnan(got[0, 1]) and got[1, 4] == np.inf
        assert np.isfinite(np.delete(got.ravel(), [1, 10])).all()
