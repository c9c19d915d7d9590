"""Models ORT runs that once crashed pyforge with a non-pyforge exception: each now gives ORT's
answer (or, for a model ORT refuses too, a pyforge error)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

import pyforge
from pyforge.errors import PyforgeError
from tests.helpers import check_against_ort, make_model

F32 = np.float32


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(F32)


@pytest.mark.parametrize("fusion", [True, False])
@pytest.mark.parametrize("fmod", [1, 0])
def test_float_mod_matches_ort(fmod, fusion):
    rng = np.random.default_rng(1)
    node = helper.make_node("Mod", ["a", "b"], ["y"], fmod=fmod)
    io = [("a", F32, [12]), ("b", F32, [12])], [("y", F32, [12])]
    m = make_model([node], *io, opset=17 if fmod else 28)  # floored float Mod is opset 28's
    a = _rand(rng, 12) * 7
    b = _rand(rng, 12) * 2
    a[:3] = [-0.0, 5.0, -5.0]
    b[:4] = [3.0, -1.5, 1.5, 0.0]
    check_against_ort(m, {"a": a, "b": b}, fusion=fusion)


@pytest.mark.parametrize("fusion", [True, False])
def test_gemm_output_that_is_a_graph_output_and_feeds_an_activation(fusion):
    """MatMul, Gemm and Conv outputs each read by an activation and also returned."""
    rng = np.random.default_rng(2)
    inits = [
        numpy_helper.from_array(_rand(rng, 4, 3), "W"),
        numpy_helper.from_array(_rand(rng, 5, 4), "G"),
        numpy_helper.from_array(_rand(rng, 3, 2, 3, 3), "K"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["mm"]),
        helper.make_node("Relu", ["mm"], ["mm_act"]),
        helper.make_node("Gemm", ["x", "G"], ["gm"], transB=1),
        helper.make_node("Sigmoid", ["gm"], ["gm_act"]),
        helper.make_node("Conv", ["img", "K"], ["cv"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["cv"], ["cv_act"]),
    ]
    outs = [(o, F32, None) for o in ("mm", "mm_act", "gm", "gm_act", "cv", "cv_act")]
    m = make_model(nodes, [("x", F32, [2, 4]), ("img", F32, [1, 2, 5, 5])], outs, inits)
    feeds = {"x": _rand(rng, 2, 4), "img": _rand(rng, 1, 2, 5, 5)}
    check_against_ort(m, feeds, fusion=fusion)


@pytest.mark.parametrize("fusion", [True, False])
def test_vector_dot_plus_a_constant_scalar(fusion):
    """MatMul of two vectors is 0-d; a constant scalar Add fused after it."""
    rng = np.random.default_rng(3)
    c = numpy_helper.from_array(np.array(0.25, F32), "c")
    nodes = [
        helper.make_node("MatMul", ["a", "b"], ["h"]),
        helper.make_node("Add", ["h", "c"], ["y"]),
    ]
    m = make_model(nodes, [("a", F32, [6]), ("b", F32, [6])], [("y", F32, [])], [c])
    check_against_ort(m, {"a": _rand(rng, 6), "b": _rand(rng, 6)}, fusion=fusion)


def _gather_elements(indices: np.ndarray):
    rng = np.random.default_rng(4)
    data = numpy_helper.from_array(_rand(rng, 3, 4), "D")
    idx = numpy_helper.from_array(indices, "I")
    nodes = [
        helper.make_node("GatherElements", ["D", "I"], ["g"], axis=1),
        helper.make_node("Add", ["g", "x"], ["y"]),
    ]
    shape = list(indices.shape)
    return make_model(nodes, [("x", F32, shape)], [("y", F32, shape)], [data, idx])


def test_constant_gather_elements_with_a_smaller_index_tensor():
    m = _gather_elements(np.array([[0, 3, -1], [1, 0, 2]], np.int64))
    check_against_ort(m, {"x": _rand(np.random.default_rng(5), 2, 3)})


def test_constant_gather_elements_out_of_range_is_a_pyforge_error():
    m = _gather_elements(np.array([[0, 4], [1, 0]], np.int64))
    with pytest.raises(PyforgeError, match="GatherElements"):
        pyforge.compile(m, target="cpu")


def test_floored_float_mod_before_opset_28_is_a_pyforge_error():
    node = helper.make_node("Mod", ["a", "b"], ["y"], fmod=0)
    m = make_model([node], [("a", F32, [3]), ("b", F32, [3])], [("y", F32, [3])], opset=17)
    with pytest.raises(PyforgeError, match="Mod"):
        pyforge.compile(m, target="cpu")
