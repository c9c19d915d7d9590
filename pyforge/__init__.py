"""pyforge: an ONNX inference compiler written in Python.

>>> import pyforge
>>> model = pyforge.compile("resnet50.onnx")       # cuda when a GPU is usable, else cpu
>>> y = model.predict(x)                            # numpy in, numpy out
>>> model.save("resnet50.plan"); pyforge.load("resnet50.plan").predict(x)
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from . import errors
from .exec.plan import ExecutionPlan, normalise_feeds

__all__ = ["CompiledModel", "compile", "default_target", "errors", "load"]
__version__ = "0.1.0"


def default_target() -> str:
    """ "cuda" when a real CUDA GPU is usable, else "cpu"."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return "cpu"
    try:
        from numba import cuda

        return "cuda" if cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001  (no driver, no numba-cuda: the cpu target always works)
        return "cpu"


def _runtime(plan: ExecutionPlan, target: str, **options: Any):
    if target == "cpu":
        from .exec.cpu import CpuRuntime

        return CpuRuntime(plan, **options)
    if target == "cuda":
        from .exec.cuda import CudaRuntime

        return CudaRuntime(plan, **options)
    raise ValueError(f"unknown target {target!r}; use 'cpu' or 'cuda'")


class CompiledModel:
    """A compiled plan bound to a target runtime. ``predict`` is the steady-state path."""

    def __init__(self, plan: ExecutionPlan, target: str, **options: Any):
        t0 = time.perf_counter()
        self.plan = plan
        self.target = target
        self.runtime = _runtime(plan, target, **options)
        self.stats: dict[str, Any] = dict(plan.stats)
        self.stats["target"] = target
        self.stats["launches"] = self.runtime.launches  # kernels + GEMM calls per inference
        # as the runtime issues them: on cpu a GEMM step's driver runs its im2col and epilogue
        # inside the one call, so "kernels" counts only what is launched besides GEMM steps
        self.stats["kernels"] = self.runtime.launches - self.stats.get("gemms", 0)
        self.stats["bind_seconds"] = time.perf_counter() - t0
        self.stats["compile_seconds"] = (
            self.stats.get("compile_seconds_frontend", 0.0) + self.stats["bind_seconds"]
        )

    @property
    def input_names(self) -> list[str]:
        return list(self.plan.inputs)

    @property
    def output_names(self) -> list[str]:
        return list(self.plan.outputs)

    def predict(self, x: np.ndarray | dict[str, np.ndarray]) -> np.ndarray | dict[str, np.ndarray]:
        """Run one inference: one array for a single-input model (or a dict name -> array);
        returns one array for a single-output model, else a dict name -> array.

        On the cuda target, inputs may be GPU arrays (Numba, CuPy, torch: anything with
        ``__cuda_array_interface__``); they are copied device to device, and the outputs come
        back as Numba device arrays in pyforge's arena, valid until the next ``predict``.

        >>> y = model.predict(cuda.to_device(x))   # y: DeviceNDArray; y.copy_to_host()
        """
        outs = self.runtime.run(normalise_feeds(self.plan, x))
        return outs[self.plan.outputs[0]] if len(outs) == 1 else outs

    def save(self, directory: str | os.PathLike) -> None:
        """Write plan.json, weights.bin and every kernel source to ``directory``."""
        self.plan.save(os.fspath(directory))


def plan_options(target: str, options: dict[str, Any]) -> dict[str, Any]:
    """The compile_to_plan arguments of ``target`` (its defaults, overridden by ``options``,
    from which the plan-only ones are removed; ``precision`` stays: the runtime reads it too)."""
    precision = options.get("precision", "fp32")
    if precision == "fp16" and target != "cuda":
        raise ValueError("precision='fp16' needs the cuda target (the cpu computes in fp32)")
    return {
        # shape-specialised kernels pay on the GPU (index math by constants); the cpu target
        # keeps shape-generic kernels, compiled once and shared across models and tests
        "specialize": options.pop("specialize", target == "cuda"),
        # channels-last lets cuBLASLt fold conv epilogues (bias per column); the cpu GEMM
        # applies them in its store either way, so the cpu target stays NCHW unless asked
        "layout": options.pop("layout", "nhwc" if target == "cuda" else "nchw"),
        # "implicit": a channels-last conv that needs im2col becomes one implicit-GEMM kernel
        "conv": options.pop("conv", "im2col"),
        "conv_tile": options.pop("conv_tile", None),
        "precision": precision,
    }


def compile(
    model: Any,
    target: str | None = None,
    fusion: bool = True,
    **options: Any,
) -> CompiledModel:
    """Compile an ONNX model (path, bytes or ModelProto) for "cpu" or "cuda" (default: best).

    >>> m = pyforge.compile("mlp.onnx", target="cpu", fusion=False)
    """
    from .compiler import compile_to_plan

    target = target or default_target()
    plan, details = compile_to_plan(model, fusion_on=fusion, **plan_options(target, options))
    compiled = CompiledModel(plan, target, **options)
    compiled.details = details
    return compiled


def load(directory: str | os.PathLike, target: str | None = None, **options: Any) -> CompiledModel:
    """Load a saved plan; needs neither the ONNX file nor the onnx package."""
    plan = ExecutionPlan.load(os.fspath(directory))
    return CompiledModel(plan, target or default_target(), **options)
