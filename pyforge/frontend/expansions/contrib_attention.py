"""com.microsoft attention ops (Attention, MultiHeadAttention, GroupQueryAttention) expanded into
MatMul / Softmax / Transpose; masks become one additive bias, as ORT's CPU kernels apply them."""

from __future__ import annotations

import numpy as np

from ..expand import Builder, expands
from .contrib import MS, i64, required, rope


def heads(b: Builder, x: str, n: int, keys_t: bool = False) -> str:
    """(B, S, N*h) -> (B, N, S, h), or (B, N, h, S) with ``keys_t``: one transpose for K^T."""
    bsz, seq, hidden = b.value(x).shape
    x = b.op("Reshape", [x, b.const(i64(bsz, seq, n, hidden // n))])
    return b.op("Transpose", [x], perm=[0, 2, 3, 1] if keys_t else [0, 2, 1, 3])


def attend(b: Builder, q, k, v, scale: float, bias, out: str, cap=0.0, k_t=False):
    """softmax(q k^T * scale (+ bias)) v for q (B, N, S, h), k/v (B, N, T, h) (k (B, N, h, T)
    with ``k_t``); out (B, S, N*h)."""
    dtype = b.value(q).dtype
    kt = k if k_t else b.op("Transpose", [k], perm=[0, 1, 3, 2])
    scores = b.op("MatMul", [q, kt])
    scores = b.op("Mul", [scores, b.const(np.asarray(scale, dtype))])
    if cap:  # GroupQueryAttention's softcap
        t = b.op("Tanh", [b.op("Div", [scores, b.const(np.asarray(cap, dtype))])])
        scores = b.op("Mul", [t, b.const(np.asarray(cap, dtype))])
    if bias is not None:
        scores = b.op("Add", [scores, bias])
    o = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), v])
    bsz, n, seq, hv = b.value(o).shape
    o = b.op("Transpose", [o], perm=[0, 2, 1, 3])
    b.op("Reshape", [o, b.const(i64(bsz, seq, n * hv))], outputs=[out])


def mask_bias(b: Builder, mask, batch: int, seq: int, total: int, past: int, causal: bool):
    """The additive (B|1, 1, S|1, T) bias of a mask_index / key_padding_mask: raw 0/1 masks of
    (B, T) or (B, S, T), right-padding lengths (B,), or ends then starts (2B,); plus, when
    ``causal``, the fill above the diagonal (ORT adds the two)."""
    fill, dtype, bias = b.attrs.get("mask_filter_value", -10000.0), b.value(b.input(0)).dtype, None
    if mask is not None:
        shape = b.value(mask).shape
        if len(shape) == 1 and shape[0] in (batch, 2 * batch):
            cols = b.const(np.arange(total, dtype=b.value(mask).dtype).reshape(1, total))
            lens = b.op("Reshape", [mask, b.const(i64(-1, 1))])
            if shape[0] == batch:
                keep = b.op("Less", [cols, lens])
            else:
                ends, starts = b.op("Split", [lens, b.const(i64(batch, batch))], n_outputs=2)
                keep = b.op(
                    "And", [b.op("Less", [cols, ends]), b.op("GreaterOrEqual", [cols, starts])]
                )
        elif len(shape) in (2, 3) and shape[-1] == total:
            keep = b.op("Greater", [mask, b.const(np.zeros((), b.value(mask).dtype))])
        else:
            b.fail(f"mask of shape {shape}: only (B,), (2B,), (B, T) and (B, S, T) are supported")
        zero, fill_c = (b.const(np.asarray(v, dtype)) for v in (0.0, fill))
        dims = i64(batch, 1, seq if len(shape) == 3 else 1, total)
        bias = b.op("Reshape", [b.op("Where", [keep, zero, fill_c]), b.const(dims)])
    if causal:
        future = np.arange(total)[None, :] > np.arange(seq)[:, None] + past
        tri = b.const((future * np.asarray(fill, dtype)).astype(dtype))
        bias = tri if bias is None else b.op("Add", [bias, tri])
    return bias


def _refuse(b: Builder, attrs=(), inputs=(), outputs=()) -> None:
    for a in attrs:
        if b.attrs.get(a, 0):
            b.fail(f"attribute {a}={b.attrs[a]} is not supported")
    for i, what in inputs:
        if b.input(i) is not None:
            b.fail(f"input {i} ({what}) is not supported")
    for k, what in outputs:
        if b.used(k):
            b.fail(f"output {k} ({what}) is not supported")


def _with_past(b: Builder, past: str | None, new: str, out: str) -> str:
    """past (B, N, P, h) ++ new along the sequence, written to ``out`` (a present output)."""
    if past is None:
        return b.op("Identity", [new], outputs=[out]) if out else new
    return b.op("Concat", [past, new], outputs=[out] if out else None, axis=2)


def _scale(b: Builder, head: int) -> float:
    return b.attrs.get("scale", 0.0) or 1.0 / float(np.sqrt(head))


@expands("Attention", domain=MS)
def _attention(b: Builder) -> None:
    _refuse(b, ("do_rotary", "past_present_share_buffer"), [(6, "past_sequence_length")])
    (n,) = required(b, "num_heads")
    x, w = b.input(0), b.input(1)
    bsz, seq, _ = b.value(x).shape
    width = b.value(w).shape[1]
    sizes = list(b.attrs.get("qkv_hidden_sizes", None) or [width // 3] * 3)
    wc, wb = b.value(w).const, b.input(2)
    bc = None if wb is None else b.value(wb).const
    if wc is not None and (wb is None or bc is not None):  # a GEMM per projection, no Split
        cuts = list(zip(np.cumsum([0, *sizes[:2]]), np.cumsum(sizes)))
        parts = [b.op("MatMul", [x, b.const(wc[:, i:j])]) for i, j in cuts]
        if bc is not None:
            parts = [b.op("Add", [t, b.const(bc[i:j])]) for t, (i, j) in zip(parts, cuts)]
    else:
        qkv = b.op("MatMul", [x, w])
        qkv = qkv if wb is None else b.op("Add", [qkv, wb])
        parts = b.op("Split", [qkv, b.const(i64(*sizes))], n_outputs=3, axis=-1)
    past, present = b.input(4), b.output(1) if b.used(1) else ""
    k_t = past is None and not present
    q, k, v = heads(b, parts[0], n), heads(b, parts[1], n, k_t), heads(b, parts[2], n)
    npast = 0
    if past is not None or present:
        pk = pv = None
        if past is not None:
            npast = b.value(past).shape[3]
            pk, pv = (
                b.op("Squeeze", [t, b.const(i64(0))])
                for t in b.op("Split", [past, b.const(i64(1, 1))], n_outputs=2, axis=0)
            )
        k, v = _with_past(b, pk, k, ""), _with_past(b, pv, v, "")
        if present:
            kv = [b.op("Unsqueeze", [t, b.const(i64(0))]) for t in (k, v)]
            b.op("Concat", kv, outputs=[present], axis=0)
    uni = bool(b.attrs.get("unidirectional", 0))
    bias = mask_bias(b, b.input(3), bsz, seq, seq + npast, npast, uni)
    if b.input(5) is not None:
        bias = b.input(5) if bias is None else b.op("Add", [bias, b.input(5)])
    attend(b, q, k, v, _scale(b, sizes[0] // n), bias, b.output(0), k_t=k_t)


@expands("MultiHeadAttention", domain=MS)
def _multi_head_attention(b: Builder) -> None:
    _refuse(b, (), [(8, "past_sequence_length"), (9, "cache_indirection")], [(3, "qk")])
    (n,) = required(b, "num_heads")
    q, k, v = b.input(0), b.input(1), b.input(2)
    qs = b.value(q).shape
    bsz, seq = qs[:2]
    if len(qs) == 5 or k is None or len(b.value(k).shape) == 5:
        b.fail("packed QKV or KV (B, S, N, 3|2, h): ORT's CPU kernel refuses them too")
    ks = b.value(k).shape
    if b.input(3) is not None:
        if len(ks) != 3:
            b.fail("input 3 (bias) with BNSH key/value is not supported")
        hq, hk, hv = qs[-1], ks[-1], b.value(v).shape[-1]
        bq, bk, bv = b.op("Split", [b.input(3), b.const(i64(hq, hk, hv))], n_outputs=3)
        q, k, v = b.op("Add", [q, bq]), b.op("Add", [k, bk]), b.op("Add", [v, bv])
    pk, pv = b.input(6), b.input(7)
    k_t = len(ks) == 3 and pk is None and not b.used(1)
    q = heads(b, q, n)
    if len(ks) == 3:  # else BNSH already
        k, v = heads(b, k, n, k_t), heads(b, v, n)
    npast = 0 if pk is None else b.value(pk).shape[2]
    outs = [b.output(i) if b.used(i) else "" for i in (1, 2)]
    k, v = _with_past(b, pk, k, outs[0]), _with_past(b, pv, v, outs[1])
    total = b.value(k).shape[3 if k_t else 2]
    uni = bool(b.attrs.get("unidirectional", 0))
    bias = mask_bias(b, b.input(4), bsz, seq, total, npast, uni)
    if b.input(5) is not None:
        bias = b.input(5) if bias is None else b.op("Add", [bias, b.input(5)])
    attend(b, q, k, v, _scale(b, b.value(q).shape[-1]), bias, b.output(0), k_t=k_t)


def _place(b: Builder, past, new: str, start: str, total: int, out: str) -> str:
    """present (B, Nkv, total, h): the past's rows, and from row start[b] on the S new ones."""
    bsz, nkv, seq, h = b.value(new).shape
    have = 0 if past is None else b.value(past).shape[2]
    pad = b.const(np.zeros((bsz, nkv, total - have, h), b.value(new).dtype))
    base = pad if past is None else past if have == total else b.op("Concat", [past, pad], axis=2)
    rel = b.op("Sub", [b.const(np.arange(total, dtype=np.int32).reshape(1, 1, -1, 1)), start])
    idx = b.op("Clip", [rel, b.const(np.int32(0)), b.const(np.int32(seq - 1))])
    inside = b.op("Equal", [idx, rel])
    idx = b.op("Expand", [idx, b.const(i64(bsz, nkv, total, h))])
    got = b.op("GatherElements", [new, idx], axis=2)
    return b.op("Where", [inside, got, base], outputs=[out] if out else None)


def _repeat_heads(b: Builder, t: str, groups: int) -> str:
    """(B, Nkv, T, h) -> (B, Nkv * groups, T, h), each head repeated ``groups`` times."""
    bsz, nkv, total, h = b.value(t).shape
    t = b.op(
        "Expand",
        [b.op("Unsqueeze", [t, b.const(i64(2))]), b.const(i64(bsz, nkv, groups, total, h))],
    )
    return b.op("Reshape", [t, b.const(i64(bsz, nkv * groups, total, h))])


@expands("GroupQueryAttention", domain=MS)
def _group_query_attention(b: Builder) -> None:
    unsupported = [(9, "position_ids"), (11, "head_sink"), (12, "k_scale"), (13, "v_scale")]
    unsupported += [(14, "q_norm_weight"), (15, "k_norm_weight")]
    _refuse(b, ("smooth_softmax", "qk_output", "sliding_window_cache"), unsupported, [(3, "qk")])
    if b.attrs.get("local_window_size", -1) != -1:
        b.fail(f"attribute local_window_size={b.attrs['local_window_size']} is not supported")
    n, nkv = required(b, "num_heads", "kv_num_heads")
    q, k, v = b.input(0), b.input(1), b.input(2)
    bsz, seq, width = b.value(q).shape
    if k is None:  # packed QKV (B, S, (N + 2 Nkv) h)
        h = width // (n + 2 * nkv)
        q, k, v = b.op("Split", [q, b.const(i64(n * h, nkv * h, nkv * h))], n_outputs=3, axis=-1)
    past_k, past_v = b.input(3), b.input(4)
    have = 0 if past_k is None else b.value(past_k).shape[2]
    if past_k is not None and b.value(past_k).dtype != b.value(q).dtype:
        b.fail(f"input 3 (past_key) of type {b.value(past_k).dtype}: a quantized cache")
    given = b.value(b.input(6)).const  # total_sequence_length; a run-time one is taken as P + S
    total = max(have, int(given)) if given is not None else have + seq
    prompt = seq == (int(given) if given is not None else have + seq)
    # the new tokens' first position per row: 0 for a prompt, else seqlens_k + 1 - S
    lens = b.op("Add", [b.input(5), b.const(np.int32(1))])
    start = b.const(np.zeros((bsz, 1, 1, 1), np.int32))
    if not prompt:
        first = b.op("Sub", [lens, b.const(np.int32(seq))])
        start = b.op("Reshape", [first, b.const(i64(-1, 1, 1, 1))])
    q, k, v = heads(b, q, n), heads(b, k, nkv), heads(b, v, nkv)
    if b.attrs.get("do_rotary", 0):
        pos = b.const(np.arange(seq, dtype=np.int32))
        if not prompt:
            pos = b.op("Add", [b.op("Reshape", [start, b.const(i64(-1, 1))]), pos])
        caches, inter = (b.input(7), b.input(8)), b.attrs.get("rotary_interleaved", 0)
        q, k = rope(b, q, pos, caches, inter, 1), rope(b, k, pos, caches, inter, 1)
    outs = (b.output(1), b.output(2))
    if have == 0 and total == seq:
        k, v = (b.op("Identity", [t], outputs=[o] if o else None) for t, o in zip((k, v), outs))
    else:
        k, v = (_place(b, p, t, start, total, o) for p, t, o in zip((past_k, past_v), (k, v), outs))
    if n != nkv:  # each K/V head serves N / Nkv query heads
        k, v = _repeat_heads(b, k, n // nkv), _repeat_heads(b, v, n // nkv)
    # key j is seen by query i when j < seqlens_k + 1 and (causal) j <= start + i
    cols = b.const(np.arange(total, dtype=np.int32))
    keep = b.op("Less", [cols, b.op("Reshape", [lens, b.const(i64(-1, 1, 1, 1))])])
    if b.attrs.get("causal", 1):
        last = b.op("Add", [start, b.const(np.arange(1, seq + 1, dtype=np.int32).reshape(-1, 1))])
        keep = b.op("And", [keep, b.op("Less", [cols, last])])
    dtype = b.value(q).dtype
    zero, fill = b.const(np.asarray(0.0, dtype)), b.const(np.asarray(np.finfo(dtype).min, dtype))
    bias = b.op("Where", [keep, zero, fill])
    if b.input(10) is not None:
        bias = b.op("Add", [bias, b.input(10)])
    cap = b.attrs.get("softcap", 0.0)
    attend(b, q, k, v, _scale(b, b.value(q).shape[-1]), bias, b.output(0), cap)
