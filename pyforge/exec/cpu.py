"""The cpu runtime: one numpy arena, every step's arguments bound once, then a flat call list."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import IndexRangeError, ModelLoadError
from ..lower_numba.cache import load_kernel, module_name
from .cpu_gemm import bind_gemm_step
from .cpu_own import shared_scratch
from .plan import DeviceFeed, ExecutionPlan


def flat_views(
    plan: ExecutionPlan, arena: np.ndarray, weights: np.ndarray
) -> dict[str, np.ndarray]:
    """A flat typed view into the arena (or weights) for every slot."""
    views = {}
    for name, s in plan.slots.items():
        buf = arena if s.region == "arena" else weights
        views[name] = buf[s.offset : s.offset + s.nbytes].view(s.dtype)
    return views


def strided(
    flat: np.ndarray, batch: int, rows: int, cols: int, ld: int, bstride: int
) -> np.ndarray:
    isz = flat.itemsize
    return np.lib.stride_tricks.as_strided(
        flat, (batch, rows, cols), (bstride * isz, ld * isz, isz), writeable=True
    )


def gemm_operands(g: dict, views: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A, B, D) as batched numpy views implementing the GemmCall's row-major semantics."""
    m, n, k, batch = g["m"], g["n"], g["k"], g["batch"]
    a = strided(
        views[g["a"]], batch, *((k, m) if g["trans_a"] else (m, k)), g["lda"], g["stride_a"]
    )
    b = strided(
        views[g["b"]], batch, *((n, k) if g["trans_b"] else (k, n)), g["ldb"], g["stride_b"]
    )
    d = strided(views[g["d"]], batch, m, n, g["ldd"], g["stride_d"])
    a = a.transpose(0, 2, 1) if g["trans_a"] else a
    b = b.transpose(0, 2, 1) if g["trans_b"] else b
    if batch == 1:
        return a[0], b[0], d[0]
    return a, b, d


def _bind_gemm(g: dict, views: dict) -> Callable[[], None]:
    a, b, d = gemm_operands(g, views)
    alpha, beta = g["alpha"], g["beta"]
    c = None
    if g.get("c"):
        c = strided(views[g["c"]], g["batch"], g["m"], g["n"], g["ldc"], g["stride_c"])
        c = c[0] if g["batch"] == 1 else c

    def run() -> None:
        np.matmul(a, b, out=d)
        if alpha != 1.0:
            np.multiply(d, d.dtype.type(alpha), out=d)
        if c is not None:
            np.add(d, d.dtype.type(beta) * c, out=d)

    return run


class CpuRuntime:
    """Binds a plan to a numpy arena; ``run`` executes the bound calls in order."""

    def __init__(self, plan: ExecutionPlan, precision: str = "fp32", fused_steps: bool = True):
        if precision != "fp32":
            raise ValueError(f"precision={precision!r}: the cpu target computes in fp32 only")
        halves = [n for n in _step_tensors(plan) if np.dtype(plan.slots[n].dtype) == np.float16]
        if halves:  # a plan saved from compile(..., precision="fp16")
            raise ModelLoadError(
                f"the plan computes on float16 tensors ({halves[0]!r}...): it was compiled with "
                "precision='fp16', which runs on the cuda target only"
            )
        self.plan = plan
        self.arena = np.empty(max(plan.arena_bytes, 1), np.uint8)
        self.views = flat_views(plan, self.arena, plan.weights)
        self.kernel_paths: dict[str, str] = {}
        self.calls: list[Callable[[], None]] = []
        self.launches = 0
        self._no_errors = np.zeros(1, np.int32)  # cuda's error word; cpu kernels raise instead
        constants = frozenset(n for n, s in plan.slots.items() if s.region != "arena")
        shared = shared_scratch(plan.steps)  # reused by every GEMM step (one runs at a time)
        for step in plan.steps:
            if step["kind"] == "gemm":
                # one compiled call for prologue + GEMM + epilogue where CBLAS is reachable
                driver = (
                    bind_gemm_step(step, self.views, self._bound, constants, shared)
                    if fused_steps
                    else None
                )
                if driver is not None:
                    self.calls.append(driver)
                    self.launches += 1
                    continue
                parts = [self._kernel(step["prologue"])] if step["prologue"] else []
                parts.append(_bind_gemm(step, self.views))
                parts += [self._kernel(step["epilogue"])] if step["epilogue"] else []
                self.calls.append(parts[0] if len(parts) == 1 else sequence(parts))
                self.launches += len(parts)
            else:
                self.calls.append(self._kernel(step))
                self.launches += 1

    def _bound(self, step: dict) -> tuple[str, Callable, int, tuple]:
        """(module name, compiled kernel, n, arguments) of a kernel step."""
        fn, path = load_kernel(self.plan.kernels[step["kernel"]]["cpu"], "cpu")
        self.kernel_paths[step["kernel"]] = path
        # "w" (a 16-byte view on cuda) is the plain tensor here
        args = tuple(
            self.views[v] if kind in "tw" else self._no_errors if kind == "e" else np.int64(v)
            for kind, v in step["args"]
        )
        return module_name(path, "cpu"), fn, step["n"], args

    def _kernel(self, step: dict) -> Callable[[], None]:
        _, fn, n, args = self._bound(step)
        return _kernel_call(fn, np.int64(n), args)

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
                raise IndexRangeError(self.plan.steps[i].get("label", "kernel"), str(e)) from None
        return {
            name: self.views[name].reshape(self.plan.slots[name].shape).copy()
            for name in self.plan.outputs
        }


def _step_tensors(plan: ExecutionPlan) -> set[str]:
    """Every tensor a step of the plan reads or writes (a constant output may be in none)."""
    names: set[str] = set()
    for step in plan.steps:
        for part in (step, step.get("prologue"), step.get("epilogue")):
            if part and part.get("kind", "kernel") == "kernel" and "args" in part:
                names.update(v for kind, v in part["args"] if kind in ("t", "w"))
        if step["kind"] == "gemm":
            names.update(step[k] for k in ("a", "b", "c", "d") if step.get(k))
    return names


def _kernel_call(fn, n, args) -> Callable[[], None]:
    return lambda: fn(n, *args)


def sequence(parts: list[Callable[[], None]]) -> Callable[[], None]:
    """One callable running ``parts`` in order (a GEMM step's prologue, GEMM, epilogue)."""

    def run() -> None:
        for part in parts:
            part()

    return run
