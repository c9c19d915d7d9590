"""ScatterElements, ScatterND and the int8 ops (QuantizeLinear, DequantizeLinear,
DynamicQuantizeLinear, MatMulInteger) against ORT, fused and unfused."""

import numpy as np
import pytest
from onnx import helper

import pyforge
from pyforge.errors import IndexRangeError, ShapeError
from tests.helpers import check_against_ort, make_model

REDUCTIONS = ["none", "add", "mul", "max", "min"]


def _scatter_model(op, data, idx, upd, tail, **attrs):
    """One scatter node (with a Neg after it when ``tail``) over run-time data/indices/updates."""
    out = "s" if tail else "y"
    nodes = [helper.make_node(op, ["x", "i", "u"], [out], name="sc", **attrs)]
    if tail:
        nodes.append(helper.make_node("Neg", ["s"], ["y"]))
    inputs = [("x", np.float32, list(data)), ("i", np.int64, list(idx)), ("u", np.float32, upd)]
    return make_model(nodes, inputs, [("y", np.float32, list(data))], opset=18)


def _attrs(reduction, **extra):
    return extra if reduction == "none" else dict(extra, reduction=reduction)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize(
    "data,idx,axis", [((3, 4, 5), (2, 3, 5), 1), ((3, 4, 5), (3, 4, 2), -1), ((6,), (4,), 0)]
)
@pytest.mark.parametrize("fusion", [True, False])
def test_scatter_elements_matches_ort(reduction, data, idx, axis, fusion):
    rng = np.random.default_rng(21)
    d = data[axis]
    if reduction == "none":  # repeated indices leave the winner open: distinct along the axis
        i = np.argsort(rng.random((*idx[: axis % len(idx)], d, *idx[axis % len(idx) + 1 :])), axis)
        i = np.take(i, np.arange(idx[axis]), axis) - d * rng.integers(0, 2, idx)
    else:  # repeats (and negatives) are combined in
        i = rng.integers(-d, d, idx)
    feeds = {
        "x": rng.standard_normal(data).astype(np.float32),
        "i": i.astype(np.int64),
        "u": rng.standard_normal(idx).astype(np.float32),
    }
    model = _scatter_model(
        "ScatterElements", data, idx, list(idx), fusion, **_attrs(reduction, axis=axis)
    )
    check_against_ort(model, feeds, fusion=fusion)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize(
    "data,idx", [((4, 5, 6), (3, 1)), ((4, 5, 6), (2, 3, 2)), ((4, 5), (5, 2))]
)
@pytest.mark.parametrize("fusion", [True, False])
def test_scatter_nd_matches_ort(reduction, data, idx, fusion):
    rng = np.random.default_rng(22)
    k, n = idx[-1], int(np.prod(idx[:-1]))
    if reduction == "none":  # distinct index tuples
        flat = rng.permutation(int(np.prod(data[:k])))[:n]
    else:
        flat = rng.integers(0, int(np.prod(data[:k])), n)
    i = np.stack(np.unravel_index(flat, data[:k]), -1).reshape(idx)
    i = i - np.array(data[:k]) * rng.integers(0, 2, idx)  # some negative
    upd = [*idx[:-1], *data[k:]]
    feeds = {
        "x": rng.standard_normal(data).astype(np.float32),
        "i": i.astype(np.int64),
        "u": rng.standard_normal(upd).astype(np.float32),
    }
    model = _scatter_model("ScatterND", data, idx, upd, fusion, **_attrs(reduction))
    check_against_ort(model, feeds, fusion=fusion)


def test_scatter_with_mismatched_updates_is_a_shape_error():
    model = _scatter_model("ScatterND", (4, 5), (3, 1), [3, 4], False)
    with pytest.raises(ShapeError, match="'sc'"):
        pyforge.compile(model)


def test_scatter_with_an_out_of_range_index_raises_at_predict():
    model = _scatter_model("ScatterElements", (3, 4), (3, 4), [3, 4], False, axis=1)
    compiled = pyforge.compile(model)
    feeds = {"x": np.ones((3, 4), np.float32), "u": np.ones((3, 4), np.float32)}
    with pytest.raises(IndexRangeError, match="out of range"):
        compiled.predict(dict(feeds, i=np.full((3, 4), 4, np.int64)))


# -- the int8 ops -------------------------------------------------------------------------------


def _qdq_model(dtype, axis_len):
    """x -> QuantizeLinear -> DequantizeLinear -> Relu, scale and zero point run-time inputs
    (per tensor when axis_len is None, else per axis 1)."""
    p = [] if axis_len is None else [axis_len]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], axis=1),
        helper.make_node("Relu", ["d"], ["y"]),
    ]
    inputs = [("x", np.float32, [2, 3, 4]), ("s", np.float32, p), ("z", dtype, p)]
    outputs = [("y", np.float32, [2, 3, 4]), ("q", dtype, [2, 3, 4])]
    return make_model(nodes, inputs, outputs, opset=13)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("axis_len", [None, 3])
