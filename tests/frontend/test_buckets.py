"""Length buckets: predict pads the bucketed dim, pyforge masks what mixes positions, and the
outputs at real positions equal the unpadded run's (and ORT's)."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import pyforge
from pyforge import errors

H, HEADS, VOCAB, POS = 16, 2, 50, 64


def _encoder(pool: str = "cls", masked: bool = True):
    """One BERT layer (embeddings, masked two-head attention, GELU FFN) over [1, seq] ids."""
    rng = np.random.default_rng(0)
    w = {}

    def p(name, *shape, scale=0.3):
        w[name] = (rng.standard_normal(shape) * scale).astype(np.float32)
        return name

    def c(name, value, dtype=np.int64):
        w[name] = np.asarray(value, dtype)
        return name

    d = H // HEADS
    n = []

    def op(kind, ins, out, **attrs):
        n.append(helper.make_node(kind, ins, [out], **attrs))
        return out

    tok = op("Gather", [p("emb", VOCAB, H), "ids"], "tok")
    shp = op("Shape", ["ids"], "shp")
    seq = op("Gather", [shp, c("one", 1)], "seq")
    pos_ids = op("Range", [c("zero", 0), seq, c("step", 1)], "pos_ids")
    pos = op("Gather", [p("pos_emb", POS, H), pos_ids], "pos")
    x = op("LayerNormalization", [op("Add", [tok, pos], "e"), p("g0", H), p("b0", H)], "x", axis=-1)

    def heads(name):
        y = op("MatMul", [x, p("w" + name, H, H)], name)
        r = op("Reshape", [y, c("hs", [1, -1, HEADS, d])], name + "r")
        return r

    q = op("Transpose", [heads("q")], "qt", perm=[0, 2, 1, 3])
    k = op("Transpose", [heads("k")], "kt", perm=[0, 2, 3, 1])
    v = op("Transpose", [heads("v")], "vt", perm=[0, 2, 1, 3])
    s = op("Div", [op("MatMul", [q, k], "qk"), c("sq", np.sqrt(d), np.float32)], "s")
    if not masked:  # no attention mask at all: only pyforge's own masks keep pads out
        n.append(helper.make_node("Identity", ["s"], ["sb"]))
    m = op("Cast", ["mask"], "mf", to=T.FLOAT)
    bias = op(
        "Mul",
        [op("Sub", [c("onef", 1.0, np.float32), m], "inv"), c("big", -1e4, np.float32)],
        "bias",
    )
    bias = op("Unsqueeze", [bias, c("ax12", [1, 2])], "bias4")
    prob = op("Softmax", [op("Add", [s, bias], "sb") if masked else "sb"], "prob", axis=-1)
    ctx = op("Transpose", [op("MatMul", [prob, v], "ctx")], "ctxt", perm=[0, 2, 1, 3])
    ctx = op("Reshape", [ctx, c("flat", [1, -1, H])], "ctxr")
    a = op("Add", [x, op("MatMul", [ctx, p("wo", H, H)], "ao")], "res")
    a = op("LayerNormalization", [a, p("g1", H), p("b1", H)], "a", axis=-1)
    f = op("MatMul", [a, p("w1", H, 2 * H)], "f1")
    f = op(
        "Mul",
        [f, op("Sigmoid", [op("Mul", [f, c("gelu_k", 1.702, np.float32)], "fk")], "fs")],
        "gelu",
    )
    hidden = op(
        "LayerNormalization",
        [op("Add", [a, op("MatMul", [f, p("w2", 2 * H, H)], "f2")], "r2"), p("g2", H), p("b2", H)],
        "hidden",
        axis=-1,
    )
    if pool == "cls":
        op("Tanh", [op("Gather", [hidden, c("cls", 0)], "first", axis=1)], "pooled")
    else:  # mean over positions, pads included: padding would change it
        op("ReduceMean", [hidden, c("ax1", [1])], "pooled", keepdims=0)
    if not masked:
        n = [node for node in n if node.output[0] not in ("mf", "inv", "bias", "bias4")]
    inputs = [helper.make_tensor_value_info("ids", T.INT64, [1, "seq"])]
    inputs += [helper.make_tensor_value_info("mask", T.INT64, [1, "seq"])] if masked else []
    g = helper.make_graph(
        n,
        "encoder",
        inputs,
        [
            helper.make_tensor_value_info("hidden", T.FLOAT, [1, "seq", H]),
            helper.make_tensor_value_info("pooled", T.FLOAT, [1, H]),
        ],
        [numpy_helper.from_array(a, k) for k, a in w.items()],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def _feeds(length, seed):
    rng = np.random.default_rng(seed)
    return {"ids": rng.integers(1, VOCAB, (1, length)), "mask": np.ones((1, length), np.int64)}


def test_bucketed_encoder_equals_the_unpadded_run_and_ort():
    model = _encoder()
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    plain = pyforge.compile(model, target="cpu")
    bucketed = pyforge.compile(model, target="cpu", buckets={"seq": [8, 16]})
    for length, seed in [(5, 0), (8, 1), (3, 2), (13, 3)]:
        feeds = _feeds(length, seed)
        want = dict(zip(["hidden", "pooled"], sess.run(None, feeds)))
        got, alone = bucketed.predict(feeds), plain.predict(feeds)
        for name, ref in want.items():
            assert got[name].shape == ref.shape
            np.testing.assert_allclose(got[name], alone[name], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5)
    # four lengths, two plans: one per bucket
    assert [p["ids"] for p in bucketed.stats["plans"]] == [(1, 8), (1, 16)]
    assert bucketed.input_names == ["ids", "mask"]
    with pytest.raises(errors.InputError, match="over the largest bucket 16"):
        bucketed.predict(_feeds(17, 0))


def test_padding_is_exact_where_the_model_has_no_mask():
    # without pyforge's own masks the padded positions would take attention weight
    model = _encoder(masked=False)
    bucketed = pyforge.compile(model, target="cpu", buckets={"seq": [16]})
    plain = pyforge.compile(model, target="cpu")
    feeds = {"ids": _feeds(6, 7)["ids"]}
    got, alone = bucketed.predict(feeds), plain.predict(feeds)
    for name in ("hidden", "pooled"):
        np.testing.assert_allclose(got[name], alone[name], rtol=1e-5, atol=1e-6)


def test_a_model_padding_cannot_keep_exact_is_refused_naming_the_node():
    with pytest.raises(errors.OptionError, match=r"not exact at node .*\(ReduceMean\).*count"):
        pyforge.compile(_encoder(pool="mean"), target="cpu", buckets={"seq": [8, 16]})
    with pytest.raises(errors.OptionError, match="no input has a dim named 'len'"):
        pyforge.compile(_encoder(), target="cpu", buckets={"len": [8]})
    with pytest.raises(errors.OptionError, match="buckets takes"):
        pyforge.compile(_encoder(), target="cpu", buckets={"seq": []})
