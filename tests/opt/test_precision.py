"""The fp16 pass (precision="fp16"): which values become float16, where the casts go, and what
stays float32. The numbers themselves are checked on the GPU (tests/exec/test_gpu.py) and in
the CUDA simulator (tests/lower_numba/test_cuda_sim.py)."""

import numpy as np
import pytest
from onnx import helper, numpy_helper

import pyforge
import pyforge.compiler
from pyforge.frontend import import_onnx
from pyforge.models import MODELS
from pyforge.opt.passes import PassManager
from tests.helpers import make_model

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)


def _half(model, layout: bool = False):
    names = ["const_fold", "bn_fold", "split_bias", "const_fold", "dce"]
    names += ["nhwc_layout", "dce"] if layout else []
    return PassManager(names + ["fp16"]).run(import_onnx(model))


def _ops(graph, op):
    return [n for n in graph.nodes if n.op == op]


def test_resnet50_runs_half_between_one_cast_in_and_one_out():
    g = _half(MODELS["resnet50"](1), layout=True)
    casts = _ops(g, "Cast")
    assert [c.attrs["to"] for c in casts] == [F16, F32]
    assert [v.name for v in g.inputs] == ["input"] and g.inputs[0].dtype == F32
    assert [v.name for v in g.outputs] == ["output"] and g.outputs[0].dtype == F32
    convs = _ops(g, "ConvNHWC")
    assert len(convs) == 53
    for node in convs + _ops(g, "Gemm"):
        assert all(v.dtype == F16 for v in node.inputs + node.outputs if v is not None), node
    assert all(n.outputs[0].dtype == F16 for n in _ops(g, "Relu") + _ops(g, "Add"))


def test_ops_off_the_list_stay_float32_with_casts_around():
    w = numpy_helper.from_array(np.full((4, 4), 0.5, np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
        helper.make_node("Softmax", ["a"], ["s"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["s", "w"], ["y"], name="mm2"),
    ]
    g = _half(make_model(nodes, [("x", np.float32, [2, 4])], [("y", np.float32, [2, 4])], [w]))
    softmax = _ops(g, "Softmax")[0]
    assert softmax.inputs[0].dtype == F32 and softmax.outputs[0].dtype == F32
    assert [c.attrs["to"] for c in _ops(g, "Cast")] == [F16, F32, F16, F32]
    g.verify()


def test_rms_norm_reads_a_float16_input_without_a_cast():
    """reads_half: the norm takes the GEMM's float16 output as it is and stays float32."""
    r = np.random.default_rng(3)
    w = numpy_helper.from_array(r.standard_normal((4, 8)).astype(np.float32), "w")
    scale = numpy_helper.from_array(r.uniform(0.5, 1.5, 8).astype(np.float32), "scale")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
        helper.make_node("RMSNormalization", ["a", "scale"], ["y"], axis=-1, name="rms"),
    ]
    model = make_model(nodes, [("x", np.float32, [2, 4])], [("y", np.float32, [2, 8])], [w, scale])
    g = _half(model)
    (rms,) = _ops(g, "RMSNormalization")
    assert rms.inputs[0].dtype == F16 and rms.outputs[0].dtype == F32
    assert [c.attrs["to"] for c in _ops(g, "Cast")] == [F16]  # x into the GEMM only
    g.verify()


def test_constant_beyond_float16_range_keeps_its_node_float32():
    big = numpy_helper.from_array(np.full((4,), 1e6, np.float32), "big")
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
        helper.make_node("Add", ["a", "big"], ["y"], name="add"),
    ]
    g = _half(make_model(nodes, [("x", np.float32, [2, 4])], [("y", np.float32, [2, 4])], [big, w]))
    add = _ops(g, "Add")[0]
    assert add.outputs[0].dtype == F32
    assert add.inputs[1].const is not None and add.inputs[1].const.dtype == F32
    assert _ops(g, "MatMul")[0].outputs[0].dtype == F16


def test_a_float16_model_is_refused_by_name():
    from pyforge.errors import UnsupportedOperatorError

    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu")]
    model = make_model(nodes, [("x", np.float16, [3])], [("y", np.float16, [3])])
    with pytest.raises(UnsupportedOperatorError, match="'relu'.*float16 tensor 'x'"):
        _half(model)


def test_fp16_plan_halves_weights_and_arena():
    from pyforge.compiler import compile_to_plan

    model = MODELS["resnet50"](1)
    opts = dict(specialize=True, layout="nhwc")
    full, _ = compile_to_plan(model, **opts)
    half, _ = compile_to_plan(model, precision="fp16", **opts)
    assert half.stats["steps"] == full.stats["steps"]
    assert half.stats["weights_bytes"] <= full.stats["weights_bytes"] // 2 + 4096
    assert half.stats["arena_bytes"] <= full.stats["arena_bytes"] // 2 + 4096
    assert half.slots["output"].dtype == F32.str


def test_fp16_is_refused_on_the_cpu_target():
    with pytest.raises(ValueError, match="fp16"):
        pyforge.compile(MODELS["mlp"](1), target="cpu", precision="fp16")


def test_an_fp16_plan_is_refused_by_the_cpu_runtime(tmp_path):
    from pyforge.compiler import compile_to_plan
    from pyforge.errors import ModelLoadError
    from pyforge.exec.plan import ExecutionPlan

    plan, _ = compile_to_plan(MODELS["mlp"](1), specialize=True, precision="fp16")
    plan.save(str(tmp_path / "plan"))
    with pytest.raises(ModelLoadError, match="precision='fp16'"):
        pyforge.load(tmp_path / "plan", target="cpu")
    assert ExecutionPlan.load(str(tmp_path / "plan")).slots["y"].dtype == F32.str


def test_cli_takes_a_precision(capsys):
    from pyforge.cli import main

    assert main(["run", "mlp", "--target", "cpu", "--precision", "fp32"]) == 0
    assert main(["run", "mlp", "--target", "cpu", "--precision", "fp16"]) != 0
    assert "cuda target" in capsys.readouterr().err
