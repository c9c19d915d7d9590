"""A new input shape on the cuda target (CUDA simulator): the per-model work (initializers,
BatchNorm folds, the weights array) is shared with the first plan, and the answers match cpu."""

from __future__ import annotations

import os

import numpy as np
import pytest
from onnx import helper, numpy_helper

import pyforge
from tests.helpers import ATOL, RTOL, make_model, run_in_simulator
from tests.test_shapes import _conv_bn_model, _images

INSIDE_SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


@pytest.mark.sim
@pytest.mark.skipif(INSIDE_SIM, reason="this is the launcher")
def test_new_shapes_on_cuda_in_simulator():
    run_in_simulator(__file__, timeout=900)


@pytest.mark.skipif(not INSIDE_SIM, reason="runs inside the simulator subprocess")
def test_a_new_cuda_shape_shares_the_models_work():
    proto = _conv_bn_model()
    model = pyforge.compile(proto, target="cuda")
    cpu = pyforge.compile(proto, target="cpu")
    folds = model._source.cache.folds_computed  # BatchNorm's 4, and on cuda the NHWC weights
    assert folds >= 4
    for batch in (3, 2):
        x = _images(batch)
        y = model.predict(x)
        y = y.copy_to_host() if hasattr(y, "copy_to_host") else y
        np.testing.assert_allclose(y, cpu.predict(x), rtol=RTOL, atol=ATOL)
    assert model._source.cache.folds_computed == folds  # nothing refolded for batches 3 and 2
    assert len({id(b.plan.weights) for b in model._plans.values()}) == 1
    # compile()'s plan for batch 1 is bound only when a predict asks for it: none did
    assert [plan["x"][0] for plan in model.stats["plans"]] == [3, 2]


def _conv_head_model():
    """x ('batch', 8, 6, 6) -> Conv 3x3 stride 2 (8 channels: the channel-run im2col) -> Relu
    -> GlobalAveragePool -> Flatten -> Gemm to 5 (a (batch, 5) bias kernel), seeded weights."""
    rng = np.random.default_rng(11)
    w = lambda name, *shape: numpy_helper.from_array(
        rng.standard_normal(shape).astype(np.float32), name
    )
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1),
    ]
    inits = [w("w", 8, 8, 3, 3), w("b", 8), w("fw", 5, 8), w("fb", 5)]
    x, y = ("x", np.float32, ["batch", 8, 6, 6]), ("y", np.float32, ["batch", 5])
    return make_model(nodes, [x], [y], inits)


@pytest.mark.skipif(not INSIDE_SIM, reason="runs inside the simulator subprocess")
def test_a_new_cuda_batch_runs_the_first_plans_kernels():
    proto = _conv_head_model()
    model = pyforge.compile(proto, target="cuda")
    cpu = pyforge.compile(proto, target="cpu")
    rng = np.random.default_rng(4)
    for batch in (1, 2, 3):
        x = rng.standard_normal((batch, 8, 6, 6)).astype(np.float32)
        y = model.predict(x)
        y = y.copy_to_host() if hasattr(y, "copy_to_host") else y
        np.testing.assert_allclose(y, cpu.predict(x), rtol=RTOL, atol=ATOL)
    paths = [set(b.runtime.kernel_paths.values()) for b in model._plans.values()]
    assert len(paths) == 3 and paths[1] == paths[0] and paths[2] == paths[0]
