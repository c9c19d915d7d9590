"""pyforge's own float32 GEMM on the cpu target (cpu.sgemm via cpu.own): convolutions without an
im2col matrix, epilogues in the GEMM's store, and the same summation order for every element."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import pyforge
from pyforge.exec.cpu import CpuRuntime
from pyforge.exec.cpu import pack as cpu_pack
from pyforge.exec.cpu import sgemm as cpu_sgemm
from tests.helpers import check_against_ort, make_model

pytestmark = pytest.mark.skipif(not cpu_sgemm.available(), reason="needs AVX2 + FMA")


def _conv(cin, cout, hw, k, stride=1, pads=(0, 0, 0, 0), dil=1, batch=1, tail=(), seed=0):
    """Conv (+ bias) followed by the ops in ``tail`` ("residual", "relu", "relu6", "sigmoid")."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((cout, cin, k, k)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "b")
    attrs = dict(pads=list(pads), strides=[stride, stride], dilations=[dil, dil])
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["t0"], **attrs)]
    h, wd = hw
    oh = (h + pads[0] + pads[2] - dil * (k - 1) - 1) // stride + 1
    ow = (wd + pads[1] + pads[3] - dil * (k - 1) - 1) // stride + 1
    inputs = [("x", np.float32, [batch, cin, h, wd])]
    feeds = {"x": rng.standard_normal((batch, cin, h, wd)).astype(np.float32)}
    for i, op in enumerate(tail):
        src, dst = f"t{i}", f"t{i + 1}"
        if op == "residual":
            inputs.append(("r", np.float32, [batch, cout, oh, ow]))
            feeds["r"] = rng.standard_normal((batch, cout, oh, ow)).astype(np.float32)
            nodes.append(helper.make_node("Add", [src, "r"], [dst]))
        elif op == "relu6":  # Clip(0, 6), its bounds as inputs (opset 11 on)
            nodes.append(helper.make_node("Clip", [src, "lo", "hi"], [dst]))
        else:
            nodes.append(helper.make_node(op.capitalize(), [src], [dst]))
    nodes[-1].output[0] = "y"
    inits = [w, b]
    if "relu6" in tail:
        inits += [numpy_helper.from_array(np.float32(v), n) for v, n in ((0, "lo"), (6, "hi"))]
    model = make_model(nodes, inputs, [("y", np.float32, [batch, cout, oh, ow])], inits)
    return model, feeds


CONVS = {
    "3x3 pad 1": dict(cin=8, cout=16, hw=(20, 23), k=3, pads=(1, 1, 1, 1)),
    "uneven pads": dict(cin=5, cout=13, hw=(17, 19), k=3, pads=(2, 0, 1, 1)),
    "5x5 dilated": dict(cin=4, cout=7, hw=(21, 18), k=5, pads=(4, 4, 4, 4), dil=2),
    "1x1 padded": dict(cin=9, cout=12, hw=(9, 33), k=1, pads=(1, 1, 1, 1)),
    "7x7 map": dict(cin=32, cout=24, hw=(7, 7), k=3, pads=(1, 1, 1, 1)),
    "strided": dict(cin=6, cout=10, hw=(31, 30), k=3, stride=2, pads=(1, 1, 1, 1)),
    "7x7 stride 2": dict(cin=3, cout=8, hw=(30, 27), k=7, stride=2, pads=(3, 2, 3, 1)),
    "stride 3 dilated": dict(cin=4, cout=9, hw=(26, 29), k=3, stride=3, pads=(2, 2, 2, 2), dil=2),
    "1x1 stride 2": dict(cin=12, cout=16, hw=(15, 14), k=1, stride=2),
    "batch 2": dict(cin=6, cout=8, hw=(16, 16), k=3, pads=(1, 1, 1, 1), batch=2),
    "long k": dict(cin=64, cout=8, hw=(12, 12), k=3, pads=(1, 1, 1, 1)),  # 576: 3 k blocks
    # more weight panels than column panels: threads split the rows, windows read in place
    "split rows": dict(cin=40, cout=96, hw=(7, 7), k=3, pads=(1, 1, 1, 1)),
    # k of at most ROWS_OUTER_K: tiled a row panel at a time
    "short k": dict(cin=5, cout=24, hw=(21, 30), k=3, pads=(1, 1, 1, 1)),
    # no padding, stride 1: the plain GEMM weights @ image, its last column panel partial
    "1x1 pointwise": dict(cin=32, cout=40, hw=(15, 17), k=1),
    "1x1 pointwise batch 2": dict(cin=72, cout=20, hw=(15, 13), k=1, batch=2),
}
# large enough for own sgemm whatever the micro-tile's height (7, 8 and 24 rows: part panels)
OWN = {"3x3 pad 1", "5x5 dilated", "7x7 map", "long k", "split rows", "short k", "1x1 pointwise"}
OWN |= {"1x1 pointwise batch 2"}
TAILS = {"none": (), "relu": ("relu",), "res+relu": ("residual", "relu"), "sigmoid": ("sigmoid",)}
TAILS |= {"relu6": ("relu6",), "res+relu6": ("residual", "relu6")}


