"""Models that need run-time data before a plan can exist: ops whose output shape depends on
their data (NonZero, NonMaxSuppression, Unique, Compress) and shapes, k or pads computed at run
time. pyforge runs them in stages (pyforge/staged.py); each case is checked against ORT."""

import os

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import pyforge
from pyforge import errors
from tests.helpers import run_in_simulator

INSIDE_SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_empty_tensor_value_info(n) for n in outputs],
        [numpy_helper.from_array(a, n) for n, a in inits],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _check(model, feeds_list):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    compiled = pyforge.compile(model, target="cpu")
    assert compiled.stats["stages"]["cut at"]
    names = [o.name for o in model.graph.output]
    for feeds in feeds_list:
        want = sess.run(None, feeds)
        got = compiled.predict(feeds)
        got = got if isinstance(got, dict) else {names[0]: got}
        for n, w in zip(names, want):
            assert got[n].shape == w.shape, n
            np.testing.assert_allclose(got[n], w, rtol=1e-5, atol=1e-6)
    return compiled


def _rand(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_nonzero_feeds_later_ops():
    model = _count_then_scale(("y", "total", "nz"))
    m = _check(model, [{"x": _rand(s, (3, 4))} for s in range(3)])
    assert m.stats["stages"]["host op"] == "NonZero"
    assert m.stats["stages"]["rest plans held"] >= 2  # the count of nonzeros differs per seed


def test_the_rest_starts_at_the_cut_and_keeps_only_the_constants_it_reads():
    nodes = [
        helper.make_node("Add", ["s", "s"], ["s2"]),  # constant-only, read before the cut only
        helper.make_node("Mul", ["s", "s"], ["s3"]),  # constant-only, read after it
        helper.make_node("Mul", ["x", "s2"], ["a"]),
        helper.make_node("Relu", ["x"], ["r"]),  # not needed by the NonZero: first stage too
        helper.make_node("NonZero", ["a"], ["nz"]),
        helper.make_node("Cast", ["nz"], ["nf"], to=T.FLOAT),
        helper.make_node("ReduceSum", ["nf"], ["n"], keepdims=0),
        helper.make_node("Mul", ["r", "s3"], ["y"]),
    ]
    model = _model(nodes, [("x", T.FLOAT, [3, 4])], ["y", "n"], [("s", np.float32([2.0]))])
    m = _check(model, [{"x": _rand(s, (3, 4))} for s in range(2)])
    rest = [n.output[0] for n in m._cut._rest_nodes]
    assert rest == ["s3", "nf", "n", "y"] and m._cut.host.op_type == "NonZero"


def test_gather_by_nonzero_indices():
    # y = x[x > 0]: the pattern torch exports for boolean indexing
    nodes = [
        helper.make_node("Greater", ["x", "zero"], ["mask"]),
        helper.make_node("NonZero", ["mask"], ["idx"]),
        helper.make_node("Squeeze", ["idx", "ax0"], ["flat"]),
        helper.make_node("Gather", ["x", "flat"], ["y"], axis=0),
        helper.make_node("Exp", ["y"], ["e"]),
    ]
    inits = [("zero", np.array(0, np.float32)), ("ax0", np.int64([0]))]
    _check(
        _model(nodes, [("x", T.FLOAT, [16])], ["e"], inits), [{"x": _rand(s, 16)} for s in range(2)]
    )


def test_reshape_and_tile_from_run_time_values():
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Tile", ["r", "reps"], ["t"]),
        helper.make_node("Sigmoid", ["t"], ["y"]),
    ]
    inputs = [("x", T.FLOAT, [2, 6]), ("shape", T.INT64, [2]), ("reps", T.INT64, [2])]
    x = _rand(0, (2, 6))
    feeds = [
        {"x": x, "shape": np.int64([3, 4]), "reps": np.int64([1, 2])},
        {"x": x, "shape": np.int64([4, 3]), "reps": np.int64([2, 1])},
        {"x": x + 1, "shape": np.int64([3, 4]), "reps": np.int64([1, 2])},
    ]
    m = _check(_model(nodes, inputs, ["y"]), feeds)
    assert m.stats["stages"]["rest plans held"] == 2  # the third run reuses the first's plan


