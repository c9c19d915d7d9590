"""The com.microsoft ops of exported and ORT-optimised transformers (pyforge expands each into
ONNX ops) against ONNX Runtime's CPU kernels, one node per model, several forms of each."""

import numpy as np
import pytest
from onnx import helper, numpy_helper

from pyforge.errors import BadAttributeError, UnsupportedOperatorError
from tests.helpers import check_against_ort, make_model

MS = "com.microsoft"
rng = np.random.default_rng(613)


def rand(*shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def contrib(op, inputs, outputs=(("y", np.float32),), domain=MS, **attrs):
    """One ``op`` node. ``inputs``: (name, array) pairs in the op's order, None for an absent
    optional one; names starting with "c" are initializers, the rest are fed at run time."""
    names = ["" if i is None else i[0] for i in inputs]
    node = helper.make_node(op, names, [o[0] for o in outputs], name="n0", domain=domain, **attrs)
    given = [i for i in inputs if i is not None]
    feeds = {n: a for n, a in given if not n.startswith("c")}
    inits = [numpy_helper.from_array(a, n) for n, a in given if n.startswith("c")]
    model = make_model(
        [node],
        [(n, a.dtype, list(a.shape)) for n, a in feeds.items()],
        [(n, dt, None) for n, dt in outputs if n],
        inits,
    )
    if domain:
        model.opset_import.append(helper.make_opsetid(domain, 1))
    return model, feeds


def check(model, feeds, **tol):
    return check_against_ort(model, feeds, **tol)


def refused(model, feeds, match):
    import pyforge

    with pytest.raises(UnsupportedOperatorError, match=match):
        pyforge.compile(model, target="cpu").predict(feeds)


# ---- the GELU family -------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 5, 16), (7, 12)])
@pytest.mark.parametrize(
    "op,bias,attrs",
    [
        ("Gelu", False, {}),
        ("BiasGelu", True, {}),
        ("FastGelu", False, {}),
        ("FastGelu", True, {}),
        ("QuickGelu", False, {}),
        ("QuickGelu", False, {"alpha": 1.0}),
    ],
)
def test_gelu_family(op, bias, attrs, shape):
    inputs = [("x", rand(*shape, scale=2.0))] + ([("cb", rand(shape[-1]))] if bias else [])
    check(*contrib(op, inputs, **attrs))


# ---- layer norms -----------------------------------------------------------------------------

F = np.float32
SKIP_OUTS = (("y", F), ("mean", F), ("inv", F), ("sum", F))


@pytest.mark.parametrize(
    "skip_shape,beta,bias,n_out",
    [
        ((2, 5, 32), True, True, 4),
        ((2, 5, 32), False, False, 1),
        ((5, 32), True, False, 4),
        ((1, 5, 32), False, True, 2),
    ],
)
@pytest.mark.parametrize("fusion", [True, False])
def test_skip_layer_norm(skip_shape, beta, bias, n_out, fusion):
    inputs = [("x", rand(2, 5, 32)), ("skip", rand(*skip_shape)), ("cg", rand(32))]
    inputs += [("cbeta", rand(32)) if beta else None, ("cbias", rand(32)) if bias else None]
    while inputs[-1] is None:
        inputs.pop()
    model, feeds = contrib("SkipLayerNormalization", inputs, SKIP_OUTS[:n_out], epsilon=1e-5)
    check(model, feeds, fusion=fusion)


@pytest.mark.parametrize("bias,outs", [(True, (0, 2, 3)), (False, (0,)), (False, (0, 3))])
def test_skip_simplified_layer_norm(bias, outs):
    inputs = [("x", rand(2, 5, 24)), ("skip", rand(2, 5, 24)), ("cg", rand(24))]
    inputs += [("cbias", rand(24))] if bias else []
    outputs = [SKIP_OUTS[k] if k in outs else ("", F) for k in range(max(outs) + 1)]
    check(*contrib("SkipSimplifiedLayerNormalization", inputs, outputs, epsilon=1e-6))


def test_skip_simplified_mean_output_is_refused():
    inputs = [("x", rand(2, 5, 24)), ("skip", rand(2, 5, 24)), ("cg", rand(24))]
    refused(*contrib("SkipSimplifiedLayerNormalization", inputs, SKIP_OUTS[:2]), "mean")


@pytest.mark.parametrize("eps,n_out", [(1e-5, 1), (1e-6, 2)])
def test_simplified_layer_norm_onnx_domain(eps, n_out):
    # ORT registers SimplifiedLayerNormalization in the ONNX domain only ("com.microsoft"
    # is refused by ORT 1.32: not a registered op)
    inputs = [("x", rand(3, 4, 16)), ("cs", rand(16))]
    outs = (("y", F), ("inv", F))[:n_out]
    check(*contrib("SimplifiedLayerNormalization", inputs, outs, domain="", axis=-1, epsilon=eps))


def test_simplified_layer_norm_other_axis_is_refused():
    inputs = [("x", rand(3, 4, 16)), ("cs", rand(4, 16))]
    refused(*contrib("SimplifiedLayerNormalization", inputs, domain="", axis=1), "axis")


I32 = np.int32


@pytest.mark.parametrize(
    "segments,mask,pos_ids,n_out",
    [
        (True, True, False, 3),
        (False, False, False, 2),
        (True, False, True, 2),
        (False, True, True, 2),
    ],
)
def test_embed_layer_norm(segments, mask, pos_ids, n_out):
    # ORT's shape inference requires the mask_index output, so every case has it
    b, s, h = 2, 6, 16
    ids = rng.integers(0, 30, (b, s)).astype(I32)
    inputs = [("ids", ids), ("seg", rng.integers(0, 2, (b, s)).astype(I32)) if segments else None]
    inputs += [("cword", rand(30, h)), ("cpos", rand(8, h))]
    inputs += [("cseg", rand(2, h)) if segments else None, ("cg", rand(h)), ("cb", rand(h))]
    lengths = np.array([4, 6])
    m = (np.arange(s)[None] < lengths[:, None]).astype(I32)
    inputs += [("mask", m) if mask else None]
    if pos_ids:
        inputs += [("pos", rng.integers(0, 8, (b, s)).astype(I32))]
    while inputs[-1] is None:
        inputs.pop()
    outs = (("y", F), ("mask_index", I32), ("emb_sum", F))[:n_out]
    check(*contrib("EmbedLayerNormalization", inputs, outs, epsilon=1e-12))


# ---- RotaryEmbedding -------------------------------------------------------------------------


def _caches(max_seq, half):
    inv = 1.0 / 10000 ** (np.arange(half) / half)
    angles = np.arange(max_seq)[:, None] * inv[None]
    return np.cos(angles).astype(F), np.sin(angles).astype(F)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize(
    "layout,pos_form,rot_dim",
    [
        ("bsd", "bs", 0),
        ("bnsh", "bs", 0),
        ("bsd", "start", 0),
        ("bnsh", "start", 8),
        ("bsd", "bs", 8),
    ],
)
def test_rotary_embedding(layout, pos_form, rot_dim, interleaved):
    b, n, s, h = 2, 3, 5, 16
    x = rand(b, s, n * h) if layout == "bsd" else rand(b, n, s, h)
    pos = rng.integers(0, 12, (b, s)) if pos_form == "bs" else np.array([3])
    cos, sin = _caches(20, (rot_dim or h) // 2)
    attrs = dict(interleaved=interleaved)
    if rot_dim:
        attrs.update(rotary_embedding_dim=rot_dim, num_heads=n)
    inputs = [("x", x), ("pos", pos.astype(np.int64)), ("ccos", cos), ("csin", sin)]
    check(*contrib("RotaryEmbedding", inputs, **attrs))


def test_rotary_packed_batching_is_refused():
    cos, sin = _caches(8, 4)
    inputs = [
        ("x", rand(1, 4, 8)),
        ("pos", np.zeros((1, 4), np.int64)),
        ("ccos", cos),
        ("csin", sin),
    ]
    refused(*contrib("RotaryEmbedding", inputs, is_packed_batching=1), "is_packed_batching")


# ---- MatMulNBits -----------------------------------------------------------------------------


def _quantized(n, k, block, bits, zp_form):
    blocks = -(-k // block)
    q = rng.integers(0, 2**bits, (n, blocks, block)).astype(np.uint8)
    per = 8 // bits
    packed = np.zeros((n, blocks, block // per), np.uint8)
    for j in range(per):
        packed |= q[..., j::per] << (bits * j)
    scales = rng.uniform(0.01, 0.1, (n, blocks)).astype(F)
    extra = []
    if zp_form == "uint8":
        zq = rng.integers(0, 2**bits, (n, -(-blocks // per) * per)).astype(np.uint8)
        zp = np.zeros((n, zq.shape[1] // per), np.uint8)
        for j in range(per):
            zp |= zq[:, j::per] << (bits * j)
        extra = [("czp", zp)]
    elif zp_form == "float":
        extra = [("czp", rng.uniform(0, 2**bits - 1, (n, blocks)).astype(F))]
    return [("cB", packed), ("cscales", scales.reshape(-1))] + extra


@pytest.mark.parametrize(
    "a_shape,n,k,block,bits,zp,bias",
    [
        ((3, 64), 24, 64, 32, 4, None, False),
        ((2, 5, 48), 16, 48, 16, 4, "uint8", True),
        ((4, 40), 8, 40, 16, 4, "float", False),
        ((2, 32), 8, 32, 16, 8, "uint8", True),
        ((2, 64), 8, 64, 32, 2, None, False),
    ],
)
def test_matmul_nbits(a_shape, n, k, block, bits, zp, bias):
    inputs = [("a", rand(*a_shape))] + _quantized(n, k, block, bits, zp)
    if bias:
        inputs += [None] * (5 - len(inputs)) + [("cbias", rand(n))]
    attrs = dict(K=k, N=n, bits=bits, block_size=block)
    check(*contrib("MatMulNBits", inputs, **attrs), rtol=1e-4, atol=1e-4)


def test_matmul_nbits_runtime_weight_is_refused():
    qs = _quantized(8, 32, 16, 4, None)
    inputs = [("a", rand(2, 32)), ("b", qs[0][1]), qs[1]]
    refused(*contrib("MatMulNBits", inputs, K=32, N=8, bits=4, block_size=16), "not a constant")


# ---- attention -------------------------------------------------------------------------------

B, S, N, HD = 2, 5, 4, 8  # batch, sequence, heads, head size
H = N * HD


def _mask(form, total):
    """A mask_index / key_padding_mask of one of ORT's forms, leaving every row some key."""
    lengths, starts = np.array([total - 2, total]), np.array([1, 0])
    if form == "lengths":
        return lengths.astype(I32)
    if form == "ends_starts":
        return np.concatenate([lengths, starts]).astype(I32)
    raw = (np.arange(total)[None] < lengths[:, None]).astype(I32)
    raw[1, 1] = 0
    if form == "raw3d":
        return np.broadcast_to(raw[:, None], (B, S, total)).copy()
    return raw


ATTENTION_CASES = {
    "plain": {},
    "raw_mask": dict(mask="raw"),
    "lengths": dict(mask="lengths"),
    "ends_starts": dict(mask="ends_starts"),
    "raw3d": dict(mask="raw3d", attrs=dict(mask_filter_value=-1e4)),
    "causal": dict(attrs=dict(unidirectional=1)),
    "qkv_sizes_scale": dict(sizes=(H, H, 16), attrs=dict(scale=0.3)),
    "attention_bias": dict(attn_bias=True, mask="raw"),
    "past_present": dict(past=3, mask="raw", attrs=dict(unidirectional=1)),
    "past_no_mask": dict(past=2),
    "runtime_weights": dict(runtime_w=True, mask="lengths"),
}


@pytest.mark.parametrize("fusion", [True, False])
@pytest.mark.parametrize("case", sorted(ATTENTION_CASES))
def test_attention(case, fusion):
    c = ATTENTION_CASES[case]
    sizes, past = c.get("sizes", (H, H, H)), c.get("past", 0)
    total = S + past
    w = "w" if c.get("runtime_w") else "cw"  # a run-time weight takes the one-GEMM form
    inputs = [("x", rand(B, S, 12)), (w, rand(12, sum(sizes), scale=0.5)), ("cb", rand(sum(sizes)))]
    inputs += [("mask", _mask(c["mask"], total)) if "mask" in c else None]
    inputs += [("past", rand(2, B, N, past, HD)) if past else None]
    inputs += [("ab", rand(1, N, S, total)) if c.get("attn_bias") else None]
    while inputs[-1] is None:
        inputs.pop()
    outs = (("y", F), ("present", F))[: 2 if past else 1]
    attrs = dict(num_heads=N, **c.get("attrs", {}))
    if sizes[2] != H:
        attrs["qkv_hidden_sizes"] = list(sizes)
    check(*contrib("Attention", inputs, outs, **attrs), fusion=fusion)


@pytest.mark.parametrize(
    "attrs,mask_shape,match",
    [(dict(do_rotary=1), None, "do_rotary"), ({}, (B, 1, S, S), "mask of shape")],
)
def test_attention_refusals(attrs, mask_shape, match):
    inputs = [("x", rand(B, S, 12)), ("cw", rand(12, 3 * H)), ("cb", rand(3 * H))]
    if mask_shape:
        inputs.append(("mask", np.ones(mask_shape, I32)))
    refused(*contrib("Attention", inputs, num_heads=N, **attrs), match)


MHA_CASES = {
    "self_bias": dict(bias=True),
    "cross": dict(kv_len=7, bias=True, mask="lengths"),
    "cross_raw_mask": dict(kv_len=7, mask="raw"),
    "bnsh_kv": dict(form="bnsh", kv_len=6, mask="raw"),
    "causal_past": dict(past=3, attrs=dict(unidirectional=1)),
    "attention_bias": dict(attn_bias=True, attrs=dict(scale=0.2)),
}


@pytest.mark.parametrize("case", sorted(MHA_CASES))
def test_multi_head_attention(case):
    c = MHA_CASES[case]
    form, kv_len, past = c.get("form", "3d"), c.get("kv_len", S), c.get("past", 0)
    if form == "bnsh":
        inputs = [
            ("q", rand(B, S, H)),
            ("k", rand(B, N, kv_len, HD)),
            ("v", rand(B, N, kv_len, HD)),
        ]
    else:
        inputs = [("q", rand(B, S, H)), ("k", rand(B, kv_len, H)), ("v", rand(B, kv_len, H))]
    total = kv_len + past
    inputs += [("cbias", rand(3 * H)) if c.get("bias") else None]
    inputs += [("mask", _mask(c["mask"], total)) if "mask" in c else None]
    inputs += [("ab", rand(1, N, S, total)) if c.get("attn_bias") else None]
    if past:
        inputs += [("pk", rand(B, N, past, HD)), ("pv", rand(B, N, past, HD))]
    while inputs[-1] is None:
        inputs.pop()
    outs = (("y", F), ("present_k", F), ("present_v", F))[: 3 if past else 1]
    check(*contrib("MultiHeadAttention", inputs, outs, num_heads=N, **c.get("attrs", {})))


def test_multi_head_attention_refusals():
    inputs = [("q", rand(B, S, H)), ("k", rand(B, S, H)), ("v", rand(B, S, H))]
    inputs += [None] * 6 + [("ci", np.zeros((B, 1, S), I32))]
    refused(*contrib("MultiHeadAttention", inputs, num_heads=N), "cache_indirection")
    # ORT's CPU kernel refuses packed QKV and packed KV too, so there is no reference for them
    packed = [("q", rand(B, S, N, 3, HD))]
    refused(*contrib("MultiHeadAttention", packed, num_heads=N), "packed QKV")
    packed_kv = [("q", rand(B, S, H)), ("kv", rand(B, S, N, 2, HD))]
    refused(*contrib("MultiHeadAttention", packed_kv, num_heads=N), "packed QKV or KV")


KV = 2  # key/value heads of GroupQueryAttention
GQA_OUTS = (("y", F), ("present_k", F), ("present_v", F))


def _gqa_inputs(packed=False, lengths=None, rotary=False, past=0, seq=S, kv=KV, B=B):
    """GroupQueryAttention's inputs; ``lengths``: each row's total valid length (seqlens_k + 1)."""
    h = 2 * HD if rotary else HD  # ORT's rotary wants a multiple of 16
    if packed:
        qkv = [("q", rand(B, seq, (N + 2 * kv) * h)), None, None]
    else:
        qkv = [("q", rand(B, seq, N * h)), ("k", rand(B, seq, kv * h)), ("v", rand(B, seq, kv * h))]
    pasts = [("pk", rand(B, kv, past, h)), ("pv", rand(B, kv, past, h))] if past else [None] * 2
    seqlens = np.asarray(lengths or (past + seq,) * B, I32) - 1
    inputs = qkv + pasts + [("seqlens", seqlens), ("ctotal", np.asarray(seq + past, I32))]
    if rotary:
        inputs += [("ccos", _caches(16, h // 2)[0]), ("csin", _caches(16, h // 2)[1])]
    return inputs


GQA_CASES = {
    "plain": dict(),
    "packed": dict(packed=True),
    "rotary": dict(rotary=True, attrs=dict(do_rotary=1)),
    "rotary_interleaved": dict(rotary=True, attrs=dict(do_rotary=1, rotary_interleaved=1)),
    "softcap_scale": dict(attrs=dict(softcap=2.0, scale=0.5)),
    "not_causal": dict(attrs=dict(causal=0)),
    "ragged_prompt": dict(lengths=(S, S - 2)),
    "equal_heads": dict(kv=N),
    "decode": dict(past=4, seq=1),
    "decode_ragged_rotary": dict(
        past=4, seq=1, lengths=(5, 3), rotary=True, attrs=dict(do_rotary=1)
    ),
    # ORT takes several new tokens after a past only in a batch of one
    "chunk_after_past": dict(past=3, seq=3, lengths=(5,), packed=True, B=1),
}


@pytest.mark.parametrize("case", sorted(GQA_CASES))
def test_group_query_attention(case):
    c = dict(GQA_CASES[case])
    attrs = dict(num_heads=N, kv_num_heads=c.get("kv", KV), **c.pop("attrs", {}))
    model, feeds = contrib("GroupQueryAttention", _gqa_inputs(**c), GQA_OUTS, **attrs)
    if "lengths" not in c:
        check(model, feeds)
        return
    # rows past a sequence's length are left unspecified by ORT: compare the others
    import pyforge
    from tests.helpers import run_ort

    got = pyforge.compile(model, target="cpu").predict(feeds)
    past = c.get("past", 0)
    for k, want in enumerate(run_ort(model, feeds)):
        name = GQA_OUTS[k][0]
        for row, length in enumerate(c["lengths"]):
            g, w = got[name][row], want[row]
            if k and past:  # present: the cache rows up to the length
                g, w = g[:, :length], w[:, :length]
            elif not k and not past:  # a prompt's query rows up to the length
                g, w = g[:length], w[:length]
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"{name}[{row}]")


@pytest.mark.parametrize(
    "attrs,extra,match",
    [
        ({}, [None] * 2 + [("pos", np.zeros((B, S), np.int64))], "position_ids"),
        (dict(local_window_size=2), [], "local_window_size"),
    ],
)
def test_group_query_attention_refusals(attrs, extra, match):
    inputs = _gqa_inputs() + extra
    model = contrib("GroupQueryAttention", inputs, GQA_OUTS, num_heads=N, kv_num_heads=KV, **attrs)
    refused(*model, match)


# ---- fusion: the expansions fuse as the plain ops they stand for ------------------------------


def _bert_layer(contrib_norms):
    """Attention, output projection, residual + LayerNorm, FFN with GELU, residual + LayerNorm:
    the norms and GELU as com.microsoft fused ops, or as the plain ONNX ops they replace."""
    d, ff = 32, 64
    inits = {
        "cw": rand(d, 3 * d, scale=0.2),
        "cb": rand(3 * d),
        "wo": rand(d, d, scale=0.2),
        "bo": rand(d),
        "w1": rand(d, ff, scale=0.2),
        "b1": rand(ff),
        "w2": rand(ff, d, scale=0.2),
        "b2": rand(d),
        "g1": rand(d),
        "be1": rand(d),
        "g2": rand(d),
        "be2": rand(d),
    }
    mk = helper.make_node
    nodes = [mk("Attention", ["x", "cw", "cb", "m"], ["att"], domain=MS, num_heads=4)]
    nodes.append(mk("MatMul", ["att", "wo"], ["o"]))
    if contrib_norms:
        nodes += [
            mk("SkipLayerNormalization", ["o", "x", "g1", "be1", "bo"], ["ln1"], domain=MS),
            mk("MatMul", ["ln1", "w1"], ["f1"]),
            mk("FastGelu", ["f1", "b1"], ["a"], domain=MS),
            mk("MatMul", ["a", "w2"], ["f2"]),
            mk("SkipLayerNormalization", ["f2", "ln1", "g2", "be2", "b2"], ["y"], domain=MS),
        ]
    else:
        nodes += [
            mk("Add", ["o", "bo"], ["ob"]),
            mk("Add", ["ob", "x"], ["r1"]),
            mk("LayerNormalization", ["r1", "g1", "be1"], ["ln1"], epsilon=1e-12),
            mk("MatMul", ["ln1", "w1"], ["f1"]),
            mk("Add", ["f1", "b1"], ["f1b"]),
            mk("Gelu", ["f1b"], ["a"], approximate="tanh"),
            mk("MatMul", ["a", "w2"], ["f2"]),
            mk("Add", ["f2", "b2"], ["f2b"]),
            mk("Add", ["f2b", "ln1"], ["r2"]),
            mk("LayerNormalization", ["r2", "g2", "be2"], ["y"], epsilon=1e-12),
        ]
    model = make_model(
        nodes,
        [("x", F, [2, 8, d]), ("m", I32, [2, 8])],
        [("y", F, None)],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
        opset=20,
    )
    model.opset_import.append(helper.make_opsetid(MS, 1))
    m = np.ones((2, 8), I32)
    m[1, 6:] = 0
    return model, {"x": rand(2, 8, d), "m": m}


def test_bert_layer_fuses_like_plain_ops():
    contrib_model, plain_model = (_bert_layer(c) for c in (True, False))
    fused, _ = check(*contrib_model)
    plain, _ = check(*plain_model)
    print(
        "launches: com.microsoft norms", fused.stats["launches"], "plain", plain.stats["launches"]
    )
    assert fused.stats["launches"] == plain.stats["launches"]
    assert fused.stats["ops_out"] == plain.stats["ops_out"]


def test_missing_or_bad_attributes_name_the_node():
    import pyforge

    attention = contrib("Attention", [("x", rand(B, S, 12)), ("cw", rand(12, 3 * H))])
    qs = _quantized(8, 32, 16, 4, None)
    nbits = contrib("MatMulNBits", [("a", rand(2, 32)), *qs], K=32, N=16, bits=4, block_size=16)
    for (model, feeds), match in ((attention, "num_heads"), (nbits, "N=16")):
        with pytest.raises(BadAttributeError, match=match) as info:
            pyforge.compile(model, target="cpu").predict(feeds)
        assert "n0" in str(info.value)
