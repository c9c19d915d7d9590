"""The cpu runtime: one numpy arena, every step's arguments bound once, then a flat call list."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

import numpy as np

from ...errors import IndexRangeError, ModelLoadError
from ..kernels import load_kernel, module_name
from ..plan import DeviceFeed, ExecutionPlan
from ..pool import ContextPool
from ..steps import GemmStep, KernelStep
from .gemm import choose_gemm
from .own import shared_scratch, usable


def flat_views(
    plan: ExecutionPlan, arena: np.ndarray, weights: np.ndarray, state: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """A flat typed view into the arena (or weights, or state) for every slot."""
    views, regions = {}, {"arena": arena, "weights": weights, "state": state}
    for name, s in plan.slots.items():
        if s.region != "scratch":  # made at bind, where a step needs it (_scratch_views)
            buf = regions[s.region]
            views[name] = buf[s.offset : s.offset + s.nbytes].view(s.dtype)
    return views


class CpuRuntime:
    """Binds a plan to numpy arenas; ``run`` executes the bound calls in order in one of them.

    ``max_concurrency`` calls run at once, each in its own context (arena, bound calls, GEMM
    scratch), made at first need; the weights (and own sgemm's packed weights) are shared.
    ``arena``, ``views`` and ``calls`` are the first context's.
    """

    def __init__(
        self,
        plan: ExecutionPlan,
        *,
        precision: str = "fp32",
        fused_steps: bool = True,
        own_gemm: bool = True,
        max_concurrency: int = 2,
        progress: Callable[[str, int, int], None] | None = None,
        state: np.ndarray | None = None,
        warm_up: bool = True,
        packed: dict | None = None,
    ):
        """``state``: the buffer of the plan's state slots (a model's plans share one; default a
        new zeroed one); a plan with state runs one call at a time. ``fused_steps=False`` runs every GEMM step as prologue, numpy matmul, epilogue;
        ``own_gemm=False`` keeps float32 GEMMs off pyforge's own sgemm (CBLAS drivers instead).
        ``progress(stage, done, total)`` is called as each step is bound ("bind") and as each
        runs once so that Numba compiles its kernels ("jit"). ``warm_up=False`` skips that run:
        for a plan whose first run comes right away (a new shape's, made by ``predict``), which
        compiles whatever kernel is new at no extra cost. ``packed``: own sgemm's
        packed weights of another runtime whose plan has this plan's weights array (the same
        object), shared rather than packed again."""
        if precision != "fp32":
            raise ValueError(f"precision={precision!r}: the cpu target computes in fp32 only")
        halves = [n for n in _step_tensors(plan) if np.dtype(plan.slots[n].dtype) == np.float16]
        if halves:  # a plan saved from compile(..., precision="fp16")
            raise ModelLoadError(
                f"the plan computes on float16 tensors ({halves[0]!r}...): it was compiled with "
                "precision='fp16', which runs on the cuda target only"
            )
        self.plan = plan
        self.kernel_paths: dict[str, str] = {}
        self._options = {"own_gemm": own_gemm, "fused_steps": fused_steps}
        # own sgemm's packed weights, one copy for every context (and plan: see ``packed``)
        self._packed: dict = {} if packed is None else packed
        self.state = np.zeros(max(plan.state_bytes, 1), np.uint8) if state is None else state
        max_concurrency = 1 if plan.state else max_concurrency
        first = _CpuContext(self, progress)
        self.arena, self.views, self.calls = first.arena, first.views, first.calls
        self.launches = first.launches
        self.gemm_impls, self.driver_paths = first.gemm_impls, first.driver_paths
        self.scratch_bytes = first.scratch_bytes
        self.jit_seconds = first.warm_up(progress) if warm_up else 0.0
        if max_concurrency > 1 and _workqueue_only():
            max_concurrency = 1  # that threading layer aborts on parallel regions run at once
        self.pool = ContextPool(lambda: _CpuContext(self), max_concurrency, first)

        self.threads = usable_threads()

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import numba

        if numba.get_num_threads() != self.threads:  # per calling thread in Numba
            numba.set_num_threads(self.threads)
        with self.pool.context() as ctx:
            return ctx.run(feeds)


class _CpuContext:
    """One arena with every step bound to it: what one ``predict`` at a time runs in."""

    def __init__(self, rt: CpuRuntime, progress: Callable | None = None) -> None:
        plan = rt.plan
        self.rt, self.plan = rt, plan
        # zeroed: the bind-time warm-up runs every step on it before any input exists
        self.arena = np.zeros(max(plan.arena_bytes, 1), np.uint8)
        self.views = flat_views(plan, self.arena, plan.weights, rt.state)
        self.calls: list[Callable[[], None]] = []
        self.launches = 0
        self.gemm_impls: dict[int, str] = {}  # step index -> the GEMM implementation bound
        self.driver_paths: dict[int, str] = {}  # step index -> its generated driver's file
        self._no_errors = np.zeros(1, np.int32)  # cuda's error word; cpu kernels raise instead
        constants = frozenset(n for n, s in plan.slots.items() if s.region == "weights")
        self.scratch_bytes = self._scratch_views(constants, **rt._options)
        shared = shared_scratch(plan.steps)  # reused by every GEMM step (one runs at a time)
        shared["packed"] = rt._packed
        for i, step in enumerate(plan.steps):
            if isinstance(step, GemmStep):
                call, launches, self.gemm_impls[i] = choose_gemm(
                    step, self.views, self._bound, self._kernel, constants, shared, **rt._options
                )
                if getattr(call, "source_path", None):
                    self.driver_paths[i] = call.source_path
            else:
                call, launches = self._kernel(step), 1
            self.calls.append(call)
            self.launches += launches
            if progress is not None:
                progress("bind", i + 1, len(plan.steps))

    def _scratch_views(self, constants: frozenset[str], own_gemm: bool, fused_steps: bool) -> int:
        """Views of one buffer for the column matrices a GEMM step here needs after all (own
        sgemm does without them, but not the CBLAS driver, numpy, or a GEMM too small for own
        sgemm): steps run one at a time, so they share it. The bytes it takes."""
        need = []
        for step in self.plan.steps:
            col = step.conv.col if isinstance(step, GemmStep) and step.conv else None
            if col is None or self.plan.slots[col].region != "scratch":
                continue
            if not (own_gemm and fused_steps and usable(step, self.views, step.a in constants)):
                need.append(col)
        slots = [self.plan.slots[c] for c in need]
        buf = np.empty(max([s.offset + s.nbytes for s in slots] + [0]), np.uint8)
        for col, s in zip(need, slots):
            self.views[col] = buf[s.offset : s.offset + s.nbytes].view(s.dtype)
        return buf.nbytes

    def _bound(self, step: KernelStep) -> tuple[str, Callable, int, tuple]:
        """(module name, compiled kernel, n, arguments) of a kernel step."""
        # "w" (a 16-byte view on cuda) is the plain tensor here
        args = tuple(
            self.views[v] if kind in "tw" else self._no_errors if kind == "e" else np.int64(v)
            for kind, v in step.args
        )
        source = one_name_per_buffer(self.plan.kernel_source(step.kernel, "cpu"), args)
        fn, path = load_kernel(source, "cpu")
        self.rt.kernel_paths[step.kernel] = path
        return module_name(path, "cpu"), fn, step.n, args

    def _kernel(self, step: KernelStep) -> Callable[[], None]:
        _, fn, n, args = self._bound(step)
        return _kernel_call(fn, np.int64(n), args)

    def warm_up(self, progress: Callable[[str, int, int], None] | None) -> float:
        """Run every step once on the zeroed arena, so Numba compiles (or loads from its disk
        cache) each kernel and driver here, not in the first predict; the seconds it took."""
        t0, total = time.perf_counter(), len(self.calls)
        kept = self.rt.state.copy()  # a state in use (another plan's cache): left as it was
        if progress is not None:
            progress("jit", 0, total)
        for i, call in enumerate(self.calls):
            try:
                call()
            except Exception:  # noqa: BLE001, S110  (zeros may divide by zero: compiled by now)
                pass
            if progress is not None:
                progress("jit", i + 1, total)
        self.rt.state[:] = kept
        return time.perf_counter() - t0

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for name, arr in feeds.items():
            if isinstance(arr, DeviceFeed):  # a GPU array given to the cpu target: bring it over
                from numba import cuda

                dev = arr.array
                arr = (dev if arr.ptr is None else cuda.as_cuda_array(dev)).copy_to_host()
            self.views[name][:] = np.ravel(arr)
        for i, call in enumerate(self.calls):
            try:
                call()
            except IndexError as e:  # a kernel's index check (KernelBuilder.check_range)
                raise IndexRangeError(self.plan.steps[i].label or "kernel", str(e)) from None
        outs = {n: self.views[n].reshape(self.plan.slots[n].shape) for n in self.plan.outputs}
        return {n: v if n in self.plan.state else v.copy() for n, v in outs.items()}  # state: views


_SIGNATURE = re.compile(r"^def kernel\(n, ([^)]*)\):\n", re.MULTILINE)


def one_name_per_buffer(source: str, args: tuple) -> str:
    """``source`` with every array parameter bound to the same buffer as an earlier one used
    under that earlier one's name. LLVM vectorises ``y[i] = f(x[i])`` behind a run-time check
    that x and y do not overlap; an in-place step (x is y) fails it and runs the scalar loop,
    4-6x slower, where ``x[i] = f(x[i])`` needs no check."""
    sig = _SIGNATURE.search(source)
    params = [p.strip() for p in sig.group(1).split(",")] if sig else []
    if len(params) != len(args):
        return source
    first: dict[tuple, str] = {}
    body = source[sig.end() :]
    for p, a in zip(params, args):
        if isinstance(a, np.ndarray) and a.size:
            name = first.setdefault((a.ctypes.data, a.dtype.str, a.size), p)
            if name != p:
                body = re.sub(rf"\b{p}\b", name, body)
    return source[: sig.end()] + body


def usable_threads() -> int:
    """Threads a parallel region uses: the cores this process may run on (its affinity mask,
    as taskset or a container sets it), at most NUMBA_NUM_THREADS. Numba's own default is
    every core of the machine, which oversubscribes a process pinned to a few of them."""
    import numba

    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(cores, numba.config.NUMBA_NUM_THREADS))


def _workqueue_only() -> bool:
    """Whether Numba runs parallel regions on its workqueue layer (no TBB, no OpenMP)."""
    import numba

    numba.get_num_threads()  # starts the thread pool, which picks the layer
    try:
        return numba.threading_layer() == "workqueue"
    except ValueError:
        return False


def _step_tensors(plan: ExecutionPlan) -> set[str]:
    """Every tensor a step of the plan reads or writes (a constant output may be in none)."""
    return {name for step in plan.steps for name in step.tensors()}


def _kernel_call(fn, n, args) -> Callable[[], None]:
    return lambda: fn(n, *args)
