"""The cuda runtime: one device arena, cuBLASLt GEMMs planned at load, the whole inference
captured once as a CUDA graph and replayed by ``predict``.

Under NUMBA_ENABLE_CUDASIM=1 (CI) the same code runs the kernels in Numba's simulator, with the
plain GEMM kernel in place of cuBLASLt and no graph.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
from numba import cuda

from ..errors import IndexRangeError
from ..lower_numba.cache import load_kernel
from ..lower_numba.gemm_kernel import gemm_kernel
from .cpu import sequence
from .plan import DeviceFeed, ExecutionPlan

SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
THREADS = 256
MAX_BLOCKS = 132 * 16  # grid-stride loops cover the rest; enough blocks to fill an H200
WORKSPACE_BYTES = 32 << 20


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


def _pointer(arr) -> int:
    return int(arr.__cuda_array_interface__["data"][0])


def _capability() -> str:
    if SIMULATED:
        return "sim"
    major, minor = cuda.get_current_device().compute_capability
    return f"sm_{major}{minor}"


class CudaRuntime:
    """Binds a plan to device memory. ``graph=False`` launches step by step (for debugging)."""

    def __init__(
        self,
        plan: ExecutionPlan,
        graph: bool = True,
        precision: str = "fp32",
        library_epilogues: bool = True,
    ):
        if precision not in ("fp32", "tf32", "fp16"):
            raise ValueError(f"precision={precision!r}: use 'fp32', 'tf32' or 'fp16'")
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
        host_w = plan.weights if plan.weights.size else np.zeros(1, np.uint8)
        self.weights = cuda.to_device(host_w, stream=self.stream)
        self.views = {}
        for name, s in plan.slots.items():
            buf = self.arena if s.region == "arena" else self.weights
            self.views[name] = buf[s.offset : s.offset + max(s.nbytes, 0)].view(np.dtype(s.dtype))
        self.capability = _capability()
        self.kernel_paths: dict[str, str] = {}
        self.gemm_backend = "numba" if SIMULATED else _gemm_backend()
        self.workspace = (
            None if self.gemm_backend == "numba" else cuda.device_array(WORKSPACE_BYTES, np.uint8)
        )
        # one int32 error word per index-checking kernel (KernelBuilder.guard_index)
        words = max(_error_words(plan), 1)
        self.errors = cuda.to_device(np.zeros(words, np.int32), stream=self.stream)
        self._errors_host = _host_array((words,), np.dtype(np.int32))
        self._error_labels: list[str] = []
        self.calls = [self._bind(step) for step in plan.steps]
        self.host_out = {
            n: _host_array(plan.slots[n].shape, np.dtype(plan.slots[n].dtype)) for n in plan.outputs
        }
        self.graph = None
        self._staging = None
        self._event = None  # orders our stream after a device input's producer stream
        self._device_views = None
        self.stream.synchronize()
        if self.use_graph:
            # captured at bind time: the first predict is then the same replay as every other
            # (replaying straight after a capture made inside predict gave stale outputs once)
            from .cuda_graph import CudaGraph

            self.graph = CudaGraph(self.stream)
            self.graph.capture(self._launch_all)  # runs once first, so kernels compile outside
            self.stream.synchronize()

    # -- binding -------------------------------------------------------------------------------
    def _kernel(
        self, key: str, source: str, n: int, args: list, inner: int = 0, launch=None, label=""
    ) -> Callable[[], None]:
        fn, path = load_kernel(source, "cuda", self.capability)
        self.kernel_paths[key] = path
        bound = tuple(
            self._error_word(label or key) if kind == "e" else _arg(self.views, kind, v)
            for kind, v in args
        )
        if launch:  # a tiled kernel written for exactly this grid and block
            launch = fn[tuple(launch[0]), int(launch[1]), self.stream]
        elif inner:  # rows x inner: blocks along x cover a row, along y the rows
            gx = max(1, min(-(-inner // THREADS), MAX_BLOCKS))
            gy = max(1, min(n // inner, 65535, MAX_BLOCKS * 8 // gx))
            launch = fn[(gx, gy), THREADS, self.stream]
        else:
            launch = fn[max(1, min(-(-n // THREADS), MAX_BLOCKS)), THREADS, self.stream]
        return lambda: launch(n, *bound)

    def _bind(self, step: dict) -> Callable[[], None]:
        if step["kind"] == "kernel":
            self.launches += 1
            src = self.plan.kernels[step["kernel"]]["cuda"]
            return self._kernel(
                step["kernel"],
                src,
                step["n"],
                step["args"],
                step.get("inner", 0),
                step.get("launch"),
                step.get("label", ""),
            )
        parts = []
        if step["prologue"]:
            parts.append(self._bind(step["prologue"]))
        epilogue_done = False
        if self.gemm_backend == "numba":
            call = gemm_kernel(step, np.dtype(self.plan.slots[step["d"]].dtype))
            parts.append(self._kernel(call.key, call.source_cuda, call.n, call.args, call.inner))
            self.launches += 1
        else:
            gemm, epilogue_done = self._lt_gemm(step)
            parts.append(gemm)
            self.launches += 1
        if step["epilogue"] and not epilogue_done:
            parts.append(self._bind(step["epilogue"]))
        return parts[0] if len(parts) == 1 else sequence(parts)

    def _lt_gemm(self, g: dict) -> tuple[Callable[[], None], bool]:
        """A cuBLASLt call; with the epilogue folded in when cuBLASLt can express it."""
        from .cublaslt import LtGemm

        common = dict(
            trans_a=g["trans_a"],
            trans_b=g["trans_b"],
            lda=g["lda"],
            ldb=g["ldb"],
            ldd=g["ldd"],
            batch=g["batch"],
            stride_a=g["stride_a"],
            stride_b=g["stride_b"],
            stride_d=g["stride_d"],
            alpha=g["alpha"],
            precision=self._gemm_precision(g),
            workspace_bytes=WORKSPACE_BYTES,
        )
        pat = g.get("pattern") if self.library_epilogues else None
        lt, folded = None, False
        if pat and not g.get("c"):
            try:
                lt = LtGemm(
                    g["m"],
                    g["n"],
                    g["k"],
                    ldc=g["ldd"],
                    stride_c=g["stride_d"],
                    beta=1.0 if pat["residual"] else 0.0,
                    act=pat["act"],
                    bias_axis=pat["bias_axis"],
                    **common,
                )
                c = pat["residual"] or g["d"]
                bias = pat["bias"]
                folded = True
            except NotImplementedError:
                lt = None
        if lt is None:
            lt = LtGemm(
                g["m"],
                g["n"],
                g["k"],
                ldc=g["ldc"] or g["ldd"],
                stride_c=g["stride_c"],
                beta=g["beta"] if g.get("c") else 0.0,
                **common,
            )
            c, bias = g.get("c") or g["d"], None
        a, b = (_pointer(self.views[g[k]]) for k in ("a", "b"))
        cc, d = _pointer(self.views[c]), _pointer(self.views[g["d"]])
        bp = _pointer(self.views[bias]) if bias else 0
        ws, handle = _pointer(self.workspace), _stream_handle(self.stream)
        self.gemm_folded += folded
        return (lambda: lt.run(a, b, cc, d, bp, ws, handle)), folded

    def _gemm_precision(self, g: dict) -> str:
        """float16 operands (a plan compiled with precision="fp16") run cuBLASLt's fp16 tensor
        cores, accumulating in float32; float32 GEMMs left in such a plan run TF32."""
        if np.dtype(self.plan.slots[g["d"]].dtype) == np.float16:
            return "fp16"
        return "tf32" if self.precision == "fp16" else self.precision

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

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.graph is not None:
            return self._run_graph(feeds)
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
        for name in self.plan.outputs:
            if self.host_out[name].size:
                self.views[name].copy_to_host(self.host_out[name].reshape(-1), stream=self.stream)
        self.stream.synchronize()
        self._raise_device_errors()
        return {name: self.host_out[name].copy() for name in self.plan.outputs}

    def _run_graph(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The steady state: pinned staging, raw async copies, one graph launch, one sync."""
        from cuda.bindings import driver as drv

        if self._staging is None:
            self._staging = {
                n: (
                    _host_array(self.plan.slots[n].shape, np.dtype(self.plan.slots[n].dtype)),
                    _pointer(self.views[n]),
                    self.plan.slots[n].nbytes,
                )
                for n in self.plan.inputs
            }
            self._outs = [
                (n, self.host_out[n], _pointer(self.views[n]), self.plan.slots[n].nbytes)
                for n in self.plan.outputs
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
                self._errors_host.ctypes.data, _pointer(self.errors), 4 * len(self._error_labels), h
            )
        if not device_in:
            for _, host, dptr, nbytes in self._outs:
                if nbytes:
                    drv.cuMemcpyDtoHAsync(host.ctypes.data, dptr, nbytes, h)
        err = drv.cuStreamSynchronize(h)[0]
        if err != drv.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"CUDA error after predict: {err}")
        self._raise_device_errors()
        if device_in:
            return dict(self._device_outputs())
        return {name: host.copy() for name, host, _, _ in self._outs}

    def _device_outputs(self):
        """The outputs as device arrays in the arena: no copy, valid until the next predict
        (the convention of a CUDA-graph runtime: PyTorch's graphed outputs are static too)."""
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

        from .cuda_graph import check

        if self._event is None:
            flags = drv.CUevent_flags.CU_EVENT_DISABLE_TIMING
            self._event = check(drv.cuEventCreate(flags))[0]
        check(drv.cuEventRecord(self._event, producer))
        check(drv.cuStreamWaitEvent(_stream_handle(self.stream), self._event, 0))


def _error_words(plan: ExecutionPlan) -> int:
    """How many kernels of the plan take an error word (("e", 0) arguments)."""

    def words(step: dict | None) -> int:
        return sum(kind == "e" for kind, _ in step["args"]) if step else 0

    return sum(
        words(st) if st["kind"] == "kernel" else words(st["prologue"]) + words(st["epilogue"])
        for st in plan.steps
    )


def _gemm_backend() -> str:
    try:
        from . import cublaslt  # noqa: F401

        return "cublaslt"
    except ImportError:
        return "numba"


def _stream_handle(stream) -> int:
    from .cuda_graph import raw_stream

    return raw_stream(stream)
