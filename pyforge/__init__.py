"""pyforge: an ONNX inference compiler written in Python.

>>> import pyforge
>>> model = pyforge.compile("resnet50.onnx")       # cuda when a GPU is usable, else cpu
>>> y = model.predict(x)                            # numpy in, numpy out
>>> model.save("resnet50.plan"); pyforge.load("resnet50.plan").predict(x)
"""

from __future__ import annotations

import inspect
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import errors
from .exec.plan import ExecutionPlan, normalise_feeds
from .options import CompileOptions, Progress, RuntimeOptions, load_options, split_options

__all__ = [
    "CompileOptions",
    "CompiledModel",
    "RuntimeOptions",
    "TensorSpec",
    "compile",
    "default_target",
    "errors",
    "load",
]
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


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a compiled model: name, shape (a tuple) and numpy dtype.

    >>> model.inputs
    [TensorSpec('x', (1, 256), float32)]
    """

    name: str
    shape: tuple[int | str, ...]
    dtype: np.dtype

    def __repr__(self) -> str:
        return f"TensorSpec({self.name!r}, {self.shape}, {self.dtype})"


def _runtime(plan: ExecutionPlan, target: str, runtime: RuntimeOptions):
    kwargs: dict[str, Any] = runtime.runtime_kwargs(target)
    if target == "cpu":
        from .exec.cpu import CpuRuntime as cls
    else:
        from .exec.cuda import CudaRuntime as cls

        kwargs["precision"] = plan.stats.get("precision", "fp32")
    accepted = inspect.signature(cls.__init__).parameters
    for name in [k for k in kwargs if k not in accepted]:
        if kwargs.pop(name) is not True:  # only the default (True) may go unsaid
            raise errors.OptionError(name, f"{name}: this {target} runtime does not take it yet")
    return cls(plan, **kwargs)


class CompiledModel:
    """A compiled plan bound to a target runtime. ``predict`` is the steady-state path.

    ``inputs``/``outputs`` describe the tensors; ``stats`` the plan and the compile times;
    ``details`` the pass report (None for a plan loaded from disk).

    >>> model = pyforge.compile("mlp.onnx", target="cpu")
    >>> model.inputs, model.stats["launches"]
    ([TensorSpec('x', (1, 256), float32)], 6)
    """

    def __init__(
        self,
        plan: ExecutionPlan,
        target: str,
        runtime: RuntimeOptions | None = None,
        *,
        details: dict[str, Any] | None = None,
        progress: Progress | None = None,
    ):
        runtime = (runtime or RuntimeOptions()).resolve(target)
        self.plan = plan
        self.target = target
        self.details = details
        self.runtime_options = runtime
        if progress is not None:
            progress("bind", 0, 1)
        t0 = time.perf_counter()
        self.runtime = _runtime(plan, target, runtime)
        bind = time.perf_counter() - t0
        if progress is not None:
            progress("bind", 1, 1)
        self.stats: dict[str, Any] = dict(plan.stats)
        self.stats["target"] = target
        self.stats["launches"] = self.runtime.launches  # kernels + GEMM calls per inference
        # as the runtime issues them: on cpu a GEMM step's driver runs its im2col and epilogue
        # inside the one call, so "kernels" counts only what is launched besides GEMM steps
        self.stats["kernels"] = self.runtime.launches - self.stats.get("gemms", 0)
        # "bind" loads every kernel; on cuda it also JIT-compiles them (the graph capture runs
        # each once), on cpu Numba compiles each at its first call
        stages = dict((details or {}).get("stage_seconds", {}), bind=bind)
        self.stats["stage_seconds"] = stages
        self.stats["bind_seconds"] = bind
        self.stats["compile_seconds"] = sum(stages.values())

    @property
    def inputs(self) -> list[TensorSpec]:
        """The run-time inputs, in ``predict``'s order."""
        return [TensorSpec(*s) for s in self.plan.signature(self.plan.inputs)]

    @property
    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec(*s) for s in self.plan.signature(self.plan.outputs)]

    @property
    def input_names(self) -> list[str]:
        return list(self.plan.inputs)

    @property
    def output_names(self) -> list[str]:
        return list(self.plan.outputs)

    def __repr__(self) -> str:
        return (
            f"CompiledModel(target={self.target!r}, inputs={self.inputs}, "
            f"outputs={self.outputs}, launches={self.stats['launches']})"
        )

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


