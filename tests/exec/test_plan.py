"""ExecutionPlan save/load round trip, and loading without the onnx package."""

import subprocess
import sys

import numpy as np
import pytest
from onnx import helper, numpy_helper

import pyforge
from pyforge.compiler import compile_to_plan
from pyforge.exec.plan import ExecutionPlan
from pyforge.lower_numba.describe import regenerate
from pyforge.models import mlp, random_inputs
from pyforge.options import CompileOptions
from tests.exec.test_threads import two_conv
from tests.helpers import check_against_ort, make_model


def block(seq: int = 8, d: int = 16, heads: int = 2):
    """A pre-norm transformer block: LayerNorm, attention (Reshape, Transpose, Softmax), an
    erf-GELU MLP and two residual Adds."""
    rng = np.random.default_rng(11)
    inits = []

    def param(name, array):
        inits.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def weight(name, *shape):
        return param(name, rng.standard_normal(shape) * 0.3)

    hd = d // heads
    inits.append(numpy_helper.from_array(np.array([1, seq, heads, hd], np.int64), "split"))
    inits.append(numpy_helper.from_array(np.array([1, seq, d], np.int64), "merge"))
    scale, half = param("scale", 1 / np.sqrt(hd)), param("half", 0.5)
    N = helper.make_node
    nodes = [N("LayerNormalization", ["x", weight("g", d), weight("b", d)], ["ln"], axis=-1)]
    for t in "qkv":
        perm = [0, 2, 3, 1] if t == "k" else [0, 2, 1, 3]
        nodes += [
            N("MatMul", ["ln", weight("w" + t, d, d)], [t + "0"]),
            N("Reshape", [t + "0", "split"], [t + "1"]),
            N("Transpose", [t + "1"], [t], perm=perm),
        ]
    nodes += [
        N("MatMul", ["q", "k"], ["s0"]),
        N("Mul", ["s0", scale], ["s"]),
        N("Softmax", ["s"], ["p"], axis=-1),
        N("MatMul", ["p", "v"], ["o0"]),
        N("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
        N("Reshape", ["o1", "merge"], ["o2"]),
        N("MatMul", ["o2", weight("wo", d, d)], ["o3"]),
        N("Add", ["x", "o3"], ["h"]),
        N("MatMul", ["h", weight("w1", d, 4 * d)], ["f0"]),
        N("Add", ["f0", weight("b1", 4 * d)], ["f1"]),
        N("Div", ["f1", scale], ["f2"]),
        N("Erf", ["f2"], ["f3"]),
        N("Mul", ["f1", "f3"], ["f4"]),
        N("Mul", ["f4", half], ["f5"]),
        N("MatMul", ["f5", weight("w2", 4 * d, d)], ["f6"]),
        N("Add", ["h", "f6"], ["y"]),
    ]
    io = [("x", np.float32, [1, seq, d])], [("y", np.float32, [1, seq, d])]
    return make_model(nodes, *io, inits)


MODELS = {"mlp": lambda: mlp(batch=2), "conv": two_conv, "block": block}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_loaded_plan_is_regenerated_and_predicts_the_same(tmp_path, name):
    model = MODELS[name]()
    x = random_inputs(model, seed=9)
    compiled, _ = check_against_ort(model, x)
    compiled.save(tmp_path / "plan")
    loaded = pyforge.load(tmp_path / "plan", target="cpu")
    np.testing.assert_array_equal(loaded.predict(x), compiled.predict(x))
    assert loaded.plan.steps == compiled.plan.steps
    assert loaded.plan.kernels == compiled.plan.kernels


@pytest.mark.parametrize("options", [{}, {"conv": "implicit", "specialize": True}])
def test_a_cuda_plan_regenerates_on_any_machine(tmp_path, options):
    """Lowering is pure Python: a cuda plan's description lowers to its kernels without a GPU."""
    plan, _ = compile_to_plan(two_conv(), CompileOptions(**options).resolve("cuda"))
    plan.save(str(tmp_path))
    loaded = ExecutionPlan.load(str(tmp_path), regenerate)
    assert loaded.kernels == plan.kernels and loaded.steps == plan.steps
    assert any("cuda" in k for k in loaded.kernels.values())


def test_save_load_round_trip(tmp_path):
    model = mlp(batch=1)
    x = random_inputs(model, seed=7)
    compiled = pyforge.compile(model, target="cpu")
    compiled.save(tmp_path / "plan")
    for f in ("plan.json", "weights.bin"):
        assert (tmp_path / "plan" / f).is_file()
    assert list((tmp_path / "plan" / "kernels").glob("*.cpu.py"))
    loaded = pyforge.load(tmp_path / "plan", target="cpu")
    np.testing.assert_array_equal(loaded.predict(x), compiled.predict(x))
    assert loaded.stats["launches"] == compiled.stats["launches"]


def test_loaded_plan_runs_without_onnx(tmp_path):
    model = mlp(batch=1)
    x = random_inputs(model, seed=8)["x"]
    compiled = pyforge.compile(model, target="cpu")
    compiled.save(tmp_path / "plan")
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "want.npy", compiled.predict(x))
    script = f"""
import sys, numpy as np
sys.modules["onnx"] = None  # any import of onnx now fails
import pyforge
y = pyforge.load({str(tmp_path / "plan")!r}, target="cpu").predict(np.load({str(tmp_path / "x.npy")!r}))
np.testing.assert_array_equal(y, np.load({str(tmp_path / "want.npy")!r}))
assert "onnx" not in [m for m in sys.modules if sys.modules[m] is not None and m == "onnx"]
print("ok")
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


class _FakeDeviceArray:
    """Exports only the CUDA array interface, like a GPU array would (no GPU needed)."""

    def __init__(self, shape, typestr, strides=None):
        self.__cuda_array_interface__ = {
            "shape": shape, "typestr": typestr, "strides": strides, "data": (0, False),
            "version": 3,
        }  # fmt: skip


def test_device_inputs_are_checked_without_copying():
    from pyforge.errors import InputError
    from pyforge.exec.plan import normalise_feeds

    plan = pyforge.compile(mlp(batch=2), target="cpu").plan
    ((name, shape, dtype),) = plan.signature(plan.inputs)
    ok = _FakeDeviceArray(shape, dtype.str)
    assert normalise_feeds(plan, {name: ok})[name].array is ok  # kept on the device
    row = dtype.itemsize * int(np.prod(shape[1:]))
    dense = _FakeDeviceArray(shape, dtype.str, (row, dtype.itemsize))
    assert normalise_feeds(plan, dense)[name].array is dense
    with pytest.raises(InputError, match="shape"):
        normalise_feeds(plan, _FakeDeviceArray((shape[0] + 1, *shape[1:]), dtype.str))
    with pytest.raises(InputError, match="dtype"):
        normalise_feeds(plan, _FakeDeviceArray(shape, "<f8"))
    with pytest.raises(InputError, match="C-contiguous"):
        normalise_feeds(plan, _FakeDeviceArray(shape, dtype.str, (dtype.itemsize, row)))
