"""The cpu target's one-call GEMM steps (generated driver around CBLAS)."""

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import pyforge
from pyforge.exec.cpu.blas import cblas_gemm
from tests.helpers import check_against_ort, make_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _conv_model(seed: int = 0) -> onnx.ModelProto:
    """3x3 conv + bias + residual + Relu: big enough that its kernels are compiled parallel."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c", "x"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    shape = [1, 8, 64, 64]
    return make_model(nodes, [("x", np.float32, shape)], [("y", np.float32, shape)], [w, b])


def test_numpy_blas_is_found():
    # CI installs numpy from PyPI: its bundled OpenBLAS must be reachable, or every GEMM step
    # silently falls back to three calls
    assert cblas_gemm(np.float32) is not None
    assert cblas_gemm(np.float64) is not None
    assert cblas_gemm(np.int32) is None


def test_conv_step_is_one_call_and_matches_ort():
    model = _conv_model()
    x = {"x": np.random.default_rng(1).standard_normal((1, 8, 64, 64)).astype(np.float32)}
    fused, _ = check_against_ort(model, x)
    assert fused.stats["launches"] == 1  # im2col + GEMM + bias/residual/Relu in one call
    three = pyforge.compile(model, target="cpu", fused_steps=False)
    assert three.stats["launches"] == 3
    np.testing.assert_allclose(fused.predict(x), three.predict(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_gemm_transposes_alpha_beta_and_c(trans_a, trans_b):
    rng = np.random.default_rng(trans_a * 2 + trans_b)
    m, k, n = 5, 7, 3
    a_shape = [k, m] if trans_a else [m, k]
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float64)
    node = helper.make_node(
        "Gemm", ["a", "b", "c"], ["y"], alpha=0.5, beta=2.0, transA=trans_a, transB=trans_b
    )
    model = make_model(
        [node],
        [("a", np.float64, a_shape), ("c", np.float64, [m, n])],
        [("y", np.float64, [m, n])],
        [numpy_helper.from_array(b, "b")],
    )
    feeds = {
        "a": rng.standard_normal(a_shape),
        "c": rng.standard_normal((m, n)),
    }
    compiled, _ = check_against_ort(model, feeds)
    assert compiled.stats["launches"] == 1


@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_one_row_gemm_split_over_threads(trans_a, trans_b):
    # a decode step's GEMV (m 1, n * k >= GEMV_SPLIT_MIN): each thread takes a slice of the
    # output columns (n odd: the parts are unequal)
    rng = np.random.default_rng(10 + trans_a * 2 + trans_b)
    k, n = 512, 8193  # n * k >= GEMV_SPLIT_MIN
    a_shape = [k, 1] if trans_a else [1, k]
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transA=trans_a, transB=trans_b)
    model = make_model(
        [node],
        [("a", np.float32, a_shape)],
        [("y", np.float32, [1, n])],
        [
            numpy_helper.from_array(b, "b"),
            numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "c"),
        ],
    )
    x = {"a": rng.standard_normal(a_shape).astype(np.float32)}
    compiled, _ = check_against_ort(model, x, atol=1e-4)  # sums of 512 products ~ 20
    assert "gemv" in compiled.runtime.gemm_impls[0]


def test_batched_matmul_with_broadcast_a():
    rng = np.random.default_rng(4)
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    model = make_model(
        [node],
        [("a", np.float32, [4, 6]), ("b", np.float32, [3, 6, 5])],
        [("y", np.float32, [3, 4, 5])],
    )
    feeds = {
        "a": rng.standard_normal((4, 6)).astype(np.float32),
        "b": rng.standard_normal((3, 6, 5)).astype(np.float32),
    }
    check_against_ort(model, feeds)


def test_cached_drivers_run_in_a_fresh_process():
    """Drivers loaded from Numba's cache call parallel kernels before any kernel ran from
    Python: the thread pool must be started for them (ResNet-50's first conv segfaulted)."""
    from pyforge.models import cached_model

    path = cached_model("resnet50")
    script = (
        "import numpy as np, pyforge\n"
        "from pyforge.models import random_inputs\n"
        f"m = pyforge.compile({path!r}, target='cpu')\n"
        f"y = m.predict(random_inputs({path!r}, seed=0))\n"
        "assert np.isfinite(y).all()\n"
    )
    env = dict(os.environ, PYTHONPATH=ROOT)
    for _ in range(2):  # the second run loads every driver from the cache
        run = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, check=False
        )
        assert run.returncode == 0, run.stderr.decode()[-2000:]


@pytest.mark.parametrize(
    "c,h,w,k,stride,pad,dil",
    [
        (3, 9, 7, 3, 1, (1, 1), 1),
        (4, 8, 8, 3, 2, (1, 0), 1),
        (2, 7, 9, 3, 1, (2, 2), 2),
        (5, 6, 6, 1, 2, (0, 0), 1),
    ],
)
def test_row_copy_im2col_matches_numpy(c, h, w, k, stride, pad, dil):
    """The cpu target's im2col against a padded-array reference (strides, uneven pads, dilation)."""
    from pyforge.exec.cpu.conv import im2col_nchw

    x = np.random.default_rng(c * 100 + h).standard_normal((2, c, h, w)).astype(np.float32)
    ph, pw = pad
    span = dil * (k - 1) + 1
    oh, ow = (h + 2 * ph - span) // stride + 1, (w + 2 * pw - span) // stride + 1
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    want = np.empty((2, c, k, k, oh, ow), np.float32)
    for ky in range(k):
        for kx in range(k):
            y0, x0 = ky * dil, kx * dil
            want[:, :, ky, kx] = xp[
                :, :, y0 : y0 + stride * oh : stride, x0 : x0 + stride * ow : stride
            ]
    col = np.full(want.size, np.nan, np.float32)
    g = np.array([2, c, h, w, k, k, stride, stride, ph, pw, dil, dil, oh, ow], np.int64)
    im2col_nchw(x.ravel(), col, g)
    np.testing.assert_array_equal(col, want.ravel())
