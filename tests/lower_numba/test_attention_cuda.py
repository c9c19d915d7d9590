"""The FusedAttention cuda kernel: run in Numba's CUDA simulator on tiny shapes against ORT (in a
subprocess: the simulator must be on before numba is imported), and compiled to sm_90 PTX."""

import os

import pytest

from pyforge.compiler import compile_to_plan
from pyforge.exec.steps import kernel_steps
from tests.helpers import check_against_ort, run_in_simulator
from tests.opt.test_attention import core

INSIDE = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"

CASES = {
    "additive_b_1_1_s": dict(b=1, h=2, sq=3, sk=5, d=4),
    "decode_where_two_key_tiles": dict(b=1, h=1, sq=1, sk=70, d=4, mask="where_inverted"),
    "gqa_causal_rows_past_the_tile": dict(b=1, h=4, hk=2, sq=5, sk=5, d=2, mask="causal_const"),
    "no_mask_dv_differs": dict(b=2, h=1, sq=2, sk=3, d=3, dv=5, mask=None, out_transpose=False),
}


@pytest.mark.sim
@pytest.mark.skipif(INSIDE, reason="this is the launcher")
def test_attention_in_simulator():
    run_in_simulator(__file__, timeout=900)


@pytest.mark.skipif(not INSIDE, reason="runs inside the simulator subprocess")
@pytest.mark.parametrize("case", sorted(CASES))
def test_attention_case_in_simulator(case):
    model, feeds = core(**CASES[case])
    compiled, _ = check_against_ort(model, feeds, target="cuda")
    assert any("FusedAttention" in s.label for s in kernel_steps(compiled.plan.steps))


@pytest.mark.skipif(INSIDE, reason="NVVM, not the simulator")
@pytest.mark.parametrize("case", ["bert", pytest.param("gqa_decode", marks=pytest.mark.slow)])
def test_attention_kernel_compiles_to_ptx(case, tmp_path):
    from tests.lower_numba.test_ptx import _ptx_available, _ptx_of

    if not _ptx_available():
        pytest.skip("no numba-cuda with NVVM/NVRTC ([cuda] extra) to compile PTX")
    shape = dict(b=1, h=12, sq=128, sk=128, d=64) if case == "bert" else {}
    if case == "gqa_decode":
        shape = dict(b=2, h=8, hk=2, sq=1, sk=300, d=128, mask="where_inverted")
    plan, _ = compile_to_plan(core(**shape)[0])
    steps = [s for s in kernel_steps(plan.steps) if "FusedAttention" in s.label]
    assert len(steps) == 1
    ptx = _ptx_of(plan, steps[0], tmp_path)
    assert ".shared" in ptx and "bar.sync" in ptx