@pytest.mark.parametrize("fusion", [True, False])
def test_quantize_dequantize_match_ort(dtype, axis_len, fusion):
    rng = np.random.default_rng(23)
    shape = () if axis_len is None else (axis_len,)
    lo = 0 if dtype == np.uint8 else -20
    feeds = {
        "x": (rng.standard_normal((2, 3, 4)) * 4).astype(np.float32),
        "s": rng.uniform(0.01, 0.1, shape).astype(np.float32),
        "z": rng.integers(lo, 20, shape).astype(dtype),
    }
    feeds["x"].flat[:3] = [1e9, -1e9, 0.0]  # saturation both ways
    check_against_ort(_qdq_model(dtype, axis_len), feeds, fusion=fusion)


def test_quantize_without_zero_point_is_uint8_and_matches_ort():
    node = helper.make_node("QuantizeLinear", ["x", "s"], ["y"])
    model = make_model(
        [node], [("x", np.float32, [3, 5]), ("s", np.float32, [])], [("y", np.uint8, [3, 5])]
    )
    x = np.random.default_rng(24).standard_normal((3, 5)).astype(np.float32)
    check_against_ort(model, {"x": x, "s": np.array(0.01, np.float32)})


def _dynamic_matmul_model(a_shape, b_shape):
    """quantize_dynamic's pattern: DynamicQuantizeLinear on the activation, MatMulInteger with
    an int8 weight, Cast, and the product of the two scales."""
    out = [*a_shape[:-1], b_shape[-1]]
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
        helper.make_node("MatMulInteger", ["q", "w", "z", "wz"], ["m"]),
        helper.make_node("Cast", ["m"], ["f"], to=1),
        helper.make_node("Mul", ["s", "ws"], ["ss"]),
        helper.make_node("Mul", ["f", "ss"], ["y"]),
    ]
    inputs = [("x", np.float32, list(a_shape)), ("w", np.uint8, list(b_shape))]
    inputs += [("wz", np.uint8, []), ("ws", np.float32, [])]
    outputs = [("y", np.float32, out), ("s", np.float32, []), ("z", np.uint8, [])]
    return make_model(nodes, inputs, outputs, opset=13)


@pytest.mark.parametrize("a_shape,b_shape", [((3, 8), (8, 5)), ((2, 3, 8), (8, 4))])
@pytest.mark.parametrize("fusion", [True, False])
def test_dynamic_quantize_and_matmul_integer_match_ort(a_shape, b_shape, fusion):
    rng = np.random.default_rng(25)
    feeds = {
        "x": (rng.standard_normal(a_shape) + 0.5).astype(np.float32),
        "w": rng.integers(0, 256, b_shape).astype(np.uint8),
        "wz": np.array(128, np.uint8),
        "ws": np.array(0.02, np.float32),
    }
    check_against_ort(_dynamic_matmul_model(a_shape, b_shape), feeds, fusion=fusion)


@pytest.mark.parametrize(
    "a_type,b_type,a_shape,b_shape",
    [
        (np.int8, np.int8, (3, 4), (4, 5)),
        (np.uint8, np.int8, (2, 1, 3, 4), (3, 4, 5)),
        (np.uint8, np.uint8, (2, 3, 4), (4, 5)),
    ],
)
def test_matmul_integer_with_zero_points_matches_ort(a_type, b_type, a_shape, b_shape):
    rng = np.random.default_rng(26)
    zb = [b_shape[-1]] if len(b_shape) == 2 else []  # ORT takes per-column ones for 2-d B
    out = [*np.broadcast_shapes(a_shape[:-2], b_shape[:-2]), a_shape[-2], b_shape[-1]]
    node = helper.make_node("MatMulInteger", ["a", "b", "za", "zb"], ["y"])
    inputs = [("a", a_type, list(a_shape)), ("b", b_type, list(b_shape))]
    inputs += [("za", a_type, []), ("zb", b_type, zb)]
    model = make_model([node], inputs, [("y", np.int32, out)], opset=13)
    feeds = {
        "a": rng.integers(0, 128, a_shape).astype(a_type),
        "b": rng.integers(0, 128, b_shape).astype(b_type),
        "za": np.array(7, a_type),
        "zb": rng.integers(0, 30, zb).astype(b_type),
    }
    check_against_ort(model, feeds)


