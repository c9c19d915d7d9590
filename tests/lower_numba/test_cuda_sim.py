"""Every CUDA kernel template, run in Numba's CUDA simulator on tiny shapes against ONNX Runtime.

The simulator must be switched on before numba is imported, so the outer test re-runs this file
in a subprocess with NUMBA_ENABLE_CUDASIM=1; inside it the parametrised cases run.
"""

import os

import numpy as np
import pytest
from onnx import helper

from tests.frontend.test_ops import one_op, rand
from tests.frontend.test_sample_ops import _grid_model, _roi_model
from tests.helpers import check_against_ort, make_model, run_in_simulator

INSIDE = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
inside_only = pytest.mark.skipif(not INSIDE, reason="runs inside the simulator subprocess")


@pytest.mark.sim
@pytest.mark.skipif(INSIDE, reason="this is the launcher")
def test_simulator_suite():
    run_in_simulator(__file__, timeout=1500)


def _conv(attrs, cin=2, cout=3, size=5):
    g = attrs.get("group", 1)
    return one_op(
        "Conv",
        [rand(1, cin, size, size)],
        None,
        attrs,
        consts=[rand(cout, cin // g, *attrs["kernel_shape"]), rand(cout)],
    )


CASES = {
    "conv3x3_im2col_gemm_epilogue": lambda: _conv(dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
    "conv1x1_gemm": lambda: _conv(dict(kernel_shape=[1, 1])),
    # 3 channels (the ResNet stem's case): the generic im2col kernel, stride 2, uneven pads
    "conv3x3_s2_c3_row_im2col": lambda: _conv(
        dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 0, 0]), cin=3, cout=2, size=5
    ),
    # 8 channels: the im2col kernel copying channel runs of 8 (stride 2, uneven pads)
    "conv3x3_s2_vector_im2col": lambda: _conv(
        dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 0, 1]), cin=8, cout=4, size=5
    ),
    "conv_grouped_direct": lambda: _conv(dict(kernel_shape=[3, 3], group=2), cin=2, cout=2),
    "maxpool": lambda: one_op(
        "MaxPool",
        [rand(1, 2, 5, 5)],
        None,
        dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    ),
    "avgpool_incl_pad": lambda: one_op(
        "AveragePool",
        [rand(1, 2, 5, 5)],
        None,
        dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
    ),
    "global_avgpool": lambda: one_op("GlobalAveragePool", [rand(2, 3, 4, 4)], None),
    "transpose": lambda: one_op("Transpose", [rand(2, 3, 4)], None, dict(perm=[2, 0, 1])),
    "concat": lambda: one_op("Concat", [rand(2, 3), rand(2, 2)], None, dict(axis=1)),
    "softmax": lambda: one_op("Softmax", [rand(3, 7)], [3, 7], dict(axis=-1)),
    # statistics as graph inputs: not folded, so the BatchNormalization template runs
    "batchnorm_runtime_stats": lambda: one_op(
        "BatchNormalization",
        [rand(2, 3, 4, 4), rand(3), rand(3), rand(3), np.abs(rand(3)) + 0.5],
        None,
        dict(epsilon=1e-3),
    ),
    "gemm_trans_alpha": lambda: one_op(
        "Gemm",
        [rand(4, 3)],
        [3, 5],
        dict(transA=1, transB=1, alpha=0.5),
        consts=[rand(5, 4), rand(5)],
    ),
    "matmul_batched": lambda: one_op("MatMul", [rand(2, 3, 4), rand(2, 4, 5)], None),
    "roi_align_max": lambda: _roi_model(16, mode="max", spatial_scale=0.5),
    "grid_sample_bicubic_reflection": lambda: _grid_model("bicubic", "reflection", 0, 16),
    "broadcast_chain": lambda: (
        make_model(
            [
                helper.make_node("Mul", ["x", "s"], ["a"], name="mul"),
                helper.make_node("Sigmoid", ["a"], ["b"], name="sig"),
                helper.make_node("Tanh", ["a"], ["c"], name="tanh"),
                helper.make_node("Add", ["b", "c"], ["y"], name="add"),
            ],
            [("x", np.float32, [2, 3, 4]), ("s", np.float32, [3, 1])],
            [("y", np.float32, [2, 3, 4])],
        ),
        {"x": rand(2, 3, 4), "s": rand(3, 1)},
    ),
}


