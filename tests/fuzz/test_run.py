"""The fuzzer's verdicts and its summary: a dispute is not a finding, a wrong answer is."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from onnx import helper, numpy_helper

from tests.helpers import make_model

from . import run
from .run import DISPUTE, classify


def _global_max(x):
    node = helper.make_node("GlobalMaxPool", ["x"], ["y"], name="gmp")
    return make_model([node], [("x", np.float32, x.shape)], [("y", np.float32, None)], opset=18)


def test_ort_and_reference_disagree_is_a_dispute():
    # ORT's vector max drops a NaN that is not last; the reference (np.max) keeps it
    x = np.array([1.5, np.nan, 0.25, -1.0], np.float32).reshape(1, 1, 2, 2)
    res = classify(_global_max(x), {"x": x})
    assert res.cls == DISPUTE, res
    assert "pyforge agrees with the reference" in res.detail


def test_reference_failing_on_nan_is_a_dispute():
    # ORT gives -3.4e38 for a window holding only -inf; the reference cannot pool an all-NaN one
    x = np.array([[[-np.inf, np.nan, 0.5, 1.25]]], np.float32)
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[1], name="mp")
    model = make_model([node], [("x", np.float32, x.shape)], [("y", np.float32, None)], opset=18)
    assert classify(model, {"x": x}).cls == DISPUTE


def test_an_ort_graph_rewrite_the_reference_cannot_check_is_a_dispute():
    # seed 812 of the 10,344-graph run: ORT's optimised Transpose -> MatMul by a vector ->
    # GatherElements is off by up to 4.9; onnx.reference refuses the GatherElements; ORT with
    # its graph optimisations off agrees with pyforge (and numpy)
    w = numpy_helper.from_array(np.array([-0.07, -0.93, 1.75, -1.63], np.float32), "w")
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["t", "w"], ["m"]),
        helper.make_node("GatherElements", ["m", "i"], ["y"], axis=-1),
    ]
    inputs = [("x", np.float32, [3, 4, 5]), ("i", np.int64, [3, 1])]
    model = make_model(nodes, inputs, [("y", np.float32, None)], [w], opset=23)
    x = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float32)
    res = classify(model, {"x": x, "i": np.array([[1], [4], [0]], np.int64)})
    assert res.cls == DISPUTE and "without its graph optimisations agrees" in res.detail, res


def test_wrong_answer_is_a_mismatch(monkeypatch):
    x = np.random.default_rng(3).uniform(-2, 2, (1, 2, 3, 3)).astype(np.float32)

    def off_by_one(model, feeds, fusion):
        return {"y": run.run_ort(model, feeds)["y"] + 1}

    monkeypatch.setattr(run, "run_pyforge", off_by_one)
    res = classify(_global_max(x), {"x": x})
    assert res.cls == "mismatch" and "ORT and reference" in res.detail


def test_summary_counts_and_lists(tmp_path):
    tally = run.Tally()
    rows = [
        dict(seed=5, cls="ok", op="", variants=[], detail="", nodes=3),
        dict(seed=7, cls="mismatch", op="TopK", variants=["fused"], detail="d", nodes=1),
        dict(seed=6, cls=DISPUTE, op="Squeeze", variants=["fused"], detail="d", nodes=1),
    ]
    for row in rows:
        tally.add(row)
    summary = json.loads(json.dumps(tally.summary(range(5, 8), jobs=1)))
    assert (summary["crashes"], summary["mismatches"], summary["disputes"]) == (0, 1, 1)
    assert [(f["seed"], f["op"]) for f in summary["findings"]] == [(7, "TopK")]
    assert [d["seed"] for d in summary["dispute_cases"]] == [6]
    assert "7: mismatch [TopK]" in tally.table()


@pytest.mark.slow
def test_parallel_run_writes_summary(tmp_path):
    out = tmp_path / "summary.json"
    before = {v: os.environ.get(v) for v in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS")}
    code = run.main(["--seeds", "0:4", "--jobs", "2", "--out", str(out)])
    summary = json.loads(out.read_text())
    assert summary["graphs"] == 4 and summary["jobs"] == 2
    # the workers' one-thread settings do not stay in this process (Numba would refuse them)
    assert {v: os.environ.get(v) for v in before} == before
    assert code == (1 if summary["crashes"] + summary["mismatches"] else 0)


def test_float32_cancellation_shared_by_ort_and_reference_is_a_dispute():
    # seed 40998 (FINDINGS.md 18): LayerNormalization of a row of variance 7.2e-8 under epsilon
    # 1e-6; ORT and the float32 reference agree with each other 0.7% off the float64 value,
    # which pyforge gives
    from .gen import generate

    case = generate(40998)
    res = classify(case.model, case.feeds)
    assert res.cls == DISPUTE and "float64 reference agrees with pyforge" in res.detail, res
    wide = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in case.feeds.items()}
    outs = run.run_reference(run.as_float64(case.model), wide)
    assert all(v.dtype != np.float32 for v in outs.values())  # it really ran in float64
