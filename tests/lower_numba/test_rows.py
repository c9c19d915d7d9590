"""Row kernels (LayerNorm, RMSNorm, GroupNorm, InstanceNorm, Softmax, LogSoftmax): each row's
statistics are computed once, at the row loop's level, never per element; ORT parity on the cpu
(fused tails and unfused), in the CUDA simulator, and every cuda kernel compiles to sm_90 PTX."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from onnx import helper, numpy_helper

from pyforge.compiler import compile_to_plan
from pyforge.exec.steps import kernel_steps
from tests.helpers import check_against_ort, make_model, run_in_simulator

F32 = np.float32
INSIDE = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def _case(op, shape, attrs, params=(), tail=None, outs=1, opset=17):
    """One ``op`` node over x of ``shape`` (its params seeded), optionally an elementwise tail
    (``tail``: Relu, or a SiLU: x * Sigmoid(x)) that fusion puts in the kernel's epilogue."""
    rng = np.random.default_rng(len(op) * 100 + sum(shape))
    inits = [
        numpy_helper.from_array(rng.standard_normal(p).astype(F32), f"p{k}")
        for k, p in enumerate(params)
    ]
    names = ["x"] + [i.name for i in inits]
    first = ["r"] if tail else ["y"]
    if outs == 3:  # LayerNormalization's Mean and InvStdDev outputs
        first += ["mean", "inv"]
    nodes = [helper.make_node(op, names, first, **attrs)]
    if tail == "relu":
        nodes.append(helper.make_node("Relu", ["r"], ["y"]))
    elif tail == "silu":
        nodes.append(helper.make_node("Sigmoid", ["r"], ["sg"]))
        nodes.append(helper.make_node("Mul", ["r", "sg"], ["y"]))
    outputs = [("y", F32, list(shape))]
    if outs == 3:
        a = attrs.get("axis", -1) % len(shape)
        stat = list(shape[:a]) + [1] * (len(shape) - a)
        outputs += [("mean", F32, stat), ("inv", F32, stat)]
    model = make_model(nodes, [("x", F32, list(shape))], outputs, inits, opset=opset)
    x = (rng.standard_normal(shape) * 3 + 2).astype(F32)
    return model, {"x": x}


CASES = {
    "layernorm_relu": lambda: _case(
        "LayerNormalization", (2, 3, 300), {"axis": -1}, [(300,), (300,)], "relu"
    ),
    "layernorm_axis1": lambda: _case("LayerNormalization", (2, 3, 7), {"axis": 1}, [(3, 7), (7,)]),
    "layernorm_stats": lambda: _case("LayerNormalization", (4, 9), {"axis": -1}, [(9,)], outs=3),
    "rmsnorm": lambda: _case("RMSNormalization", (5, 33), {"axis": -1}, [(33,)], "relu", opset=23),
    "groupnorm_silu": lambda: _case(
        "GroupNormalization", (2, 4, 3, 5), {"num_groups": 2}, [(4,), (4,)], "silu", opset=21
    ),
    "instancenorm": lambda: _case("InstanceNormalization", (2, 3, 11), {}, [(3,), (3,)]),
    "softmax_last": lambda: _case("Softmax", (2, 3, 300), {"axis": -1}, opset=13),
    "logsoftmax_last": lambda: _case("LogSoftmax", (5, 17), {"axis": -1}, opset=13),
    "softmax_flatten": lambda: _case("Softmax", (2, 3, 4), {"axis": 1}, opset=11),
    "softmax_strided": lambda: _case("Softmax", (2, 3, 4), {"axis": 1}, opset=13),
}
ROW_KERNELS = [c for c in CASES if c != "softmax_strided"]  # that one loops per (row, column)
# passes over the row before its elements are written: two (mean, centred squares; max, sum of
# exp), RMSNorm one (mean square)
PASSES = {c: 1 if c == "rmsnorm" else 2 for c in ROW_KERNELS}


@pytest.mark.skipif(INSIDE, reason="cpu cases run outside the simulator")
@pytest.mark.parametrize("fusion", [True, False])
@pytest.mark.parametrize("case", sorted(CASES))
def test_row_kernel_matches_ort(case, fusion):
    model, feeds = CASES[case]()
    check_against_ort(model, feeds, fusion=fusion)


def _row_kernel_sources(case: str) -> list[str]:
    plan, _ = compile_to_plan(CASES[case]()[0])
    steps = [s for s in kernel_steps(plan.steps) if re.search("Normalization|Softmax", s.label)]
    assert steps
    return [plan.kernels[s.kernel]["cpu"] for s in steps]


@pytest.mark.skipif(INSIDE, reason="cpu cases run outside the simulator")
@pytest.mark.parametrize("case", ROW_KERNELS)
def test_statistics_once_per_row(case):
    """The load-independent figure: the row's statistics take PASSES loops at the row level,
    and the loop writing the row's elements holds no loop (no per-element recomputation)."""
    for src in _row_kernel_sources(case):
        body = src[src.index("for o in prange") :]
        row_level, element_level = body.split("for q0 in range")
        # a pass is its main loop and its tail, over one loop variable
        assert len(set(re.findall(r"\bfor (j\d+) in range", row_level))) == PASSES[case], src
        assert "for j" not in element_level and "while" not in element_level, src


@pytest.mark.skipif(INSIDE, reason="cpu cases run outside the simulator")
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("case", ROW_KERNELS)
def test_row_kernels_compile_to_ptx(case, precision, tmp_path):
    """The cuda form (one block per row, a shared-memory tree per statistic) types for sm_90;
    under fp16 the statistics are float32 (no float16 arithmetic is linked)."""
    from tests.lower_numba.test_ptx import _ptx_available, _ptx_of

    if not _ptx_available():
        pytest.skip("no NVVM/NVRTC to compile PTX")
    plan, _ = compile_to_plan(CASES[case]()[0], specialize=True, precision=precision)
    for step in kernel_steps(plan.steps):
        ptx = _ptx_of(plan, step, tmp_path)
        assert "__half" not in ptx, step.label
        if step.launch is not None:
            assert "bar.sync" in ptx, step.label  # the block's threads meet per statistic


@pytest.mark.sim
@pytest.mark.skipif(INSIDE, reason="this is the launcher")
def test_row_kernels_in_simulator():
    run_in_simulator(__file__, timeout=1500)


@pytest.mark.skipif(not INSIDE, reason="runs inside the simulator subprocess")
@pytest.mark.parametrize("case", sorted(CASES))
def test_row_kernel_in_simulator(case):
    model, feeds = CASES[case]()
    check_against_ort(model, feeds, target="cuda")


def test_masked_softmax_rows_flush_to_exact_zeros():
    """Scores masked with float32's lowest value (as torch exports a causal mask): their exps
    are subnormal or below, computed as exact zeros (fexpz), every kept key as ORT has it."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((2, 3, 40, 40)) * 4).astype(np.float32)
    causal = np.triu(np.ones((40, 40), bool), 1)
    x[..., causal] = np.finfo(np.float32).min
    x[0, 0, 20, :7] = -95.0  # e**(x - max) below the smallest normal float32, not masked
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
                       [("x", np.float32, x.shape)], [("y", np.float32, x.shape)])  # fmt: skip
    compiled, _ = check_against_ort(model, {"x": x}, atol=1e-7)
    y = compiled.predict({"x": x})
    assert (y[..., causal] == 0).all() and (y[0, 0, 20, :7] == 0).all()
    np.testing.assert_allclose(y.sum(-1), 1, rtol=1e-6)
