"""Unit tests of the graph passes: each pass keeps the IR valid and does what its name says."""

import numpy as np
import pytest
from onnx import helper, numpy_helper

import pyforge.compiler  # noqa: F401  (registers every pass)
from pyforge.errors import IRVerificationError
from pyforge.frontend import import_onnx
from pyforge.ir import Graph, Node, Value
from pyforge.models import MODELS
from pyforge.opt.passes import PassManager
from tests.helpers import make_model

rng = np.random.default_rng(7)


def conv_bn_relu_model():
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    bn = [
        rng.uniform(0.5, 1.5, 4),
        rng.standard_normal(4),
        rng.standard_normal(4),
        rng.uniform(0.5, 2, 4),
    ]
    inits = [numpy_helper.from_array(w, "w")] + [
        numpy_helper.from_array(a.astype(np.float32), n) for a, n in zip(bn, ["s", "b", "m", "v"])
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"], name="bn"),
        helper.make_node("Relu", ["n"], ["y"], name="relu"),
        helper.make_node("Neg", ["x"], ["dead"], name="unused"),
    ]
    return make_model(
        nodes, [("x", np.float32, [1, 3, 6, 6])], [("y", np.float32, [1, 4, 6, 6])], inits
    )


def test_bn_fold_removes_batchnorm_and_dce_removes_dead_nodes():
    graph = import_onnx(conv_bn_relu_model())
    assert [n.op for n in graph.nodes] == ["Conv", "BatchNormalization", "Relu", "Neg"]
    graph = PassManager(["bn_fold", "dce"]).run(graph)
    assert [n.op for n in graph.nodes] == ["Conv", "Relu"]
    assert len(graph.nodes[0].inputs) == 3  # the BN shift became the conv's bias


def test_bn_fold_is_exact_enough():
    from tests.helpers import check_against_ort

    model = conv_bn_relu_model()
    check_against_ort(model, {"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32)})


def test_fusion_groups_conv_epilogue():
    graph = import_onnx(conv_bn_relu_model())
    graph = PassManager(["bn_fold", "split_bias", "dce", "fuse"]).run(graph)
    (group,) = graph.nodes
    assert group.op == "Fused"
    assert [m.op for m in group.group.members] == ["Conv", "Add", "Relu"]
    assert group.group.anchor.op == "Conv"


def test_dump_ir_writes_one_file_per_pass(tmp_path, monkeypatch):
    monkeypatch.setenv("PYFORGE_DUMP_IR", str(tmp_path))
    PassManager(["const_fold", "dce", "fuse"]).run(import_onnx(MODELS["ew"]()))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["00_import.txt", "01_const_fold.txt", "02_dce.txt", "03_fuse.txt"]
    assert "Fused" in (tmp_path / "03_fuse.txt").read_text()


def test_pass_manager_times_every_pass():
    pm = PassManager(["const_fold", "dce"])
    pm.run(import_onnx(MODELS["mlp"]()))
    assert set(pm.timings) == {"const_fold", "dce"}


def test_verify_catches_use_before_definition():
    g = Graph()
    x = Value("x", (2,), np.dtype(np.float32))
    a = Value("a", (2,), np.dtype(np.float32))
    b = Value("b", (2,), np.dtype(np.float32))
    g.inputs = [x]
    g.add_node(Node("Relu", [a], [b], name="uses_a_too_early"))
    g.add_node(Node("Relu", [x], [a], name="defines_a"))
    g.outputs = [b]
    with pytest.raises(IRVerificationError, match="uses_a_too_early"):
        g.verify()
