"""An If whose branches need run-time data, inside a model run in stages (the pattern of
torchvision's detection models: boxes kept by NonZero, then ``if boxes.numel() == 0`` around a
batched NonMaxSuppression whose Slice reads a top-level constant). Each case against ORT."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import pyforge


def _node(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, **attrs)


def _const(name, value):
    return _node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value)))


def _nms_branch(boxes: str, scores: str, axis: str) -> onnx.GraphProto:
    """The else branch: boxes offset by a slice whose axes come from the outer ``axis``, then
    NonMaxSuppression, its selected box indices squeezed to one axis."""
    nodes = [
        _const("b_ax", np.int64([0])),
        _const("b_st", np.int64([0])),
        _const("b_en", np.int64([2])),
        _node("Unsqueeze", [axis, "b_ax"], ["b_axes"]),
        _node("Slice", [boxes, "b_st", "b_en", "b_axes"], ["b_head"]),
        _node("ReduceMax", ["b_head"], ["b_off"], keepdims=0),
        _node("Add", [boxes, "b_off"], ["b_moved"]),
        _node("Unsqueeze", ["b_moved", "b_ax"], ["b_batched"]),
        _node("Unsqueeze", [scores, "b_ax"], ["b_s1"]),
        _node("Unsqueeze", ["b_s1", "b_ax"], ["b_s2"]),
        _const("b_max", np.int64([100])),
        _const("b_iou", np.float32([0.5])),
        _node("NonMaxSuppression", ["b_batched", "b_s2", "b_max", "b_iou"], ["b_sel"]),
        _const("b_col", np.int64([2])),
        _node("Gather", ["b_sel", "b_col"], ["b_g"], axis=1),
        _const("b_one", np.int64([1])),
        _node("Squeeze", ["b_g", "b_one"], ["keep"]),
    ]
    out = [helper.make_tensor_value_info("keep", T.INT64, None)]
    return helper.make_graph(nodes, "else", [], out)


def _empty_branch() -> onnx.GraphProto:
    nodes = [_const("none", np.zeros(0, np.int64))]
    return helper.make_graph(
        nodes, "then", [], [helper.make_tensor_value_info("none", T.INT64, None)]
    )


def _detection_model(cond_from_data: bool):
    """boxes[N, 4], scores[N] -> the boxes with score > thr, then NMS unless none is left.
    ``cond_from_data``: the If's condition is a value (sum of scores > 0), not a shape."""
    nodes = [
        _const("axis0", np.int64(0)),
        _node("Cast", ["axis0"], ["thr"], to=T.FLOAT),  # the constant is read before the cut too
        _node("Greater", ["scores", "thr"], ["alive"]),
        _node("NonZero", ["alive"], ["nz"]),
        _node("Squeeze", ["nz", "one"], ["idx"]),
        _node("Gather", ["boxes", "idx"], ["kept_boxes"], axis=0),
        _node("Gather", ["scores", "idx"], ["kept_scores"], axis=0),
    ]
    if cond_from_data:
        nodes += [
            _node("ReduceSum", ["scores"], ["total"], keepdims=0),
            _node("Less", ["total", "thr"], ["cond"]),
        ]
    else:
        nodes += [
            _node("Shape", ["kept_boxes"], ["shape"]),
            _node("ReduceProd", ["shape"], ["numel"], keepdims=0),
            _node("Equal", ["numel", "zero"], ["cond"]),
        ]
    nodes += [
        _node(
            "If",
            ["cond"],
            ["keep"],
            then_branch=_empty_branch(),
            else_branch=_nms_branch("kept_boxes", "kept_scores", "axis0"),
        ),
        _node("Gather", ["kept_boxes", "keep"], ["out_boxes"], axis=0),
    ]
    inputs = [
        helper.make_tensor_value_info("boxes", T.FLOAT, ["n", 4]),
        helper.make_tensor_value_info("scores", T.FLOAT, ["n"]),
    ]
    outputs = [helper.make_empty_tensor_value_info(n) for n in ("out_boxes", "keep")]
    inits = [
        numpy_helper.from_array(np.int64([0]), "one"),
        numpy_helper.from_array(np.int64(0), "zero"),
    ]
    g = helper.make_graph(nodes, "detect", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(seed: int, n: int, alive: bool = True) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    corner = rng.uniform(0, 8, (n, 2)).astype(np.float32)
    boxes = np.concatenate([corner, corner + rng.uniform(1, 4, (n, 2))], 1).astype(np.float32)
    scores = rng.standard_normal(n).astype(np.float32)
    return {"boxes": boxes, "scores": scores if alive else -np.abs(scores) - 0.1}


def _check(model, feeds_list):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    compiled = pyforge.compile(model, target="cpu")
    for feeds in feeds_list:
        want = dict(zip(["out_boxes", "keep"], sess.run(None, feeds)))
        got = compiled.predict(feeds)
        for name, w in want.items():
            assert got[name].shape == w.shape, (name, got[name].shape, w.shape)
            np.testing.assert_allclose(got[name], w, rtol=1e-6, atol=0)
    return compiled


def test_if_around_nms_after_nonzero():
    feeds = [_feeds(1, 12), _feeds(2, 20), _feeds(3, 12, alive=False)]
    assert any(len(f["scores"]) for f in feeds)
    _check(_detection_model(cond_from_data=False), feeds)


def test_if_with_run_time_condition_and_data_dependent_branch():
    feeds = [_feeds(4, 12), _feeds(5, 16), _feeds(6, 12, alive=False)]
    _check(_detection_model(cond_from_data=True), feeds)
