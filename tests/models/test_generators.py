import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from pyforge.models import MODELS, cached_model, random_inputs

OUTPUT_SHAPES = {
    "mlp": lambda b: (b, 10),
    "ew": lambda b: (b, 8, 32, 32),
    "resnet50": lambda b: (b, 1000),
}


@pytest.fixture(scope="module")
def built() -> dict[str, onnx.ModelProto]:
    """Each model once, at batch 2, so a batch dimension of 1 cannot hide a shape bug."""
    return {name: make(batch=2) for name, make in MODELS.items()}


@pytest.fixture(scope="module")
def outputs(built) -> dict[str, np.ndarray]:
    """Each model's only output under ONNX Runtime's CPU provider."""
    result = {}
    for name, model in built.items():
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        (result[name],) = sess.run(None, random_inputs(model))
    return result


@pytest.mark.parametrize("name", list(MODELS))
def test_passes_checker_with_unique_names(built, name):
    model = built[name]
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == 17
    node_names = [n.name for n in model.graph.node]
    assert all(node_names) and len(set(node_names)) == len(node_names)


@pytest.mark.parametrize("name", list(MODELS))
def test_runs_in_onnxruntime(outputs, name):
    out = outputs[name]
    assert out.shape == OUTPUT_SHAPES[name](2)
    assert np.isfinite(out).all()
    assert out.std() > 0


def test_resnet50_activations_stay_sane(outputs):
    out = outputs["resnet50"]
    assert 0.01 < out.std() < 100
    assert not np.allclose(out[0], out[1])


def test_resnet50_size(built):
    params = sum(int(np.prod(t.dims)) for t in built["resnet50"].graph.initializer)
    trainable = params - sum(
        int(np.prod(t.dims)) for t in built["resnet50"].graph.initializer if "running" in t.name
    )
    assert trainable == 25_557_032  # torchvision's resnet50 parameter count


def test_ew_has_a_multi_use_value(built):
    uses: dict[str, int] = {}
    for node in built["ew"].graph.node:
        for i in node.input:
            uses[i] = uses.get(i, 0) + 1
    assert any(n > 1 for name, n in uses.items() if name != "x")


@pytest.mark.parametrize("name", list(MODELS))
def test_generation_is_deterministic(name):
    make = MODELS[name]
    first = make(batch=1, seed=3).SerializeToString()
    assert make(batch=1, seed=3).SerializeToString() == first
    assert make(batch=1, seed=4).SerializeToString() != first


def test_random_inputs_seeded_and_nonzero(built):
    a = random_inputs(built["mlp"], seed=1)
    assert list(a) == ["x"] and a["x"].dtype == np.float32 and a["x"].shape == (2, 256)
    np.testing.assert_array_equal(a["x"], random_inputs(built["mlp"], seed=1)["x"])
    assert not np.array_equal(a["x"], random_inputs(built["mlp"], seed=2)["x"])
    assert np.count_nonzero(a["x"]) == a["x"].size


def test_random_inputs_skips_initializers_and_resolves_symbolic_dims():
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 4])
    w = onnx.helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [4])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 4])
    init = onnx.numpy_helper.from_array(np.ones(4, np.float32), "w")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Add", ["x", "w"], ["y"])], "g", [x, w], [y], [init]
    )
    feeds = random_inputs(onnx.helper.make_model(graph))
    assert list(feeds) == ["x"] and feeds["x"].shape == (1, 4)


def test_cached_model_writes_once_and_reuses(tmp_path):
    path = cached_model("mlp", batch=3, cache_dir=str(tmp_path))
    assert path == str(tmp_path / "models" / "mlp_b3.onnx")
    model = onnx.load(path)
    assert model.SerializeToString() == MODELS["mlp"](batch=3).SerializeToString()
    assert random_inputs(path)["x"].shape == (3, 256)
    mtime = os.stat(path).st_mtime_ns
    assert cached_model("mlp", batch=3, cache_dir=str(tmp_path)) == path
    assert os.stat(path).st_mtime_ns == mtime
    assert os.listdir(tmp_path / "models") == ["mlp_b3.onnx"]


def test_cached_model_uses_env_var(tmp_path, monkeypatch):
    monkeypatch.setenv("PYFORGE_CACHE", str(tmp_path))
    assert cached_model("ew") == str(tmp_path / "models" / "ew_b1.onnx")
