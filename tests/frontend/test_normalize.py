"""The frontend's normalize table: ONNX forms are the frontend's, the op table knows none."""

import dataclasses

import pytest

from pyforge.frontend.normalize import NORMALIZE, normalizes
from pyforge.ops import OPS, OpDef


def test_every_rule_is_for_an_onnx_op_of_the_table():
    assert set(NORMALIZE) <= {name for name, d in OPS.items() if not d.internal}
    # the ops whose ONNX form is already canonical
    assert {"MatMul", "Shape", "Size", "Range"} <= set(OPS) - set(NORMALIZE)


def test_op_table_has_no_import_rules():
    assert "normalize" not in {f.name for f in dataclasses.fields(OpDef)}


@pytest.mark.parametrize("op", ["Reshape", "NoSuchOp"])
def test_a_second_rule_or_an_unknown_op_is_refused(op):
    with pytest.raises(ValueError, match=op):
        normalizes(op)(lambda node: None)
