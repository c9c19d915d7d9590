"""MeanVarianceNormalization, the op added to show what one op costs: one ops/ entry, one
frontend rule, one lowering, this test."""

import numpy as np
import pytest
from onnx import helper

from tests.helpers import check_against_ort, make_model


def _mvn(shape, axes=None, tail=False):
    attrs = {} if axes is None else {"axes": axes}
    nodes = [helper.make_node("MeanVarianceNormalization", ["x"], ["m" if tail else "y"], **attrs)]
    if tail:  # an elementwise tail fuses into the normalization's kernel
        nodes += [helper.make_node("Relu", ["m"], ["r"]), helper.make_node("Neg", ["r"], ["y"])]
    return make_model(nodes, [("x", np.float32, list(shape))], [("y", np.float32, list(shape))])


@pytest.mark.parametrize(
    "shape,axes", [((2, 3, 4, 5), None), ((2, 3, 4, 5), [1]), ((3, 8), [1]), ((2, 4, 6), [0, 2])]
)
@pytest.mark.parametrize("fusion", [True, False])
def test_mean_variance_normalization_matches_ort(shape, axes, fusion):
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32) * 3 + 1
    check_against_ort(_mvn(shape, axes), {"x": x}, fusion=fusion)


def test_mean_variance_normalization_takes_an_epilogue():
    x = np.random.default_rng(4).standard_normal((2, 3, 4, 5)).astype(np.float32)
    fused, _ = check_against_ort(_mvn(x.shape, tail=True), {"x": x})
    unfused, _ = check_against_ort(_mvn(x.shape, tail=True), {"x": x}, fusion=False)
    assert (fused.stats["launches"], unfused.stats["launches"]) == (1, 3)
