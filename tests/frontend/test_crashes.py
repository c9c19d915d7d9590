"""One-node models that used to crash or be refused though ORT runs them: Pad without its
constant value, Gather with run-time indices on a size-1 axis, MatMul whose batch dims both
broadcast, Gemm with a run-time C that broadcasts."""

import numpy as np
import pytest
from onnx import helper, numpy_helper

from pyforge.errors import ShapeError
from tests.helpers import check_against_ort, make_model

RNG = np.random.default_rng(13)


def _rand(shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("opset", [11, 13, 18, 19, 21])
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_without_constant_value_matches_ort(mode, opset):
    if mode == "wrap" and opset < 19:
        pytest.skip("wrap is a mode since opset 19")
    pads = numpy_helper.from_array(np.array([0, 1, 2, 0, 2, 1], np.int64), "pads")
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)
    model = make_model(
        [node], [("x", np.float32, [2, 3, 4])], [("y", np.float32, [2, 6, 7])], [pads], opset
    )
    check_against_ort(model, {"x": _rand((2, 3, 4))})


@pytest.mark.parametrize("fusion", [True, False])
def test_gather_with_runtime_indices_on_a_size_one_axis_matches_ort(fusion):
    node = helper.make_node("Gather", ["x", "i"], ["y"], axis=1)
    model = make_model(
        [node],
        [("x", np.float32, [3, 1, 4]), ("i", np.int64, [2, 2])],
        [("y", np.float32, [3, 2, 2, 4])],
    )
    feeds = {"x": _rand((3, 1, 4)), "i": np.array([[0, -1], [-1, 0]], np.int64)}
    check_against_ort(model, feeds, fusion=fusion)


@pytest.mark.parametrize(
    "sa,sb",
    [((2, 1, 4, 5), (3, 5, 6)), ((1, 3, 4, 5), (2, 1, 5, 6)), ((2, 3, 4, 5), (1, 5, 6))],
)
@pytest.mark.parametrize("fusion", [True, False])
def test_matmul_with_broadcasting_batch_dims_matches_ort(sa, sb, fusion):
    out = list(np.broadcast_shapes(sa[:-2], sb[:-2])) + [sa[-2], sb[-1]]
    nodes = [helper.make_node("MatMul", ["a", "b"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    model = make_model(
        nodes, [("a", np.float32, list(sa)), ("b", np.float32, list(sb))], [("y", np.float32, out)]
    )
    check_against_ort(model, {"a": _rand(sa), "b": _rand(sb)}, fusion=fusion)


def _gemm(c_shape, trans_a=0):
    a_shape = [5, 4] if trans_a else [4, 5]
    node = helper.make_node(
        "Gemm", ["a", "b", "c"], ["y"], transA=trans_a, alpha=0.5, beta=2.0, name="g"
    )
    inputs = [("a", np.float32, a_shape), ("b", np.float32, [5, 6])]
    return make_model(
        [node], inputs + [("c", np.float32, list(c_shape))], [("y", np.float32, [4, 6])]
    )


@pytest.mark.parametrize("c_shape", [(6,), (1, 6), (4, 1), (1,), ()])
@pytest.mark.parametrize("fusion", [True, False])
def test_gemm_with_a_runtime_broadcast_c_matches_ort(c_shape, fusion):
    feeds = {"a": _rand((5, 4)), "b": _rand((5, 6)), "c": _rand(c_shape)}
    check_against_ort(_gemm(c_shape, trans_a=1), feeds, fusion=fusion)


def test_gemm_with_a_c_that_does_not_broadcast_is_a_shape_error():
    import pyforge

    with pytest.raises(ShapeError, match="'g'.*broadcast"):
        pyforge.compile(_gemm((3,)))


@pytest.mark.gpu
def test_broadcast_matmul_and_gemm_c_match_ort_on_cuda():
    sa, sb = (2, 1, 4, 5), (3, 5, 6)
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    model = make_model(
        [node],
        [("a", np.float32, list(sa)), ("b", np.float32, list(sb))],
        [("y", np.float32, [2, 3, 4, 6])],
    )
    check_against_ort(model, {"a": _rand(sa), "b": _rand(sb)}, target="cuda")
    feeds = {"a": _rand((5, 4)), "b": _rand((5, 6)), "c": _rand((4, 1))}
    check_against_ort(_gemm((4, 1), trans_a=1), feeds, target="cuda")


@pytest.mark.parametrize("scale_shape, zero_shape", [((1,), ()), ((), (1,)), ((1,), (1,))])
def test_per_tensor_scale_and_zero_point_of_rank_0_and_1_mix(scale_shape, zero_shape):
    # ORT's quantize_static writes a (1,) scale beside a scalar zero point
    nodes = [
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
        helper.make_node("QuantizeLinear", ["d", "s", "z"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.full(scale_shape, 0.05, np.float32), "s"),
        numpy_helper.from_array(np.full(zero_shape, 128, np.uint8), "z"),
    ]
    model = make_model([nodes[0], nodes[1]], [("q", np.uint8, [6])], [("y", np.uint8, [6])], inits)
    q = np.random.default_rng(3).integers(0, 256, 6).astype(np.uint8)
    check_against_ort(model, {"q": q})


def test_an_empty_max_pool_of_a_constant_folds():
    # fuzzer seeds 12961 and 13841: the numpy reference viewed windows of an empty pool
    import onnxruntime as ort

    import pyforge

    w = np.random.default_rng(4).standard_normal((4, 3, 1)).astype(np.float32)
    attrs = dict(auto_pad="SAME_UPPER", ceil_mode=1, dilations=[2], kernel_shape=[3], strides=[2])
    nodes = [
        helper.make_node("MaxPool", ["w"], ["p"], **attrs),
        helper.make_node("Add", ["p", "x"], ["y"]),
    ]
    model = make_model(
        nodes,
        [("x", np.float32, [1])],
        [("y", np.float32, None)],
        [numpy_helper.from_array(w, "w")],
    )
    x = np.ones(1, np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    got = pyforge.compile(model, target="cpu").predict(x)
    assert got.shape == want.shape == (4, 3, 0)