@inside_only
@pytest.mark.parametrize("fusion", [True, False])
@pytest.mark.parametrize("case", sorted(CASES))
def test_template_in_simulator(case, fusion):
    model, feeds = CASES[case]()
    compiled, _ = check_against_ort(model, feeds, target="cuda", fusion=fusion)
    assert compiled.runtime.gemm_backend == "numba"


@inside_only
def test_models_in_simulator():
    from pyforge.models import MODELS, random_inputs

    for name in ("mlp", "ew"):
        model = MODELS[name](batch=1)
        check_against_ort(model, random_inputs(model, seed=2), target="cuda")


@inside_only
def test_device_inputs_in_simulator():
    from numba import cuda

    import pyforge
    from pyforge.models import MODELS, random_inputs

    model = MODELS["mlp"](batch=1)
    compiled = pyforge.compile(model, target="cuda")
    ((name, x),) = random_inputs(model, seed=3).items()
    y = compiled.predict({name: cuda.to_device(x)})
    assert hasattr(y, "__cuda_ndarray__")  # a (simulated) Numba device array
    np.testing.assert_array_equal(y.copy_to_host(), compiled.predict({name: x}))


@inside_only
@pytest.mark.parametrize("case", range(4))
def test_device_index_checks_in_simulator(case):
    import pyforge
    from pyforge.errors import IndexRangeError
    from tests.lower_numba.test_index_checks import CASES, _indices, _model

    op, attrs, dshape, ishape, oshape, dims = CASES[case]
    compiled = pyforge.compile(_model(op, attrs, dshape, ishape, oshape), target="cuda")
    rng = np.random.default_rng(case)
    data = rng.standard_normal(dshape).astype(np.float32)
    idx = _indices(ishape, dims)
    want = pyforge.compile(_model(op, attrs, dshape, ishape, oshape), target="cpu").predict(
        {"data": data, "idx": idx}
    )
    bad = idx.copy()
    bad.flat[-1] = int(np.broadcast_to(np.asarray(dims), ishape).flat[-1])  # one past the end
    with pytest.raises(IndexRangeError, match=op):
        compiled.predict({"data": data, "idx": bad})
    # the error word is cleared: the same model answers the next, valid call
    np.testing.assert_array_equal(compiled.predict({"data": data, "idx": idx}), want)


@inside_only
def test_roi_align_batch_index_check_in_simulator():
    import pyforge
    from pyforge.errors import IndexRangeError

    model, feeds = _roi_model(16)
    compiled = pyforge.compile(model, target="cuda")
    with pytest.raises(IndexRangeError, match="RoiAlign"):
        compiled.predict({**feeds, "b": np.array([0, 1, 2, 0, 1], np.int64)})
    check_against_ort(model, feeds, target="cuda")


def _conv_pool_chain():
    """Conv (8 channels: the 16-byte im2col runs) -> Relu -> MaxPool -> GlobalAveragePool:
    the pools follow the conv into float16."""
    from onnx import numpy_helper

    w = numpy_helper.from_array(rand(8, 8, 3, 3), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="mp"),
        helper.make_node("GlobalAveragePool", ["p"], ["y"], name="gap"),
    ]
    model = make_model(
        nodes, [("x", np.float32, [1, 8, 4, 4])], [("y", np.float32, [1, 8, 1, 1])], [w]
    )
    return model, {"x": rand(1, 8, 4, 4)}


@inside_only
@pytest.mark.parametrize("case", ["conv3x3_s2_vector_im2col", "conv3x3_s2_c3_row_im2col", "chain"])
def test_fp16_in_simulator(case):
    """precision="fp16": float16 storage, float32 arithmetic; within 1e-2 of ORT's float32."""
    model, feeds = _conv_pool_chain() if case == "chain" else CASES[case]()
    compiled, _ = check_against_ort(
        model, feeds, target="cuda", precision="fp16", rtol=1e-2, atol=1e-2
    )
    assert any(np.dtype(s.dtype) == np.float16 for s in compiled.plan.slots.values())


@inside_only
def test_fp16_mlp_in_simulator():
    from pyforge.models import MODELS, random_inputs

    model = MODELS["mlp"](batch=2)
    check_against_ort(
        model, random_inputs(model, seed=5), target="cuda", precision="fp16", rtol=1e-2, atol=1e-2
    )
