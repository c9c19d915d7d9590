"""Own sgemm's small GEMMs run on the calling thread alone (cpu.own.SERIAL_WORK): the same
results as the parallel ones, and Numba's thread count is given back after each."""

from pathlib import Path

import numba
import numpy as np
import pytest
from onnx import helper, numpy_helper

from pyforge.exec.cpu import own
from pyforge.exec.cpu import sgemm as cpu_sgemm
from pyforge.exec.steps import GemmStep
from tests.helpers import check_against_ort, make_model

pytestmark = pytest.mark.skipif(not cpu_sgemm.available(), reason="needs AVX2 + FMA")


def _mlp(hidden: int, inner: int, seq: int = 128, seed: int = 5):
    """x @ w1 + b1, Relu, @ w2: a transformer block's feed-forward at a small and a large size."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((hidden, inner)) / np.sqrt(hidden)).astype(np.float32)
    w2 = (rng.standard_normal((inner, hidden)) / np.sqrt(inner)).astype(np.float32)
    b1 = rng.standard_normal(inner).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (w2, "w2"), (b1, "b1"))]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    shape = [1, seq, hidden]
    model = make_model(nodes, [("x", np.float32, shape)], [("y", np.float32, shape)], inits)
    return model, {"x": rng.standard_normal(shape).astype(np.float32)}


@pytest.mark.parametrize("hidden, inner", [(64, 256), (384, 1536)])
def test_small_gemms_serial_large_parallel_same_results(hidden, inner):
    model, feeds = _mlp(hidden, inner)
    before = numba.get_num_threads()
    compiled, _ = check_against_ort(model, feeds)
    at = [i for i, s in enumerate(compiled.plan.steps) if isinstance(s, GemmStep)]
    gemms = [compiled.plan.steps[i] for i in at]
    assert len(gemms) == 2 and all("sgemm" in compiled.runtime.gemm_impls[i] for i in at)
    small = hidden * inner * 128 <= own.SERIAL_WORK
    assert small == (hidden == 64)
    expect = 1 if small else before
    assert [own.threads_for(s) for s in gemms] == [expect, expect]
    compiled.predict(feeds)
    assert numba.get_num_threads() == before  # the serial driver gives the count back


def test_drivers_are_disk_cacheable():
    """The serial driver sets the thread count through the linked symbol, not numba's ctypes
    call, which would keep every driver out of Numba's disk cache (compiled in each process)."""
    import warnings

    from numba.core.errors import NumbaWarning

    model, feeds = _mlp(64, 256, seed=7)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NumbaWarning)
        compiled, _ = check_against_ort(model, feeds)
    assert not [w for w in caught if "Cannot cache" in str(w.message)]
    src = "".join(Path(p).read_text() for p in compiled.runtime.driver_paths.values())
    assert "set_threads(1)" in src
