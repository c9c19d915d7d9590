"""The FusedAttention cuda kernel: run in Numba's CUDA simulator on tiny shapes against ORT (in a
subprocess: the simulator must be on before numba is imported), and compiled to sm_90 PTX."""

import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import pyforge
from pyforge.compiler import compile_to_plan
from pyforge.exec.steps import kernel_steps
from tests.helpers import ATOL, RTOL, check_against_ort, run_in_simulator, run_ort
from tests.opt.test_attention import core

INSIDE = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
TOL = dict(rtol=RTOL, atol=ATOL)

CASES = {
    "additive_b_1_1_s": dict(b=1, h=2, sq=3, sk=5, d=4),
    "decode_where_two_key_tiles": dict(b=1, h=1, sq=1, sk=70, d=4, mask="where_inverted"),
    "gqa_causal_rows_past_the_tile": dict(b=1, h=4, hk=2, sq=5, sk=5, d=2, mask="causal_const"),
    "no_mask_dv_differs": dict(b=2, h=1, sq=2, sk=3, d=3, dv=5, mask=None, out_transpose=False),
    # the tiled kernel (more than 16 rows of a narrow head) and the per-row one with a head dim
    # over one warp's lanes (each lane two dims, the last lanes one)
    "tiled_rows_causal": dict(b=1, h=1, sq=18, sk=18, d=4, mask="causal_const"),
    "row_wide_head_gqa": dict(b=1, h=2, hk=1, sq=2, sk=6, d=40, mask="where_inverted"),
    # the prefill kernel: d 192 in quarters of 48, dv 64 (4 row groups); dv 16 (a row a thread)
    # over 23 keys (a partial tile) under an additive mask
    "prefill_no_mask_dv_64": dict(b=1, h=1, sq=20, sk=20, d=192, dv=64, mask=None),
    "prefill_additive_dv_16": dict(b=1, h=1, sq=18, sk=23, d=128, dv=16),
}


@pytest.mark.sim
@pytest.mark.skipif(INSIDE, reason="this is the launcher")
def test_attention_in_simulator():
    run_in_simulator(__file__, timeout=900)


