"""NaN, +-Inf, -0.0 and denormals through every float elementwise op, comparison and reduction,
compiled (one fused kernel per sweep) and constant-folded (the numpy references), against ORT.

Each sweep is one model: many ops over the same special-value inputs, one output per op, so the
whole sweep costs a kernel or two of JIT. Values must match ORT where both are numbers, NaN must
sit where ORT puts NaN, and a zero's sign must be ORT's.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

import pyforge
from tests.helpers import check_against_ort, make_model, run_ort

F32 = np.float32
SPECIAL = np.array(
    [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-40, -1e-40, 0.5, -0.5, 0.7, -1.5, 2.5, -3.0, 1e30],
    F32,
)

UNARY = [
    ("Relu", {}),
    ("Sigmoid", {}),
    ("Tanh", {}),
    ("Exp", {}),
    ("Log", {}),
    ("Sqrt", {}),
    ("Abs", {}),
    ("Reciprocal", {}),
    ("Floor", {}),
    ("Ceil", {}),
    ("Round", {}),
    ("Sign", {}),
    ("Erf", {}),
    ("Gelu", {}),
    ("Gelu", {"approximate": "tanh"}),
    ("LeakyRelu", {"alpha": 0.1}),
    ("HardSigmoid", {}),
    ("HardSwish", {}),
    ("Sin", {}),
    ("Cos", {}),
    ("Atan", {}),
    ("Asinh", {}),
    ("Sinh", {}),
    ("Softplus", {}),
    ("Softsign", {}),
    ("Elu", {}),
    ("Selu", {}),
    ("Celu", {}),
    ("Mish", {}),
    ("ThresholdedRelu", {"alpha": 0.6}),
    ("Shrink", {"lambd": 0.6, "bias": 0.2}),
    ("IsNaN", {}),
    ("IsInf", {}),
]

BINARY = [
    ("Add", {}),
    ("Sub", {}),
    ("Mul", {}),
    ("Div", {}),
    ("Pow", {}),
    ("Max", {}),
    ("Min", {}),
    ("Sum", {}),
    ("Mean", {}),
    ("Mod", {"fmod": 1}),
    ("PRelu", {}),
    ("Equal", {}),
    ("Less", {}),
    ("LessOrEqual", {}),
    ("Greater", {}),
    ("GreaterOrEqual", {}),
]

REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1"]
REDUCE += ["ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin"]
ROWS = np.array(
    [
        [np.nan, 1, 2, 3],
        [1, 2, np.nan, -np.inf],
        [np.inf, -np.inf, 1, 2],
        [-0.0, -0.0, -0.0, -0.0],
        [-0.0, 0.0, -0.0, 0.0],
        [1e-40, -1e-40, 2e-40, 1e-40],
        [np.inf, 1, 2, np.inf],
        [-np.inf, -1, -np.inf, 0.5],
        [0.5, -1.5, 2.5, 0.25],
    ],
    F32,
)

# Where ORT and onnx.reference disagree on these inputs, pyforge follows the reference:
ORT_DEVIATES = {
    "Tanh",  # ORT's tanh(1e-40) is 9.9939e-41: its rational approximation loses denormals
    "Elu",  # ORT flushes Elu(-1e-40) to 0; expm1(-1e-40) is -1e-40
    "Selu",  # likewise, and ORT's Selu(-0.0) is +0.0
    "Celu",  # likewise
    "Clip(max only)",  # ORT's missing min is the lowest float, so Clip(-inf) is -3.4e38
    "ReduceMax",  # ORT's max drops a NaN that is not first in the row ([1, 2, nan, -inf] -> 2)
    "ReduceMin",  # likewise
    "ArgMax",  # ORT skips NaN; the reference (numpy) takes the first NaN as the extreme
    "ArgMin",  # likewise
}

# ... and where the reference is off the spec, pyforge follows ORT:
REFERENCE_DEVIATES = {
    "PRelu",  # the reference gives PRelu(-0.0, slope=inf) NaN; the spec's x >= 0 branch is -0.0
}

# Clip with and without bounds rides with the unary sweep (its bounds are inputs from opset 11)
CLIP_BOUNDS = (np.array(-0.6, F32), np.array(0.8, F32))


def _value_info(v: np.ndarray):
    return ("x", v.dtype, list(v.shape))


def _unary_nodes():
    nodes, outs = [helper.make_node("Neg", ["xn"], ["x"])], []
    for k, (op, attrs) in enumerate(UNARY):
        nodes.append(helper.make_node(op, ["x"], [f"u{k}"], **attrs))
        outs.append(f"u{k}")
    nodes.append(helper.make_node("Clip", ["x", "clo", "chi"], ["clip"]))
    nodes.append(helper.make_node("Clip", ["x", "", "chi"], ["clip_hi"]))
    return nodes, outs + ["clip", "clip_hi"]


def _binary_nodes():
    nodes = [helper.make_node("Neg", ["an"], ["a"]), helper.make_node("Neg", ["bn"], ["b"])]
    outs = []
    for k, (op, attrs) in enumerate(BINARY):
        nodes.append(helper.make_node(op, ["a", "b"], [f"b{k}"], **attrs))
        outs.append(f"b{k}")
    return nodes, outs


def _reduce_nodes():
    nodes, outs = [], []
    for k, op in enumerate(REDUCE):
        extra = {"axis": 1} if op.startswith("Arg") else {}
        ins = ["r"] if op.startswith("Arg") else ["r", "raxes"]
        nodes.append(helper.make_node(op, ins, [f"r{k}"], keepdims=0, **extra))
        outs.append(f"r{k}")
    return nodes, outs


def _model(nodes, outs, feeds: dict, consts: dict, folded: bool):
    """Feeds become initializers when ``folded``, so pyforge computes every op with numpy."""
    inits = [numpy_helper.from_array(v, k) for k, v in consts.items()]
    # a graph needs a run-time input: a bystander keeps one when everything else folds
    inputs = [("z", np.float32, [2])]
    nodes = [*nodes, helper.make_node("Neg", ["z"], ["zn"])]
    for name, v in feeds.items():
        if folded:
            inits.append(numpy_helper.from_array(v, name))
        else:
            inputs.append((name, v.dtype, list(v.shape)))
    outputs = [(o, np.float32, None) for o in [*outs, "zn"]]
    model = make_model(nodes, inputs, outputs, inits, opset=20)
    for o in model.graph.output:  # output types are left to ORT's own inference
        o.ClearField("type")
    return model


def _same(g: np.ndarray, w: np.ndarray, signed: bool = True) -> np.ndarray:
    """Where g is w: NaN where w is NaN, close numbers, and (``signed``) a zero of w's sign."""
    if w.dtype.kind != "f":
        return g == w
    same = (np.isnan(g) == np.isnan(w)) & (np.isclose(g, w, rtol=1e-4, atol=0) | np.isnan(w))
    return same & ((g != 0) | (w != 0) | (np.signbit(g) == np.signbit(w)) | (not signed))


