"""The cuda runtime: one device arena, cuBLASLt GEMMs planned at load, the whole inference
captured once as a CUDA graph and replayed by ``predict``.

Under NUMBA_ENABLE_CUDASIM=1 (CI) the same code runs the kernels in Numba's simulator, with the
GEMM steps' fallback kernels in place of cuBLASLt and no graph.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable

import numpy as np
from numba import cuda

from ...errors import IndexRangeError
from ..kernels import load_kernel, sequence
from ..plan import DeviceFeed, ExecutionPlan
from ..pool import ContextPool
from ..steps import GemmStep, KernelStep, Step, kernel_steps
from .gemm import WORKSPACE_BYTES, choose_gemm, gemm_backend, pointer

SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
THREADS = 256
MAX_BLOCKS = 132 * 16  # grid-stride loops cover the rest; enough blocks to fill an H200
_UPLOADS: dict[int, object] = {}  # id(host weights) -> their device copy
_UPLOAD_LOCK = threading.Lock()
_SIMULATOR_LOCK = threading.Lock()


def _host_array(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Pinned host memory for copies; an empty tensor gets a plain array (pinning zero bytes
    gives a null buffer, which Numba refuses: "null buffer pointer")."""
    if int(np.prod(shape, dtype=np.int64)) == 0:
        return np.empty(shape, dtype)
    return cuda.pinned_array(shape, dtype)


def _arg(views: dict, kind: str, value):
    """A kernel argument: a tensor ("t"), the same tensor as 16-byte elements ("w": a kernel
    moving 4 float32 per load), or an int ("i")."""
    if kind == "t":
        return views[value]
    if kind == "w":
        return views[value].view(np.complex128)
    return int(value)


def _capability() -> str:
    if SIMULATED:
        return "sim"
    major, minor = cuda.get_current_device().compute_capability
    return f"sm_{major}{minor}"


class CudaRuntime:
    """Binds a plan to device memory. ``graph=False`` launches step by step (for debugging).

    ``max_concurrency`` predicts run at once, each in its own context (arena, stream, staging,
    error words, captured graph), made at first need; further calls wait. Every context reads
    one device copy of the weights. Device outputs (for device inputs) live in their context's
    arena: valid until a later predict reuses that context. Other attributes (``views``,
    ``graph``, ``stream``, ``calls``, ``launches``...) are the first context's.
    """

    def __init__(
        self,
        plan: ExecutionPlan,
        *,
        graph: bool = True,
        precision: str = "fp32",
        library_epilogues: bool = True,
        max_concurrency: int = 4,
        progress: Callable[[str, int, int], None] | None = None,
        state=None,
    ):
        """``state``: the device buffer of the plan's state slots (a model's plans share one;
        default a new zeroed one), captured at its fixed address; such a plan runs one call
        at a time."""
        if precision not in ("fp32", "tf32", "fp16"):
            raise ValueError(f"precision={precision!r}: use 'fp32', 'tf32' or 'fp16'")
        self.plan = plan
        weights = upload_weights(plan.weights)
        if state is None:
            state = cuda.to_device(np.zeros(max(plan.state_bytes, 1), np.uint8))
        self.state, max_concurrency = state, 1 if plan.state else max_concurrency
        opts = {"graph": graph, "precision": precision, "library_epilogues": library_epilogues}
        opts["state"] = state
        self.first = CudaContext(plan, weights, progress=progress, **opts)
        self.pool = ContextPool(
            lambda: CudaContext(plan, weights, **opts), max_concurrency, self.first
        )

    def run(self, feeds: dict[str, np.ndarray], outputs=None) -> dict[str, np.ndarray]:
        """``outputs``: the host outputs to copy back (default every one); state views always."""
        with self.pool.context() as ctx:
            if SIMULATED:  # the simulator swaps module globals per launch: one at a time
                with _SIMULATOR_LOCK:
                    return ctx.run(feeds, outputs)
            return ctx.run(feeds, outputs)

    def __getattr__(self, name: str):
        # stats, explain and the profiling scripts read one context's binding: the first's
        first = self.__dict__.get("first")
        if first is None:
            raise AttributeError(name)
        return getattr(first, name)


def upload_weights(host: np.ndarray):
    """The device copy of a plan's weights, uploaded once per host array: plans of one model
    share their host weights, so they share this copy too (freed with the host array)."""
    if not host.size:  # a plan without weights: a 1-byte buffer, so views have a base
        return cuda.device_array(1, np.uint8)
    with _UPLOAD_LOCK:
        dev = _UPLOADS.get(id(host))
        if dev is None:
            dev = _UPLOADS[id(host)] = cuda.to_device(host)
            weakref.finalize(host, _UPLOADS.pop, id(host), None)
        return dev