@pytest.mark.parametrize("tail", sorted(TAILS))
@pytest.mark.parametrize("case", sorted(CONVS))
def test_conv_matches_ort(case, tail):
    model, feeds = _conv(**CONVS[case], tail=TAILS[tail])
    compiled, _ = check_against_ort(model, feeds)
    assert compiled.stats["launches"] == 1  # pad + GEMM + epilogue in one driver
    if case in OWN and cpu_sgemm.available():
        assert set(compiled.runtime.gemm_impls.values()) == {"pyforge sgemm (AVX2)"}


def test_relu6_runs_in_the_gemm_store():
    """Clip(0, 6) after the conv is the step's library epilogue: own sgemm clamps each tile in
    its store, on the last k block only (3 blocks here: partial sums past 6 stay unclamped)."""
    model, feeds = _conv(**CONVS["long k"], tail=("relu6",))
    compiled, _ = check_against_ort(model, feeds)
    (step,) = compiled.plan.steps
    assert step.pattern.act == "relu6"
    y = compiled.predict(feeds)
    assert (y == 6).any() and (y == 0).any() and ((y > 0) & (y < 6)).any()


def test_own_and_blas_paths_agree():
    model, feeds = _conv(**CONVS["long k"], tail=("residual", "relu"))
    compiled = pyforge.compile(model, target="cpu")
    own = compiled.predict(feeds)
    blas_rt = CpuRuntime(compiled.plan, own_gemm=False)
    assert blas_rt.launches == 1  # the CBLAS driver: one call for the step, as own sgemm
    blas = blas_rt.run(feeds)["y"]
    np.testing.assert_allclose(own, blas, rtol=1e-4, atol=1e-4)  # two summation orders


