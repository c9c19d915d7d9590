"""The attention rewrite (opt/attention.py): which graphs become one FusedAttention, which stay as
they are, and ORT parity of the fused kernel on the cpu target."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

import pyforge
from pyforge.compiler import compile_to_plan
from tests.helpers import check_against_ort, make_model

F32 = np.float32


def _c(name: str, a) -> object:
    return numpy_helper.from_array(np.asarray(a), name)


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(F32)


def core(
    b=2, h=2, sq=5, sk=5, d=4, dv=None, hk=None, scale="div", mask="add", mask_shape=None,
    k_form="transpose", axis=-1, out_transpose=True, seed=0,
):  # fmt: skip
    """softmax(q kᵀ scale + mask) v on 4-D inputs q (b, h, sq, d), k/v (b, hk, sk, d|dv) as torch
    and the com.microsoft expansions write it; returns (model, feeds)."""
    rng = np.random.default_rng(seed)
    dv, hk = dv or d, hk or h
    n, inits = helper.make_node, []
    feeds = {"q": rand(rng, b, h, sq, d), "v": rand(rng, b, hk, sk, dv)}
    inputs = [("q", F32, [b, h, sq, d]), ("v", F32, [b, hk, sk, dv])]
    kshape = [b, hk, d, sk] if k_form == "pre_t" else [b, hk, sk, d]
    feeds["k"] = rand(rng, *kshape)
    inputs.append(("k", F32, kshape))
    nodes, q, k, v = [], "q", "k", "v"
    if hk != h:  # repeat each key/value head h // hk times: Unsqueeze -> Expand -> Reshape
        g = h // hk
        inits += [_c("ax2", np.array([2])), _c("rep_k", np.array([b, hk, g, sk, d]))]
        inits += [_c("rep_v", np.array([b, hk, g, sk, dv]))]
        inits += [_c("sh_k", np.array([b, h, sk, d])), _c("sh_v", np.array([b, h, sk, dv]))]
        for t in ("k", "v"):
            nodes += [
                n("Unsqueeze", [t, "ax2"], [f"{t}_u"]),
                n("Expand", [f"{t}_u", f"rep_{t}"], [f"{t}_e"]),
                n("Reshape", [f"{t}_e", f"sh_{t}"], [f"{t}_r"]),
            ]
        k, v = "k_r", "v_r"
    if k_form == "transpose":
        nodes.append(n("Transpose", [k], ["kt"], perm=[0, 1, 3, 2]))
        k = "kt"
    c = 1 / np.sqrt(d)
    if scale == "q_mul":
        inits.append(_c("c", np.asarray(c, F32)))
        nodes.append(n("Mul", [q, "c"], ["qs"]))
        q = "qs"
    if scale == "sqrt_both":  # torch's scaled_dot_product_attention export
        inits.append(_c("rc", np.asarray(np.sqrt(c), F32)))
        nodes += [n("Mul", [q, "rc"], ["qs"]), n("Mul", [k, "rc"], ["ks"])]
        q, k = "qs", "ks"
    nodes.append(n("MatMul", [q, k], ["s0"]))
    s = "s0"
    if scale == "div":
        inits.append(_c("sd", np.asarray(np.sqrt(d), F32)))
        nodes.append(n("Div", [s, "sd"], ["s1"]))
        s = "s1"
    future = np.arange(sk)[None, :] > np.arange(sq)[:, None] + (sk - sq)
    if mask == "add":
        shape = mask_shape or (b, 1, 1, sk)
        feeds["m"] = np.where(rng.random(shape) < 0.3, -10000.0, 0.0).astype(F32)
        inputs.append(("m", F32, list(shape)))
        nodes.append(n("Add", [s, "m"], ["s2"]))
        s = "s2"
    elif mask == "causal_const":
        inits.append(_c("tri", (future * np.finfo(F32).min).astype(F32).reshape(1, 1, sq, sk)))
        nodes.append(n("Add", ["tri", s], ["s2"]))
        s = "s2"
    elif mask in ("where", "where_inverted"):
        keep = ~future if mask == "where" else future
        inits += [_c("cond", keep.reshape(1, 1, sq, sk)), _c("fill", np.asarray(-np.inf, F32))]
        args = ["cond", s, "fill"] if mask == "where" else ["cond", "fill", s]
        nodes.append(n("Where", args, ["s2"]))
        s = "s2"
    elif mask == "mul":  # not additive: must not fire
        feeds["m"] = rand(rng, b, 1, 1, sk)
        inputs.append(("m", F32, [b, 1, 1, sk]))
        nodes.append(n("Mul", [s, "m"], ["s2"]))
        s = "s2"
    nodes += [n("Softmax", [s], ["p"], axis=axis), n("MatMul", ["p", v], ["o"])]
    oshape = [b, h, sq, dv]
    if out_transpose:
        nodes.append(n("Transpose", ["o"], ["y"], perm=[0, 2, 1, 3]))
        oshape = [b, sq, h, dv]
    else:
        nodes.append(n("Identity", ["o"], ["y"]))
    return make_model(nodes, inputs, [("y", F32, oshape)], inits), feeds


def bert_layer(b=1, s=16, e=32, heads=4, ff=64, seed=0):
    """One BERT encoder layer as torch exports it: projections, heads split by Reshape and
    Transpose (K straight to (B, H, D, S)), Div by sqrt(D), the (B, 1, 1, S) mask from
    attention_mask, Softmax, context, output projection, residual, LayerNorm, GELU FFN."""
    rng = np.random.default_rng(seed)
    d = e // heads
    n = helper.make_node
    w = lambda name, *shape: _c(name, (rng.standard_normal(shape) * 0.2).astype(F32))
    inits = [w(f"W{t}", e, e) for t in "qkvo"] + [w(f"b{t}", e) for t in "qkvo"]
    inits += [w("W1", e, ff), w("b1", ff), w("W2", ff, e), w("b2", e), w("g", e), w("beta", e)]
    inits += [_c("heads", np.array([b, s, heads, d])), _c("flat", np.array([b, s, e]))]
    inits += [_c("ax12", np.array([1, 2])), _c("one", np.asarray(1, F32))]
    inits += [_c("big", np.asarray(-10000.0, F32)), _c("sqd", np.asarray(np.sqrt(d), F32))]
    inits += [_c("sq2", np.asarray(np.sqrt(2), F32)), _c("half", np.asarray(0.5, F32))]
    nodes = [
        n("Unsqueeze", ["mask", "ax12"], ["m4"]),
        n("Sub", ["one", "m4"], ["m5"]),
        n("Mul", ["m5", "big"], ["m6"]),
    ]
    for t, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [
            n("MatMul", ["x", f"W{t}"], [f"{t}0"]),
            n("Add", [f"{t}0", f"b{t}"], [f"{t}1"]),
            n("Reshape", [f"{t}1", "heads"], [f"{t}2"]),
            n("Transpose", [f"{t}2"], [f"{t}3"], perm=perm),
        ]
    nodes += [
        n("MatMul", ["q3", "k3"], ["s0"]),
        n("Div", ["s0", "sqd"], ["s1"]),
        n("Add", ["s1", "m6"], ["s2"]),
        n("Softmax", ["s2"], ["p"], axis=-1),
        n("MatMul", ["p", "v3"], ["c0"]),
        n("Transpose", ["c0"], ["c1"], perm=[0, 2, 1, 3]),
        n("Reshape", ["c1", "flat"], ["c2"]),
        n("MatMul", ["c2", "Wo"], ["o0"]),
        n("Add", ["o0", "bo"], ["o1"]),
        n("Add", ["o1", "x"], ["r"]),
        n("LayerNormalization", ["r", "g", "beta"], ["ln"], axis=-1, epsilon=1e-12),
        n("MatMul", ["ln", "W1"], ["f0"]),
        n("Add", ["f0", "b1"], ["f1"]),
        n("Div", ["f1", "sq2"], ["f2"]),
        n("Erf", ["f2"], ["f3"]),
        n("Add", ["f3", "one"], ["f4"]),
        n("Mul", ["f1", "f4"], ["f5"]),
        n("Mul", ["f5", "half"], ["f6"]),
        n("MatMul", ["f6", "W2"], ["f7"]),
        n("Add", ["f7", "b2"], ["f8"]),
        n("Add", ["f8", "ln"], ["y"]),
    ]
    inputs = [("x", F32, [b, s, e]), ("mask", F32, [b, s])]
    model = make_model(nodes, inputs, [("y", F32, [b, s, e])], inits)
    mask = np.ones((b, s), F32)
    mask[:, s - s // 4 :] = 0  # right padding
    return model, {"x": rand(rng, b, s, e), "mask": mask}


def fused_attention_nodes(model) -> list:
    _, details = compile_to_plan(model)
    members = [
        m for node in details["graph"].nodes for m in (node.group.members if node.group else [node])
    ]
    return [m for m in members if m.op == "FusedAttention"]


CASES = {
    "bert_additive_mask": dict(),
    "vit_no_mask": dict(mask=None, scale=None),
    "gpt2_causal_const": dict(mask="causal_const", sq=7, sk=7),
    "gpt2_where": dict(mask="where", sq=6, sk=6),
    "where_inverted": dict(mask="where_inverted", sq=6, sk=6),
    "sdpa_sqrt_scale_both": dict(scale="sqrt_both", mask="add", mask_shape=(2, 1, 5, 5)),
    "scale_on_q_pre_transposed_k": dict(scale="q_mul", k_form="pre_t"),
    "gqa_4_heads_2_kv": dict(h=4, hk=2, mask="causal_const", sq=6, sk=6),
    "mqa_broadcast_mask_1_1_s_s": dict(h=3, hk=1, mask="add", mask_shape=(1, 1, 5, 5)),
    "decode_sq1_long_kv": dict(sq=1, sk=37, mask="add", mask_shape=(2, 1, 1, 37)),
    "s_not_multiple_of_tile": dict(sq=19, sk=67, d=8, mask="add"),
    "v_head_dim_differs_no_out_transpose": dict(dv=6, out_transpose=False),
}


# the cpu kernel is compiled once per mask structure (additive, none, where, where inverted):
# the additive cases share one compile, the other structures' parity runs are slow
SLOW = {"vit_no_mask", "gpt2_where", "where_inverted"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_pattern_fires(case):
    model, _ = core(**CASES[case])
    (node,) = fused_attention_nodes(model)
    assert len(node.inputs) == 4 + len(node.attrs["mask"])


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in sorted(CASES)]
)
def test_fused_matches_ort(case):
    model, feeds = core(**CASES[case])
    check_against_ort(model, feeds)
    if case == "gqa_4_heads_2_kv":  # the unfused graph: the same answer
        check_against_ort(model, feeds, fusion=False)


NOT_FIRING = {
    "softmax_on_another_axis": dict(axis=2),
    "mask_multiplied_not_added": dict(mask="mul"),
}


@pytest.mark.parametrize("case", sorted(NOT_FIRING))
def test_pattern_does_not_fire_where_semantics_differ(case):
    model, feeds = core(**NOT_FIRING[case])
    assert fused_attention_nodes(model) == []
    check_against_ort(model, feeds)


def test_scale_after_mask_or_scores_used_twice_do_not_fire():
    model, feeds = core(scale=None)
    g = model.graph
    # (scores + mask) * c: a scale after the mask scales the mask too
    sm = next(x for x in g.node if x.op_type == "Softmax")
    g.initializer.append(_c("c2", np.asarray(0.3, F32)))
    g.node.insert(list(g.node).index(sm), helper.make_node("Mul", ["s2", "c2"], ["s3"]))
    sm.input[0] = "s3"
    assert fused_attention_nodes(model) == []
    check_against_ort(model, feeds)
    model, feeds = core()
    model.graph.output.append(helper.make_tensor_value_info("s0", 1, [2, 2, 5, 5]))
    assert fused_attention_nodes(model) == []
    check_against_ort(model, feeds)


def test_bert_layer_launches_drop():
    model, feeds = bert_layer()
    fused, _ = check_against_ort(model, feeds)
    assert len(fused_attention_nodes(model)) == 1
    from pyforge.opt import passes

    saved = passes.PASSES["attention"]
    passes.PASSES["attention"] = lambda graph, **_: graph
    try:
        unfused, _ = check_against_ort(model, feeds)
    finally:
        passes.PASSES["attention"] = saved
    print("launches", unfused.stats["launches"], "->", fused.stats["launches"])
    assert fused.stats["launches"] <= unfused.stats["launches"] - 5


def test_nan_and_fully_masked_rows_follow_ort():
    model, feeds = core(mask="add", mask_shape=(2, 1, 5, 5))
    feeds["m"][0, 0, 1, :] = -np.inf  # a row with every key masked: NaN, as ORT gives
    feeds["q"][1, 0, 2, 0] = np.nan
    got = pyforge.compile(model, target="cpu").predict(feeds)
    from tests.helpers import run_ort

    np.testing.assert_array_equal(np.isnan(got), np.isnan(run_ort(model, feeds)[0]))


def test_saved_plan_reloads_the_fused_kernel(tmp_path):
    model, feeds = core(b=1, sq=3, sk=9, mask="add")
    compiled = pyforge.compile(model, target="cpu")
    compiled.save(tmp_path / "plan")
    loaded = pyforge.load(tmp_path / "plan")
    np.testing.assert_array_equal(loaded.predict(feeds), compiled.predict(feeds))


def _members(graph) -> list:
    return [m for n in graph.nodes for m in (n.group.members if n.group else [n])]


def test_attention_rows_bounds_the_fused_query_length():
    """``attention_rows``: a wide head's (128+) queries longer than it stay GEMMs around a row
    softmax (cuda's default 64, chosen by the H200 A/B); narrower heads and the cpu fuse every
    length; the unfused cpu graph still equals ORT."""
    from pyforge.options import CompileOptions

    model, feeds = core(sq=19, sk=67, d=128, mask="add")

    def fused(m, opts) -> int:
        _, details = compile_to_plan(m, opts)
        return sum(m.op == "FusedAttention" for m in _members(details["graph"]))

    assert fused(model, CompileOptions().resolve("cpu")) == 1
    assert fused(model, CompileOptions(attention_rows=18).resolve("cpu")) == 0
    assert fused(model, CompileOptions(attention_rows=19).resolve("cuda")) == 1
    cuda = CompileOptions().resolve("cuda")
    assert fused(core(sq=65, sk=65, d=128, mask="add")[0], cuda) == 0
    assert fused(core(sq=65, sk=65, d=64, mask="add")[0], cuda) == 1
    check_against_ort(model, feeds, attention_rows=18)
