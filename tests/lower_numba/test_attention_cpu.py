"""The cpu FusedAttention kernel's blocking (templates/attention.py): query blocks that do not
cover the rows, keys and value columns that do not fill a 16-wide panel, a last block of fewer
than 6 rows, and scores spread wide enough that most exps underflow; ORT parity."""

from __future__ import annotations

from tests.helpers import check_against_ort
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