@pytest.mark.parametrize("fusion", [True, False])
def test_blocked_quantisation_matches_ort(fusion):
    """Opset 21's blocks: each scale covers 2 elements along axis 1 (the last block short)."""
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1, block_size=2),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1, block_size=2),
    ]
    inputs = [("x", np.float32, [3, 5]), ("s", np.float32, [3, 3]), ("z", np.int8, [3, 3])]
    outputs = [("y", np.float32, [3, 5]), ("q", np.int8, [3, 5])]
    model = make_model(nodes, inputs, outputs, opset=21)
    rng = np.random.default_rng(29)
    feeds = {
        "x": (rng.standard_normal((3, 5)) * 3).astype(np.float32),
        "s": rng.uniform(0.02, 0.1, (3, 3)).astype(np.float32),
        "z": rng.integers(-10, 10, (3, 3)).astype(np.int8),
    }
    check_against_ort(model, feeds, fusion=fusion)


@pytest.mark.parametrize(
    "a_shape,b_shape,per_column", [((3, 8), (8, 5), True), ((2, 3, 8), (2, 8, 4), False)]
)
@pytest.mark.parametrize("fusion", [True, False])
def test_qlinear_matmul_matches_ort(a_shape, b_shape, per_column, fusion):
    rng = np.random.default_rng(27)
    col = [b_shape[-1]] if per_column else []
    names = ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"]
    nodes = [
        helper.make_node("QLinearMatMul", names, ["q"]),
        helper.make_node("DequantizeLinear", ["q", "sy", "zy"], ["y"]),
    ]
    out = [*a_shape[:-1], b_shape[-1]]
    types = [np.uint8, np.float32, np.uint8, np.int8, np.float32, np.int8, np.float32, np.uint8]
    shapes = [a_shape, [], [], b_shape, col, col, [], []]
    inputs = [(n, t, list(s)) for n, t, s in zip(names, types, shapes)]
    model = make_model(nodes, inputs, [("y", np.float32, out), ("q", np.uint8, out)], opset=13)
    feeds = {
        "a": rng.integers(0, 256, a_shape).astype(np.uint8),
        "sa": np.array(0.05, np.float32),
        "za": np.array(120, np.uint8),
        # ORT's uint8 x int8 kernel (x86 without VNNI) sums product pairs in saturating int16:
        # |b| < 64 keeps every pair in range, so ORT computes the exact product pyforge does
        "b": rng.integers(-64, 64, b_shape).astype(np.int8),
        "sb": rng.uniform(0.01, 0.05, col).astype(np.float32),
        "zb": rng.integers(-5, 5, col).astype(np.int8),
        "sy": np.array(0.3, np.float32),
        "zy": np.array(100, np.uint8),
    }
    check_against_ort(model, feeds, fusion=fusion)


# -- cuda: the same kernels compiled for sm_90, and run on a real GPU where there is one ---------


def _cuda_cases():
    rng = np.random.default_rng(28)
    scatter = _scatter_model(
        "ScatterElements", (3, 4, 5), (2, 3, 5), [2, 3, 5], True, axis=1, reduction="add"
    )
    nd = _scatter_model("ScatterND", (4, 5, 6), (2, 3, 2), [2, 3, 6], False, reduction="mul")
    return [
        (
            scatter,
            {
                "x": rng.standard_normal((3, 4, 5)).astype(np.float32),
                "i": rng.integers(-4, 4, (2, 3, 5)),
                "u": rng.standard_normal((2, 3, 5)).astype(np.float32),
            },
        ),
        (
            nd,
            {
                "x": rng.standard_normal((4, 5, 6)).astype(np.float32),
                "i": np.stack([rng.integers(0, 4, (2, 3)), rng.integers(-5, 5, (2, 3))], -1),
                "u": rng.standard_normal((2, 3, 6)).astype(np.float32),
            },
        ),
        (
            _qdq_model(np.int8, 3),
            {
                "x": (rng.standard_normal((2, 3, 4)) * 4).astype(np.float32),
                "s": np.array([0.02, 0.05, 0.1], np.float32),
                "z": np.array([-3, 0, 7], np.int8),
            },
        ),
        (
            _dynamic_matmul_model((2, 3, 8), (8, 4)),
            {
                "x": rng.standard_normal((2, 3, 8)).astype(np.float32),
                "w": rng.integers(0, 256, (8, 4)).astype(np.uint8),
                "wz": np.array(128, np.uint8),
                "ws": np.array(0.02, np.float32),
            },
        ),
    ]


def test_cuda_kernels_compile_to_ptx(tmp_path):
    from tests.lower_numba.test_ptx import _kernels, _ptx_available, _ptx_of

    if not _ptx_available():
        pytest.skip("no NVVM/NVRTC to compile PTX")
    from pyforge.compiler import compile_to_plan

    for model, _ in _cuda_cases():
        plan, _ = compile_to_plan(model, specialize=True)
        for step in _kernels(plan):
            assert _ptx_of(plan, step, tmp_path), step.label


@pytest.mark.gpu
@pytest.mark.parametrize("case", range(4))
def test_scatter_and_quant_match_ort_on_cuda(case):
    model, feeds = _cuda_cases()[case]
    check_against_ort(model, feeds, target="cuda")
