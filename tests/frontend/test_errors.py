"""Bad input gets a clear pyforge.errors exception naming what is wrong."""

import numpy as np
import pytest
from onnx import helper

import pyforge
from pyforge.errors import InputError, ModelLoadError, ShapeError, UnsupportedOperatorError
from pyforge.models import mlp
from tests.helpers import make_model


def test_unsupported_op_names_op_node_and_opset():
    model = make_model(
        [helper.make_node("DFT", ["x"], ["y"], name="dft0")],
        [("x", np.float32, [1, 4, 1])],
        [("y", np.float32, [1, 4, 2])],
    )
    with pytest.raises(UnsupportedOperatorError) as e:
        pyforge.compile(model, target="cpu")
    msg = str(e.value)
    assert "DFT" in msg and "dft0" in msg and "opset 17" in msg


def test_custom_domain_is_refused_at_compile_time():
    node = helper.make_node("Foo", ["x"], ["y"], name="foo1", domain="com.example")
    model = make_model([node], [("x", np.float32, [2])], [("y", np.float32, [2])])
    with pytest.raises(UnsupportedOperatorError, match="com.example"):
        pyforge.compile(model, target="cpu")


@pytest.fixture(scope="module")
def compiled_mlp():
    return pyforge.compile(mlp(batch=1), target="cpu")


def test_wrong_input_name(compiled_mlp):
    with pytest.raises(InputError, match="unknown input name.*'z'.*takes \\['x'\\]"):
        compiled_mlp.predict({"z": np.ones((1, 256), np.float32)})


def test_wrong_input_shape(compiled_mlp):
    with pytest.raises(InputError, match=r"shape \(2, 256\): dim 0 must be 1 .*\(1, 256\)"):
        compiled_mlp.predict(np.ones((2, 256), np.float32))


def test_wrong_input_dtype(compiled_mlp):
    with pytest.raises(InputError, match="dtype float64, expected float32"):
        compiled_mlp.predict(np.ones((1, 256), np.float64))


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        pyforge.compile(str(tmp_path / "nope.onnx"), target="cpu")


def test_truncated_file(tmp_path):
    data = mlp().SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(ModelLoadError, match="cut.onnx"):
        pyforge.compile(str(path), target="cpu")


def test_not_onnx_file(tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("this is a text file, not a model\n" * 10)
    with pytest.raises(ModelLoadError, match="notes.onnx"):
        pyforge.compile(str(path), target="cpu")


def test_run_time_reshape_target_is_staged_and_checked():
    model = make_model(
        [helper.make_node("Reshape", ["x", "s"], ["y"], name="r0")],
        [("x", np.float32, [2, 3]), ("s", np.int64, [2])],
        [("y", np.float32, [3, 2])],
    )
    m = pyforge.compile(model, target="cpu")  # the shape is read from each run's "s"
    x = np.arange(6, dtype=np.float32) + 0.5
    got = m.predict({"x": x.reshape(2, 3), "s": np.int64([3, 2])})
    np.testing.assert_array_equal(got, x.reshape(3, 2))
    with pytest.raises(ShapeError, match="r0"):  # 6 elements cannot be 4 x 2
        m.predict({"x": x.reshape(2, 3), "s": np.int64([4, 2])})