def test_topk_k_and_range_computed_at_run_time():
    nodes = [
        helper.make_node("ReduceMax", ["n"], ["k"], keepdims=1),  # k = max(n): a run-time value
        helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=-1),
        helper.make_node("Range", ["start", "lim", "step"], ["ramp"]),
    ]
    inputs = [("x", T.FLOAT, [3, 10]), ("n", T.INT64, [2]), ("lim", T.FLOAT, [])]
    inits = [("start", np.array(0.5, np.float32)), ("step", np.array(0.75, np.float32))]
    model = _model(nodes, inputs, ["v", "i", "ramp"], inits)
    feeds = [
        {"x": _rand(s, (3, 10)), "n": np.int64([s + 1, 2]), "lim": np.array(3 + s, np.float32)}
        for s in range(3)
    ]
    _check(model, feeds)


@pytest.mark.parametrize("center", [0, 1])
def test_non_max_suppression(center):
    rng = np.random.default_rng(center)
    xy = rng.uniform(0, 8, (2, 12, 2)).astype(np.float32)
    wh = rng.uniform(1, 4, (2, 12, 2)).astype(np.float32)
    if center:
        boxes = np.concatenate([xy, wh], -1)
    else:  # corners, some given flipped (y1 < y0)
        boxes = np.concatenate([xy, xy + wh], -1)[..., [1, 0, 3, 2]]
        boxes[:, ::3] = boxes[:, ::3][..., [2, 3, 0, 1]]
    nodes = [
        helper.make_node(
            "NonMaxSuppression", ["b", "s", "m", "iou", "th"], ["sel"], center_point_box=center
        )
    ]
    inputs = [("b", T.FLOAT, [2, 12, 4]), ("s", T.FLOAT, [2, 3, 12])]
    inits = [("m", np.int64([4])), ("iou", np.float32([0.3])), ("th", np.float32([0.2]))]
    model = _model(nodes, inputs, ["sel"], inits)
    feeds = [{"b": boxes, "s": rng.uniform(0, 1, (2, 3, 12)).astype(np.float32)} for _ in range(2)]
    _check(model, feeds)


def test_non_max_suppression_of_many_overlapping_boxes_takes_what_ort_takes():
    # torchvision's batched NMS: every class in one call, boxes on a coarse grid (ties, repeats)
    rng = np.random.default_rng(5)
    xy = rng.integers(0, 30, (1, 400, 2)).astype(np.float32)
    boxes = np.concatenate([xy, xy + rng.integers(1, 12, (1, 400, 2))], -1).astype(np.float32)
    scores = (rng.integers(0, 50, (1, 2, 400)) / 50).astype(np.float32)
    nodes = [helper.make_node("NonMaxSuppression", ["b", "s", "m", "iou"], ["sel"])]
    inits = [("m", np.int64([1000])), ("iou", np.float32([0.4]))]
    inputs = [("b", T.FLOAT, [1, 400, 4]), ("s", T.FLOAT, [1, 2, 400])]
    _check(_model(nodes, inputs, ["sel"], inits), [{"b": boxes, "s": scores}])


def test_greedy_suppression_in_pieces_is_the_one_box_at_a_time_loop():
    from pyforge.ops.dynamic import _greedy, _iou

    rng = np.random.default_rng(6)
    for _ in range(20):
        c = rng.integers(0, 12, (60, 4)).astype(np.float64)
        c = np.concatenate([np.minimum(c[:, :2], c[:, 2:]), np.maximum(c[:, :2], c[:, 2:])], 1)
        area = (c[:, 2] - c[:, 0]) * (c[:, 3] - c[:, 1])
        keep, cap = rng.permutation(60)[:50], int(rng.integers(1, 60))
        want: list[int] = []
        for i in keep:
            if len(want) < cap and not (_iou(c, area, i, np.array(want, int)) > 0.3).any():
                want.append(int(i))
        assert _greedy(c, area, keep, cap, 0.3, chunk=7) == want


@pytest.mark.parametrize("attrs", [{}, {"sorted": 0}, {"axis": 0}])
def test_unique_and_compress(attrs):
    nodes = [
        helper.make_node("Round", ["x"], ["r"]),
        helper.make_node("Unique", ["r"], ["y", "first", "inverse", "counts"], **attrs),
        helper.make_node("Greater", ["x", "zero"], ["keep"]),
        helper.make_node("Compress", ["x", "keep2"], ["c"], axis=1),
        helper.make_node("Cast", ["keep"], ["keepf"], to=T.FLOAT),
        helper.make_node("ReduceMax", ["keepf"], ["keep1"], axes=[0], keepdims=0),
        helper.make_node("Cast", ["keep1"], ["keep2"], to=T.BOOL),
    ]
    inputs = [("x", T.FLOAT, [4, 5])]
    model = _model(
        nodes,
        inputs,
        ["y", "first", "inverse", "counts", "c"],
        [("zero", np.array(0.5, np.float32))],
        opset=17,
    )
    feeds = [{"x": (_rand(s, (4, 5)) * 1.5).round(0)} for s in range(2)]
    feeds[0]["x"][1] = feeds[0]["x"][0]  # a repeated row for axis=0
    _check(model, feeds)


