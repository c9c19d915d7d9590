"""Dynamic tiles of the cpu target's parallel loops (exec/cpu/tiles.py): every iteration runs
exactly once, and a tiled kernel gives bit for bit what the serial loop gives."""

from pathlib import Path

import numba
import numpy as np
import onnx
import pytest
from numba import njit, prange
from onnx import TensorProto, helper, numpy_helper

import pyforge
from pyforge.exec.cpu.tiles import claim, threads, tiling
from pyforge.lower_numba import emit


@njit(parallel=True, nogil=True)
def _count_claims(n, hits):
    parts = threads()
    per, tiles, nxt = tiling(n, parts)
    for _ in prange(parts):
        t = claim(nxt)
        while t < tiles:
            for i in range(t * per, min(n, t * per + per)):
                hits[i] += 1
            t = claim(nxt)
    return tiles


@pytest.mark.parametrize("n", [1, 7, 16, 17, 1001, 40_003])
@pytest.mark.parametrize("width", [1, 2])
def test_every_iteration_once(n, width):
    before = numba.get_num_threads()
    numba.set_num_threads(min(width, numba.config.NUMBA_NUM_THREADS))
    try:
        hits = np.zeros(n, np.int64)
        tiles = _count_claims(n, hits)
    finally:
        numba.set_num_threads(before)
    assert np.array_equal(hits, np.ones(n, np.int64))
    per, tiles2, nxt = tiling(n, width)
    assert tiles == tiles2 and (tiles - 1) * per < n <= tiles * per and nxt[0] == 0


def _model() -> onnx.ModelProto:
    """Broadcast elementwise, a rows kernel (Softmax) and a window kernel (MaxPool), each over
    more than PARALLEL_MIN elements and shapes no tile count divides."""
    rng = np.random.default_rng(5)
    b = numpy_helper.from_array(rng.standard_normal((1, 37, 1, 1)).astype(np.float32), "b")
    nodes = [
        helper.make_node("Add", ["x", "b"], ["a"]),
        helper.make_node("Tanh", ["a"], ["t"]),
        helper.make_node("MaxPool", ["t"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Softmax", ["p"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "tiled",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 37, 29, 61])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 37, 29, 61])],
        [b],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_tiled_kernels_equal_serial(monkeypatch):
    ort = pytest.importorskip("onnxruntime")
    model = _model()
    x = np.random.default_rng(6).standard_normal((3, 37, 29, 61)).astype(np.float32)
    tiled = pyforge.compile(model, target="cpu")
    sources = [Path(p).read_text() for p in tiled.runtime.kernel_paths.values()]
    assert sources and all("claim(nxt)" in s for s in sources)
    monkeypatch.setattr(emit, "PARALLEL_MIN", 1 << 40)  # every kernel serial: one plain loop
    serial = pyforge.compile(model, target="cpu")
    assert not any("claim(" in Path(p).read_text() for p in serial.runtime.kernel_paths.values())
    got, want = tiled.predict(x), serial.predict(x)
    assert np.array_equal(got, want)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_small_kernels_stay_serial():
    """Below PARALLEL_MIN iterations (a transformer block's 128 x 256 GELU) a kernel is one plain
    loop: no parallel region to start, whose thread wake-up costs more than the loop on a
    loaded machine."""
    for n, tiled in ((128 * 256, False), (128 * 384 * 4, True)):
        model = helper.make_model(
            helper.make_graph(
                [helper.make_node("Tanh", ["x"], ["y"])],
                "tanh",
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])],
            ),
            opset_imports=[helper.make_opsetid("", 17)],
        )
        compiled = pyforge.compile(model, target="cpu")
        src = "".join(Path(p).read_text() for p in compiled.runtime.kernel_paths.values())
        assert ("claim(nxt)" in src) == tiled, n
        x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
        np.testing.assert_allclose(compiled.predict(x), np.tanh(x), rtol=1e-6, atol=1e-7)
