"""The public face: typed options checked before any work, model specs, repr, progress, help."""

from __future__ import annotations

import pydoc
from dataclasses import fields

import numpy as np
import pytest

import pyforge
import pyforge.compiler
from pyforge import CompileOptions, RuntimeOptions, TensorSpec
from pyforge.errors import OptionError, PyforgeError
from pyforge.models import MODELS
from pyforge.opt.pipeline import pass_names


@pytest.fixture
def no_work(monkeypatch):
    """Fails the test if compile() gets as far as reading the model."""

    def reached(*_args, **_kwargs):
        raise AssertionError("the importer ran: the option was not checked first")

    monkeypatch.setattr(pyforge.compiler, "load_model", reached)
    monkeypatch.setattr(pyforge.compiler, "import_onnx", reached)


@pytest.fixture(scope="module")
def mlp():
    return MODELS["mlp"](1)


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"fuson": False}, ["'fuson'", "did you mean 'fusion'", "layout", "own_gemm", "graph"]),
        ({"input_shap": {"x": [1, 256]}}, ["did you mean 'input_shapes'", "fused_steps"]),
        ({"input_shapes": {"x": "big"}}, ["input_shapes['x']='big'", "tuple of sizes"]),
        ({"input_shapes": [(1, 256)]}, ["input_shapes=[(1, 256)]", "{input name: shape}"]),
        ({"max_plans": 0}, ["max_plans=0", "a positive int"]),
        ({"layout": "NHWC"}, ["layout='NHWC'", "did you mean 'nhwc'", "'nchw', 'nhwc'"]),
        ({"precision": "bf16"}, ["precision='bf16'", "'fp32', 'tf32', 'fp16'"]),
        ({"conv": "winograd"}, ["conv='winograd'", "'im2col', 'implicit'"]),
        ({"conv_tile": "big"}, ["conv_tile='big'", "64x32x16/4x4"]),
        ({"fusion": "yes"}, ["fusion='yes'", "True or False"]),
        ({"fused_steps": 0}, ["fused_steps=0", "True or False"]),
    ],
)
def test_a_wrong_name_or_value_is_refused_before_any_work(no_work, mlp, kwargs, says):
    with pytest.raises(OptionError) as e:
        pyforge.compile(mlp, target="cpu", **kwargs)
    assert isinstance(e.value, PyforgeError) and isinstance(e.value, ValueError)
    assert e.value.option == next(iter(kwargs))
    for text in says:
        assert text in str(e.value)


@pytest.mark.parametrize(
    "target, kwargs, says",
    [
        ("cpu", {"precision": "tf32"}, "precision='tf32' applies to the cuda target only"),
        ("cpu", {"precision": "fp16"}, "precision='fp16' applies to the cuda target only"),
        ("cpu", {"graph": False}, "graph=False applies to the cuda target only"),
        ("cpu", {"library_epilogues": True}, "library_epilogues=True applies to the cuda"),
        ("cuda", {"fused_steps": False}, "fused_steps=False applies to the cpu target only"),
        ("cuda", {"own_gemm": False}, "own_gemm=False applies to the cpu target only"),
        ("cpu", {"conv": "implicit"}, "conv='implicit' needs layout='nhwc'"),
        ("cuda", {"conv_tile": "64x32x16/4x4"}, "conv_tile is the implicit-GEMM tile"),
        ("gpu", {}, "target='gpu' is not allowed"),
    ],
)
def test_an_option_the_target_does_not_take_is_refused(no_work, mlp, target, kwargs, says):
    with pytest.raises(OptionError, match=says.replace("(", r"\(")):
        pyforge.compile(mlp, target=target, **kwargs)


def test_defaults_are_resolved_per_target():
    cpu, cuda = CompileOptions().resolve("cpu"), CompileOptions().resolve("cuda")
    assert (cpu.layout, cpu.specialize, cpu.precision, cpu.conv) == (
        "nchw",
        False,
        "fp32",
        "im2col",
    )
    assert (cuda.layout, cuda.specialize, cuda.fusion, cuda.verify) == ("nhwc", True, True, True)
    assert CompileOptions(layout="nchw").resolve("cuda").layout == "nchw"
    assert RuntimeOptions().resolve("cpu") == RuntimeOptions(fused_steps=True, own_gemm=True)
    assert RuntimeOptions().resolve("cuda") == RuntimeOptions(graph=True, library_epilogues=True)
    with pytest.raises(OptionError, match="layout='x'"):
        CompileOptions(layout="x")  # checked when built, not only when used
    with pytest.raises(Exception, match="cannot assign"):
        CompileOptions().layout = "nhwc"  # frozen


def test_an_options_object_or_keywords_give_the_same_plan(mlp):
    a = pyforge.compile(mlp, "cpu", CompileOptions(fusion=False, specialize=True))
    b = pyforge.compile(mlp, "cpu", fusion=False, specialize=True)
    c = pyforge.compile(mlp, "cpu", CompileOptions(fusion=False), specialize=True, fusion=False)
    assert a.plan.kernels == b.plan.kernels == c.plan.kernels
    assert a.details["options"] == b.details["options"] == c.details["options"]
    assert not a.stats["fusion"] and a.stats["specialize"]


