"""Layers of one structure compile to one kernel source: a trained scalar (a learnable affine
block's scale and shift) is read at run time rather than written into the source, and an input
axis of size 1 adds no index term whether or not the output's axis is 1 (so a batch of 1 and a
batch of 2 need the same kernels). Both matter for compile time: every distinct source is one
Numba compile of a second or more; results match ORT either way."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from onnx import helper, numpy_helper

from pyforge.compiler import compile_to_plan
from pyforge.exec.steps import kernel_steps
from tests.helpers import check_against_ort, make_model

F32 = np.float32


def _affine_layers(layers: int, batch: int, seed: int = 0):
    """x -> [Conv 3x3 -> Mul(scale_i) -> Add(shift_i) -> Relu] x layers, each layer's scalars
    its own (random), the conv bias a (1, C, 1, 1) Add after it."""
    rng = np.random.default_rng(seed)
    c, hw = 8, 12
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        w = rng.standard_normal((c, c, 3, 3)).astype(F32) * 0.2
        b = rng.standard_normal((1, c, 1, 1)).astype(F32)
        s, t = (rng.uniform(0.3, 1.7, ()).astype(F32), rng.standard_normal(()).astype(F32))
        inits += [
            numpy_helper.from_array(w, f"w{i}"),
            numpy_helper.from_array(b, f"b{i}"),
            numpy_helper.from_array(s, f"s{i}"),
            numpy_helper.from_array(t, f"t{i}"),
        ]
        y = f"y{i}" if i < layers - 1 else "y"
        nodes += [
            helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
            helper.make_node("Add", [f"c{i}", f"b{i}"], [f"cb{i}"]),
            helper.make_node("Mul", [f"cb{i}", f"s{i}"], [f"m{i}"]),
            helper.make_node("Add", [f"m{i}", f"t{i}"], [f"a{i}"]),
            helper.make_node("Relu", [f"a{i}"], [y]),
        ]
        x = y
    shape = [batch, c, hw, hw]
    model = make_model(nodes, [("x", F32, shape)], [("y", F32, shape)], inits)
    feeds = {"x": rng.standard_normal(shape).astype(F32)}
    return model, feeds


def _sources(model) -> set[str]:
    plan, _ = compile_to_plan(model, specialize=False)
    return {plan.kernels[s.kernel]["cpu"] for s in kernel_steps(plan.steps)}


def test_layers_with_their_own_scalars_share_one_kernel():
    one, _ = _affine_layers(1, batch=1)
    three, feeds = _affine_layers(3, batch=1)
    # three layers, three different (scale, shift) pairs: no more sources than one layer has
    assert len(_sources(three)) == len(_sources(one)) >= 1
    check_against_ort(three, feeds, target="cpu")


def test_round_constants_stay_literals():
    """HardSwish's 3 and 6 and a square's 2 are the op's own, not a layer's: still literals."""
    model = make_model(
        [
            helper.make_node("Pow", ["x", "two"], ["p"]),
            helper.make_node("Mul", ["p", "k"], ["y"]),
        ],
        [("x", F32, [4, 300])],
        [("y", F32, [4, 300])],
        [
            numpy_helper.from_array(np.array(2.0, F32), "two"),
            numpy_helper.from_array(np.array(0.37, F32), "k"),
        ],
    )
    (src,) = _sources(model)
    assert "f32(2.0)" in src and "0.37" not in src
    x = np.random.default_rng(3).standard_normal((4, 300)).astype(F32)
    check_against_ort(model, {"x": x}, target="cpu")


def test_batch_of_one_needs_the_kernels_of_a_batch_of_two():
    one, feeds1 = _affine_layers(2, batch=1, seed=5)
    two, feeds2 = _affine_layers(2, batch=2, seed=5)
    assert _sources(one) == _sources(two)
    check_against_ort(one, feeds1, target="cpu")
    check_against_ort(two, feeds2, target="cpu")


def _ptx_available() -> bool:
    try:
        import numba_cuda  # noqa: F401
        from numba import cuda, types

        cuda.compile_ptx(lambda a: None, (types.int64,), cc=(9, 0))
        return True
    except Exception:  # noqa: BLE001  (no NVVM/NVRTC here)
        return False


@pytest.mark.skipif(not _ptx_available(), reason="no numba-cuda with NVVM/NVRTC to compile PTX")
def test_hoisted_scalars_compile_for_cuda(tmp_path):
    """Shape-generic cuda kernels (specialize=False) read the scalars before their loop too."""
    import numba
    from numba import cuda, types

    model, _ = _affine_layers(2, batch=1)
    plan, _ = compile_to_plan(model, specialize=False)
    hoisted = 0
    for step in kernel_steps(plan.steps):
        src = plan.kernels[step.kernel]["cuda"]
        hoisted += "s = t" in src
        path = tmp_path / f"k_{step.kernel}.py"
        path.write_text(src.replace("cache=True", "cache=False"))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sig = [types.int64]
        for kind, v in step.args:
            dtype = numba.from_dtype(np.dtype(plan.slots[v].dtype)) if kind == "t" else None
            sig.append(
                types.Array(dtype, 1, "C")
                if kind == "t"
                else types.Array(types.int32, 1, "C")
                if kind == "e"
                else types.Array(types.complex128, 1, "C")
                if kind == "w"
                else types.int64
            )
        cuda.compile_ptx(module.kernel.py_func, tuple(sig), cc=(9, 0))
    assert hoisted


@pytest.mark.parametrize("name, batches", [("resnet50", (1, 3)), ("mlp", (1, 5))])
def test_cuda_kernels_do_not_change_with_the_batch(name, batches):
    """specialize=True (the cuda default) bakes shapes into the sources, but not the batch: a
    new batch size then needs no kernel compiled afresh (NVVM: 0.1-0.3 s a kernel). ResNet-50's
    channel-run im2col and mlp's (batch, 10) bias kernel (a run over every axis) took it."""
    from pyforge.models import MODELS
    from pyforge.options import CompileOptions

    options = CompileOptions(specialize=True, layout="nhwc").resolve(None)
    sources = []
    for b in batches:
        plan, _ = compile_to_plan(MODELS[name](b), options)
        sources.append({plan.kernels[s.kernel]["cuda"] for s in kernel_steps(plan.steps)})
    assert sources[0] == sources[1]


