"""explain tells what the runtime runs: each GEMM's implementation and driver, every launch's
source; compile's stage seconds and progress cover the kernel JIT."""

from __future__ import annotations

import os

import numpy as np
import pytest
from onnx import helper, numpy_helper

import pyforge
from pyforge import explain
from pyforge.exec.cpu import sgemm
from pyforge.exec.kernels import _LOADED
from tests.helpers import check_against_ort, make_model

RNG = np.random.default_rng(18)


def _conv_model():
    """3x3 conv + Relu (own sgemm reads shifted windows: no im2col), then a strided 1x1 conv
    (its im2col a plain subsample), then a Gemm of one row (a GEMV)."""
    w1 = RNG.standard_normal((32, 16, 3, 3)).astype(np.float32) * 0.1
    b1 = RNG.standard_normal(32).astype(np.float32)
    w2 = RNG.standard_normal((32, 32, 1, 1)).astype(np.float32) * 0.1
    wf = RNG.standard_normal((32 * 16 * 16, 10)).astype(np.float32) * 0.01
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="down", strides=[2, 2]),
        helper.make_node("Flatten", ["c2"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "wf"], ["y"], name="fc"),
    ]
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"))]
    inits.append(numpy_helper.from_array(wf, "wf"))
    return make_model(
        nodes, [("x", np.float32, [1, 16, 32, 32])], [("y", np.float32, [1, 10])], inits
    )


def _feeds():
    return {"x": RNG.standard_normal((1, 16, 32, 32)).astype(np.float32)}


def test_stage_seconds_cover_the_jit_and_sum_to_compile_seconds():
    m = pyforge.compile(_conv_model(), target="cpu")
    stages = m.stats["stage_seconds"]
    assert list(stages) == ["import", "passes", "lowering", "plan", "bind", "jit"]
    assert all(v >= 0 for v in stages.values())
    assert m.stats["compile_seconds"] == pytest.approx(sum(stages.values()))
    # bind ran every step once: each kernel and driver is compiled before the first predict
    rt = m.runtime
    paths = set(rt.kernel_paths.values()) | set(rt.driver_paths.values())
    assert paths and all(_LOADED[p].signatures for p in paths), paths


def test_progress_counts_steps_bound_then_jit_compiled():
    calls = []
    m = pyforge.compile(_conv_model(), target="cpu", progress=lambda *c: calls.append(c))
    n = len(m.plan.steps)
    bind = [c for c in calls if c[0] == "bind"]
    jit = [c for c in calls if c[0] == "jit"]
    assert bind[0] == ("bind", 0, 1) and bind[1:] == [("bind", k, n) for k in range(1, n + 1)]
    assert jit == [("jit", k, n) for k in range(n + 1)]
    assert calls.index(("bind", n, n)) < calls.index(("jit", 0, n))


@pytest.mark.parametrize("own_gemm", [True, False])
def test_explain_names_the_gemm_that_runs_and_a_source_for_every_launch(own_gemm, tmp_path):
    if own_gemm and not sgemm.available():
        pytest.skip("pyforge's own sgemm needs AVX2 + FMA")
    m, _ = check_against_ort(_conv_model(), _feeds(), own_gemm=own_gemm)
    text = explain.report(m)
    assert "BLAS\n" not in text and "source not loaded" not in text
    lines = explain.step_lines(m)
    gemms = {label: how for _, what, label, how, _ in lines if what == "gemm"}
    blas = ("OpenBLAS", "CBLAS")
    if own_gemm:  # the two convs on own sgemm, the one-row Gemm on the BLAS's gemv
        assert gemms["Conv conv1"].startswith("pyforge sgemm"), gemms
        assert gemms["Conv down"].startswith("pyforge sgemm"), gemms
    else:
        assert gemms["Conv conv1"].startswith(blas) and "sgemm" in gemms["Conv conv1"], gemms
    assert gemms["Gemm fc"].startswith(blas) and "sgemv" in gemms["Gemm fc"], gemms
    launched = [row for row in lines if "no launch" not in row[3]]
    assert len(launched) == m.stats["launches"] + sum("epilogue" == r[1] for r in launched)
    assert all(os.path.isfile(path) for *_, path in launched), launched

    page = tmp_path / "conv.html"
    explain.write_html(m, str(page))
    html = page.read_text()
    for *_, path in launched:  # each launch's source, collapsed under its file name
        assert f"<details><summary>{path}</summary><pre>" in html
    assert html.count("<details>") == len(launched)
    assert "def kernel(" in html


@pytest.mark.parametrize(
    "runtime", [{}, {"own_gemm": False}, {"fused_steps": False}], ids=["own", "blas", "numpy"]
)
def test_columns_own_sgemm_does_without_are_not_in_the_arena(runtime, tmp_path):
    feeds = _feeds()
    m, _ = check_against_ort(_conv_model(), feeds, **runtime)
    slots = m.plan.slots
    col3x3 = next(n for n in slots if n.endswith("::col") and n != "c2::col")
    col1x1 = "c2::col"
    assert slots[col3x3].region == "scratch" and slots[col1x1].region == "arena"
    planned = {name for name, *_ in m.details["buffers"]}
    assert col3x3 not in planned and col1x1 in planned
    assert col3x3 not in explain.report(m)
    own = not runtime and sgemm.available()
    # made at bind only where this runtime's GEMM needs the columns after all
    assert m.runtime.scratch_bytes == (0 if own else slots[col3x3].nbytes)
    assert ("column scratch" in explain.report(m)) == (not own)
    m.save(tmp_path / "conv.plan")
    again = pyforge.load(tmp_path / "conv.plan", target="cpu", **runtime)
    np.testing.assert_array_equal(again.predict(feeds), m.predict(feeds))
