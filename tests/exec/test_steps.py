"""Typed plan steps: JSON round trips, what tensors() and parts() report, and plan formats."""

import json

import pytest

import pyforge
from pyforge.errors import ModelLoadError
from pyforge.exec.plan import ExecutionPlan
from pyforge.exec.steps import (
    ConvGeometry,
    EpiloguePattern,
    GemmStep,
    KernelStep,
    kernel_steps,
    step_from_json,
)
from pyforge.models import mlp

IM2COL = KernelStep("k_im2col", 96, (("t", "x"), ("t", "col"), ("i", 3), ("e", 0)), "im2col c")
EPILOGUE = KernelStep("k_epi", 64, (("w", "d"), ("t", "bias")), "relu c", inner=16)
TILED = KernelStep("k_tiled", 8, (("t", "x"),), "implicit c", launch=((2, 1, 3), 64))


def _gemm(**kw) -> GemmStep:
    return GemmStep(
        a="w",
        b="col",
        d="d",
        m=4,
        n=16,
        k=27,
        lda=27,
        ldb=16,
        ldd=16,
        alpha=0.5,
        label="Conv c",
        prologue=IM2COL,
        epilogue=EPILOGUE,
        pattern=EpiloguePattern(bias="bias", bias_axis="m", act="relu"),
        conv=ConvGeometry("x", "col", (1, 3, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 4, 4)),
        fallback=KernelStep("k_gemm", 64, (("t", "w"), ("t", "col"), ("t", "d")), "gemm Conv c"),
        **kw,
    )


@pytest.mark.parametrize("step", [IM2COL, EPILOGUE, TILED, _gemm(), _gemm(c="r", beta=1.0)])
def test_json_round_trip_gives_an_equal_step(step):
    text = json.dumps(step.to_json())  # through real JSON: tuples come back as lists
    again = step_from_json(json.loads(text))
    assert again == step and type(again) is type(step)
    assert type(step).from_json(json.loads(text)) == step


def test_tensors_and_parts_include_the_nested_kernels():
    g = _gemm(c="r")
    assert g.parts() == [IM2COL, EPILOGUE]  # run order; the fallback replaces the GEMM only
    assert set(g.tensors()) == {"w", "col", "d", "r", "x", "bias"}
    assert IM2COL.tensors() == ["x", "col"] and IM2COL.parts() == [IM2COL]
    assert kernel_steps([TILED, g]) == [TILED, IM2COL, EPILOGUE]


def test_saved_plan_loads_to_equal_steps(tmp_path):
    plan = pyforge.compile(mlp(batch=1), target="cpu").plan
    assert any(isinstance(s, GemmStep) and s.fallback for s in plan.steps)
    plan.save(str(tmp_path))
    loaded = ExecutionPlan.load(str(tmp_path))
    assert loaded.steps == plan.steps
    assert loaded.kernels == plan.kernels  # the cuda-only fallback sources included


def test_plan_of_another_format_is_refused(tmp_path):
    pyforge.compile(mlp(batch=1), target="cpu").plan.save(str(tmp_path))
    meta = json.loads((tmp_path / "plan.json").read_text())
    meta["format"] = 1
    (tmp_path / "plan.json").write_text(json.dumps(meta))
    with pytest.raises(ModelLoadError, match="another pyforge version.*recompiled"):
        pyforge.load(tmp_path, target="cpu")
