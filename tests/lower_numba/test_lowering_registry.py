"""Every op that can reach lowering has a lowering, of a form that agrees with the op table, and
the templates package imports without cycles or private cross-module names."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx.defs
import pytest
from onnx import helper, numpy_helper

import pyforge.lower_numba.lower  # loads every lowering
from pyforge.errors import UnsupportedOperatorError
from pyforge.frontend.normalize import NORMALIZE
from pyforge.ir import Node, Value
from pyforge.lower_numba.registry import EPILOGUE_FORMS, LOWERINGS, forms_of, lowering_for
from pyforge.ops import OPS, OpDef
from tests.helpers import check_against_ort, make_model

LOWER = Path(pyforge.lower_numba.lower.__file__).parent

# ops whose normalise rule rewrites them into another op, checked below to still do so
RENAMED = {"CastLike": "Cast"}


def _folds_at_import(opdef: OpDef) -> bool:
    """The frontend folds it whatever the model: its result depends on shapes only, or every
    input its ONNX schema allows must be a constant (Constant has none)."""
    if opdef.shape_only:
        return True
    if opdef.internal or not onnx.defs.has(opdef.name):
        return False
    schema = onnx.defs.get_schema(opdef.name)
    n = schema.max_input  # 2**31 - 1 for a variadic input
    return n <= len(opdef.const_inputs) and set(range(n)) <= set(opdef.const_inputs)


def reaches_lowering(opdef: OpDef) -> bool:
    """A view lowers to an alias, a folded op never gets there, a renamed one arrives renamed."""
    return opdef.kind != "view" and not _folds_at_import(opdef) and opdef.name not in RENAMED


def test_every_op_that_reaches_lowering_has_one():
    missing = [op for op, d in sorted(OPS.items()) if reaches_lowering(d) and op not in LOWERINGS]
    assert not missing, f"ops with no lowering (register one in lower_numba/templates/): {missing}"


def test_the_rule_skips_only_views_folded_and_renamed_ops():
    skipped = {op for op, d in OPS.items() if not reaches_lowering(d)}
    views = {op for op, d in OPS.items() if d.kind == "view"}
    assert skipped - views == {
        "CastLike",
        "Compress",
        "Constant",
        "ConstantOfShape",
        "EyeLike",
        "NonMaxSuppression",
        "NonZero",
        "Range",
        "Shape",
        "Size",
        "Unique",
    }


def test_renamed_ops_arrive_as_an_op_with_a_lowering():
    x, like = Value("x", (2,), np.dtype(np.float32)), Value("y", (2,), np.dtype(np.int32))
    for op, target in RENAMED.items():
        node = Node(op, [x, like], [], {}, "n", 19)
        NORMALIZE[op](node)
        assert node.op == target and target in LOWERINGS


def test_no_lowering_for_an_op_the_table_does_not_know():
    assert not set(LOWERINGS) - set(OPS)


def test_forms_agree_with_kind_and_epilogue_flag():
    wrong = {}
    for op, entries in sorted(LOWERINGS.items()):
        d, forms = OPS[op], forms_of(op)
        if (d.kind == "elementwise") != (forms == {"scalar"}):
            wrong[op] = f"kind {d.kind}, forms {sorted(forms)}"
        elif d.kind != "elementwise" and d.epilogue != (forms <= set(EPILOGUE_FORMS)):
            wrong[op] = f"epilogue={d.epilogue}, forms {sorted(forms)}"
    assert not wrong, wrong


def test_every_epilogue_op_has_an_element_or_gemm_lowering():
    for op, d in OPS.items():
        if d.epilogue:
            assert forms_of(op) and forms_of(op) <= set(EPILOGUE_FORMS), op


def test_conv_picks_its_lowering_by_group():
    def conv(group):
        return Node("Conv", [], [], {"group": group}, "c", 17)

    assert lowering_for(conv(1)).form == "gemm"
    assert lowering_for(conv(4)).form == "element"
    with pytest.raises(UnsupportedOperatorError, match="no lowering"):
        lowering_for(Node("ConvNHWC", [], [], {"group": 2}, "c", 17))


def _template_modules() -> list[str]:
    return sorted(
        f"pyforge.lower_numba.templates.{p.stem}"
        for p in (LOWER / "templates").glob("*.py")
        if p.stem != "__init__"
    )


def test_each_templates_module_imports_alone():
    for mod in _template_modules():
        cmd = [sys.executable, "-c", f"import {mod}"]
        proc = subprocess.run(cmd, capture_output=True, check=False)
        assert proc.returncode == 0, f"{mod}:\n{proc.stderr.decode()[-2000:]}"


def test_no_private_name_is_imported_across_lowering_modules():
    bad = []
    for path in sorted(LOWER.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                bad += [f"{path.name}: {a.name}" for a in node.names if a.name.startswith("_")]
    assert not bad, bad


def _bn_model(shape, consts: dict):
    """BatchNormalization whose scale/bias/mean/var are graph inputs, except those in consts."""
    names = ["scale", "bias", "mean", "var"]
    node = helper.make_node("BatchNormalization", ["x", *names], ["y"], epsilon=1e-3, name="bn")
    inputs = [("x", np.float32, list(shape))]
    inputs += [(n, np.float32, [shape[1]]) for n in names if n not in consts]
    inits = [numpy_helper.from_array(a, n) for n, a in consts.items()]
    return make_model([node], inputs, [("y", np.float32, list(shape))], inits)


@pytest.mark.parametrize(
    "shape,const", [((2, 3, 4, 5), ()), ((3, 6), ()), ((2, 4, 7), ()), ((2, 3, 4, 4), ("scale",))]
)
def test_batchnorm_with_runtime_statistics_matches_ort(shape, const):
    rng = np.random.default_rng(7)
    c = shape[1]
    stats = {
        "scale": rng.standard_normal(c).astype(np.float32),
        "bias": rng.standard_normal(c).astype(np.float32),
        "mean": rng.standard_normal(c).astype(np.float32),
        "var": (np.abs(rng.standard_normal(c)) + 0.1).astype(np.float32),
    }
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    feeds |= {n: a for n, a in stats.items() if n not in const}
    model = _bn_model(shape, {n: stats[n] for n in const})
    compiled, _ = check_against_ort(model, feeds)
    assert "BatchNormalization" in " ".join(compiled.plan.step_labels())


def test_batchnorm_with_runtime_statistics_takes_an_epilogue():
    rng = np.random.default_rng(8)
    shape = (2, 3, 4, 5)
    bn = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["t"], name="bn")
    tail = [helper.make_node("Relu", ["t"], ["r"]), helper.make_node("Neg", ["r"], ["y"])]
    inputs = [("x", np.float32, list(shape))] + [(n, np.float32, [3]) for n in "sbmv"]
    model = make_model([bn, *tail], inputs, [("y", np.float32, list(shape))])
    feeds = {n: rng.standard_normal(3).astype(np.float32) for n in "sbm"}
    feeds |= {"x": rng.standard_normal(shape).astype(np.float32)}
    feeds["v"] = (np.abs(rng.standard_normal(3)) + 0.1).astype(np.float32)
    fused, _ = check_against_ort(model, feeds)
    unfused, _ = check_against_ort(model, feeds, fusion=False)
    assert (fused.stats["launches"], unfused.stats["launches"]) == (1, 3)


def test_every_op_read_from_onnx_has_a_shape_rule():
    # no op's shapes come from running its numpy reference on dummy inputs
    assert not [op for op, d in OPS.items() if d.infer is None and not d.internal]
