"""RNN, GRU, LSTM and com.microsoft DynamicQuantizeLSTM (expanded at import) against ONNX Runtime:
directions, sequence_lens, initial states, peepholes, input_forget, linear_before_reset, layout,
clip and the activation functions, one node per model."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import pyforge
from pyforge.errors import BadAttributeError, UnsupportedOperatorError
from tests.helpers import ATOL, RTOL, check_against_ort, make_model, run_ort

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
SEQ, BATCH, INPUT, HIDDEN = 5, 4, 3, 6


def lengths(rng, seq=SEQ, batch=BATCH):
    """Random lengths in [1, seq] with at least one full and one short entry."""
    lens = rng.integers(1, seq + 1, batch).astype(np.int32)
    lens[0], lens[-1] = seq, rng.integers(1, seq)
    return lens


def rnn_model(
    kind,
    seed=0,
    direction="forward",
    layout=0,
    lens=False,
    init=False,
    peep=False,
    bias=True,
    fed=(),
    outputs=None,
    **attrs,
):
    """A one-node model; ``fed`` names the inputs given at run time (the rest are initializers),
    ``lens`` True for random sequence_lens. Returns (model, feeds, arrays by input name)."""
    rng = np.random.default_rng(seed)
    nd, g = (2 if direction == "bidirectional" else 1), GATES[kind]
    x_shape = (SEQ, BATCH, INPUT) if layout == 0 else (BATCH, SEQ, INPUT)
    state = (nd, BATCH, HIDDEN) if layout == 0 else (BATCH, nd, HIDDEN)
    arrays = {
        "X": rng.standard_normal(x_shape),
        "W": rng.standard_normal((nd, g * HIDDEN, INPUT)) * 0.6,
        "R": rng.standard_normal((nd, g * HIDDEN, HIDDEN)) * 0.6,
        "B": rng.standard_normal((nd, 2 * g * HIDDEN)) * 0.5 if bias else None,
        "sequence_lens": lengths(rng) if lens else None,
        "initial_h": rng.standard_normal(state) if init else None,
        "initial_c": rng.standard_normal(state) if init and kind == "LSTM" else None,
        "P": rng.standard_normal((nd, 3 * HIDDEN)) if peep else None,
    }
    arrays = {
        k: v if v is None or v.dtype == np.int32 else v.astype(np.float32)
        for k, v in arrays.items()
    }
    names = [k if arrays[k] is not None else "" for k in arrays]
    while not names[-1]:
        names.pop()
    if kind != "LSTM":
        names = names[:6]
    fed = {"X", *fed}
    inputs = [(n, arrays[n].dtype, arrays[n].shape) for n in names if n in fed]
    inits = [numpy_helper.from_array(arrays[n], n) for n in names if n and n not in fed]
    outs = outputs or ["Y", "Y_h", "Y_c"][: 3 if kind == "LSTM" else 2]
    node = helper.make_node(
        kind,
        names,
        outs,
        name=f"{kind.lower()}0",
        hidden_size=HIDDEN,
        direction=direction,
        layout=layout,
        **attrs,
    )
    model = make_model([node], inputs, [(o, np.float32, None) for o in outs if o], inits, opset=22)
    return model, {n: arrays[n] for n in names if n in fed}, arrays


CASES = {
    "rnn_forward": ("RNN", {}),
    "rnn_reverse_lens_init": ("RNN", dict(direction="reverse", lens=True, init=True)),
    "rnn_bidirectional_lens": ("RNN", dict(direction="bidirectional", lens=True, bias=False)),
    "gru_forward": ("GRU", {}),
    "gru_reverse_lens": ("GRU", dict(direction="reverse", lens=True, init=True)),
    "gru_bidirectional_lbr1_lens": (
        "GRU",
        dict(direction="bidirectional", lens=True, init=True, linear_before_reset=1),
    ),
    "gru_lbr1_no_bias": ("GRU", dict(linear_before_reset=1, bias=False, init=True)),
    "gru_clip": ("GRU", dict(clip=0.6, lens=True)),
    "lstm_forward": ("LSTM", {}),
    "lstm_reverse_lens_init": ("LSTM", dict(direction="reverse", lens=True, init=True)),
    "lstm_bidirectional_peep_lens": (
        "LSTM",
        dict(direction="bidirectional", lens=True, init=True, peep=True),
    ),
    "lstm_input_forget_clip": ("LSTM", dict(input_forget=1, clip=0.5, peep=True, init=True)),
    "lstm_all_fed": (
        "LSTM",
        dict(
            direction="bidirectional",
            lens=True,
            init=True,
            peep=True,
            fed=("W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"),
        ),
    ),
    "gru_lens_fed": ("GRU", dict(direction="bidirectional", lens=True, fed=("sequence_lens",))),
    "lstm_only_y_h": ("LSTM", dict(lens=True, outputs=["", "Y_h"])),
    "gru_only_y": ("GRU", dict(direction="reverse", lens=True, outputs=["Y"])),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_recurrent_matches_ort(case):
    kind, kw = CASES[case]
    model, feeds, _ = rnn_model(kind, seed=len(case), **kw)
    check_against_ort(model, feeds)


@pytest.mark.parametrize("kind", sorted(GATES))
def test_unfused_matches_ort(kind):
    model, feeds, _ = rnn_model(kind, seed=9, direction="bidirectional", lens=True, init=True)
    check_against_ort(model, feeds, fusion=False)


@pytest.mark.parametrize("fed", [False, True])
@pytest.mark.parametrize("kind", sorted(GATES))
def test_zero_length_entry_ends_in_zero_states(kind, fed):
    model, feeds, _ = rnn_model(
        kind, seed=2, direction="bidirectional", lens=True, init=True, fed=["sequence_lens"] * fed
    )
    lens = np.asarray([SEQ, 0, 2, 3], np.int32)
    if fed:
        feeds["sequence_lens"] = lens
    else:
        init = next(i for i in model.graph.initializer if i.name == "sequence_lens")
        init.CopyFrom(numpy_helper.from_array(lens, "sequence_lens"))
    check_against_ort(model, feeds)


ACTIVATION_CASES = {
    # LSTM (f, g, h) per direction; ORT hands alpha/beta only to functions that take them
    "lstm_scaled": (
        "LSTM",
        dict(
            direction="bidirectional",
            activations=["HardSigmoid", "ScaledTanh", "Softsign", "Sigmoid", "Affine", "Elu"],
            activation_alpha=[0.3, 1.2, 0.8, 0.7],
            activation_beta=[0.4, 0.9, 0.1],
        ),
    ),
    "gru_relu_family": (
        "GRU",
        dict(
            direction="bidirectional",
            activations=["Sigmoid", "LeakyRelu", "HardSigmoid", "ThresholdedRelu"],
            activation_alpha=[0.2, 0.25],
            activation_beta=[0.45],
            lens=True,
        ),
    ),
    "rnn_softplus": ("RNN", dict(activations=["Softplus"], init=True)),
    "rnn_relu_reverse": ("RNN", dict(direction="reverse", activations=["Relu"])),
    "lstm_default_alphas": ("LSTM", dict(activations=["HardSigmoid", "LeakyRelu", "Elu"])),
}


@pytest.mark.parametrize("case", sorted(ACTIVATION_CASES))
def test_activations_match_ort(case):
    kind, kw = ACTIVATION_CASES[case]
    model, feeds, _ = rnn_model(kind, seed=7, **kw)
    check_against_ort(model, feeds)


@pytest.mark.parametrize("kind", sorted(GATES))
def test_layout_1_matches_ort_on_the_transposed_model(kind):
    """ORT refuses layout=1, so its reference is the layout-0 model on transposed inputs."""
    kw = dict(direction="bidirectional", lens=True, init=True, peep=kind == "LSTM")
    model1, feeds1, arrays = rnn_model(kind, seed=3, layout=1, **kw)
    model0, _, _ = rnn_model(kind, seed=3, layout=0, **kw)
    for init in model0.graph.initializer:  # the same states, in layout 0's axis order
        if init.name in ("initial_h", "initial_c"):
            state = arrays[init.name].transpose(1, 0, 2).copy()
            init.CopyFrom(numpy_helper.from_array(state, init.name))
    got = pyforge.compile(model1, target="cpu").predict(feeds1)
    want = run_ort(model0, {"X": arrays["X"].transpose(1, 0, 2)})
    perms = {"Y": (2, 0, 1, 3), "Y_h": (1, 0, 2), "Y_c": (1, 0, 2)}
    for (name, perm), ref in zip(perms.items(), want):
        np.testing.assert_allclose(got[name], ref.transpose(perm), RTOL, ATOL, err_msg=name)


def test_lstm_seq16_launches_stay_per_step():
    """One step of a 1-layer LSTM is a handful of launches, not one per emitted node."""
    model, feeds, _ = rnn_model("LSTM", seed=5)
    compiled, _ = check_against_ort(model, feeds)
    assert compiled.stats["launches"] <= 8 * SEQ, compiled.stats["launches"]


def _quantize(w, dtype, per_column, rng):
    """Per-direction or per-column scales and zero points of the ORT layout [dirs, in, 4H]
    (ORT takes int8 weights only with zero points of 0, and one zero point for all columns)."""
    lo, hi = (-128, 127) if dtype == np.int8 else (0, 255)
    amax = np.abs(w).max(axis=1 if per_column else (1, 2), keepdims=True)
    scale = (amax / 100).astype(np.float32)
    zp = np.full(scale.shape, rng.integers(125, 132) if dtype == np.uint8 else 0)
    q = np.clip(np.round(w / scale) + zp, lo, hi)
    shape = (w.shape[0], -1) if per_column else (w.shape[0],)
    scale, zp = scale.reshape(shape), zp.reshape(shape).astype(dtype)
    return q.astype(dtype), scale, zp


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("per_column", [False, True])
def test_dynamic_quantize_lstm(dtype, per_column):
    """Exact against ORT's float LSTM with the dequantized weights. ORT's own kernel also
    quantizes X and each h to uint8 (range / 255 steps), which costs it up to ~0.1 here; a
    misread scale or gate order would be off by O(1)."""
    rng = np.random.default_rng(11)
    direction = "bidirectional" if per_column else "reverse"
    ref, _, arrays = rnn_model(
        "LSTM", seed=11, direction=direction, lens=True, init=True, peep=True
    )
    nd = 2 if per_column else 1
    w = rng.standard_normal((nd, INPUT, 4 * HIDDEN)).astype(np.float32) * 0.6
    r = rng.standard_normal((nd, HIDDEN, 4 * HIDDEN)).astype(np.float32) * 0.6
    (wq, ws, wz), (rq, rs, rz) = (
        _quantize(w, dtype, per_column, rng),
        _quantize(r, dtype, per_column, rng),
    )
    deq = lambda q, s, z: (q.astype(np.float32) - z.reshape(nd, 1, -1)) * s.reshape(nd, 1, -1)
    arrays = dict(arrays, W=wq, R=rq, W_scale=ws, W_zero_point=wz, R_scale=rs, R_zero_point=rz)
    names = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
    names += ["W_scale", "W_zero_point", "R_scale", "R_zero_point"]
    node = helper.make_node(
        "DynamicQuantizeLSTM",
        names,
        ["Y", "Y_h", "Y_c"],
        name="dqlstm0",
        domain="com.microsoft",
        hidden_size=HIDDEN,
        direction=direction,
    )
    inits = [numpy_helper.from_array(arrays[n], n) for n in names[1:]]
    model = make_model(
        [node],
        [("X", np.float32, arrays["X"].shape)],
        [(o, np.float32, None) for o in ("Y", "Y_h", "Y_c")],
        inits,
        opset=17,
    )
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    feeds = {"X": arrays["X"]}
    got = pyforge.compile(model, target="cpu").predict(feeds)
    for init in ref.graph.initializer:  # the float LSTM: ONNX layout [dirs, 4H, in] of the same
        if init.name in ("W", "R"):
            q = (wq, ws, wz) if init.name == "W" else (rq, rs, rz)
            init.CopyFrom(numpy_helper.from_array(deq(*q).transpose(0, 2, 1).copy(), init.name))
    for name, want, approx in zip(("Y", "Y_h", "Y_c"), run_ort(ref, feeds), run_ort(model, feeds)):
        np.testing.assert_allclose(got[name], want, RTOL, ATOL, err_msg=name)
        np.testing.assert_allclose(got[name], approx, rtol=0, atol=0.15, err_msg=name)


def test_unmapped_activation_is_refused_naming_the_node():
    model, _, _ = rnn_model("RNN", activations=["Gelu"])
    with pytest.raises(UnsupportedOperatorError, match="rnn0.*Gelu"):
        pyforge.compile(model, target="cpu")


@pytest.mark.parametrize(
    "attrs,match",
    [
        (dict(direction="sideways"), "direction"),
        (dict(activations=["Sigmoid"]), "activations"),
    ],
)
def test_bad_attributes_are_refused(attrs, match):
    model, _, _ = rnn_model("GRU", **attrs)
    with pytest.raises(BadAttributeError, match=match):
        pyforge.compile(model, target="cpu")


def test_weight_of_the_wrong_shape_is_refused():
    model, _, _ = rnn_model("LSTM", init=True)
    init = next(i for i in model.graph.initializer if i.name == "R")
    init.CopyFrom(numpy_helper.from_array(np.ones((1, 4 * HIDDEN, HIDDEN + 1), np.float32), "R"))
    with pytest.raises(BadAttributeError, match="lstm0.*input 2 has shape"):
        pyforge.compile(model, target="cpu")


def test_hidden_size_left_out_is_read_from_r():
    """ORT insists on hidden_size; ONNX leaves it optional. The reference keeps it."""
    model, feeds, _ = rnn_model("GRU", direction="reverse", lens=True)
    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    attrs = bare.graph.node[0].attribute
    attrs.remove(next(a for a in attrs if a.name == "hidden_size"))
    got = pyforge.compile(bare, target="cpu").predict(feeds)
    for name, want in zip(("Y", "Y_h"), run_ort(model, feeds)):
        np.testing.assert_allclose(got[name], want, RTOL, ATOL, err_msg=name)


def test_sequence_lens_past_the_sequence_is_refused():
    model, _, _ = rnn_model("LSTM", lens=True)
    init = next(i for i in model.graph.initializer if i.name == "sequence_lens")
    init.CopyFrom(numpy_helper.from_array(np.full(BATCH, SEQ + 1, np.int32), "sequence_lens"))
    with pytest.raises(BadAttributeError, match="sequence_lens"):
        pyforge.compile(model, target="cpu")


def test_quantized_lstm_with_a_fed_weight_is_refused():
    x = helper.make_tensor_value_info("W", onnx.TensorProto.INT8, [1, INPUT, 4 * HIDDEN])
    node = helper.make_node(
        "DynamicQuantizeLSTM",
        ["X", "W", "R"],
        ["Y"],
        domain="com.microsoft",
        hidden_size=HIDDEN,
        name="dq",
    )
    r = numpy_helper.from_array(np.ones((1, HIDDEN, 4 * HIDDEN), np.int8), "R")
    model = make_model(
        [node], [("X", np.float32, (SEQ, BATCH, INPUT))], [("Y", np.float32, None)], [r]
    )
    model.graph.input.append(x)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    with pytest.raises(UnsupportedOperatorError, match="dq.*constant"):
        pyforge.compile(model, target="cpu")
