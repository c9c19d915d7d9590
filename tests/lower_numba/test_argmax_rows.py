"""ArgMax/ArgMin over one long last axis (a vocabulary's logits): a block of threads per row on
cuda (two row reductions: the extreme, then its first or last index). Parity with numpy, ties
and NaN rows included, on the cpu and in the CUDA simulator; the cuda kernel compiles to sm_90."""

from __future__ import annotations

import os

import numpy as np
import pytest
from onnx import helper

import pyforge
from pyforge.compiler import compile_to_plan
from pyforge.exec.steps import kernel_steps
from pyforge.lower_numba.templates.reduce import ROW_LONG
from pyforge.options import CompileOptions
from tests.helpers import make_model, run_in_simulator

INSIDE = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
SHAPE = (2, 3, ROW_LONG + 37)  # not a multiple of the block or of the cpu's unroll


def _model(op: str, dtype, last: int = 0, keepdims: int = 1):
    node = helper.make_node(op, ["x"], ["y"], axis=-1, keepdims=keepdims, select_last_index=last)
    out = list(SHAPE[:-1]) + [1] * keepdims
    return make_model([node], [("x", dtype, list(SHAPE))], [("y", np.int64, out)], opset=13)


def _input(dtype) -> np.ndarray:
    rng = np.random.default_rng(7)
    if np.dtype(dtype).kind == "i":
        x = rng.integers(-50, 50, SHAPE).astype(dtype)  # many ties of the extreme
    else:
        x = rng.standard_normal(SHAPE).astype(dtype)
        x[0, 1, [5, 90, 280]] = x[0, 1].max() + 1  # a tie of three
        x[1, 2, [77, 250]] = np.nan  # a NaN row: its first (or last) NaN
    return x


def _want(op: str, x: np.ndarray, last: int) -> np.ndarray:
    fn = np.argmax if op == "ArgMax" else np.argmin
    if not last:
        return fn(x, axis=-1, keepdims=True)
    flipped = fn(x[..., ::-1], axis=-1, keepdims=True)
    return x.shape[-1] - 1 - flipped


CASES = [
    (op, dt, last)
    for op in ("ArgMax", "ArgMin")
    for dt in (np.float32, np.int32)
    for last in (0, 1)
]


def _check(target: str, op, dtype, last) -> None:
    x = _input(dtype)
    got = pyforge.compile(_model(op, dtype, last), target=target).predict(x)
    np.testing.assert_array_equal(got, _want(op, x, last))


@pytest.mark.skipif(INSIDE, reason="cpu cases run outside the simulator")
@pytest.mark.parametrize("op,dtype,last", CASES)
def test_long_row_arg_matches_numpy(op, dtype, last):
    _check("cpu", op, dtype, last)


@pytest.mark.skipif(INSIDE, reason="cpu cases run outside the simulator")
def test_long_rows_get_a_block_per_row_short_ones_do_not():
    cuda = CompileOptions().resolve("cuda")
    plan, _ = compile_to_plan(_model("ArgMax", np.float32), cuda)
    (step,) = kernel_steps(plan.steps)
    assert step.launch is not None and step.launch[0][1] == SHAPE[0] * SHAPE[1]
    plan, _ = compile_to_plan(_model("ArgMax", np.float32, keepdims=0), cuda)
    (step,) = kernel_steps(plan.steps)
    assert step.launch is None  # the per-output-element loop


@pytest.mark.skipif(INSIDE, reason="cpu cases run outside the simulator")
def test_long_row_arg_compiles_to_ptx(tmp_path):
    from tests.lower_numba.test_ptx import _ptx_available, _ptx_of

    if not _ptx_available():
        pytest.skip("no NVVM/NVRTC to compile PTX")
    plan, _ = compile_to_plan(_model("ArgMax", np.float32), specialize=True)
    for step in kernel_steps(plan.steps):
        assert "bar.sync" in _ptx_of(plan, step, tmp_path)


@pytest.mark.sim
@pytest.mark.skipif(INSIDE, reason="this is the launcher")
def test_long_row_arg_in_simulator():
    run_in_simulator(__file__, timeout=900)


@pytest.mark.skipif(not INSIDE, reason="runs inside the simulator subprocess")
@pytest.mark.parametrize("op,dtype,last", [c for c in CASES if c[1] is np.float32])
def test_long_row_arg_on_simulated_cuda(op, dtype, last):
    _check("cuda", op, dtype, last)


def _pick_model(vocab: int):
    from pyforge.generate import gemma3

    g = gemma3._Graph()
    gemma3._greedy_pick(g, vocab)
    logits = helper.make_tensor_value_info("logits", 1, [1, 1, vocab])
    out = helper.make_tensor_value_info("next_token", 7, [1, 1, 1])
    graph = helper.make_graph(g.nodes, "pick", [logits], [out], g.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.skipif(INSIDE, reason="cpu cases run outside the simulator")
@pytest.mark.parametrize("case", ["random", "tie_across_chunks", "nan"])
def test_the_decoders_two_round_greedy_pick_is_argmax(case):
    """Gemma's next_token over a 64k+ vocabulary: chunk ArgMaxes, then the chunks' (two rounds,
    so a block per chunk): numpy's argmax, the first of tied maxima in different chunks too."""
    vocab = 65536
    model = pyforge.compile(_pick_model(vocab), target="cpu")
    assert sum(s.label.startswith("ArgMax") for s in model.plan.steps) == 2
    x = np.random.default_rng(11).standard_normal((1, 1, vocab)).astype(np.float32)
    if case == "tie_across_chunks":
        x[0, 0, [40000, 9000, 9001]] = 9.0  # the first index wins, in an earlier chunk
    elif case == "nan":
        x[0, 0, [60000, 30000]] = np.nan
    got = model.predict(x)
    assert got.shape == (1, 1, 1) and int(got[0, 0, 0]) == int(np.argmax(x))
