"""ExecutionPlan save/load round trip, and loading without the onnx package."""

import subprocess
import sys

import numpy as np
import pytest

import pyforge
from pyforge.models import mlp, random_inputs


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
