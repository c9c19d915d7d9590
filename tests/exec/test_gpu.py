"""Parity of the three models on a real GPU (cuBLASLt + CUDA graph); skipped without one."""

import numpy as np
import pytest
from onnx import helper, numpy_helper

import pyforge
from pyforge.models import MODELS, cached_model, random_inputs
from tests.helpers import check_against_ort, make_model

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("graph", [True, False], ids=["graph", "stepwise"])
@pytest.mark.parametrize("name", ["mlp", "ew", "resnet50"])
def test_model_matches_ort_on_cuda(name, graph):
    model = cached_model(name) if name == "resnet50" else MODELS[name](batch=2)
    compiled, _ = check_against_ort(
        model, random_inputs(model, seed=11), target="cuda", graph=graph
    )
    assert compiled.target == "cuda"


@pytest.mark.parametrize("fusion", [True, False])
def test_resnet50_fusion_parity_on_cuda(fusion):
    path = cached_model("resnet50")
    check_against_ort(path, random_inputs(path, seed=4), target="cuda", fusion=fusion)


def test_graph_replay_gives_fresh_outputs():
    model = MODELS["mlp"](batch=1)
    compiled = pyforge.compile(model, target="cuda")
    a = compiled.predict(random_inputs(model, seed=1))
    b = compiled.predict(random_inputs(model, seed=2))
    assert not np.allclose(a, b)
    np.testing.assert_allclose(compiled.predict(random_inputs(model, seed=1)), a, rtol=1e-6)


def test_saved_plan_runs_on_cuda(tmp_path):
    model = MODELS["ew"](batch=1)
    x = random_inputs(model, seed=3)
    compiled = pyforge.compile(model, target="cuda")
    compiled.save(tmp_path / "plan")
    np.testing.assert_allclose(
        pyforge.load(tmp_path / "plan", target="cuda").predict(x), compiled.predict(x), rtol=1e-6
    )


def test_no_device_allocation_after_first_predict():
    from numba import cuda

    path = cached_model("resnet50")
    x = random_inputs(path, seed=5)
    compiled = pyforge.compile(path, target="cuda")
    compiled.predict(x)
    cuda.synchronize()
    free_before, _ = cuda.current_context().get_memory_info()
    for seed in range(20):
        compiled.predict(random_inputs(path, seed=seed))
    cuda.synchronize()
    free_after, _ = cuda.current_context().get_memory_info()
    print(f"device bytes allocated over 20 predicts: {free_before - free_after}")
    assert free_after == free_before


def test_tf32_error_is_stated():
    path = cached_model("resnet50")
    _, err = check_against_ort(
        path, random_inputs(path, seed=6), target="cuda", precision="tf32", rtol=5e-2, atol=5e-2
    )
    print(f"tf32 max abs error vs ORT fp32: {err:.3g}")


@pytest.mark.parametrize("graph", [True, False], ids=["graph", "steps"])
def test_fp16_resnet50_error_is_stated(graph):
    """float16 storage, cuBLASLt fp16 tensor cores accumulating in float32: within 2% of the
    output's scale against ORT's float32, and fresh inputs give fresh outputs."""
    from tests.helpers import run_ort

    path = cached_model("resnet50")
    compiled = pyforge.compile(path, target="cuda", precision="fp16", graph=graph)
    for seed in (7, 8):
        feeds = random_inputs(path, seed=seed)
        got, (want,) = compiled.predict(feeds), run_ort(path, feeds)
        assert got.dtype == np.float32
        rel = float(np.abs(got - want).max() / np.abs(want).max())
        print(f"fp16 seed {seed}: max abs error {np.abs(got - want).max():.3g}, {rel:.3g} of max")
        assert rel < 2e-2


def test_fp16_mlp_matches_ort():
    model = MODELS["mlp"](batch=4)
    check_against_ort(
        model, random_inputs(model, seed=9), target="cuda", precision="fp16", rtol=2e-2, atol=2e-2
    )


@pytest.mark.parametrize("graph", [True, False], ids=["graph", "steps"])
def test_empty_tensors_on_cuda(graph):
    """An empty input and an empty output (zero-byte buffers: nothing to pin or copy)."""
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)
    empty = helper.make_node("Identity", ["x"], ["same"])
    model = make_model(
        [node, empty],
        [("x", np.float32, [2, 0, 4])],
        [("y", np.float32, [2, 1, 4]), ("same", np.float32, [2, 0, 4])],
        [numpy_helper.from_array(np.array([1], np.int64), "axes")],
        opset=18,
    )
    x = {"x": np.zeros((2, 0, 4), np.float32)}
    check_against_ort(model, x, target="cuda", graph=graph)


@pytest.mark.parametrize("graph", [True, False], ids=["graph", "steps"])
def test_device_inputs_give_device_outputs(graph):
    from numba import cuda

    model = MODELS["mlp"](batch=2)
    compiled = pyforge.compile(model, target="cuda", graph=graph)
    feeds = [random_inputs(model, seed=s) for s in (7, 8)]
    want = [compiled.predict(f) for f in feeds]  # numpy in, numpy out
    for f, w in zip(feeds, want):  # fresh device inputs, fresh device outputs each call
        ((name, x),) = f.items()
        y = compiled.predict({name: cuda.to_device(x)})
        assert hasattr(y, "__cuda_array_interface__") and y.shape == w.shape
        np.testing.assert_array_equal(y.copy_to_host(), w)
    before = want[1].copy()
    compiled.predict(feeds[0])  # host outputs are copies: the next predict leaves them alone
    np.testing.assert_array_equal(want[1], before)


def test_device_input_from_another_stream_is_waited_for():
    from numba import cuda

    model = MODELS["ew"](batch=1)
    compiled = pyforge.compile(model, target="cuda")
    ((name, x),) = random_inputs(model, seed=9).items()
    producer = cuda.stream()
    d = cuda.device_array(x.shape, x.dtype, stream=producer)
    d.copy_to_device(x, stream=producer)  # still in flight on `producer` when predict starts
    y = compiled.predict({name: d})
    np.testing.assert_array_equal(y.copy_to_host(), compiled.predict({name: x}))


def test_out_of_range_gather_index_raises_on_the_device():
    from pyforge.errors import IndexRangeError

    node = helper.make_node("Gather", ["data", "idx"], ["y"], name="gather_node", axis=0)
    model = make_model(
        [node],
        [("data", np.float32, [300, 8]), ("idx", np.int64, [40, 9])],
        [("y", np.float32, [40, 9, 8])],
    )
    compiled = pyforge.compile(model, target="cuda")  # graph replay
    rng = np.random.default_rng(11)
    data = rng.standard_normal((300, 8)).astype(np.float32)
    idx = rng.integers(-300, 300, (40, 9))
    want = compiled.predict({"data": data, "idx": idx})
    np.testing.assert_array_equal(want, np.take(data, idx, axis=0))
    bad = idx.copy()
    bad[7, 3] = 300
    with pytest.raises(IndexRangeError, match="gather_node"):
        compiled.predict({"data": data, "idx": bad})
    np.testing.assert_array_equal(compiled.predict({"data": data, "idx": idx}), want)
