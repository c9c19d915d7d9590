"""A new input shape on the cuda target (CUDA simulator): the per-model work (initializers,
BatchNorm folds, the weights array) is shared with the first plan, and the answers match cpu."""

from __future__ import annotations

import os

import numpy as np
import pytest

import pyforge
from tests.helpers import ATOL, RTOL, run_in_simulator
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
    assert model._source.cache.folds_computed == 4
    for batch in (3, 2):
        x = _images(batch)
        y = model.predict(x)
        y = y.copy_to_host() if hasattr(y, "copy_to_host") else y
        np.testing.assert_allclose(y, cpu.predict(x), rtol=RTOL, atol=ATOL)
    assert model._source.cache.folds_computed == 4  # nothing refolded for batches 3 and 2
    assert len({id(b.plan.weights) for b in model._plans.values()}) == 1
    assert len(model.stats["plans"]) == 3
