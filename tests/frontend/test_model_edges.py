"""Malformed or unusual models: each compiles to the right answer or fails with a pyforge.errors
exception naming what is wrong (node, op, tensor, file, sizes)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import pyforge
from pyforge.errors import ModelLoadError, OptionError, ResourceError
from pyforge.frontend import import_onnx
from tests.helpers import check_against_ort, make_model

F = np.float32
RNG = np.random.default_rng(14)


def _x(n=4):
    return {"x": RNG.standard_normal(n).astype(F)}


def node(op, ins, outs, name, **attrs):
    return helper.make_node(op, ins, outs, name=name, **attrs)


# --- node order ----------------------------------------------------------------------------


def test_nodes_out_of_order_are_sorted_as_ort_runs_them():
    nodes = [
        node("Add", ["b", "c"], ["y"], "add"),
        node("Neg", ["a"], ["b"], "neg"),
        node("Relu", ["x"], ["a"], "relu"),
        node("Exp", ["a"], ["c"], "exp"),
    ]
    model = make_model(nodes, [("x", F, [4])], [("y", F, [4])])
    check_against_ort(model, _x(), fusion=False)


def test_the_sort_is_stable():
    # independent nodes keep their proto order; a node moves only behind what it needs
    nodes = [
        node("Neg", ["x"], ["p"], "n0"),
        node("Relu", ["q"], ["r"], "n1"),
        node("Abs", ["x"], ["s"], "n2"),
        node("Exp", ["x"], ["q"], "n3"),
    ]
    outs = [(n, F, [4]) for n in "prs"]
    graph = import_onnx(make_model(nodes, [("x", F, [4])], outs))
    assert [n.name for n in graph.nodes] == ["n0", "n2", "n3", "n1"]


@pytest.mark.parametrize("self_loop", [False, True])
def test_a_cycle_names_its_nodes_and_tensors(self_loop):
    if self_loop:
        nodes = [node("Add", ["x", "a"], ["a"], "loop")]
        want = "cycle: node 'loop' \\(Add\\) needs 'a'"
    else:
        nodes = [
            node("Relu", ["x"], ["c"], "ok"),
            node("Relu", ["b"], ["a"], "r1"),
            node("Neg", ["a"], ["b"], "n1"),
        ]
        want = "cycle: node 'r1' \\(Relu\\) needs 'b', node 'n1' \\(Neg\\) needs 'a'"
    model = make_model(nodes, [("x", F, [4])], [("a", F, [4])])
    with pytest.raises(ModelLoadError, match=want):
        pyforge.compile(model, target="cpu")


def test_an_input_made_nowhere_names_node_and_tensor():
    nodes = [node("Relu", ["x"], ["a"], "r0"), node("Add", ["a", "ghost"], ["y"], "add0")]
    model = make_model(nodes, [("x", F, [4])], [("y", F, [4])])
    with pytest.raises(ModelLoadError, match="node 'add0' \\(Add\\) takes tensor 'ghost'"):
        pyforge.compile(model, target="cpu")


def test_an_unnamed_node_is_named_by_its_proto_index():
    nodes = [node("Relu", ["x"], ["a"], ""), node("Neg", ["ghost"], ["y"], "")]
    model = make_model(nodes, [("x", F, [4])], [("y", F, [4])])
    with pytest.raises(ModelLoadError, match="node 'Neg_1' \\(Neg\\)"):
        pyforge.compile(model, target="cpu")


# --- duplicate names -----------------------------------------------------------------------

W = numpy_helper.from_array(np.ones(4, F), "w")


@pytest.mark.parametrize(
    "nodes, inputs, inits, first, second",
    [
        (
            [node("Relu", ["x"], ["y"], "r0"), node("Neg", ["x"], ["y"], "n0")],
            ["x"],
            [],
            "node 'r0' \\(Relu\\)",
            "node 'n0' \\(Neg\\)",
        ),
        ([node("Relu", ["x"], ["w"], "r0")], ["x"], [W], "initializer 'w'", "node 'r0'"),
        ([node("Relu", ["x"], ["y"], "r0")], ["x", "x"], [], "graph input 0", "graph input 1"),
        ([node("Relu", ["x"], ["x"], "r0")], ["x"], [], "graph input 0", "node 'r0'"),
    ],
    ids=["two-nodes", "initializer-and-node", "two-inputs", "input-and-node"],
)
def test_a_name_produced_twice_names_both_producers(nodes, inputs, inits, first, second):
    model = make_model(nodes, [(n, F, [4]) for n in inputs], [("y", F, [4])], inits)
    with pytest.raises(ModelLoadError, match=f"name '\\w' is produced twice: by {first}.*{second}"):
        pyforge.compile(model, target="cpu")


def test_an_initializer_listed_as_an_input_is_one_tensor():
    model = make_model(
        [node("Add", ["x", "w"], ["y"], "add0")], [("x", F, [4]), ("w", F, [4])], [("y", F, [4])]
    )
    model.graph.initializer.append(W)
    check_against_ort(model, _x())


# --- opsets --------------------------------------------------------------------------------


def _relu(opset=17):
    return make_model(
        [node("Relu", ["x"], ["y"], "r0")], [("x", F, [4])], [("y", F, [4])], [], opset
    )


@pytest.mark.parametrize("opset", [99, 0])
def test_an_opset_onnx_does_not_know_is_refused(opset):
    newest = onnx.defs.onnx_opset_version()
    with pytest.raises(ModelLoadError, match=f"opset {opset} .*newest supported is {newest}"):
        pyforge.compile(_relu(opset), target="cpu")


def test_a_model_importing_no_opset_is_refused_as_ort_does():
    model = _relu()
    del model.opset_import[:]
    with pytest.raises(ModelLoadError, match="imports no opset"):
        pyforge.compile(model, target="cpu")


def test_no_default_domain_opset_reads_the_newest_as_ort_does():
    # Softmax's axis default changed at opset 13 (before: axis 1 and every dim after it), so
    # reading this at opset 1 would normalise over the last two dims instead of the last
    model = make_model(
        [node("Softmax", ["x"], ["y"], "sm")], [("x", F, [2, 3, 4])], [("y", F, [2, 3, 4])]
    )
    model.opset_import[0].domain = "com.example"
    newest = onnx.defs.onnx_opset_version()
    with pytest.warns(UserWarning, match=f"no opset of the default ONNX domain.*opset {newest}"):
        check_against_ort(model, {"x": RNG.standard_normal((2, 3, 4)).astype(F)})


# --- tensor data ---------------------------------------------------------------------------


def _add_w(w: TensorProto):
    nodes = [node("Add", ["x", "w"], ["y"], "add0")]
    return make_model(nodes, [("x", F, [4])], [("y", F, [4])], [w])


def test_raw_data_shorter_than_dims_names_initializer_dims_dtype_bytes():
    w = numpy_helper.from_array(np.ones(4, F), "w")
    w.raw_data = w.raw_data[:8]
    want = "initializer 'w': dims \\[4\\] of FLOAT need 16 bytes of raw_data, it holds 8"
    with pytest.raises(ModelLoadError, match=want):
        pyforge.compile(_add_w(w), target="cpu")


def test_typed_data_count_disagreeing_with_dims():
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4], float_data=[1.0, 2.0, 3.0])
    with pytest.raises(ModelLoadError, match="need 4 values in float_data .*holds 3"):
        pyforge.compile(_add_w(w), target="cpu")


def test_a_constant_node_with_bad_raw_data():
    t = numpy_helper.from_array(np.ones(4, F), "cv")
    t.raw_data = t.raw_data + b"\0" * 4
    nodes = [node("Constant", [], ["c"], "const0", value=t), node("Add", ["x", "c"], ["y"], "a")]
    model = make_model(nodes, [("x", F, [4])], [("y", F, [4])])
    want = "attribute 'value' of node 'const0' \\(Constant\\) 'cv'.*16 bytes.*holds 20"
    with pytest.raises(ModelLoadError, match=want):
        pyforge.compile(model, target="cpu")


def _external_w(tmp_path):
    path = tmp_path / "ext.onnx"
    w = numpy_helper.from_array(np.arange(4, dtype=F), "w")
    onnx.save(_add_w(w), path, save_as_external_data=True, location="w.bin", size_threshold=0)
    return path


def test_external_data_beside_the_file_loads(tmp_path):
    x = _x()
    got = pyforge.compile(str(_external_w(tmp_path)), target="cpu").predict(x)
    np.testing.assert_array_equal(got, x["x"] + np.arange(4, dtype=F))


def test_a_missing_external_data_file_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where onnx looks for a ModelProto's external data
    path = _external_w(tmp_path)
    in_memory = onnx.load(path, load_external_data=False)
    pyforge.compile(in_memory, target="cpu")  # found in the current directory
    (tmp_path / "w.bin").unlink()
    with pytest.raises(ModelLoadError, match="w.bin"):
        pyforge.compile(str(path), target="cpu")
    with pytest.raises(ModelLoadError, match="initializer 'w': its external data file 'w.bin'"):
        pyforge.compile(in_memory, target="cpu")


def test_external_data_shorter_than_dims(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _external_w(tmp_path)
    in_memory = onnx.load(path, load_external_data=False)
    (tmp_path / "w.bin").write_bytes(b"\0" * 8)
    with pytest.raises(ModelLoadError, match="need 16 bytes from 'w.bin' at offset 0"):
        pyforge.compile(in_memory, target="cpu")


# --- memory limit --------------------------------------------------------------------------


SIDE = 1 << 20  # [SIDE, SIDE] float32 is 4 TiB: more than any machine running this has
SHAPE = numpy_helper.from_array(np.array([SIDE, SIDE], np.int64), "shape")
ONE = numpy_helper.from_array(np.ones(1, F), "one")


@pytest.mark.parametrize(
    "nodes, dims, inits, input_shapes, want",
    [
        (
            [node("Shape", ["x"], ["s"], "s0"), node("Reshape", ["x", "s"], ["y"], "r0")],
            [SIDE, SIDE],
            [],
            None,
            "input 'x' \\[1048576, 1048576\\]",
        ),
        (
            [node("EyeLike", ["x"], ["y"], "eye0")],
            ["n", "n"],
            [],
            {"x": (SIDE, SIDE)},
            "input 'x' \\[1048576, 1048576\\]",
        ),
        (
            [node("ConstantOfShape", ["shape"], ["y"], "cos0")],
            None,
            [SHAPE],
            None,
            "node 'cos0' \\(ConstantOfShape\\) \\[1048576, 1048576\\], 4,398,046,511,104 bytes",
        ),
        (
            [node("Expand", ["one", "shape"], ["y"], "ex0")],
            None,
            [SHAPE, ONE],
            None,
            "node 'ex0' \\(Expand\\) \\[1048576, 1048576\\]",
        ),
    ],
    ids=["input", "input_shapes", "ConstantOfShape", "Expand"],
)
def test_huge_inputs_and_constants_are_refused_before_folding_allocates(
    nodes, dims, inits, input_shapes, want
):
    inputs = [("x", F, dims)] if dims else []
    model = make_model(nodes, inputs, [("y", F, [SIDE, SIDE])], inits)
    with pytest.raises(ResourceError, match=f"{want}.*over the memory limit.*memory_limit"):
        pyforge.compile(model, target="cpu", input_shapes=input_shapes)


def _tiled(n=4096):
    repeats = numpy_helper.from_array(np.array([n], np.int64), "reps")
    nodes = [node("Tile", ["x", "reps"], ["y"], "tile0")]
    return make_model(nodes, [("x", F, [256])], [("y", F, [256 * n])], [repeats])


def test_an_arena_over_the_memory_limit_is_refused_and_the_option_raises_it():
    # 1 KiB of declared input passes the early check; the 4 MiB output is the arena's
    with pytest.raises(ResourceError, match="arena \\([\\d,]+ bytes\\).*limit of 1,048,576"):
        pyforge.compile(_tiled(), target="cpu", memory_limit=1 << 20)
    check_against_ort(_tiled(), _x(256), memory_limit=64 << 20)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "8GB"])
def test_memory_limit_is_validated(bad):
    with pytest.raises(OptionError, match="memory_limit"):
        pyforge.CompileOptions(memory_limit=bad)


# --- what works and stays working ----------------------------------------------------------


def test_an_empty_graph_compiles_to_no_outputs():
    assert pyforge.compile(make_model([], [], []), target="cpu").predict({}) == {}


def test_graph_outputs_that_are_an_input_and_an_initializer():
    w = numpy_helper.from_array(np.arange(3, dtype=F), "w")
    model = make_model([], [("x", F, [4])], [("w", F, [3]), ("x", F, [4])], [w])
    check_against_ort(model, _x())


def test_an_output_that_is_an_input_beside_a_computed_one():
    model = make_model(
        [node("Neg", ["x"], ["y"], "n0")], [("x", F, [4])], [("x", F, [4]), ("y", F, [4])]
    )
    check_against_ort(model, _x())


def test_every_truncation_of_a_model_file_is_a_model_load_error(tmp_path):
    w = numpy_helper.from_array(np.arange(4, dtype=F), "w")
    data = _add_w(w).SerializeToString()
    path = tmp_path / "cut.onnx"
    for n in range(len(data)):
        path.write_bytes(data[:n])
        with pytest.raises(ModelLoadError):
            pyforge.compile(str(path), target="cpu")
        with pytest.raises(ModelLoadError):
            pyforge.compile(data[:n], target="cpu")
