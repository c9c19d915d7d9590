"""Gather, GatherElements and GatherND never read out of bounds: an index outside [-dim, dim)
raises on the cpu target (at run time) or at compile time (a constant index)."""

import numpy as np
import pytest
from onnx import helper, numpy_helper

import pyforge
from pyforge.errors import IndexRangeError
from tests.helpers import check_against_ort, make_model

rng = np.random.default_rng(20261)

# (op, attrs, data shape, index shape, output shape, indexed dims of one index column)
CASES = [
    ("Gather", {"axis": 1}, (3, 5, 4), (2, 3), (3, 2, 3, 4), 5),
    ("Gather", {"axis": 0}, (300, 8), (40, 9), (40, 9, 8), 300),  # rows x inner loop
    ("GatherElements", {"axis": 2}, (2, 3, 6), (2, 3, 4), (2, 3, 4), 6),
    ("GatherND", {"batch_dims": 1}, (2, 4, 5, 3), (2, 6, 2), (2, 6, 3), (4, 5)),
]


def _model(op, attrs, dshape, ishape, oshape, consts=()):
    node = helper.make_node(op, ["data", "idx"], ["y"], name=f"{op.lower()}_node", **attrs)
    inputs = [("data", np.float32, list(dshape))]
    if not consts:
        inputs.append(("idx", np.int64, list(ishape)))
    inits = [numpy_helper.from_array(c, "idx") for c in consts]
    return make_model([node], inputs, [("y", np.float32, list(oshape))], inits)


def _indices(ishape, dims):
    """Seeded indices in [-dim, dim), negative ones included."""
    d = np.broadcast_to(np.asarray(dims, np.int64), ishape)
    return (rng.integers(0, 1 << 30, ishape) % (2 * d) - d).astype(np.int64)


@pytest.mark.parametrize("op,attrs,dshape,ishape,oshape,dims", CASES)
def test_in_range_matches_ort(op, attrs, dshape, ishape, oshape, dims):
    data = rng.standard_normal(dshape).astype(np.float32)
    model = _model(op, attrs, dshape, ishape, oshape)
    check_against_ort(model, {"data": data, "idx": _indices(ishape, dims)})


@pytest.mark.parametrize("sign", [1, -1])
@pytest.mark.parametrize("op,attrs,dshape,ishape,oshape,dims", CASES)
def test_out_of_range_raises(op, attrs, dshape, ishape, oshape, dims, sign):
    compiled = pyforge.compile(_model(op, attrs, dshape, ishape, oshape), target="cpu")
    idx = _indices(ishape, dims)
    last = int(np.broadcast_to(np.asarray(dims), ishape).flat[-1])
    bad = last if sign > 0 else -last - 1
    idx.flat[-1] = bad
    data = rng.standard_normal(dshape).astype(np.float32)
    with pytest.raises(IndexRangeError, match=rf"{op}.*out of range \[-{last}, {last}\)"):
        compiled.predict({"data": data, "idx": idx})
    idx.flat[-1] = 0  # the same compiled model still answers correctly afterwards
    compiled.predict({"data": data, "idx": idx})


@pytest.mark.parametrize("op,attrs,dshape,ishape,oshape,dims", CASES)
def test_constant_out_of_range_is_refused_at_compile_time(op, attrs, dshape, ishape, oshape, dims):
    idx = _indices(ishape, dims)
    idx.flat[0] = int(np.broadcast_to(np.asarray(dims), ishape).flat[0])
    model = _model(op, attrs, dshape, ishape, oshape, consts=[idx])
    with pytest.raises(pyforge.errors.BadAttributeError, match=f"{op.lower()}_node.*out of range"):
        pyforge.compile(model, target="cpu")