def _mismatches(model, feeds: dict, names: list[str], ops: list[str], folded: bool) -> list[str]:
    from onnx.reference import ReferenceEvaluator

    feeds = {"z": np.array([1.5, -2.0], F32), **({} if folded else feeds)}
    compiled = pyforge.compile(model, target="cpu")
    got = compiled.predict(feeds)
    got = got if isinstance(got, dict) else {compiled.output_names[0]: got}
    out_names = [o.name for o in model.graph.output]
    ort = dict(zip(out_names, run_ort(model, feeds)))
    ref = dict(zip(out_names, ReferenceEvaluator(model).run(None, feeds)))
    bad = []
    for name, op in zip(names, ops):
        g, w, r = np.asarray(got[name]), ort[name], np.asarray(ref[name])
        if g.dtype != w.dtype or g.shape != w.shape:
            bad.append(f"{op}: {g.dtype}{g.shape} vs ORT {w.dtype}{w.shape}")
            continue
        # the reference is loose about the sign of zero: ORT's zero signs are the ones kept
        agree = bool(_same(r.astype(w.dtype), w, signed=False).all())
        if (op in ORT_DEVIATES or op in REFERENCE_DEVIATES) == agree:
            bad.append(f"{op}: ORT and the reference agree: {op} is listed as they differ")
        if not agree and op not in REFERENCE_DEVIATES:
            if op not in ORT_DEVIATES:
                bad.append(f"{op}: ORT {w.ravel().tolist()}, reference {r.ravel().tolist()}")
            w = r.astype(w.dtype)
        same = _same(g, w, signed=op not in ORT_DEVIATES)
        if not same.all():
            where = np.flatnonzero(~same.ravel())[:6]
            bad.append(f"{op} at {where.tolist()}: {g.ravel()[where]} vs {w.ravel()[where]}")
    return bad


