"""pyforge: an ONNX inference compiler written in Python.

>>> import pyforge
>>> model = pyforge.compile("resnet50.onnx")       # cuda when a GPU is usable, else cpu
>>> y = model.predict(x)                            # numpy in, numpy out
>>> model.save("resnet50.plan"); pyforge.load("resnet50.plan").predict(x)
"""

from __future__ import annotations

import inspect
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
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
    "TextGenerator",
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
        import numba_cuda  # noqa: F401  (the [cuda] extra: numba's built-in numba.cuda won't do)
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


def _runtime(plan: ExecutionPlan, target: str, runtime: RuntimeOptions, progress=None, like=None):
    """``like``: a _Bound of the same model whose state (and, on cpu, packed weights where the
    weights array is the same) the new runtime shares; the cpu one then skips its warm-up run
    (the predict that asked for the plan runs it next, which loads its kernels)."""
    kwargs: dict[str, Any] = runtime.runtime_kwargs(target)
    if plan.state:  # the state buffer the model's plans share (None: the first makes it)
        kwargs["state"] = like.runtime.state if like is not None else None
    if target == "cpu":
        from .exec.cpu import CpuRuntime as cls

        if like is not None:  # cuda's warm-up run comes before its graph capture: always
            kwargs["warm_up"] = False
            if like.plan.weights is plan.weights:
                kwargs["packed"] = like.runtime._packed
    else:
        from .exec.cuda import CudaRuntime as cls

        kwargs["precision"] = plan.stats.get("precision", "fp32")
    accepted = inspect.signature(cls.__init__).parameters
    for name in [k for k in kwargs if k not in accepted]:
        if kwargs.pop(name) is not True:  # only the default (True) may go unsaid
            raise errors.OptionError(name, f"{name}: this {target} runtime does not take it yet")
    return cls(plan, progress=progress, **kwargs)


@dataclass
class _Bound:
    """One plan bound to its runtime."""

    plan: ExecutionPlan
    runtime: Any
    details: dict[str, Any] | None
    stats: dict[str, Any]


def _bind(plan, target, runtime, details, progress, like=None) -> _Bound:
    if progress is not None:
        progress("bind", 0, 1)  # the runtime reports ("bind", k, steps), then ("jit", k, steps)
    t0 = time.perf_counter()
    rt = _runtime(plan, target, runtime, progress, like)
    bind = time.perf_counter() - t0
    stats: dict[str, Any] = dict(plan.stats)
    stats["target"] = target
    stats["launches"] = rt.launches  # kernels + GEMM calls per inference
    # as the runtime issues them: on cpu a GEMM step's driver runs its im2col and epilogue
    # inside the one call, so "kernels" counts only what is launched besides GEMM steps
    stats["kernels"] = rt.launches - stats.get("gemms", 0)
    stats["scratch_bytes"] = rt.scratch_bytes  # column matrices made outside the arena
    # the runtime runs every step once after binding (cpu: on the zeroed arena; cuda: before
    # the graph capture), so Numba's JIT (or its disk cache) is paid there: "jit"; "bind" is
    # the rest (loading kernel modules, packing weights: its packing code compiles then too)
    jit = rt.jit_seconds
    stages = dict((details or {}).get("stage_seconds", {}), bind=bind - jit, jit=jit)
    stats["stage_seconds"] = stages
    stats["bind_seconds"] = bind
    stats["compile_seconds"] = sum(stages.values())
    return _Bound(plan, rt, details, stats)


def _same_bytes(a: np.ndarray, b: np.ndarray, chunk: int = 1 << 20) -> bool:
    """Two uint8 weights arrays equal byte for byte: compared in pieces, which reads each once
    and stops at the first difference (cheaper than hashing both)."""
    if a.nbytes != b.nbytes:
        return False
    a, b = (np.ascontiguousarray(w).reshape(-1).view(np.uint8) for w in (a, b))
    return all(
        np.array_equal(a[i : i + chunk], b[i : i + chunk]) for i in range(0, a.nbytes, chunk)
    )


