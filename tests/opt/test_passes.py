"""Unit tests of the graph passes: each pass keeps the IR valid and does what its name says."""

import numpy as np
import pytest
from onnx import helper, numpy_helper

import pyforge
import pyforge.compiler  # registers every pass
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


def unit_transpose_model():
    """x (1, 1, 4, 3): a Transpose moving only the 1s (a view) and one swapping 4 and 3."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3], name="units"),
        helper.make_node("Transpose", ["r"], ["s"], perm=[0, 1, 3, 2], name="swap"),
        helper.make_node("Neg", ["t"], ["y"], name="neg"),
        helper.make_node("Neg", ["s"], ["z"], name="neg2"),
    ]
    outs = [("y", np.float32, [1, 4, 1, 3]), ("z", np.float32, [1, 1, 3, 4])]
    return make_model(nodes, [("x", np.float32, [1, 1, 4, 3])], outs)


def test_unit_transpose_makes_a_view_of_a_transpose_that_keeps_the_order():
    from tests.helpers import check_against_ort

    graph = PassManager(["unit_transpose"]).run(import_onnx(unit_transpose_model()))
    assert [n.op for n in graph.nodes] == ["Relu", "Reshape", "Transpose", "Neg", "Neg"]
    x = rng.standard_normal((1, 1, 4, 3)).astype(np.float32)
    check_against_ort(unit_transpose_model(), {"x": x})


def shared_input_matmuls_model():
    """Three MatMuls of x by constants (one of them read by a GEMM, one by a Slice whose
    result a GEMM reads at a 4-byte offset) and two by one input matrix."""
    ws = {n: rng.standard_normal(s).astype(np.float32) for n, s in
          (("w1", (64, 64)), ("w2", (64, 64)), ("w3", (64, 16)), ("w4", (64, 8)), ("w5", (15, 8)))}  # fmt: skip
    inits = [numpy_helper.from_array(a, n) for n, a in ws.items()]
    inits += [numpy_helper.from_array(np.array(v, np.int64), n)
              for n, v in (("s", [1]), ("e", [16]), ("ax", [2]))]  # fmt: skip
    nodes = [
        helper.make_node("MatMul", ["x", w], [o])
        for w, o in (("w1", "a"), ("w2", "b"), ("w3", "c"))
    ]
    nodes += [helper.make_node("MatMul", ["b", "w4"], ["bw"]), helper.make_node("Relu", ["a"], ["ra"]),
              helper.make_node("Slice", ["c", "s", "e", "ax"], ["cs"]),
              helper.make_node("MatMul", ["cs", "w5"], ["cw"]), helper.make_node("Neg", ["c"], ["nc"]),
              helper.make_node("MatMul", ["ra", "w1"], ["y"]), helper.make_node("MatMul", ["ra", "w2"], ["z"])]  # fmt: skip
    outs = [("y", np.float32, [1, "seq", 64]), ("z", np.float32, [1, "seq", 64]),
            ("bw", np.float32, [1, "seq", 8]), ("cw", np.float32, [1, "seq", 8]), ("nc", np.float32, [1, "seq", 16])]  # fmt: skip
    return make_model(nodes, [("x", np.float32, [1, "seq", 64])], outs, inits)


def test_one_row_matmuls_sharing_an_input_become_one_with_views_of_its_columns():
    from tests.helpers import check_against_ort

    model = shared_input_matmuls_model()
    graph = import_onnx(model, input_shapes={"x": (1, 1, 64)})
    ops = [n.op for n in PassManager(["merge_matmuls", "slice_view"]).run(graph).nodes]
    # x's three MatMuls are one; ra's two are the graph's outputs; the misaligned Slice stays
    assert ops.count("MatMul") == 5 and ops.count("ContiguousSlice") == 3, ops
    assert ops.count("Slice") == 1
    for seq in (1, 3):  # at 3 rows the columns are not contiguous: nothing is merged
        x = rng.standard_normal((1, seq, 64)).astype(np.float32)
        compiled, _ = check_against_ort(model, {"x": x})
        assert compiled.stats["gemms"] == (5 if seq == 1 else 7)


def rotary_model():
    cos, sin = (rng.standard_normal((2, 8)).astype(np.float32) for _ in range(2))
    inits = [numpy_helper.from_array(cos, "cos"), numpy_helper.from_array(sin, "sin"),
             numpy_helper.from_array(np.array([1, 0], np.int64), "swap")]  # fmt: skip
    nodes = [helper.make_node("Mul", ["x", "cos"], ["xc"]),
             helper.make_node("Gather", ["x", "swap"], ["g"], axis=2),
             helper.make_node("Mul", ["g", "sin"], ["gs"]), helper.make_node("Add", ["xc", "gs"], ["y"])]  # fmt: skip
    return make_model(
        nodes, [("x", np.float32, [1, 4, 2, 8])], [("y", np.float32, [1, 4, 2, 8])], inits
    )


def test_an_independent_elementwise_input_joins_the_gathers_epilogue():
    """x * cos + swap(x) * sin: the Mul by cos feeds only the Add, so one kernel computes all."""
    from tests.helpers import check_against_ort

    graph = PassManager(["fuse"]).run(import_onnx(rotary_model()))
    (group,) = graph.nodes
    assert [m.op for m in group.group.members] == ["Gather", "Mul", "Mul", "Add"]
    x = rng.standard_normal((1, 4, 2, 8)).astype(np.float32)
    compiled, _ = check_against_ort(rotary_model(), {"x": x})
    assert compiled.stats["kernels"] == 1


def test_slice_view_leaves_a_reversed_dim_a_slice():
    """Fuzz seed 18: steps of -1 over a whole dim keep every element (no dim looks narrowed),
    but the result runs backwards: not a view."""
    ints = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)
    inits = [ints("s", [2, 5]), ints("e", [-(2**62), -6]), ints("a", [0, 1]), ints("t", [-1, -1])]
    nodes = [
        helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["r"], name="rev"),
        helper.make_node("Neg", ["r"], ["y"], name="neg"),
    ]
    model = make_model(nodes, [("x", np.float32, [1, 5])], [("y", np.float32, [1, 5])], inits)
    graph = PassManager(["const_fold", "slice_view"]).run(import_onnx(model))
    assert "ContiguousSlice" not in [n.op for n in graph.nodes]
    x = np.random.default_rng(4).standard_normal((1, 5)).astype(np.float32)
    got = pyforge.compile(model, target="cpu").predict(x)
    np.testing.assert_array_equal(got, -x[:, ::-1])


def dilated_conv_model(size, dilation, stride, kernel, pads):
    w = numpy_helper.from_array(
        rng.standard_normal((16, 4, kernel, kernel)).astype(np.float32), "w"
    )
    b = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b")
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], dilations=[dilation] * 2, pads=pads,
                            strides=[stride] * 2)  # fmt: skip
    out = [("y", np.float32, None)]
    return make_model([conv], [("x", np.float32, [1, 4, size, size])], out, [w, b])


@pytest.mark.parametrize(
    "size,dilation,stride,kernel,pads,cut",
    [
        (6, 8, 1, 3, [8, 8, 8, 8], [1, 1]),  # the centre tap alone: a 1x1
        (4, 5, 1, 3, [1, 1, 10, 10], [1, 1]),  # the taps past the far side only
        (9, 3, 2, 5, [3, 4, 3, 3], [3, 4]),  # strided: the first and (across) the last go
        (5, 2, 1, 3, [2, 2, 2, 2], [3, 3]),  # every tap live: unchanged
        (14, 12, 1, 3, [12] * 4, [3, 3]),  # live, but padded rows 2.6x the output: im2col
    ],
)
def test_conv_dead_taps_cuts_taps_that_read_only_padding(size, dilation, stride, kernel, pads, cut):
    """A wide dilation on a small image: taps that read only zero padding at every output are
    cut from the weight and the pads shrunk; the output equals ORT's on the uncut model."""
    from tests.helpers import check_against_ort

    model = dilated_conv_model(size, dilation, stride, kernel, pads)
    graph = PassManager(["conv_dead_taps"]).run(import_onnx(model))
    conv = graph.nodes[0]
    assert conv.attrs["kernel_shape"] == cut
    assert list(conv.inputs[1].const.shape[2:]) == cut
    assert min(conv.attrs["pads"]) >= 0
    check_against_ort(model, {"x": rng.standard_normal((1, 4, size, size)).astype(np.float32)})
