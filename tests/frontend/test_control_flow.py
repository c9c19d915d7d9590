"""If, Loop and Scan (frontend/expansions/control.py) against ONNX Runtime, and the forms they
refuse with an error naming node, op and why."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import pyforge
from pyforge.errors import UnsupportedOperatorError
from pyforge.frontend.importer import import_onnx
from tests.helpers import check_against_ort, make_model, run_ort

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
rng = np.random.default_rng(808)


def rand(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def branch(name, op, out, const):
    """A branch graph: ``out = op(x, c)`` with x from the outer scope, c its own initializer."""
    node = helper.make_node(op, ["x", f"{name}_c"], [out])
    return helper.make_graph([node], name, [], [vi(out, F, None)], [init(f"{name}_c", const)])


def if_model(cond_const=None, else_shape=(3, 4)):
    """y = If(cond): then x + c1, else x * c2 (c2 of ``else_shape``); cond an input or constant."""
    then = branch("then", "Add", "t_out", rand(3, 4))
    other = branch("else", "Mul", "e_out", rand(*else_shape))
    node = helper.make_node("If", ["cond"], ["y"], name="if0", then_branch=then, else_branch=other)
    inputs = [("x", np.float32, [3, 4])]
    inits = []
    if cond_const is None:
        inputs.append(("cond", np.bool_, []))
    else:
        inits.append(init("cond", np.array(cond_const)))
    return make_model([node], inputs, [("y", np.float32, [3, 4])], inits)


@pytest.mark.parametrize("value", [True, False])
def test_if_constant_condition_inlines_its_branch_only(value):
    model = if_model(cond_const=value)
    check_against_ort(model, {"x": rand(3, 4)})
    ops = {n.op for n in import_onnx(model).nodes} - {"Identity"}
    assert ops == ({"Add"} if value else {"Mul"}), ops


def test_if_run_time_condition_selects_between_both_branches():
    model = if_model()
    compiled, _ = check_against_ort(model, {"x": rand(3, 4), "cond": np.array(True)})
    x = rand(3, 4)  # the same plan, the other branch
    got = compiled.predict({"x": x, "cond": np.array(False)})
    want = run_ort(model, {"x": x, "cond": np.array(False)})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_if_run_time_condition_with_branch_shapes_that_differ_is_refused():
    model = if_model(else_shape=(2, 3, 4))
    with pytest.raises(UnsupportedOperatorError, match="if0.*data-dependent output shape"):
        pyforge.compile(model, target="cpu")


def loop_model(body, trip, cond, carried, n_scan, scan_shape, out_shapes, trip_input=False):
    """A Loop over ``body``: trip count and condition constants ("" = absent); carried values
    are (name, shape) inputs; outputs the final carried values and ``n_scan`` scan outputs."""
    inits, inputs = [], [("x", np.float32, [2, 3])] + [(n, np.float32, s) for n, s in carried]
    m = "" if trip is None else "M"
    if trip_input:
        inputs.append(("M", np.int64, []))
    elif trip is not None:
        inits.append(init("M", np.array(trip, np.int64)))
    if cond is not None:
        inits.append(init("cond", np.array(cond)))
    outs = [f"out{k}" for k in range(len(carried))] + [f"scan{k}" for k in range(n_scan)]
    node = helper.make_node(
        "Loop",
        [m, "" if cond is None else "cond"] + [n for n, _ in carried],
        outs,
        name="loop0",
        body=body,
    )
    shapes = out_shapes + [scan_shape] * n_scan
    return make_model([node], inputs, [(o, np.float32, s) for o, s in zip(outs, shapes)], inits)


def body_graph(nodes, carried, outputs, initializers=()):
    ins = [vi("i", I64, []), vi("c_in", B, [])] + [vi(n, F, None) for n in carried]
    outs = [vi(o, B if k == 0 else F, None) for k, o in enumerate(outputs)]
    return helper.make_graph(nodes, "body", ins, outs, list(initializers))


def test_loop_with_carried_values_and_scan_outputs():
    # a = a * x + i, b = b - a (b reads the new a); scan out a + b; the body's own constant w
    nodes = [
        helper.make_node("Identity", ["c_in"], ["c_out"]),
        helper.make_node("Cast", ["i"], ["fi"], to=F),
        helper.make_node("Mul", ["a", "x"], ["ax"]),
        helper.make_node("Add", ["ax", "fi"], ["a2"]),
        helper.make_node("Sub", ["b", "a2"], ["b2"]),
        helper.make_node("Add", ["a2", "b2"], ["s0"]),
        helper.make_node("Mul", ["s0", "w"], ["s"]),
    ]
    body = body_graph(nodes, ["a", "b"], ["c_out", "a2", "b2", "s"], [init("w", rand(2, 3))])
    model = loop_model(body, 4, True, [("a", [2, 3]), ("b", [2, 3])], 1, [4, 2, 3], [[2, 3]] * 2)
    check_against_ort(model, {"x": rand(2, 3), "a": rand(2, 3), "b": rand(2, 3)})


def test_loop_stops_where_its_folded_condition_turns_false():
    # a while loop: M = 1000, the body's condition i < 4 folds per copy: 5 iterations
    nodes = [
        helper.make_node("Less", ["i", "four"], ["c_out"]),
        helper.make_node("Add", ["a", "x"], ["a2"]),
    ]
    body = body_graph(nodes, ["a"], ["c_out", "a2", "a2"], [init("four", np.array(4, np.int64))])
    model = loop_model(body, 1000, True, [("a", [2, 3])], 1, [5, 2, 3], [[2, 3]])
    check_against_ort(model, {"x": rand(2, 3), "a": rand(2, 3)})
    assert sum(n.op == "Add" for n in import_onnx(model).nodes) == 5


def test_loop_whose_condition_folds_from_a_constant_carried_counter():
    # while k < 7: k += 2; a = a * x  (k starts as a constant, so every copy's test folds)
    nodes = [
        helper.make_node("Add", ["k", "two"], ["k2"]),
        helper.make_node("Less", ["k2", "seven"], ["c_out"]),
        helper.make_node("Mul", ["a", "x"], ["a2"]),
    ]
    ins = [vi("i", I64, []), vi("c_in", B, []), vi("k", I64, []), vi("a", F, None)]
    outs = [vi("c_out", B, []), vi("k2", I64, []), vi("a2", F, None)]
    consts = [init("two", np.array(2, np.int64)), init("seven", np.array(7, np.int64))]
    body = helper.make_graph(nodes, "body", ins, outs, consts)
    node = helper.make_node("Loop", ["", "cond", "k0", "a"], ["k_end", "y"], body=body)
    inits = [init("cond", np.array(True)), init("k0", np.array(0, np.int64))]
    model = make_model(
        [node],
        [("x", np.float32, [2, 3]), ("a", np.float32, [2, 3])],
        [("k_end", np.int64, []), ("y", np.float32, [2, 3])],
        inits,
    )
    check_against_ort(model, {"x": rand(2, 3), "a": rand(2, 3)})


def test_loop_without_trip_count_runs_until_its_condition():
    nodes = [
        helper.make_node("Less", ["i", "three"], ["c_out"]),
        helper.make_node("Mul", ["a", "x"], ["a2"]),
    ]
    body = body_graph(nodes, ["a"], ["c_out", "a2"], [init("three", np.array(3, np.int64))])
    model = loop_model(body, None, True, [("a", [2, 3])], 0, None, [[2, 3]])
    check_against_ort(model, {"x": rand(2, 3), "a": rand(2, 3)})


def test_loop_without_condition_input_still_stops_on_the_body_condition():
    # ORT reads the body's condition even when the node has no cond input: 3 of M = 5 here
    nodes = [
        helper.make_node("Less", ["i", "two"], ["c_out"]),
        helper.make_node("Add", ["a", "x"], ["a2"]),
        helper.make_node("Identity", ["a2"], ["s"]),
    ]
    body = body_graph(nodes, ["a"], ["c_out", "a2", "s"], [init("two", np.array(2, np.int64))])
    model = loop_model(body, 5, None, [("a", [2, 3])], 1, [3, 2, 3], [[2, 3]])
    check_against_ort(model, {"x": rand(2, 3), "a": rand(2, 3)})


def test_loop_of_zero_iterations_gives_its_initial_values():
    model = loop_model(_counting_body(), 0, True, [("a", [2, 3])], 0, None, [[2, 3]])
    check_against_ort(model, {"x": rand(2, 3), "a": rand(2, 3)})


def test_loop_in_a_loop_reads_the_outer_body_names():
    # the inner body reads the outer body's carried a and iteration number i (renamed per copy)
    inner_nodes = [
        helper.make_node("Identity", ["ci"], ["co"]),
        helper.make_node("Cast", ["i"], ["fi"], to=F),
        helper.make_node("Mul", ["b", "a"], ["ba"]),
        helper.make_node("Add", ["ba", "fi"], ["b2"]),
    ]
    inner = helper.make_graph(
        inner_nodes,
        "inner",
        [vi("j", I64, []), vi("ci", B, []), vi("b", F, None)],
        [vi("co", B, None), vi("b2", F, None)],
    )
    nodes = [
        helper.make_node("Identity", ["c_in"], ["c_out"]),
        helper.make_node("Loop", ["two", "", "x"], ["a2"], body=inner),
        helper.make_node("Tanh", ["a2"], ["a3"]),
    ]
    body = body_graph(nodes, ["a"], ["c_out", "a3"], [init("two", np.array(2, np.int64))])
    model = loop_model(body, 3, True, [("a", [2, 3])], 0, None, [[2, 3]])
    check_against_ort(model, {"x": rand(2, 3), "a": rand(2, 3)})


def test_loop_with_an_if_on_the_iteration_number_inside():
    # the nested If's branches read the body's renamed names (a, i) and the outer x
    then = helper.make_graph(
        [helper.make_node("Add", ["a", "x"], ["t"])], "then", [], [vi("t", F, None)]
    )
    other = helper.make_graph(
        [
            helper.make_node("Cast", ["i"], ["fi"], to=F),
            helper.make_node("Mul", ["a", "fi"], ["e"]),
        ],
        "else",
        [],
        [vi("e", F, None)],
    )
    nodes = [
        helper.make_node("Identity", ["c_in"], ["c_out"]),
        helper.make_node("Less", ["i", "two"], ["small"]),
        helper.make_node("If", ["small"], ["a2"], then_branch=then, else_branch=other),
        helper.make_node("Tanh", ["a2"], ["a3"]),
    ]
    body = body_graph(nodes, ["a"], ["c_out", "a3", "a2"], [init("two", np.array(2, np.int64))])
    model = loop_model(body, 5, True, [("a", [2, 3])], 1, [5, 2, 3], [[2, 3]])
    check_against_ort(model, {"x": rand(2, 3), "a": rand(2, 3)})


def test_loop_with_a_run_time_if_inside():
    # the condition depends on a carried value: both branches of every copy, selected by Where
    then = helper.make_graph(
        [helper.make_node("Add", ["a", "x"], ["t"])], "then", [], [vi("t", F, None)]
    )
    other = helper.make_graph(
        [helper.make_node("Sub", ["a", "x"], ["e"])], "else", [], [vi("e", F, None)]
    )
    nodes = [
        helper.make_node("Identity", ["c_in"], ["c_out"]),
        helper.make_node("ReduceSum", ["a"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["pos"]),
        helper.make_node("If", ["pos"], ["a2"], then_branch=then, else_branch=other),
    ]
    body = body_graph(nodes, ["a"], ["c_out", "a2"], [init("zero", np.array(0, np.float32))])
    model = loop_model(body, 6, True, [("a", [2, 3])], 0, None, [[2, 3]])
    check_against_ort(model, {"x": rand(2, 3), "a": rand(2, 3)})


def _counting_body():
    nodes = [
        helper.make_node("Identity", ["c_in"], ["c_out"]),
        helper.make_node("Add", ["a", "x"], ["a2"]),
    ]
    return body_graph(nodes, ["a"], ["c_out", "a2"])


def test_loop_with_a_run_time_trip_count_runs_in_stages():
    # the trip count is read at each run, and the unrolled rest compiled per value
    model = loop_model(_counting_body(), 3, True, [("a", [2, 3])], 0, None, [[2, 3]], True)
    compiled = pyforge.compile(model, target="cpu")
    assert "trip count" in compiled.stats["stages"]["cut at"]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for m in (2, 4, 2):
        feeds = {"x": rng.standard_normal((2, 3)).astype(np.float32)}
        feeds |= {"a": rng.standard_normal((2, 3)).astype(np.float32), "M": np.array(m, np.int64)}
        np.testing.assert_allclose(compiled.predict(feeds), sess.run(None, feeds)[0], rtol=1e-6)
    assert compiled.stats["stages"]["rest plans held"] == 2


def test_loop_with_a_run_time_condition_runs_on_the_host():
    # the condition is made inside the body, so no stage boundary can fall before it
    nodes = [
        helper.make_node("ReduceSum", ["a"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["c_out"]),
        helper.make_node("Add", ["a", "x"], ["a2"]),
    ]
    body = body_graph(nodes, ["a"], ["c_out", "a2"], [init("zero", np.array(0, np.float32))])
    model = loop_model(body, 3, True, [("a", [2, 3])], 0, None, [[2, 3]])
    compiled = pyforge.compile(model, target="cpu")
    assert compiled.stats["stages"]["host op"] == "Loop"
    for seed in range(3):  # x shifted down each time, so the condition turns false sooner
        feeds = {"x": rand(2, 3) - 0.3 * seed, "a": rand(2, 3)}
        want = run_ort(model, feeds)[0]
        np.testing.assert_allclose(compiled.predict(feeds), want, rtol=1e-6, atol=1e-6)


def test_loop_of_zero_iterations_with_scan_outputs_is_refused():
    nodes = [
        helper.make_node("Identity", ["c_in"], ["c_out"]),
        helper.make_node("Add", ["a", "x"], ["a2"]),
        helper.make_node("Identity", ["a2"], ["s"]),
    ]
    body = body_graph(nodes, ["a"], ["c_out", "a2", "s"])
    model = loop_model(body, 0, True, [("a", [2, 3])], 1, None, [[2, 3]])
    with pytest.raises(UnsupportedOperatorError, match="loop0.*scan output 0 of zero iterations"):
        import_onnx(model)


def test_loop_past_the_unroll_limit_is_refused():
    model = loop_model(_counting_body(), 5000, True, [("a", [2, 3])], 0, None, [[2, 3]])
    with pytest.raises(UnsupportedOperatorError, match="loop0.*more than 4096 iterations"):
        import_onnx(model)


def scan_model(opset=17, **attrs):
    """Scan with one state s [3] and scan inputs u [2, L=4, 3] (axis 1), v [4, 3] (axis 0):
    s' = s + u_t * v_t; scan outputs s' and u_t - v_t."""
    nodes = [
        helper.make_node("Mul", ["u_t", "v_t"], ["uv"]),
        helper.make_node("ReduceSum", ["uv", "ax0"], ["r"], keepdims=0),
        helper.make_node("Add", ["s", "r"], ["s2"]),
        helper.make_node("Sub", ["u_t", "v_t"], ["d"]),
        helper.make_node("Identity", ["s2"], ["so"]),  # ORT garbles one name given twice
    ]
    ins = [vi("s", F, [3]), vi("u_t", F, [2, 3]), vi("v_t", F, [3])]
    outs = [vi("s2", F, [3]), vi("so", F, [3]), vi("d", F, [2, 3])]
    body = helper.make_graph(nodes, "scan_body", ins, outs, [init("ax0", np.array([0]))])
    node = helper.make_node(
        "Scan",
        ["s0", "u", "v"],
        ["s_final", "o1", "o2"],
        name="scan0",
        body=body,
        num_scan_inputs=2,
        **attrs,
    )
    inputs = [("s0", np.float32, [3]), ("u", np.float32, [2, 4, 3]), ("v", np.float32, [4, 3])]
    outputs = [("s_final", np.float32, None), ("o1", np.float32, None), ("o2", np.float32, None)]
    return make_model([node], inputs, outputs, opset=opset)


SCAN_CASES = {
    "forward": dict(scan_input_axes=[1, 0]),
    "reversed_inputs_and_outputs_other_axes": dict(
        scan_input_axes=[1, 0],
        scan_input_directions=[1, 0],
        scan_output_axes=[1, -1],
        scan_output_directions=[1, 0],
    ),
    "negative_input_axis_both_reversed": dict(
        scan_input_axes=[-2, 0], scan_input_directions=[0, 1], scan_output_directions=[1, 1]
    ),
}


@pytest.mark.parametrize("case", sorted(SCAN_CASES))
def test_scan_matches_ort(case):
    model = scan_model(**SCAN_CASES[case])
    check_against_ort(model, {"s0": rand(3), "u": rand(2, 4, 3), "v": rand(4, 3)})


def test_scan_opset_8_batched_form_is_refused():
    model = scan_model(opset=8, scan_input_axes=[1, 0])
    with pytest.raises(UnsupportedOperatorError, match="scan0.*opset 8"):
        import_onnx(model)
