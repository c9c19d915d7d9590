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
