"""TopK on the cpu (a quickselect per output over a per-thread copy of the row): values and
indices equal ORT's, ties to the lower index, largest and smallest, inner and outer axes, a row
as long as ssdlite's 3,234 anchor scores."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from tests.helpers import check_against_ort, make_model

F32 = np.float32


def _topk(shape, k, axis, largest, x):
    out = list(shape)
    out[axis] = k
    model = make_model(
        [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)],
        [("x", F32, list(shape))],
        [("v", F32, out), ("i", np.int64, out)],
        [numpy_helper.from_array(np.array([k], np.int64), "k")],
    )
    return check_against_ort(model, {"x": x}, target="cpu")


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize(("shape", "k", "axis"), [((4, 37), 9, 1), ((29, 3, 5), 7, 0)])
def test_topk_with_ties(shape, k, axis, largest):
    rng = np.random.default_rng(sum(shape) + largest)
    x = rng.integers(-4, 5, shape).astype(F32)  # few distinct values: many ties
    _topk(shape, k, axis, largest, x)


def test_topk_long_row():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3234,)).astype(F32)
    x[::7] = x[3]  # ties across the whole row
    _topk((3234,), 300, 0, 1, x)


def test_topk_cpu_selects_instead_of_ranking_every_element():
    """The cpu kernel runs one selection per output (O(L)), not a rank count per row element
    (O(L^2)); cuda keeps the rank count (no per-thread scratch row there)."""
    from pyforge.compiler import compile_to_plan
    from pyforge.exec.steps import kernel_steps

    model = make_model(
        [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=0)],
        [("x", F32, [500])],
        [("v", F32, [20]), ("i", np.int64, [20])],
        [numpy_helper.from_array(np.array([20], np.int64), "k")],
    )
    plan, _ = compile_to_plan(model, specialize=False)
    steps = [s for s in kernel_steps(plan.steps) if "TopK" in s.label]
    assert steps
    for step in steps:
        sources = plan.kernels[step.kernel]
        assert "rank" not in sources["cpu"] and "while" in sources["cpu"]
        assert "rank" in sources["cuda"]