def _feed_key(names: list[str], x: Any) -> tuple | None:
    """The input signature ``predict`` was given (one shape per input, in order); None when
    the names are wrong (then the plan's own check names them)."""
    if not isinstance(x, dict):
        return (_shape(x),) if len(names) == 1 else None
    if len(x) != len(names) or any(n not in x for n in names):
        return None
    return tuple(_shape(x[n]) for n in names)


def _shape(v: Any) -> tuple:  # numpy, Numba, CuPy, torch (a tuple subclass) arrays; lists
    return np.shape(v) if getattr(v, "shape", None) is None else tuple(v.shape)


class CompiledModel:
    """A compiled model: one plan per input signature, each bound to a target runtime.

    ``inputs`` shows a symbolic dim as its name (``('batch', 256)``); ``predict`` binds it: the
    first call with a new signature compiles a plan for it (the kernel cache makes this fast)
    and keeps it, at most ``max_plans`` (least recently used evicted); every plan whose weights
    bytes are identical shares the first one's weights array. ``plan``, ``runtime``, ``stats``
    and ``details`` (the pass report; None for a loaded plan or one compiled by ``predict``)
    describe the most recently used plan; ``stats["plans"]`` lists every signature held.

    >>> model = pyforge.compile("mlp_dynamic.onnx", target="cpu")
    >>> model.inputs
    [TensorSpec('x', ('batch', 256), float32)]
    >>> model.predict(x1), model.predict(x4)       # batch 1, then batch 4: a second plan
    >>> model.stats["plans"]
    [{'x': (1, 256)}, {'x': (4, 256)}]
    """

    def __init__(
        self,
        plan: ExecutionPlan | None,
        target: str,
        runtime: RuntimeOptions | None = None,
        *,
        details: dict[str, Any] | None = None,
        progress: Progress | None = None,
    ):
        runtime = (runtime or RuntimeOptions()).resolve(target)
        self.target = target
        self.runtime_options = runtime
        self._plans: OrderedDict[tuple, _Bound] = OrderedDict()
        self._current: _Bound | None = None  # the most recently used; read without the lock
        self._deferred = ""  # why compile() built no plan; the first predict builds one
        # compile()'s plan for the free dims as 1, bound (and JIT-compiled) only when predict
        # asks for that signature or stats/runtime need it: (signature, plan, details)
        self._pending: tuple[tuple, ExecutionPlan, dict | None] | None = None
        self._progress = progress  # compile()'s: reports the pending plan's bind and JIT too
        self._padding: Any = None  # frontend.buckets.Padding when compiled with buckets=
        self.state: dict[str, str] = dict(plan.state) if plan is not None else {}  # out -> in
        self._state_lock = threading.Lock()  # one call at a time: the plans share the state
        if plan is not None:
            self._names = list(plan.inputs)
            first = _bind(plan, target, runtime, details, progress)
            self._plans[tuple(shape for _, shape, _ in plan.signature(self._names))] = first
            self._current = first
        self._lock = threading.Lock()
        self._max_plans = 1
        self._source: _Source | None = None  # set by compile(): what more plans are built from

    def _last(self, bind: bool = True) -> _Bound:
        """The most recently used plan; compile()'s pending one (bound first where ``bind``)."""
        if self._current is None and self._pending is not None:
            if not bind:
                return _Bound(self._pending[1], None, self._pending[2], {})
            return self._plan_for(self._pending[0])
        if self._current is None:
            raise errors.InputError(f"no plan yet: {self._deferred}; the first predict builds one")
        return self._current

    @property
    def plan(self) -> ExecutionPlan:
        return self._last(bind=False).plan

    @property
    def runtime(self) -> Any:
        return self._last().runtime

    @property
    def details(self) -> dict[str, Any] | None:
        return self._last(bind=False).details

    @property
    def stats(self) -> dict[str, Any]:
        """Figures of the most recently used plan (compile()'s pending plan is bound first)."""
        if self._current is None and self._pending is not None:
            self._last()
        if self._current is None:
            return {"target": self.target, "plans": [], "deferred": self._deferred}
        s = self._current.stats
        with self._lock:
            s["plans"] = [dict(zip(self._names, key)) for key in self._plans]
        s["max_plans"] = self._max_plans
        return s

    @property
    def inputs(self) -> list[TensorSpec]:
        """The run-time inputs, in ``predict``'s order; a dim ``predict`` binds shows as its
        symbol (``'batch'``), or None when the file names it not."""
        if self._source is None:
            return [TensorSpec(*s) for s in self.plan.signature(self._names)]
        state = set(self.state.values())
        return [
            TensorSpec(s.name, s.dims, s.dtype) for s in self._source.specs if s.name not in state
        ]

    @property
    def outputs(self) -> list[TensorSpec]:
        """The outputs, with the most recently used plan's shapes."""
        if self._current is None and self._pending is None:
            return [TensorSpec(n, None, None) for n in self._source.output_names]
        return [TensorSpec(*s) for s in self.plan.signature(self.plan.outputs)]

    @property
    def input_names(self) -> list[str]:
        return [n for n in self._names if n != _VALID]

    @property
    def output_names(self) -> list[str]:
        return [s.name for s in self.outputs]

    def __repr__(self) -> str:
        return (
            f"CompiledModel(target={self.target!r}, inputs={self.inputs}, "
            f"outputs={self.outputs}, launches={self.stats.get('launches')})"
        )

    def predict(
        self, x: np.ndarray | dict[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> np.ndarray | dict[str, np.ndarray]:
        """Run one inference: one array for a single-input model (or a dict name -> array);
        returns one array for a single-output model, else a dict name -> array. A new input
        signature compiles (and keeps) a plan for it first. ``outputs``: the output names
        wanted (a dict of them comes back; on cuda only they are copied to the host).

        On the cuda target, inputs may be GPU arrays (Numba, CuPy, torch: anything with
        ``__cuda_array_interface__``); they are copied device to device, and the outputs come
        back as Numba device arrays in pyforge's arena, valid until a later ``predict`` reuses that
        execution context (one per concurrent call, ``max_concurrency`` at most).

        >>> y = model.predict(cuda.to_device(x))   # y: DeviceNDArray; y.copy_to_host()
        """
        if self._padding is not None:  # up to the length's bucket; the outputs cut back after
            x, length = _pad(self._padding, self.input_names, x)
        if outputs is not None and (bad := set(outputs) - set(self.output_names)):
            raise errors.InputError(f"outputs {sorted(bad)}: the model's are {self.output_names}")
        bound = self._plan_for(_feed_key(self._names, x))
        wanted = (outputs,) if self.target == "cuda" else ()  # the cpu's outputs are no copy
        if self.state:
            with self._state_lock:
                outs = bound.runtime.run(normalise_feeds(bound.plan, x), *wanted)
        else:
            outs = bound.runtime.run(normalise_feeds(bound.plan, x), *wanted)
        if self._padding is not None:
            outs = {n: _cut(a, self._padding.outputs[n], length) for n, a in outs.items()}
        if outputs is not None:
            return {n: outs[n] for n in outputs}
        return outs[bound.plan.outputs[0]] if len(outs) == 1 else outs

    def _plan_for(self, key: tuple | None) -> _Bound:
        current = self._current
        if key is None:  # wrong names: the plan's own check says which
            if current is None and self._pending is None:
                raise errors.InputError(f"predict takes inputs {self._names}")
            if current is not None:
                return current
            key = self._pending[0]
        if (
            current is not None and self._plans.get(key) is current
        ):  # the steady state: the same signature again
            return current
        shapes = dict(zip(self._names, key))
        with self._lock:
            bound = self._plans.get(key)
            if bound is not None:
                self._plans.move_to_end(key)
            elif self._pending is not None and self._pending[0] == key:
                _, plan, details = self._pending
                bound = self._plans[key] = _bind_like(plan, self, details, self._progress)
                self._pending = None
                while len(self._plans) > self._max_plans:
                    self._plans.popitem(last=False)
            elif self._source is None:
                raise _loaded_shape_error(self._current.plan, shapes)
            else:
                bound = self._plans[key] = self._source.build(shapes, self)
                while len(self._plans) > self._max_plans:
                    self._plans.popitem(last=False)
            self._current = bound
            return bound

    def _share_weights(self, plan: ExecutionPlan) -> None:
        """Point ``plan.weights`` at a held plan's array when the bytes are identical, so every
        plan of the model (and, on cuda, its upload) uses one copy."""
        if any(other.plan.weights is plan.weights for other in self._plans.values()):
            return  # taken at build already (lower_numba.build_plan)
        seen: set[int] = set()
        for other in self._plans.values():
            if id(other.plan.weights) not in seen:
                seen.add(id(other.plan.weights))
                if _same_bytes(other.plan.weights, plan.weights):
                    plan.weights = other.plan.weights
                    return

    def save(self, directory: str | os.PathLike) -> None:
        """Write the most recently used plan (one signature: ``stats["plans"][-1]``) to
        ``directory``: plan.json, weights.bin and every kernel source. ``pyforge.load`` runs
        that signature only."""
        if self._padding is not None:
            raise errors.OptionError(
                "buckets", "a model compiled with buckets= cannot be saved yet"
            )
        self.plan.save(os.fspath(directory))


_VALID = "pyforge::valid"  # the bucket mask input, frontend.buckets.VALID


def _pad(padding: Any, names: list[str], x: Any) -> tuple[dict, int]:
    """The inputs padded with zeros up to their length's bucket, and the mask of real positions."""
    feeds = dict(x) if isinstance(x, dict) else {names[0]: x}
    lengths = {n: _shape(feeds[n])[a] for n, a in padding.inputs.items() if n in feeds}
    if len(set(lengths.values())) != 1:
        raise errors.InputError(
            f"inputs {sorted(lengths)} must share one {padding.symbol!r} length: got {lengths}"
        )
    length = next(iter(lengths.values()))
    try:
        size = padding.bucket(length)
    except errors.OptionError as e:
        raise errors.InputError(str(e)) from None
    for n, axis in padding.inputs.items():
        if n in feeds:
            a = np.asarray(feeds[n])
            widths = [(0, 0)] * a.ndim
            widths[axis] = (0, size - length)
            feeds[n] = np.pad(a, widths)
    feeds[_VALID] = np.arange(size) < length
    return feeds, length


def _cut(a: Any, axes: list[int], length: int) -> Any:
    return (
        a[tuple(slice(0, length) if i in axes else slice(None) for i in range(a.ndim))]
        if axes
        else a
    )


def _loaded_shape_error(plan: ExecutionPlan, shapes: dict[str, tuple]) -> errors.InputError:
    want = {name: shape for name, shape, _ in plan.signature(plan.inputs)}
    name = next(n for n in want if shapes[n] != want[n])  # a miss: some input differs
    got, shape = shapes[name], want[name]
    dim = next((i for i, (a, b) in enumerate(zip(got, shape)) if a != b), None)
    where = f"rank must be {len(shape)}" if dim is None else f"dim {dim} must be {shape[dim]}"
    return errors.InputError(
        f"input {name!r} has shape {got}, expected {shape}: {where}; this model holds one plan "
        "(a saved plan runs only the shapes it was compiled for): compile the ONNX model to "
        "run others"
    )


@dataclass
class _Source:
    """What ``predict`` compiles a new signature's plan from (specs: after ``input_shapes``)."""

    proto: Any  # compile()'s own copy: the cache below is only valid for these bytes
    options: CompileOptions
    specs: list[Any]  # frontend.shapes.InputSpec
    cache: Any = None  # ir.ConstCache: initializers and BatchNorm folds, read once per model

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.proto.graph.output]

    def build(self, shapes: dict[str, tuple[int, ...]], model: CompiledModel) -> _Bound:
        from .compiler import compile_to_plan
        from .frontend.shapes import bind

        state = {s.name: s.dims for s in self.specs if s.name in model.state.values()}
        signature = bind(self.specs, {**state, **{k: v for k, v in shapes.items() if k != _VALID}})
        opts = replace(self.options, input_shapes=signature)
        plans = tuple(b.plan for b in model._plans.values())  # build_plan takes their weights
        plans += (model._pending[1],) if model._pending is not None else ()
        plan, details = compile_to_plan(
            self.proto, opts, padding=model._padding, cache=self.cache, like=plans
        )
        model._share_weights(plan)
        bound = _bind_like(plan, model, details)
        bound.details = None  # its graph would hold one more copy of the weights per plan
        return bound


def _bind_like(plan: ExecutionPlan, model: CompiledModel, details: dict | None, progress=None):
    """``plan`` bound beside ``model``'s held plans: sharing their state, and the packed weights
    of the one whose weights array it took."""
    held = list(model._plans.values())
    like = next((b for b in held if b.plan.weights is plan.weights), None)
    like = like or next(iter(held), None)
    return _bind(plan, model.target, model.runtime_options, details, progress, like)


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

    Shapes: a symbolic dim (``batch``, ``seq``) is bound by ``predict``, one plan per input
    signature; ``compile`` builds the first plan with ``input_shapes`` and every dim still free
    as 1 (so a model that cannot compile fails here), but binds and JIT-compiles it only when
    ``predict`` asks for that signature (or ``stats``, ``runtime`` are read); with no dim free it
    binds at once. ``input_shapes={"input_ids": (1, 128)}`` fixes an input's shape, and each symbol it
    binds in every input; a name that is not a graph input, a wrong rank or a contradicted fixed
    dim is an ``OptionError`` naming input and dim.

    Options, as keywords or as ``options=CompileOptions(...)`` / ``runtime=RuntimeOptions(...)``
    (a field given both ways must agree):

    compile (``CompileOptions``; fixed in the plan):
      input_shapes={name: shape}    fix these inputs' shapes (default: bound by predict)
      max_plans=int                 plans kept, one per input signature (default 8; LRU)
      buckets={"seq": [16, 32, 64]} pad that dim up to the next size, one plan per bucket
      layout="nchw"|"nhwc"          cuda default "nhwc", cpu "nchw"
      conv="im2col"|"implicit"      "implicit": one implicit-GEMM kernel per NHWC conv
      conv_tile="64x32x16/4x4[/s2]" the implicit-GEMM tile (with conv="implicit")
      precision="fp32"|"tf32"|"fp16" tf32 and fp16: cuda only
      specialize=bool               shape-specialised kernels (cuda default True, cpu False)
      fusion=bool                   fuse ops into kernels (default True)
      verify=bool                   check the IR after every pass (default True)
      memory_limit=int              bytes the arena and weights may take (default 75% of RAM)
      optimizer="greedy"|"egraph"   cpu: "egraph" picks per region by measured kernel costs
      state={output: input}         one buffer kept across calls, written in place (KV cache)
      attention_rows=int            longest query fused for heads of 128+ (cuda default 64)
    runtime (``RuntimeOptions``; also taken by ``load``):
      fused_steps=bool              cpu: one call per GEMM step (default True)
      own_gemm=bool                 cpu: pyforge's AVX2 GEMM, else OpenBLAS (default True)
      graph=bool                    cuda: replay one CUDA graph (default True)
      library_epilogues=bool        cuda: cuBLASLt applies bias/Relu (default True)
      max_concurrency=int           predict calls run at once, each in its own context

    ``progress(stage, done, total)`` is called as each stage (import, passes, lowering, plan,
    bind, jit) starts and ends, after each pass, after each step bound and each step JIT-compiled
    (by one run of it on the zeroed arena, so the first ``predict`` runs compiled code).

    >>> m = pyforge.compile("mlp.onnx", target="cpu", fusion=False)
    >>> m = pyforge.compile("resnet50.onnx", "cuda", pyforge.CompileOptions(precision="fp16"))
    >>> m = pyforge.compile("bert.onnx", input_shapes={"input_ids": (1, 128)}, max_plans=4)
    >>> m = pyforge.compile("bert.onnx", buckets={"seq": [16, 32, 64, 128]})
    >>> m = pyforge.compile("mlp.onnx", progress=lambda stage, done, total: print(stage, done))
    """
    options, runtime = split_options(options, runtime, kwargs)
    target = target or default_target()
    options = options.resolve(target)
    runtime = runtime.resolve(target)

    from .compiler import compile_to_plan
    from .frontend import load_model
    from .frontend.shapes import default_shapes, fix_shapes, free_symbols, input_specs
    from .ir import ConstCache

    proto = load_model(model)
    if proto is model:  # the caller's object: a later edit of it must not meet our cache
        proto = type(model)()
        proto.CopyFrom(model)
    cache = ConstCache()
    specs = fix_shapes(input_specs(proto), options.input_shapes)
    for s in specs:  # a state is one buffer for every plan: its shape cannot vary
        if s.name in (options.state or {}).values() and not all(
            isinstance(d, int) for d in s.dims or [None]
        ):
            raise errors.OptionError(
                "state", f"state input {s.name!r} has shape {s.dims}: fix it with input_shapes"
            )
    shapes, padding = default_shapes(specs), None
    if options.buckets:
        from .frontend.buckets import analyze

        ((symbol, sizes),) = options.buckets.items()
        padding = analyze(proto, specs, symbol, list(sizes), dict(options.input_shapes or {}))
        for name, axis in padding.inputs.items():
            shapes[name] = shapes[name][:axis] + (sizes[0],) + shapes[name][axis + 1 :]
    first = replace(options, input_shapes=shapes)
    try:
        plan, details = compile_to_plan(
            proto, first, progress=progress, padding=padding, cache=cache
        )
    except errors.DataDependentError as e:
        if e.top is None:
            raise
        from .staged import StagedModel  # a node needs run-time data: run in stages

        return StagedModel(proto, e, target, options, runtime, specs)
    except (errors.ShapeError, errors.BadAttributeError) as e:  # both may come of the 1s
        free = free_symbols(specs)
        if not free:
            raise
        # the 1s may be what is inconsistent (a past length beside a new one, say): the first
        # predict, which brings real shapes, builds the first plan instead
        plan, details = None, None
        why = (
            f"with the free dims {free} as 1 the model does not compile ({e}); "
            "input_shapes={name: shape} fixes them at compile"
        )
    free = free_symbols(specs)  # a signature predict may never ask for: bound when it does
    eager = None if free else plan
    compiled = CompiledModel(eager, target, runtime, details=details, progress=progress)
    if eager is None:
        compiled._names = [s.name for s in specs if s.name not in (options.state or {}).values()]
        compiled.state = dict(options.state or {})
    if plan is None:
        compiled._deferred = why
    elif eager is None:
        compiled._names = list(plan.inputs)
        key = tuple(shape for _, shape, _ in plan.signature(compiled._names))
        compiled._pending = (key, plan, details)
    compiled._max_plans = options.max_plans
    compiled._padding = padding
    compiled._source = _Source(proto, options, specs, cache)
    return compiled


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
    ``OptionError``: the plan is already compiled. Every kernel is lowered again from the plan's
    description and must equal the saved source byte for byte (else ``ModelLoadError``).

    >>> m = pyforge.load("mlp.plan", target="cpu", own_gemm=False)
    """
    if target is not None and target not in ("cpu", "cuda"):
        raise errors.OptionError("target", f"target={target!r} is not allowed; use 'cpu' or 'cuda'")
    from .lower_numba.describe import regenerate  # its kernels: only what pyforge emits for it

    plan = ExecutionPlan.load(os.fspath(directory), regenerate)
    runtime = load_options(runtime, kwargs, plan.stats)
    target = target or default_target()
    return CompiledModel(plan, target, runtime.resolve(target), progress=progress)


def __getattr__(name: str):
    """``pyforge.TextGenerator`` without importing the text-generation layer at ``import pyforge``."""
    if name == "TextGenerator":
        from .generate import TextGenerator

        return TextGenerator
    raise AttributeError(f"module 'pyforge' has no attribute {name!r}")