def test_a_staged_model_cannot_be_saved(tmp_path):
    nodes = [helper.make_node("NonZero", ["x"], ["nz"])]
    m = pyforge.compile(_model(nodes, [("x", T.FLOAT, [5])], ["nz"]), target="cpu")
    with pytest.raises(errors.UnsupportedOperatorError, match="stages"):
        m.save(tmp_path / "p")
    with pytest.raises(errors.InputError, match="takes inputs"):
        m.predict({"y": np.ones(5, np.float32)})


def _count_then_scale(outputs=("y", "total")):
    """y = float(transpose(nonzero(relu(x)))) * s: the rest's shape is the count of positives."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("NonZero", ["r"], ["nz"]),
        helper.make_node("Transpose", ["nz"], ["t"], perm=[1, 0]),
        helper.make_node("Cast", ["t"], ["tf"], to=T.FLOAT),
        helper.make_node("Mul", ["tf", "s"], ["y"]),
        helper.make_node("ReduceSum", ["r"], ["total"], keepdims=0),
    ]
    inputs = [("x", T.FLOAT, [3, 4])]
    return _model(nodes, inputs, list(outputs), [("s", np.float32([2, 3]))])


def test_stages_after_the_cut_are_tallied():
    m = _check(_count_then_scale(), [{"x": _rand(s, (3, 4))} for s in (0, 1, 0)])
    tally = m.stage_tally
    assert tally["stages compiled"] == 2 and tally["compile seconds"] > 0  # seed 0's is reused
    assert m.stats["stages"]["stages compiled"] == 2
    assert m.stats["stages"]["rest target"] == "cpu"
    with pytest.raises(errors.OptionError, match="'cpu' or 'cuda'"):
        m.rest_target = "gpu"


@pytest.mark.sim
@pytest.mark.skipif(INSIDE_SIM, reason="this is the launcher")
def test_staged_cuda_in_simulator():
    run_in_simulator(__file__ + "::test_cuda_stages_after_the_cut_run_on_the_host")
    run_in_simulator(__file__ + "::test_cuda_stages_after_the_cut_share_their_kernel_sources")


def _run_on_cuda(rest_target: str):
    model = _count_then_scale()
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    m = pyforge.compile(model, target="cuda")
    m.rest_target = rest_target
    shapes = set()
    for seed in (0, 1):
        feeds = {"x": _rand(seed, (3, 4))}
        got, (y, total) = m.predict(feeds), sess.run(None, feeds)
        shapes.add(y.shape)
        np.testing.assert_allclose(got["y"], y, rtol=1e-6)
        np.testing.assert_allclose(got["total"], total, rtol=1e-5)
    assert len(shapes) == 2  # two counts, two rest plans
    assert m._first.target == "cuda" and m.stats["stages"]["rest target"] == rest_target
    assert [r.target for r in m._rest.values()] == [rest_target] * 2
    return m


@pytest.mark.skipif(not INSIDE_SIM, reason="runs inside the simulator subprocess")
def test_cuda_stages_after_the_cut_run_on_the_host():
    """By default only the first stage runs on cuda: the rest, small and shaped by the data,
    would pay a GPU bind per stage (ssdlite's 362 of them) for microseconds of work."""
    m = _run_on_cuda("cpu")
    with pytest.raises(errors.OptionError, match="before the first predict"):
        m.rest_target = "cuda"


@pytest.mark.skipif(not INSIDE_SIM, reason="runs inside the simulator subprocess")
def test_cuda_stages_after_the_cut_share_their_kernel_sources():
    """With rest_target="cuda" their shapes follow the data: cuda's specialised kernels would be
    new sources (so new compiles) for every count; the shape-generic ones are the same for all."""
    m = _run_on_cuda("cuda")
    sources = [{k["cuda"] for k in r.plan.kernels.values()} for r in m._rest.values()]
    assert len(sources) == 2 and sources[0] == sources[1]