def test_conflicting_or_mistyped_options_objects_are_refused(no_work, mlp):
    with pytest.raises(OptionError, match="fusion given twice"):
        pyforge.compile(mlp, "cpu", CompileOptions(fusion=True), fusion=False)
    with pytest.raises(OptionError, match="graph given twice"):
        pyforge.compile(mlp, "cuda", runtime=RuntimeOptions(graph=True), graph=False)
    with pytest.raises(OptionError, match="takes a pyforge.CompileOptions"):
        pyforge.compile(mlp, "cpu", {"fusion": False})
    with pytest.raises(OptionError, match="takes a pyforge.RuntimeOptions"):
        pyforge.compile(mlp, "cpu", runtime=CompileOptions())


def test_specs_repr_details_and_stats(mlp):
    stages = []
    model = pyforge.compile(mlp, "cpu", progress=lambda *a: stages.append(a))
    assert model.inputs == [TensorSpec("x", (1, 256), np.dtype(np.float32))]
    assert model.outputs == [TensorSpec("y", (1, 10), np.dtype(np.float32))]
    assert model.input_names == ["x"] and model.output_names == ["y"]
    text = repr(model)
    assert "target='cpu'" in text and "TensorSpec('x', (1, 256), float32)" in text
    assert f"launches={model.stats['launches']}" in text
    assert model.details["pass_ops"][-1][0] == "fuse"
    seconds = model.stats["stage_seconds"]
    assert list(seconds) == ["import", "passes", "lowering", "plan", "bind", "jit"]
    assert model.stats["compile_seconds"] == pytest.approx(sum(seconds.values()))
    # each stage starts at 0 and ends at its total, in pipeline order; passes count up by one
    assert [s for s, d, _ in stages if d == 0] == list(seconds)
    passes = [d for s, d, _ in stages if s == "passes"]
    assert passes == list(range(len(pass_names()) + 1))
    assert all(d == t for s, d, t in stages if s not in ("passes", "bind", "jit") and d)
    steps = len(model.plan.steps)  # bind and jit count the plan's steps up to the end
    assert [d for s, d, _ in stages if s == "jit"] == list(range(steps + 1))

    again = pyforge.CompiledModel(model.plan, "cpu", details=model.details)
    assert again.details is model.details


def test_load_takes_runtime_options_and_refuses_compile_ones(mlp, tmp_path):
    pyforge.compile(mlp, "cpu").save(tmp_path)
    x = np.random.default_rng(0).standard_normal((1, 256)).astype(np.float32)
    fused = pyforge.load(tmp_path, "cpu")
    three = pyforge.load(tmp_path, "cpu", runtime=RuntimeOptions(fused_steps=False))
    assert three.stats["launches"] > fused.stats["launches"]
    np.testing.assert_allclose(three.predict(x), fused.predict(x), rtol=1e-5, atol=1e-6)
    assert fused.details is None and fused.inputs == three.inputs
    with pytest.raises(OptionError, match="fusion=False is a compile option.*fusion=True"):
        pyforge.load(tmp_path, "cpu", fusion=False)
    with pytest.raises(OptionError, match="precision='tf32' is a compile option"):
        pyforge.load(tmp_path, "cpu", precision="tf32")
    with pytest.raises(OptionError, match="did you mean 'fused_steps'"):
        pyforge.load(tmp_path, "cpu", fused_step=False)
    with pytest.raises(OptionError, match="graph=False applies to the cuda target only"):
        pyforge.load(tmp_path, "cpu", graph=False)


def test_help_lists_every_option_with_an_example():
    text = pydoc.render_doc(pyforge.compile)
    for f in fields(CompileOptions) + fields(RuntimeOptions):
        assert f.name in text, f.name
    assert ">>> m = pyforge.compile(" in text and "progress" in text
    for cls in (CompileOptions, RuntimeOptions):
        doc = pydoc.render_doc(cls)
        assert all(f.name in doc for f in fields(cls)) and ">>>" in doc


def test_the_pass_list_follows_the_options():
    assert pass_names()[-1] == "fuse" and "nhwc_layout" not in pass_names()
    assert pass_names(layout="nhwc", fusion=False)[-3:] == ["nhwc_layout", "dce", "no_fuse"]
    assert "fp16" in pass_names(precision="fp16") and "fp16" not in pass_names(precision="tf32")


def test_the_onnx_backend_checks_options_at_prepare(mlp):
    import pyforge.backend

    with pytest.raises(OptionError, match="did you mean 'fusion'"):
        pyforge.backend.prepare(mlp, "CPU", fusoin=False)
    with pytest.raises(OptionError, match="applies to the cuda target only"):
        pyforge.backend.prepare(mlp, "CPU", precision="fp16")
    rep = pyforge.backend.prepare(mlp, "CPU", fusion=False)
    x = np.random.default_rng(1).standard_normal((1, 256)).astype(np.float32)
    assert rep.run([x])[0].shape == (1, 10)
    assert not next(iter(rep._compiled.values())).stats["fusion"]


def test_own_gemm_reaches_the_cpu_runtime_or_is_refused(mlp):
    import inspect

    from pyforge.exec.cpu import CpuRuntime

    if "own_gemm" in inspect.signature(CpuRuntime.__init__).parameters:
        x = np.random.default_rng(2).standard_normal((1, 256)).astype(np.float32)
        blas = pyforge.compile(mlp, "cpu", own_gemm=False).predict(x)
        np.testing.assert_allclose(blas, pyforge.compile(mlp, "cpu").predict(x), rtol=1e-5)
    else:  # never silently ignored
        with pytest.raises(OptionError, match="own_gemm"):
            pyforge.compile(mlp, "cpu", own_gemm=False)