def test_equal_channels_give_bit_equal_outputs():
    """Every output element is summed in the same order, whatever its tile: output channels
    whose weights are equal come out bit-equal (BLAS tiles can leave them ulps apart)."""
    rng = np.random.default_rng(5)
    w = np.broadcast_to(rng.standard_normal((1, 48, 1, 1)), (100, 48, 1, 1)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"])
    model = make_model(
        [node],
        [("x", np.float32, [1, 48, 13, 13])],
        [("y", np.float32, [1, 100, 13, 13])],
        [numpy_helper.from_array(np.ascontiguousarray(w), "w")],
    )
    x = rng.standard_normal((1, 48, 13, 13)).astype(np.float32) * 1e3
    y = pyforge.compile(model, target="cpu").predict({"x": x})
    assert (y == y[:, :1]).all()


def test_shifted_conv_geometry():
    """Padded column space: taps are offsets into one zero-bordered image."""
    #            n  c  h  w  kh kw sh sw top left dh dw oh ow
    shift = cpu_pack.shifted_conv([1, 2, 5, 6, 3, 3, 1, 1, 1, 1, 1, 1, 5, 6])
    assert (shift["wp"], shift["hp"]) == (8, 7)
    assert shift["cols"] == 4 * 8 + 6
    assert list(shift["koff"][:4]) == [0, 1, 2, 8]
    assert shift["koff"][9] == 7 * 8  # channel 1
    # stride 2: four phase planes of (3 + 1) x (3 + 1); tap (ky, kx) reads phase (ky % 2, kx % 2)
    # at (ky // 2, kx // 2)
    shift = cpu_pack.shifted_conv([1, 2, 5, 6, 3, 3, 2, 2, 1, 1, 1, 1, 3, 3])
    assert (shift["wp"], shift["hp"], len(shift["phases"])) == (4, 4, 4)
    plane = 4 * 4
    assert list(shift["koff"][:3]) == [0, 2 * plane, 1]  # (0,0) (0,1) (0,2) of channel 0
    assert shift["koff"][3] == 2 * 2 * plane  # (1, 0): phase (1, 0) is the third (of 2 channels)


def test_padded_image():
    x = np.arange(2 * 3 * 4, dtype=np.float32) + 1
    xpad = np.full(2 * 6 * 7 + 5, np.nan, np.float32)
    cpu_pack.pad_image(x, 0, 2, 3, 4, 2, 1, np.array([[0, 0, 1, 1]]), 6, 7, xpad)
    want = np.zeros((2, 6, 7), np.float32)
    want[:, 2:5, 1:5] = x.reshape(2, 3, 4)
    np.testing.assert_array_equal(xpad[: want.size], want.ravel())
    assert not xpad[want.size :].any()


def _gemm_model(m, k, n, trans_b, alpha) -> onnx.ModelProto:
    b = np.random.default_rng(m).standard_normal((n, k) if trans_b else (k, n))
    node = helper.make_node("Gemm", ["a", "b"], ["y"], transB=trans_b, alpha=alpha)
    init = [numpy_helper.from_array(b.astype(np.float32), "b")]
    return make_model([node], [("a", np.float32, [m, k])], [("y", np.float32, [m, n])], init)


@pytest.mark.parametrize("alpha", [1.0, 0.5])
@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_with_activation_left_operand(trans_b, alpha):
    """A is an input, packed at run time; alpha 0.5 cannot be folded into it, so that case
    takes the BLAS driver."""
    m, k, n = 37, 300, 70
    feeds = {"a": np.random.default_rng(9).standard_normal((m, k)).astype(np.float32)}
    check_against_ort(_gemm_model(m, k, n, trans_b, alpha), feeds)


@pytest.mark.parametrize("batched_b", [False, True])
def test_constant_right_operand_packed_once(batched_b):
    """A MatMul's constant weight (R) is packed whole-K at bind time and read by every call;
    a weight per batch entry (a 3-D constant B) is packed per call as before."""
    rng = np.random.default_rng(11)
    m, k, n = 45, 530, 83  # 3 k blocks, a part last panel of rows and of columns
    w = (rng.standard_normal((2, k, n) if batched_b else (k, n)) / 20).astype(np.float32)
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    inits = [numpy_helper.from_array(w, "w")]
    model = make_model([node], [("x", np.float32, [2, m, k])], [("y", np.float32, [2, m, n])],
                       inits)  # fmt: skip
    feeds = {"x": rng.standard_normal((2, m, k)).astype(np.float32)}
    compiled, _ = check_against_ort(model, feeds)
    for _ in range(2):  # the packed copy serves every call
        np.testing.assert_allclose(compiled.predict(feeds), feeds["x"] @ w, rtol=1e-4, atol=1e-4)
    packed_r = [key for key in compiled.runtime._packed if key[0] == "r"]
    assert len(packed_r) == (0 if batched_b else 1)