def _check(nodes, outs, feeds, consts, ops, folded):
    model = _model(nodes, outs, feeds, consts, folded)
    bad = _mismatches(model, feeds, outs, ops, folded)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("folded", [False, True], ids=["kernel", "folded"])
def test_unary_special_values_match_ort(folded):
    nodes, outs = _unary_nodes()
    ops = [f"{op}{attrs or ''}" for op, attrs in UNARY] + ["Clip", "Clip(max only)"]
    feeds = {"xn": -SPECIAL}
    consts = {"clo": CLIP_BOUNDS[0], "chi": CLIP_BOUNDS[1]}
    _check(nodes, outs, feeds, consts, ops, folded)


@pytest.mark.parametrize("folded", [False, True], ids=["kernel", "folded"])
def test_binary_and_comparison_special_values_match_ort(folded):
    nodes, outs = _binary_nodes()
    a, b = np.repeat(SPECIAL, len(SPECIAL)), np.tile(SPECIAL, len(SPECIAL))
    feeds = {"an": -a, "bn": -b}
    _check(nodes, outs, feeds, {}, [f"{op}{attrs or ''}" for op, attrs in BINARY], folded)


@pytest.mark.parametrize("folded", [False, True], ids=["kernel", "folded"])
def test_reduce_special_values_match_ort(folded):
    nodes, outs = _reduce_nodes()
    consts = {"raxes": np.array([1], np.int64)}
    _check(nodes, outs, {"r": ROWS}, consts, REDUCE, folded)


@pytest.mark.parametrize("fusion", [True, False])
def test_int64_div_and_fmod_truncate_at_the_extremes(fusion):
    lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    a = np.array([lo, lo, hi, -7, 7, -7, 7, lo + 1, -1, 0], np.int64)
    b = np.array([4, 3, -5, 2, -2, -2, 2, -3, 5, -3], np.int64)
    nodes = [
        helper.make_node("Div", ["a", "b"], ["q"]),
        helper.make_node("Mod", ["a", "b"], ["r"], fmod=1),
        helper.make_node("Mod", ["a", "b"], ["m"]),
    ]
    i64 = [("a", np.int64, [10]), ("b", np.int64, [10])]
    model = make_model(nodes, i64, [(o, np.int64, [10]) for o in "qrm"])
    check_against_ort(model, {"a": a, "b": b}, fusion=fusion)


def test_sweep_kernels_compile_to_ptx(tmp_path):
    """The cuda forms of the same expressions type as the GPU types them (sm_90 PTX)."""
    ptx = pytest.importorskip("tests.lower_numba.test_ptx")
    if not ptx._ptx_available():
        pytest.skip("no NVVM/NVRTC to compile PTX")
    from pyforge.compiler import compile_to_plan

    feeds = {"xn": SPECIAL, "an": SPECIAL, "bn": SPECIAL, "r": ROWS}
    consts = {"clo": CLIP_BOUNDS[0], "chi": CLIP_BOUNDS[1], "raxes": np.array([1], np.int64)}
    for nodes_of in (_unary_nodes, _binary_nodes, _reduce_nodes):
        nodes, outs = nodes_of()
        used = {i for n in nodes for i in n.input}
        model = _model(nodes, outs, {k: v for k, v in feeds.items() if k in used}, consts, False)
        plan, _ = compile_to_plan(model)
        steps = ptx._kernels(plan)
        assert steps
        for step in steps:
            assert ptx._ptx_of(plan, step, tmp_path), step.label
