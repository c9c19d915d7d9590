"""The ResidualRMSNorm row kernel (opt/norms.py's junction) on cuda: a block per row, two
reductions in shared memory; ORT parity in the CUDA simulator, and sm_90 PTX."""

from __future__ import annotations

import os

import pytest

from pyforge.compiler import compile_to_plan
from pyforge.exec.steps import kernel_steps
from tests.helpers import check_against_ort, run_in_simulator
from tests.opt.test_rms_norm import junction_model

INSIDE = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


@pytest.mark.skipif(INSIDE, reason="cpu cases run outside the simulator")
def test_residual_junction_compiles_to_ptx(tmp_path):
    from tests.lower_numba.test_ptx import _ptx_available, _ptx_of

    if not _ptx_available():
        pytest.skip("no NVVM/NVRTC to compile PTX")
    plan, _ = compile_to_plan(junction_model((1, 1, 640))[0], specialize=True)
    (step,) = kernel_steps(plan.steps)
    assert "bar.sync" in _ptx_of(plan, step, tmp_path)


@pytest.mark.sim
@pytest.mark.skipif(INSIDE, reason="this is the launcher")
def test_residual_junction_in_simulator():
    run_in_simulator(__file__, timeout=900)


@pytest.mark.skipif(not INSIDE, reason="runs inside the simulator subprocess")
@pytest.mark.parametrize("shape", [(1, 1, 640), (2, 3, 16)])
def test_residual_junction_on_simulated_cuda(shape):
    model, feeds = junction_model(shape)
    check_against_ort(model, feeds, target="cuda")
