"""An in-place cpu step (an elementwise kernel writing over the tensor it reads) runs a kernel that
names that buffer once: LLVM's overlap check would otherwise send its loop to the scalar path."""

from pathlib import Path

import numpy as np
from onnx import helper, numpy_helper

from pyforge.exec.cpu.runtime import one_name_per_buffer
from pyforge.exec.steps import KernelStep
from tests.helpers import check_against_ort, make_model

rng = np.random.default_rng(4)

SOURCE = """\
@njit(parallel=False, cache=True, nogil=True)
def kernel(n, t0, t1, k2, t2):
    t1s = t1[0]
    for i in prange(n):
        iu = u64(i)
        t2[iu] = t0[iu] * t1s + t0[iu]
"""


def test_parameters_bound_to_one_buffer_read_through_one_name():
    buf = rng.standard_normal(64).astype(np.float32)
    scale = np.ones(1, np.float32)
    same = one_name_per_buffer(SOURCE, (buf, scale, np.int64(3), buf[:]))
    assert "t2[iu] = t0[iu] * t1s + t0[iu]" not in same
    assert "t0[iu] = t0[iu] * t1s + t0[iu]" in same and "def kernel(n, t0, t1, k2, t2)" in same
    # other buffers, or the same bytes as another type or length, keep their names
    assert one_name_per_buffer(SOURCE, (buf, scale, np.int64(3), buf.copy())) == SOURCE
    assert one_name_per_buffer(SOURCE, (buf, scale, np.int64(3), buf.view(np.int32))) == SOURCE
    assert one_name_per_buffer(SOURCE, (buf, scale, np.int64(3), buf[:32])) == SOURCE
    assert one_name_per_buffer(SOURCE, (buf, scale)) == SOURCE  # not this kernel's arguments


def test_in_place_gelu_after_a_matmul_matches_ort_and_runs_one_name():
    x = rng.standard_normal((64, 48)).astype(np.float32)
    w = (rng.standard_normal((48, 96)) * 0.3).astype(np.float32)
    consts = [numpy_helper.from_array(w, "w")] + [
        helper.make_tensor(n, 1, [], [v])
        for n, v in (("s2", 1.4142135), ("one", 1.0), ("half", 0.5))
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Div", ["m", "s2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["a"]),
        helper.make_node("Mul", ["m", "a"], ["g"]),
        helper.make_node("Mul", ["g", "half"], ["y"]),
    ]
    model = make_model(nodes, [("x", np.float32, x.shape)], [("y", np.float32, (64, 96))], consts)
    compiled, _ = check_against_ort(model, {"x": x})
    plan, rt = compiled.plan, compiled.runtime
    steps = [s for s in plan.steps if isinstance(s, KernelStep) and "Erf" in s.label]
    assert len(steps) == 1, plan.step_labels()
    read, wrote = steps[0].args[0][1], steps[0].args[-1][1]
    r, w = plan.slots[read], plan.slots[wrote]
    assert (r.region, r.offset, r.dtype) == (w.region, w.offset, w.dtype), "not in place"
    body = Path(rt.kernel_paths[steps[0].kernel]).read_text().split("def kernel(")[-1]
    assert "t0[iu]" in body and "t2[iu]" not in body
