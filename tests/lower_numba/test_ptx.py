"""Every cuda kernel of a plan compiles to sm_90 PTX; under fp16, without NVRTC-built float16 code.

Needs no GPU, only numba-cuda, NVVM and NVRTC (the [cuda] extra); skipped where they are
missing. Why it matters: a kernel doing float16 arithmetic links the cuda_fp16 shim, and
Numba's kernel cache then fails ("Cannot pickle CUDACodeLibrary with linking files").
Under precision="fp16" every float16 load is widened to float32, so no kernel may link it.
"""

import importlib.util

import numba
import numpy as np
import pytest
from numba import cuda, types
from onnx import helper, numpy_helper

from pyforge.compiler import compile_to_plan
from pyforge.exec.steps import kernel_steps
from pyforge.models import MODELS
from tests.helpers import make_model


def _ptx_available() -> bool:
    try:  # numba's built-in numba.cuda asks a driver for the device when a kernel calls a function
        import numba_cuda  # noqa: F401

        cuda.compile_ptx(lambda a: None, (types.int64,), cc=(9, 0))
        return True
    except Exception:  # noqa: BLE001  (no NVVM/NVRTC here: the test cannot run)
        return False


pytestmark = pytest.mark.skipif(
    not _ptx_available(), reason="no numba-cuda with NVVM/NVRTC ([cuda] extra) to compile PTX"
)


def _kernels(plan):
    return kernel_steps(plan.steps)


def _arg_type(plan, kind, value):
    if kind == "t":
        return types.Array(numba.from_dtype(np.dtype(plan.slots[value].dtype)), 1, "C")
    if kind == "w":
        return types.Array(types.complex128, 1, "C")
    if kind == "e":
        return types.Array(types.int32, 1, "C")
    return types.int64


def _ptx_of(plan, step, tmp_path):
    path = tmp_path / f"k_{step.kernel}.py"
    path.write_text(plan.kernels[step.kernel]["cuda"].replace("cache=True", "cache=False"))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sig = (types.int64, *(_arg_type(plan, k, v) for k, v in step.args))
    return cuda.compile_ptx(module.kernel.py_func, sig, cc=(9, 0))[0]


def _every_follow_op():
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), "w")
    s = numpy_helper.from_array(rng.standard_normal((1, 8, 1, 1)).astype(np.float32), "s")
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        n("LeakyRelu", ["c"], ["a1"], alpha=0.1),
        n("Clip", ["a1"], ["a2"]),
        n("Sigmoid", ["a2"], ["a3"]),
        n("Tanh", ["c"], ["b1"]),
        n("HardSigmoid", ["b1"], ["b2"]),
        n("HardSwish", ["b2"], ["b3"]),
        n("Neg", ["a3"], ["d1"]),
        n("Abs", ["d1"], ["d2"]),
        n("Sub", ["d2", "b3"], ["d3"]),
        n("Mul", ["d3", "s"], ["d4"]),
        n("Max", ["d4", "c"], ["d5"]),
        n("Min", ["d5", "a3"], ["d6"]),
        n("AveragePool", ["d6"], ["p1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        n("MaxPool", ["p1"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
        n("GlobalMaxPool", ["p2"], ["g1"]),
        n("GlobalAveragePool", ["p2"], ["g2"]),
        n("Concat", ["g1", "g2"], ["cc"], axis=1),
        n("Transpose", ["cc"], ["t"], perm=[0, 2, 3, 1]),
        n("Flatten", ["t"], ["y"]),
    ]
    inputs, outputs = [("x", np.float32, [1, 8, 8, 8])], [("y", np.float32, [1, 16])]
    return make_model(nodes, inputs, outputs, [w, s])


@pytest.mark.parametrize(
    "name, layout",
    [("follow_ops", "nhwc"), ("follow_ops", "nchw"), ("mlp", "nhwc"), ("resnet50", "nhwc")],
)
@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_cuda_kernels_compile_to_ptx(name, layout, precision, tmp_path):
    """The real-GPU compile of every kernel (the simulator does not type them as the GPU does);
    under fp16, none may do float16 arithmetic."""
    model = _every_follow_op() if name == "follow_ops" else MODELS[name](1)
    plan, _ = compile_to_plan(model, specialize=True, layout=layout, precision=precision)
    halves = any(np.dtype(s.dtype) == np.float16 for s in plan.slots.values())
    assert halves == (precision == "fp16")
    steps = {s.kernel: s for s in _kernels(plan)}
    for step in steps.values():
        assert "__half" not in _ptx_of(plan, step, tmp_path), step.label