def _qdq_layers(layers: int, seed: int = 3):
    """x -> [QuantizeLinear(scale_i, zero_i) -> DequantizeLinear(scale_i, zero_i) -> Relu] x
    layers: each layer its own per-tensor scale and int8 zero point, as quantize_static writes."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        s, z = rng.uniform(0.01, 0.1, ()).astype(F32), np.array(rng.integers(-9, 9), np.int8)
        inits += [numpy_helper.from_array(s, f"s{i}"), numpy_helper.from_array(z, f"z{i}")]
        y = f"y{i}" if i < layers - 1 else "y"
        nodes += [
            helper.make_node("QuantizeLinear", [x, f"s{i}", f"z{i}"], [f"q{i}"]),
            helper.make_node("DequantizeLinear", [f"q{i}", f"s{i}", f"z{i}"], [f"d{i}"]),
            helper.make_node("Relu", [f"d{i}"], [y]),
        ]
        x = y
    shape = [2, 5, 7]
    model = make_model(nodes, [("x", F32, shape)], [("y", F32, shape)], inits)
    return model, {"x": rng.standard_normal(shape).astype(F32)}


@pytest.mark.parametrize("specialize", [True, False])
def test_quantised_layers_share_a_kernel(specialize):
    """A quantised model's layers differ only in their scale and zero point: both are read at
    run time on both targets (minilm_l6_qstatic on cuda: 406 kernel sources, 36 after)."""
    from pyforge.options import CompileOptions

    form, sources = "cuda" if specialize else "cpu", []
    options = CompileOptions(specialize=specialize, fusion=False).resolve(None)
    for layers in (1, 4):
        model, feeds = _qdq_layers(layers)
        plan, _ = compile_to_plan(model, options)
        steps = kernel_steps(plan.steps)
        sources.append({plan.kernels[s.kernel][form] for s in steps})
    assert len(steps) == 12 and sources[0] == sources[1]
    check_against_ort(model, feeds, target="cpu")
