"""GlobalAveragePool / GlobalMaxPool over a large plane as a block of threads per (n, c) row on
cuda (templates/depthwise_cuda.py), both layouts: parity with numpy (a NaN plane included) on the
cpu and in the CUDA simulator, the block launch, and sm_90 PTX with the tree's barrier."""

from __future__ import annotations

import os

import numpy as np
import pytest
from onnx import helper

import pyforge
from pyforge.compiler import compile_to_plan
from pyforge.exec.steps import kernel_steps
from pyforge.options import CompileOptions
from tests.helpers import make_model, run_in_simulator

INSIDE = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
outside = pytest.mark.skipif(INSIDE, reason="cpu case: not rerun in the simulator")
SHAPE = (2, 5, 19, 23)  # 437 a plane: not a multiple of the block or of the cpu's unroll


def _model(op: str):
    node = helper.make_node(op, ["x"], ["y"])
    out = [*SHAPE[:2], 1, 1]
    return make_model([node], [("x", np.float32, list(SHAPE))], [("y", np.float32, out)])


def _check(target: str, op: str, layout: str) -> None:
    x = np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32) + 0.5
    x[1, 2, 7, 4] = np.nan  # a NaN plane stays NaN
    got = pyforge.compile(_model(op), target=target, layout=layout).predict(x)
    fn = np.mean if op == "GlobalAveragePool" else np.max
    np.testing.assert_allclose(got, fn(x, axis=(2, 3), keepdims=True), rtol=2e-6, atol=1e-6)


CASES = [(op, lay) for op in ("GlobalAveragePool", "GlobalMaxPool") for lay in ("nchw", "nhwc")]


@outside
@pytest.mark.parametrize("op,layout", CASES)
def test_pool_rows_match_numpy_on_cpu(op, layout):
    _check("cpu", op, layout)


@outside
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_large_planes_get_a_block_per_row(layout, monkeypatch):
    cuda = CompileOptions(layout=layout).resolve("cuda")
    plan, _ = compile_to_plan(_model("GlobalAveragePool"), cuda)
    (step,) = [s for s in kernel_steps(plan.steps) if "Pool" in s.label]
    assert step.launch is not None and step.launch[0][1] == SHAPE[0] * SHAPE[1]
    monkeypatch.setenv("PYFORGE_POOL_ROWS", "0")  # the A/B switch: one thread per output
    plan, _ = compile_to_plan(_model("GlobalAveragePool"), cuda)
    (step,) = [s for s in kernel_steps(plan.steps) if "Pool" in s.label]
    assert step.launch is None


@outside
def test_pool_rows_compile_to_ptx(tmp_path):
    from tests.lower_numba.test_ptx import _ptx_available, _ptx_of

    if not _ptx_available():
        pytest.skip("no NVVM/NVRTC to compile PTX")
    for op in ("GlobalAveragePool", "GlobalMaxPool"):
        plan, _ = compile_to_plan(_model(op), specialize=True, layout="nhwc")
        steps = [s for s in kernel_steps(plan.steps) if "Pool" in s.label]
        assert steps and all("bar.sync" in _ptx_of(plan, s, tmp_path) for s in steps)


@pytest.mark.sim
@outside
def test_pool_rows_in_simulator():
    run_in_simulator(__file__, timeout=600)


@pytest.mark.skipif(not INSIDE, reason="runs inside the simulator subprocess")
@pytest.mark.parametrize("op,layout", CASES)
def test_pool_rows_match_numpy_on_cuda(op, layout):
    _check("cuda", op, layout)
