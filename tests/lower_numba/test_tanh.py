"""The vectorisable float32 tanh (emit.FTANH_CPU) behind Tanh and Gelu's tanh form on the cpu:
within 2e-7 relative of math.tanh over the float32 range, its special values, GELU against ORT."""

import math

import numpy as np
from onnx import helper

from tests.helpers import check_against_ort, make_model
from tests.lower_numba.test_erf import _sources

rng = np.random.default_rng(23)


def test_tanh_within_2e_7_of_math_tanh_over_the_float32_range():
    mag = np.exp(rng.uniform(np.log(1e-44), np.log(30.0), 30_000))
    x = np.concatenate([rng.uniform(-6, 6, 30_000), mag * rng.choice([-1, 1], 30_000)])
    x = x.astype(np.float32)
    edges = [0.5, np.nextafter(np.float32(0.5), np.float32(0)), -0.5, 9.0, 0.0, -0.0]
    x[: len(edges) + 3] = [*edges, np.inf, -np.inf, np.nan]
    model = make_model(
        [helper.make_node("Tanh", ["x"], ["y"])], [("x", np.float32, x.shape)],
        [("y", np.float32, x.shape)],
    )  # fmt: skip
    compiled, _ = check_against_ort(model, {"x": x})  # ORT (MLAS) is itself within 2.4e-7 abs
    assert "def ftanh" in _sources(compiled) and "math.tanh" not in _sources(compiled)
    got = compiled.predict({"x": x})
    ref = np.array([math.tanh(float(v)) for v in x])
    normal = np.abs(ref) >= 2.0**-126
    assert np.max(np.abs(got[normal] - ref[normal]) / np.abs(ref[normal])) < 2e-7
    assert got[6] == 1 and got[7] == -1 and np.isnan(got[8])
    assert np.signbit(got[5]) and not np.signbit(got[4])  # tanh(-0.0) is -0.0


def test_gelu_tanh_form_matches_ort():
    x = (rng.standard_normal((4, 128, 96)) * 3).astype(np.float32)
    x.flat[:3] = [np.inf, -np.inf, 40.0]
    gelu = make_model(
        [helper.make_node("Gelu", ["x"], ["y"], approximate="tanh")],
        [("x", np.float32, x.shape)], [("y", np.float32, x.shape)], opset=20,
    )  # fmt: skip
    compiled, _ = check_against_ort(gelu, {"x": x})
    assert "ftanh(" in _sources(compiled)
