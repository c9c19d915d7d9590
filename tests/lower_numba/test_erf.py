"""The vectorisable float32 erf (emit.FERF_CPU) behind Erf and Gelu on the cpu: within 1e-6
relative of math.erf over erf's whole float32 range, its special values, the GELU patterns."""

import math

import numpy as np
import pytest
from onnx import helper

import pyforge
from tests.helpers import check_against_ort, make_model

rng = np.random.default_rng(17)


def _sources(model: pyforge.CompiledModel) -> str:
    return "".join(open(p).read() for p in model.runtime.kernel_paths.values())


def _erf_range(n: int) -> np.ndarray:
    """Seeded values: uniform over where erf moves, log-spread down to the subnormals, the
    branch edges (1, 4), erf's rounding-to-1 point and the special values."""
    mag = np.exp(rng.uniform(np.log(1e-44), np.log(20.0), n // 2))
    x = np.concatenate([rng.uniform(-5, 5, n - n // 2), mag * rng.choice([-1, 1], n // 2)])
    x = x.astype(np.float32)
    edges = [1.0, -1.0, np.nextafter(np.float32(1), np.float32(0)), 4.0, 3.9, 3.93, 0.0, -0.0]
    x[: len(edges) + 3] = [*edges, np.inf, -np.inf, np.nan]
    return x


def test_erf_within_1e_6_of_math_erf_over_the_float32_range():
    x = _erf_range(60_000)
    model = make_model(
        [helper.make_node("Erf", ["x"], ["y"])], [("x", np.float32, x.shape)],
        [("y", np.float32, x.shape)],
    )  # fmt: skip
    compiled, _ = check_against_ort(model, {"x": x}, rtol=1e-6, atol=1e-44)
    src = _sources(compiled)
    assert "def ferf" in src and "math.erf" not in src
    got = compiled.predict({"x": x})
    ref = np.array([math.erf(float(v)) for v in x])
    normal = np.abs(ref) >= 2.0**-126  # a subnormal result carries less than 1e-6 by itself
    assert np.max(np.abs(got[normal] - ref[normal]) / np.abs(ref[normal])) < 1e-6
    tiny = ~normal & ~np.isnan(ref)
    assert np.max(np.abs(got[tiny] - ref[tiny])) <= 3e-45
    assert got[8] == 1 and got[9] == -1 and np.isnan(got[10])
    assert np.signbit(got[7]) and not np.signbit(got[6])  # erf(-0.0) is -0.0


def test_gelu_patterns_match_ort():
    x = (rng.standard_normal((4, 128, 96)) * 3).astype(np.float32)
    x.flat[:3] = [np.inf, -np.inf, 40.0]
    # the form torch exports: x * 0.5 * (1 + erf(x / sqrt(2)))
    s2, one, half = (helper.make_tensor(n, 1, [], [v]) for n, v in (
        ("s2", 1.4142135), ("one", 1.0), ("half", 0.5)))  # fmt: skip
    nodes = [
        helper.make_node("Div", ["x", "s2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["a"]),
        helper.make_node("Mul", ["x", "a"], ["m"]),
        helper.make_node("Mul", ["m", "half"], ["y"]),
    ]
    model = make_model(
        nodes, [("x", np.float32, x.shape)], [("y", np.float32, x.shape)], [s2, one, half]
    )
    compiled, _ = check_against_ort(model, {"x": x})
    assert "ferf(" in _sources(compiled)
    gelu = make_model(
        [helper.make_node("Gelu", ["x"], ["y"])], [("x", np.float32, x.shape)],
        [("y", np.float32, x.shape)], opset=20,
    )  # fmt: skip
    compiled, _ = check_against_ort(gelu, {"x": x})
    assert "ferf(" in _sources(compiled)


def test_float64_erf_keeps_math_erf():
    x = rng.uniform(-6, 6, 1000)  # ORT has no float64 Erf: math.erf is the reference
    model = make_model(
        [helper.make_node("Erf", ["x"], ["y"])], [("x", np.float64, [1000])],
        [("y", np.float64, [1000])],
    )  # fmt: skip
    compiled = pyforge.compile(model, target="cpu")
    got = compiled.predict({"x": x})
    np.testing.assert_allclose(got, [math.erf(v) for v in x], rtol=1e-15, atol=0)
    assert "def ferf" not in _sources(compiled)


def test_cuda_erf_stays_math_erf_and_compiles_to_ptx(tmp_path):
    from tests.lower_numba import test_ptx

    if not test_ptx._ptx_available():
        pytest.skip("no numba-cuda with NVVM/NVRTC ([cuda] extra) to compile PTX")
    from pyforge.compiler import compile_to_plan

    x = ("x", np.float32, [2, 300])
    nodes = [helper.make_node("Erf", ["x"], ["e"]), helper.make_node("Gelu", ["e"], ["y"])]
    model = make_model(nodes, [x], [("y", np.float32, [2, 300])], opset=20)
    plan, _ = compile_to_plan(model)
    steps = test_ptx._kernels(plan)
    assert steps and all("ferf = math.erf" in plan.kernels[s.kernel]["cuda"] for s in steps)
    for step in steps:
        assert test_ptx._ptx_of(plan, step, tmp_path)  # types as the GPU would