class CudaContext:
    """One inference's device state: arena, stream, staging, error words, the captured graph."""

    def __init__(
        self,
        plan: ExecutionPlan,
        weights,
        *,
        graph: bool = True,
        precision: str = "fp32",
        library_epilogues: bool = True,
        progress: Callable[[str, int, int], None] | None = None,
        state=None,
    ):
        self.plan = plan
        self.library_epilogues = library_epilogues
        self.launches = 0
        self.gemm_folded = 0
        self.precision = precision
        self.use_graph = graph and not SIMULATED
        self.stream = cuda.stream()
        self.arena = cuda.device_array(max(plan.arena_bytes, 1), np.uint8)
        # the graph is captured at bind time by running it once, before any input exists: zeroed
        # memory keeps data-dependent indexing (Gather, OneHot...) in bounds during that run
        if SIMULATED:
            self.arena.copy_to_device(np.zeros(self.arena.size, np.uint8), stream=self.stream)
        else:
            from numba.cuda.cudadrv.driver import device_memset

            device_memset(self.arena, 0, self.arena.size, stream=self.stream)
        self.weights = weights
        self.views = {}
        # every step here runs its im2col prologue: the columns the plan left out of the arena
        # (scratch slots, which cpu's own sgemm does without) share one buffer, made now
        scratch = [s.offset + s.nbytes for s in plan.slots.values() if s.region == "scratch"]
        scratch_buf = cuda.device_array(max(scratch), np.uint8) if scratch else None
        self.scratch_bytes = max(scratch, default=0)
        regions = {"arena": self.arena, "weights": self.weights, "scratch": scratch_buf}
        regions["state"] = state
        for name, s in plan.slots.items():
            buf = regions[s.region]
            self.views[name] = buf[s.offset : s.offset + max(s.nbytes, 0)].view(np.dtype(s.dtype))
        self.capability = _capability()
        self.kernel_paths: dict[str, str] = {}
        self.gemm_impls: dict[int, str] = {}  # step index -> the GEMM implementation bound
        self.tune_seconds, self.tuned = 0.0, 0  # cuBLASLt candidates timed at bind (not cached)
        self.gemm_backend = gemm_backend(SIMULATED)
        self.workspace = (
            None if self.gemm_backend == "numba" else cuda.device_array(WORKSPACE_BYTES, np.uint8)
        )
        # one int32 error word per index-checking kernel (KernelBuilder.guard_index)
        words = max(_error_words(plan), 1)
        self.errors = cuda.to_device(np.zeros(words, np.int32), stream=self.stream)
        self._errors_host = _host_array((words,), np.dtype(np.int32))
        self._error_labels: list[str] = []
        self.calls = []
        for i, step in enumerate(plan.steps):
            self.calls.append(self._bind(i, step))
            if progress is not None:
                progress("bind", i + 1, len(plan.steps))
        self.host_out = {  # a state output is returned as its device view, never copied
            n: _host_array(plan.slots[n].shape, np.dtype(plan.slots[n].dtype))
            for n in plan.outputs
            if n not in plan.state
        }
        # the runs below write the state, which another plan of the model may be using
        kept = cuda.device_array(state.size, np.uint8) if plan.state else None
        if kept is not None:
            kept.copy_to_device(state, stream=self.stream)
        self.graph = None
        self._staging = None
        self._event = None  # orders our stream after a device input's producer stream
        self._device_views = None
        self.stream.synchronize()
        self.jit_seconds = 0.0  # without a graph, kernels compile in the first predict
        self.capture_seconds = 0.0
        if self.use_graph:  # the capture runs every kernel once anyway: compile them here
            t0, total = time.perf_counter(), len(self.calls)
            for k, call in enumerate([None, *self.calls]):
                if call is not None:
                    call()
                if progress is not None:
                    progress("jit", k, total)
            self.stream.synchronize()
            self.jit_seconds = time.perf_counter() - t0
        if self.use_graph:
            # captured at bind time: the first predict is then the same replay as every other
            # (replaying straight after a capture made inside predict gave stale outputs once)
            from .graph import CudaGraph

            t0 = time.perf_counter()
            self.graph = CudaGraph(self.stream)
            self.graph.capture(self._launch_all)  # runs once first, so kernels compile outside
            self.stream.synchronize()
            self.capture_seconds = time.perf_counter() - t0
        # those runs read a zeroed arena, where a computed index may well be out of range:
        # what they flagged is no error of any predict
        self.errors.copy_to_device(np.zeros(self.errors.size, np.int32), stream=self.stream)
        if kept is not None:
            state.copy_to_device(kept, stream=self.stream)
        self.stream.synchronize()

    # -- binding -------------------------------------------------------------------------------
    def bind_kernel(self, step: KernelStep) -> Callable[[], None]:
        """One launch of a kernel step, its arguments and grid bound now."""
        self.launches += 1
        source = self.plan.kernel_source(step.kernel, "cuda")
        fn, path = load_kernel(source, "cuda", self.capability)
        self.kernel_paths[step.kernel] = path
        bound = tuple(
            self._error_word(step.label or step.kernel)
            if kind == "e"
            else _arg(self.views, kind, v)
            for kind, v in step.args
        )
        n = step.n
        if step.launch:  # a tiled kernel written for exactly this grid and block
            launch = fn[step.launch[0], step.launch[1], self.stream]
        elif step.inner:  # rows x inner: blocks along x cover a row, along y the rows
            gx = max(1, min(-(-step.inner // THREADS), MAX_BLOCKS))
            gy = max(1, min(n // step.inner, 65535, MAX_BLOCKS * 8 // gx))
            launch = fn[(gx, gy), THREADS, self.stream]
        else:
            launch = fn[max(1, min(-(-n // THREADS), MAX_BLOCKS)), THREADS, self.stream]
        return lambda: launch(n, *bound)

    def _bind(self, i: int, step: Step) -> Callable[[], None]:
        if isinstance(step, KernelStep):
            return self.bind_kernel(step)
        parts = [self.bind_kernel(step.prologue)] if step.prologue else []
        gemm, epilogue_done = choose_gemm(self, step)
        self.gemm_impls[i] = _gemm_name(gemm, epilogue_done)
        tuned = getattr(getattr(gemm, "lt", None), "tune_seconds", 0.0)
        self.tune_seconds, self.tuned = self.tune_seconds + tuned, self.tuned + (tuned > 0)
        parts.append(gemm)
        self.launches += self.gemm_backend != "numba"  # a fallback kernel counted itself
        self.gemm_folded += epilogue_done
        if step.epilogue and not epilogue_done:
            parts.append(self.bind_kernel(step.epilogue))
        return sequence(parts)

    @property
    def stream_handle(self) -> int:
        return _stream_handle(self.stream)

    def _error_word(self, label: str):
        self._error_labels.append(label)
        k = len(self._error_labels) - 1
        return self.errors[k : k + 1]

    def _raise_device_errors(self) -> None:
        """After a synchronised run: IndexRangeError naming the first step whose kernel found an
        index out of range (its output is not used); the words are cleared for the next run."""
        hits = np.flatnonzero(self._errors_host[: len(self._error_labels)])
        if not hits.size:
            return
        self.errors.copy_to_device(np.zeros(self.errors.size, np.int32), stream=self.stream)
        self.stream.synchronize()
        self._errors_host[:] = 0
        raise IndexRangeError(
            self._error_labels[hits[0]], "an index is out of range (found on the device)"
        )

    # -- running -------------------------------------------------------------------------------
    def _launch_all(self) -> None:
        for call in self.calls:
            call()

    def run(self, feeds: dict[str, np.ndarray], outputs=None) -> dict[str, np.ndarray]:
        if self.graph is not None:
            return self._run_graph(feeds, outputs)
        for name, arr in feeds.items():
            if self.plan.slots[name].nbytes:  # an empty tensor has no buffer to copy
                if isinstance(arr, DeviceFeed):
                    self._wait_for(arr.stream)
                    dev = arr.array if hasattr(arr.array, "__cuda_ndarray__") else None
                    src = (dev if dev is not None else cuda.as_cuda_array(arr.array)).reshape(-1)
                else:
                    src = np.ascontiguousarray(arr).reshape(-1)
                self.views[name].copy_to_device(src, stream=self.stream)
        self._launch_all()
        if self._error_labels:
            self.errors.copy_to_host(self._errors_host, stream=self.stream)
        if any(isinstance(a, DeviceFeed) for a in feeds.values()):
            self.stream.synchronize()
            self._raise_device_errors()
            return dict(self._device_outputs())
        host_out = {n: h for n, h in self.host_out.items() if outputs is None or n in outputs}
        for name, host in host_out.items():
            if host.size:
                self.views[name].copy_to_host(host.reshape(-1), stream=self.stream)
        self.stream.synchronize()
        self._raise_device_errors()
        return {**{n: h.copy() for n, h in host_out.items()}, **self._state_views()}

    def _run_graph(self, feeds: dict[str, np.ndarray], outputs=None) -> dict[str, np.ndarray]:
        """The steady state: pinned staging, raw async copies, one graph launch, one sync."""
        from cuda.bindings import driver as drv

        if self._staging is None:
            self._staging = {
                n: (
                    _host_array(self.plan.slots[n].shape, np.dtype(self.plan.slots[n].dtype)),
                    pointer(self.views[n]),
                    self.plan.slots[n].nbytes,
                )
                for n in self.plan.inputs
            }
            self._outs = [
                (n, host, pointer(self.views[n]), self.plan.slots[n].nbytes)
                for n, host in self.host_out.items()
            ]
            self._handle = _stream_handle(self.stream)
        h = self._handle
        device_in = False
        for name, arr in feeds.items():
            host, dptr, nbytes = self._staging[name]
            if not nbytes:  # an empty tensor has no buffer to copy (its pointer is null)
                continue
            if isinstance(arr, DeviceFeed):
                self._wait_for(arr.stream)
                drv.cuMemcpyDtoDAsync(dptr, arr.ptr, nbytes, h)
                device_in = True
            else:
                np.copyto(host, arr)
                drv.cuMemcpyHtoDAsync(dptr, host.ctypes.data, nbytes, h)
        self.graph.replay()
        if self._error_labels:
            drv.cuMemcpyDtoHAsync(
                self._errors_host.ctypes.data, pointer(self.errors), 4 * len(self._error_labels), h
            )
        outs = [o for o in self._outs if outputs is None or o[0] in outputs]
        if not device_in:
            for _, host, dptr, nbytes in outs:
                if nbytes:
                    drv.cuMemcpyDtoHAsync(host.ctypes.data, dptr, nbytes, h)
        err = drv.cuStreamSynchronize(h)[0]
        if err != drv.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"CUDA error after predict: {err}")
        self._raise_device_errors()
        if device_in:
            return dict(self._device_outputs())
        return {**{name: host.copy() for name, host, _, _ in outs}, **self._state_views()}

    def enqueue(self, pointers: dict[str, int]) -> None:
        """One graph replay whose inputs are all copied from device pointers, with nothing
        waited for: the caller reads outputs (``pointer(views[name])``) on ``stream`` and ends
        with ``finish``. A decoder's run-ahead loop: its next step is queued before the token of
        this one reaches the host, so the device never waits for the host."""
        from cuda.bindings import driver as drv

        if self.graph is None:
            raise RuntimeError("enqueue needs the captured graph (not in the simulator)")
        h = self._handle = _stream_handle(self.stream)
        for name, ptr in pointers.items():
            nbytes = self.plan.slots[name].nbytes
            drv.cuMemcpyDtoDAsync(pointer(self.views[name]), ptr, nbytes, h)
        self.graph.replay()

    def finish(self) -> None:
        """After ``enqueue``s: wait for them and raise what the device found."""
        if self._error_labels:
            self.errors.copy_to_host(self._errors_host, stream=self.stream)
        self.stream.synchronize()
        self._raise_device_errors()

    def _state_views(self) -> dict:
        return {n: v for n, v in self._device_outputs() if n in self.plan.state}

    def _device_outputs(self):
        """The outputs as device arrays in the arena: no copy, valid until this context runs
        again (the convention of a CUDA-graph runtime: PyTorch's graphed outputs are static)."""
        if SIMULATED:  # the simulator's reshape hands back a plain numpy array: wrap it again
            for name in self.plan.outputs:
                yield name, cuda.to_device(self.views[name].reshape(self.plan.slots[name].shape))
            return
        if self._device_views is None:  # made once: a DeviceNDArray costs ~10 us to create
            self._device_views = {
                n: self.views[n].reshape(self.plan.slots[n].shape) for n in self.plan.outputs
            }
        yield from self._device_views.items()

    def _wait_for(self, producer) -> None:
        """Order our stream after the producer stream a device input names (CUDA array
        interface v3): None means already ready, 1 is the legacy default stream, with which
        our blocking stream synchronises anyway; any other handle gets an event."""
        if producer is None or producer in (0, 1):
            return
        from cuda.bindings import driver as drv

        from .graph import check

        if self._event is None:
            flags = drv.CUevent_flags.CU_EVENT_DISABLE_TIMING
            self._event = check(drv.cuEventCreate(flags))[0]
        check(drv.cuEventRecord(self._event, producer))
        check(drv.cuStreamWaitEvent(_stream_handle(self.stream), self._event, 0))


def _gemm_name(call, folded: bool) -> str:
    lt = getattr(call, "lt", None)
    if lt is None:
        return "generated GEMM kernel (no cuBLASLt)"
    algo = f"algo {lt._algo.tobytes()[:8].hex()}"
    if lt.algo_time_us is not None:
        algo += f", {lt.algo_time_us:.1f} us" + (" (cached)" if lt.from_cache else " (tuned)")
    return f"cuBLASLt {lt._key['precision']} ({algo}{', epilogue folded' if folded else ''})"


def _error_words(plan: ExecutionPlan) -> int:
    """How many kernels of the plan take an error word (("e", 0) arguments)."""
    fallbacks = [s.fallback for s in plan.steps if isinstance(s, GemmStep) and s.fallback]
    kernels = kernel_steps(plan.steps) + fallbacks
    return sum(kind == "e" for k in kernels for kind, _ in k.args)


def _stream_handle(stream) -> int:
    from .graph import raw_stream

    return raw_stream(stream)
