"""The cpu FusedAttention kernel's blocking (templates/attention.py): query blocks that do not
cover the rows, keys and value columns that do not fill a 16-wide panel, a last block of fewer
than 6 rows, and scores spread wide enough that most exps underflow; ORT parity."""

from __future__ import annotations

import numpy as np
import pytest

import pyforge
from tests.helpers import check_against_ort, run_ort
from tests.opt.test_attention import core, fused_attention_nodes


def test_several_query_blocks_and_partial_panels():
    # 2100 keys: 32768 // (6 * 2112) -> query blocks of 12 rows: 12 + 12 + 5 for 29 queries;
    # 2100 keys and 20 value columns are padded to whole 16-wide panels
    model, feeds = core(b=1, h=2, sq=29, sk=2100, d=8, dv=20, mask="add", seed=3)
    assert len(fused_attention_nodes(model)) == 1
    feeds["q"] *= 8  # scores ~ N(0, 64): exps from 1 down past float32's normal range
    _, err = check_against_ort(model, feeds)
    assert err < 1e-5


def test_decode_rows_read_keys_in_place_or_strided():
    # fewer query rows than a panel: keys and values in blocks of 64 (70 = 64 + 6), read in place
    # when their rows are contiguous, element by element when k comes transposed
    for k_form in ("transpose", "pre_t"):
        model, feeds = core(b=2, h=3, sq=1, sk=70, d=8, dv=12, k_form=k_form, seed=4)
        assert len(fused_attention_nodes(model)) == 1, k_form
        check_against_ort(model, feeds)


def _window_mask_model(h: int, sq: int, sk: int, d: int):
    """softmax(where(cond, q kᵀ / sqrt(d), -3e38)) v with cond a graph input (1, 1, sq, sk), as
    a static KV cache's decoder masks rows past the valid length and before a sliding window."""
    from onnx import TensorProto, helper, numpy_helper

    f32, n = TensorProto.FLOAT, helper.make_node
    inits = [numpy_helper.from_array(np.asarray(np.sqrt(d), np.float32), "sd"),
             numpy_helper.from_array(np.asarray(-3.0e38, np.float32), "neg")]  # fmt: skip
    nodes = [
        n("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        n("MatMul", ["q", "kt"], ["s0"]),
        n("Div", ["s0", "sd"], ["s1"]),
        n("Where", ["cond", "s1", "neg"], ["s2"]),
        n("Softmax", ["s2"], ["p"], axis=-1),
        n("MatMul", ["p", "v"], ["y"]),
    ]
    inputs = [helper.make_tensor_value_info("q", f32, [1, h, sq, d]),
              helper.make_tensor_value_info("k", f32, [1, h, sk, d]),
              helper.make_tensor_value_info("v", f32, [1, h, sk, d]),
              helper.make_tensor_value_info("cond", TensorProto.BOOL, [1, 1, sq, sk])]  # fmt: skip
    out = [helper.make_tensor_value_info("y", f32, [1, h, sq, d])]
    graph = helper.make_graph(nodes, "window", inputs, out, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("sq", [1, 4, 20])
def test_where_mask_reads_only_the_kept_key_range(sq):
    # row i keeps keys lo_i..hi_i (a hole inside); keys and values outside every row's range are
    # NaN, which the kernel never reads, so the result is ORT's on the finite inputs (ORT itself
    # gives NaN there: 0 * NaN); sq 1 and 4 take the decode path, 20 the panel path
    rng = np.random.default_rng(7)
    h, sk, d = 2, 300, 16
    model = _window_mask_model(h, sq, sk, d)
    assert len(fused_attention_nodes(model)) == 1
    cond = np.zeros((1, 1, sq, sk), bool)
    for i in range(sq):
        cond[0, 0, i, 70 + i : 150 + 3 * i] = True
    cond[0, 0, :, 100] = False
    feeds = {t: rng.standard_normal((1, h, sk, d)).astype(np.float32) for t in "kv"}
    feeds["q"] = rng.standard_normal((1, h, sq, d)).astype(np.float32)
    feeds["cond"] = cond
    check_against_ort(model, feeds)
    kept = np.flatnonzero(cond.any(axis=(0, 1, 2)))
    outside = (np.arange(sk) < kept[0]) | (np.arange(sk) > kept[-1])
    nan_feeds = dict(feeds)
    for t in "kv":
        nan_feeds[t] = feeds[t].copy()
        nan_feeds[t][:, :, outside] = np.nan
    got = pyforge.compile(model, target="cpu").predict(nan_feeds)
    np.testing.assert_allclose(got, run_ort(model, feeds)[0], rtol=1e-4, atol=1e-5)