def compile(
    model: Any,
    target: str | None = None,
    options: CompileOptions | None = None,
    *,
    runtime: RuntimeOptions | None = None,
    progress: Progress | None = None,
    **kwargs: Any,
) -> CompiledModel:
    """Compile an ONNX model (path, bytes or ModelProto) for "cpu" or "cuda" (default: cuda
    when a GPU is usable, else cpu). Every option is checked before any work; a wrong name or
    value, or one the target does not take, raises ``pyforge.errors.OptionError``.

    Options, as keywords or as ``options=CompileOptions(...)`` / ``runtime=RuntimeOptions(...)``
    (a field given both ways must agree):

    compile (``CompileOptions``; fixed in the plan):
      layout="nchw"|"nhwc"          cuda default "nhwc", cpu "nchw"
      conv="im2col"|"implicit"      "implicit": one implicit-GEMM kernel per NHWC conv
      conv_tile="64x32x16/4x4[/s2]" the implicit-GEMM tile (with conv="implicit")
      precision="fp32"|"tf32"|"fp16" tf32 and fp16: cuda only
      specialize=bool               shape-specialised kernels (cuda default True, cpu False)
      fusion=bool                   fuse ops into kernels (default True)
      verify=bool                   check the IR after every pass (default True)
    runtime (``RuntimeOptions``; also taken by ``load``):
      fused_steps=bool              cpu: one call per GEMM step (default True)
      own_gemm=bool                 cpu: pyforge's AVX2 GEMM, else OpenBLAS (default True)
      graph=bool                    cuda: replay one CUDA graph (default True)
      library_epilogues=bool        cuda: cuBLASLt applies bias/Relu (default True)
      max_concurrency=int           predicts run at once, each in its own arena (cpu 2, cuda 4)

    ``progress(stage, done, total)`` is called as each stage (import, passes, lowering, plan,
    bind) starts and ends, and after each pass.

    >>> m = pyforge.compile("mlp.onnx", target="cpu", fusion=False)
    >>> m = pyforge.compile("resnet50.onnx", "cuda", pyforge.CompileOptions(precision="fp16"))
    >>> m = pyforge.compile("mlp.onnx", progress=lambda stage, done, total: print(stage, done))
    """
    options, runtime = split_options(options, runtime, kwargs)
    target = target or default_target()
    options = options.resolve(target)
    runtime = runtime.resolve(target)

    from .compiler import compile_to_plan

    plan, details = compile_to_plan(model, options, progress=progress)
    return CompiledModel(plan, target, runtime, details=details, progress=progress)


def load(
    directory: str | os.PathLike,
    target: str | None = None,
    runtime: RuntimeOptions | None = None,
    *,
    progress: Progress | None = None,
    **kwargs: Any,
) -> CompiledModel:
    """Load a saved plan; needs neither the ONNX file nor the onnx package. Takes the runtime
    options (``RuntimeOptions`` or its fields as keywords: fused_steps, own_gemm, graph,
    library_epilogues); a compile option (layout, precision, fusion...) is refused with an
    ``OptionError``: the plan is already compiled.

    >>> m = pyforge.load("mlp.plan", target="cpu", own_gemm=False)
    """
    if target is not None and target not in ("cpu", "cuda"):
        raise errors.OptionError("target", f"target={target!r} is not allowed; use 'cpu' or 'cuda'")
    plan = ExecutionPlan.load(os.fspath(directory))
    runtime = load_options(runtime, kwargs, plan.stats)
    target = target or default_target()
    return CompiledModel(plan, target, runtime.resolve(target), progress=progress)
