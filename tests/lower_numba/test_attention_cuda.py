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
    # the tiled kernel (more than 16 rows of a narrow head) and the per-row one with a head dim
    # over one warp's lanes (each lane two dims, the last lanes one)
    "tiled_rows_causal": dict(b=1, h=1, sq=18, sk=18, d=4, mask="causal_const"),
    "row_wide_head_gqa": dict(b=1, h=2, hk=1, sq=2, sk=6, d=40, mask="where_inverted"),
}


@pytest.mark.sim
@pytest.mark.skipif(INSIDE, reason="this is the launcher")
def test_attention_in_simulator():
    run_in_simulator(__file__, timeout=900)


@pytest.mark.skipif(not INSIDE, reason="runs inside the simulator subprocess")
@pytest.mark.parametrize("case", sorted(CASES))
def test_attention_case_in_simulator(case):
    from pyforge.lower_numba.templates.attention import per_row

    shape = CASES[case]
    model, feeds = core(**shape)
    compiled, _ = check_against_ort(model, feeds, target="cuda")
    launch = [s.launch for s in kernel_steps(compiled.plan.steps) if "FusedAttention" in s.label]
    rows = per_row(shape["sq"], shape["d"], shape["sk"])
    assert launch[0][0][0] == (shape["sq"] if rows else -(-shape["sq"] // 16))
    assert any("FusedAttention" in s.label for s in kernel_steps(compiled.plan.steps))


@pytest.mark.skipif(INSIDE, reason="NVVM, not the simulator")
@pytest.mark.parametrize(
    "case", ["bert", "gemma_decode", pytest.param("gqa_decode", marks=pytest.mark.slow)]
)
def test_attention_kernel_compiles_to_ptx(case, tmp_path):
    from tests.lower_numba.test_ptx import _ptx_available, _ptx_of

    if not _ptx_available():
        pytest.skip("no numba-cuda with NVVM/NVRTC ([cuda] extra) to compile PTX")
    shape = dict(b=1, h=12, sq=128, sk=128, d=64) if case == "bert" else {}
    if case == "gemma_decode":  # the per-row kernel: one query row, a 256-wide head, GQA 4:1
        shape = dict(b=1, h=4, hk=1, sq=1, sk=256, d=256, mask="where_inverted")
    if case == "gqa_decode":
        shape = dict(b=2, h=8, hk=2, sq=1, sk=300, d=128, mask="where_inverted")
    plan, _ = compile_to_plan(core(**shape)[0])
    steps = [s for s in kernel_steps(plan.steps) if "FusedAttention" in s.label]
    assert len(steps) == 1
    ptx = _ptx_of(plan, steps[0], tmp_path)
    assert ".shared" in ptx and "bar.sync" in ptx