@pytest.mark.skipif(not INSIDE, reason="runs inside the simulator subprocess")
@pytest.mark.parametrize("case", sorted(CASES))
def test_attention_case_in_simulator(case):
    from pyforge.lower_numba.templates.attention_cuda import per_row, prefill

    shape = CASES[case]
    model, feeds = core(**shape)
    compiled, _ = check_against_ort(model, feeds, target="cuda")
    launch = [s.launch for s in kernel_steps(compiled.plan.steps) if "FusedAttention" in s.label]
    sq, d = shape["sq"], shape["d"]
    rows = per_row(sq, d, shape["sk"]) and not prefill(sq, d, shape.get("dv", d))
    assert launch[0][0][0] == (shape["sq"] if rows else -(-shape["sq"] // 16))
    assert any("FusedAttention" in s.label for s in kernel_steps(compiled.plan.steps))


def _cache_model(b: int, h: int, hk: int, sq: int, sk: int, d: int, fill: float):
    """softmax(where(cond, q kᵀ / sqrt(d), fill)) v, cond a (b, 1, sq, sk) graph input as a static
    KV cache's decoder gives it (rows past the valid length, before a sliding window); k and v
    have hk heads, each repeated h // hk times (Unsqueeze, Expand, Reshape)."""
    f32, n = TensorProto.FLOAT, helper.make_node
    c = lambda name, a: numpy_helper.from_array(np.asarray(a), name)
    inits = [c("sd", np.float32(np.sqrt(d))), c("fill", np.float32(fill)), c("ax2", [2])]
    inits += [c("rep", [b, hk, h // hk, sk, d]), c("flat", [b, h, sk, d])]
    nodes = []
    for t in "kv":
        nodes += [n("Unsqueeze", [t, "ax2"], [f"{t}u"]), n("Expand", [f"{t}u", "rep"], [f"{t}e"])]
        nodes.append(n("Reshape", [f"{t}e", "flat"], [f"{t}r"]))
    nodes += [
        n("Transpose", ["kr"], ["kt"], perm=[0, 1, 3, 2]),
        n("MatMul", ["q", "kt"], ["s0"]),
        n("Div", ["s0", "sd"], ["s1"]),
        n("Where", ["cond", "s1", "fill"], ["s2"]),
        n("Softmax", ["s2"], ["p"], axis=-1),
        n("MatMul", ["p", "vr"], ["y"]),
    ]
    vi = helper.make_tensor_value_info
    inputs = [vi("q", f32, [b, h, sq, d]), vi("k", f32, [b, hk, sk, d])]
    inputs += [vi("v", f32, [b, hk, sk, d]), vi("cond", TensorProto.BOOL, [b, 1, sq, sk])]
    graph = helper.make_graph(nodes, "cache", inputs, [vi("y", f32, [b, h, sq, d])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# (shape, kept key ranges [(batch, row, lo, hi)], fill); every case splits the keys over blocks
MASKED = {
    # valid length 37 of 64, its two parts of 19 and 18 keys
    "static_cache_decode_gqa": (dict(b=1, h=4, hk=1, sq=1, sk=64, d=8), [(0, 0, 0, 37)], -3.0e38),
    "sliding_window_rows_batch": (dict(b=2, h=1, hk=1, sq=2, sk=64, d=4),
                                  [(0, 0, 9, 40), (0, 1, 10, 52), (1, 0, 20, 61), (1, 1, 21, 63)],
                                  float("-inf")),
    # row 0 keeps nothing (a fill of -inf: NaN, as ORT), row 1 one key (its second part empty)
    "keeps_nothing_inf": (dict(b=1, h=1, hk=1, sq=2, sk=64, d=4), [(0, 1, 30, 31)], float("-inf")),
    # nothing kept under a finite fill: every key, equally weighted
    "keeps_nothing_finite": (dict(b=1, h=1, hk=1, sq=1, sk=64, d=4), [], -3.0e38),
}  # fmt: skip


@pytest.mark.skipif(not INSIDE, reason="runs inside the simulator subprocess")
@pytest.mark.parametrize(
    "case, kernel",
    [(c, "row") for c in sorted(MASKED)]
    + [("static_cache_decode_gqa", "w4"), ("sliding_window_rows_batch", "w8")]
    + [("keeps_nothing_inf", "w4"), ("keeps_nothing_finite", "w8")],
)
def test_masked_decode_splits_keys_in_simulator(case, kernel, monkeypatch):
    from pyforge.lower_numba.templates.attention_cuda import splits

    monkeypatch.setenv("PYFORGE_DECODE_ATTN", kernel)  # the candidate decode kernels (warp)

    shape, ranges, fill = MASKED[case]
    b, h, hk, sq, sk, d = (shape[x] for x in ("b", "h", "hk", "sq", "sk", "d"))
    model = _cache_model(b, h, hk, sq, sk, d, fill)
    rng = np.random.default_rng(11)
    cond = np.zeros((b, 1, sq, sk), bool)
    for bi, row, lo, hi in ranges:
        cond[bi, 0, row, lo:hi] = True
    cond[0, 0, -1, 50] = False  # a hole inside a range
    feeds = {t: rng.standard_normal((b, hk, sk, d)).astype(np.float32) for t in "kv"}
    feeds["q"] = rng.standard_normal((b, h, sq, d)).astype(np.float32) * 3
    feeds["cond"] = cond
    # keys no row keeps are never read: NaN there leaves ORT's answer on the finite inputs
    # (ORT itself gives NaN: 0 * NaN)
    unread = dict(feeds)
    if not case.startswith("keeps"):
        for t in "kv":
            unread[t] = feeds[t].copy()
            unread[t][:, :, ~cond.any(axis=(0, 1, 2))] = np.nan
    compiled = pyforge.compile(model, target="cuda")
    np.testing.assert_allclose(compiled.predict(unread), run_ort(model, feeds)[0], **TOL)
    launch = [s.launch for s in kernel_steps(compiled.plan.steps) if "FusedAttention" in s.label]
    assert splits(sq * h * b, sk) > 1 and launch[0][0] == (sq, h, b * splits(sq * h * b, sk))
    assert launch[0][1] == (512 if kernel == "row" else int(kernel[1]) * 32)


# prefill of wide heads (the kernel sharing K/V tiles among 16 query rows): (b, h, hk, sq, sk, d,
# window per batch, fill); query i at position i of a static cache, keeping keys i - w + 1 .. i
PREFILL = {
    "d256_gqa_windows_batch": (2, 4, 1, 24, 40, 256, (10, 5), float("-inf")),
    "d128_causal_finite_fill": (1, 2, 2, 40, 40, 128, (40,), -3.0e38),
}


@pytest.mark.skipif(not INSIDE, reason="runs inside the simulator subprocess")
@pytest.mark.parametrize("case", sorted(PREFILL))
def test_prefill_shares_key_tiles_in_simulator(case):
    from pyforge.lower_numba.templates.attention_cuda import PRE_THREADS, prefill

    b, h, hk, sq, sk, d, windows, fill = PREFILL[case]
    model = _cache_model(b, h, hk, sq, sk, d, fill)
    rng = np.random.default_rng(5)
    pos, key = np.arange(sq)[:, None], np.arange(sk)[None, :]
    cond = np.stack([(key <= pos) & (key > pos - w) for w in windows])[:, None]
    if b > 1:
        cond[1, 0, 3] = False  # a row keeping nothing: NaN under -inf, as ORT
    feeds = {t: rng.standard_normal((b, hk, sk, d)).astype(np.float32) for t in "kv"}
    feeds["q"] = rng.standard_normal((b, h, sq, d)).astype(np.float32) * 3
    feeds["cond"] = cond
    # keys past the prompt are never read (batch 1's empty row reads every key, as unfused)
    unread = {t: a.copy() for t, a in feeds.items()}
    for t in "kv":
        unread[t][0, :, sq:] = np.nan
    compiled = pyforge.compile(model, target="cuda")
    np.testing.assert_allclose(compiled.predict(unread), run_ort(model, feeds)[0], **TOL)
    launch = [s.launch for s in kernel_steps(compiled.plan.steps) if "FusedAttention" in s.label]
    assert prefill(sq, d, d) and launch[0] == ((-(-sq // 16), h, b), PRE_THREADS)


@pytest.mark.skipif(INSIDE, reason="NVVM, not the simulator")
@pytest.mark.parametrize(
    "case",
    ["bert", "gemma_decode", "gemma_prefill", pytest.param("gqa_decode", marks=pytest.mark.slow)],
)
def test_attention_kernel_compiles_to_ptx(case, tmp_path):
    from tests.lower_numba.test_ptx import _ptx_available, _ptx_of

    if not _ptx_available():
        pytest.skip("no numba-cuda with NVVM/NVRTC ([cuda] extra) to compile PTX")
    shape = dict(b=1, h=12, sq=128, sk=128, d=64) if case == "bert" else {}
    if case == "gemma_decode":  # the per-row kernel: one query row, a 256-wide head, GQA 4:1
        shape = dict(b=1, h=4, hk=1, sq=1, sk=256, d=256, mask="where_inverted")
    if case == "gemma_prefill":  # the prefill kernel: 300 query rows, causal, GQA 4:1
        shape = dict(b=1, h=4, hk=1, sq=300, sk=300, d=256, mask="causal_const")
    if case == "gqa_decode":
        shape = dict(b=2, h=8, hk=2, sq=1, sk=300, d=128, mask="where_inverted")
    plan, _ = compile_to_plan(core(**shape)[0])
    steps = [s for s in kernel_steps(plan.steps) if "FusedAttention" in s.label]
    assert len(steps) == 1
    ptx = _ptx_of(plan, steps[0], tmp_path)
    assert ".shared" in ptx and "bar.sync" in ptx
