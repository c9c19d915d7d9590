"""Row-major GEMMs through cuBLASLt on raw device pointers, planned once and run many times.

Descriptors, layouts and the algorithm are fixed at construction, so ``LtGemm.run`` is one
``cublasLtMatmul`` call: no allocation, no synchronisation, safe inside CUDA stream capture.
The Pythonic ``nvmath.linalg`` API is avoided on purpose: it costs 20-45 us of host time a call.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import weakref
from pathlib import Path

import numpy as np
from nvmath import CudaDataType
from nvmath.bindings import cublas
from nvmath.bindings import cublasLt as lt

from .graph import CudaGraph, raw_stream

_NOT_SUPPORTED = 15  # CUBLAS_STATUS_NOT_SUPPORTED
_OP = {False: cublas.Operation.N, True: cublas.Operation.T}

# precision -> (compute type, storage dtype, cuda data type)
_PRECISIONS = {
    "fp32": (cublas.ComputeType.COMPUTE_32F, np.float32, CudaDataType.CUDA_R_32F),
    "tf32": (cublas.ComputeType.COMPUTE_32F_FAST_TF32, np.float32, CudaDataType.CUDA_R_32F),
    "fp16": (cublas.ComputeType.COMPUTE_32F, np.float16, CudaDataType.CUDA_R_16F),
}
_E = lt.Epilogue
_EPILOGUES = {
    (None, False): _E.DEFAULT,
    ("relu", False): _E.RELU,
    ("gelu", False): _E.GELU,
    (None, True): _E.BIAS,
    ("relu", True): _E.RELU_BIAS,
    ("gelu", True): _E.GELU_BIAS,
}

_handle: int | None = None


def lt_handle() -> int:
    """The process-wide cuBLASLt handle, created on first use in Numba's (primary) context."""
    global _handle
    if _handle is None:
        from numba import cuda

        cuda.current_context()
        _handle = lt.create()
    return _handle


def _set_attr(setter, getter, obj: int, attr, value) -> None:
    buf = np.array(value, dtype=getter(attr))
    setter(obj, attr, buf.ctypes.data, buf.nbytes)


def _layout(dtype, batch, rows, cols, ld, stride) -> int:
    layout = lt.matrix_layout_create(dtype, rows, cols, ld)
    attr = lt.MatrixLayoutAttribute

    def put(a, v) -> None:
        _set_attr(
            lt.matrix_layout_set_attribute, lt.get_matrix_layout_attribute_dtype, layout, a, v
        )

    if batch > 1:
        put(attr.BATCH_COUNT, batch)
        put(attr.STRIDED_BATCH_OFFSET, stride)
    return layout


def _destroy(desc: int, pref: int, layouts: list[int]) -> None:
    lt.matmul_desc_destroy(desc)
    lt.matmul_preference_destroy(pref)
    for layout in layouts:
        lt.matrix_layout_destroy(layout)


def _default_cache_dir() -> Path:
    root = os.environ.get("PYFORGE_CACHE")
    return Path(root) / "cublaslt" if root else Path.home() / ".cache" / "pyforge" / "cublaslt"


class LtGemm:
    """Row-major, strided-batched: ``D[b] = act(alpha * op(A[b]) @ op(B[b]) + beta * C[b] + bias)``.

    A is (m x k) after op, B is (k x n) after op, C and D are (m x n); all row-major with
    leading dimensions in elements. A stride of 0 broadcasts that operand over the batch.
    ``bias_axis='n'`` is one bias value per output column (length n), ``'m'`` one per row
    (length m); cuBLASLt fuses only the first, so ``'m'`` raises NotImplementedError and the
    caller falls back to a separate kernel. The residual is added before the activation,
    ``act(alpha*AB + beta*C + bias)`` (measured on an H200, cuBLASLt 13.1), so a ResNet
    "conv + bias + Add + Relu" is one call. ``act='gelu'`` is cuBLASLt's tanh approximation.
    Pointers passed to ``run`` must be aligned to ``align_bytes``.

    Example::

        # NHWC conv as a GEMM: out[HW, Cout] = relu(col[HW, K] @ W[Cout, K]^T + bias + res)
        g = LtGemm(3136, 64, 576, trans_b=True, bias_axis="n", act="relu", beta=1.0)
        g.run(col_ptr, w_ptr, res_ptr, out_ptr, bias_ptr, ws_ptr, raw_stream(stream))
    """

    def __init__(
        self,
        m: int,
        n: int,
        k: int,
        *,
        trans_a: bool = False,
        trans_b: bool = False,
        lda: int | None = None,
        ldb: int | None = None,
        ldc: int | None = None,
        ldd: int | None = None,
        batch: int = 1,
        stride_a: int = 0,
        stride_b: int = 0,
        stride_c: int = 0,
        stride_d: int = 0,
        alpha: float = 1.0,
        beta: float = 0.0,
        act: str | None = None,
        bias_axis: str | None = None,
        precision: str = "fp32",
        workspace_bytes: int = 32 << 20,
        autotune: bool = True,
        cache_dir: str | os.PathLike | None = None,
        align_bytes: int = 256,
        n_candidates: int = 8,
    ) -> None:
        if precision not in _PRECISIONS:
            raise ValueError(f"precision must be one of {sorted(_PRECISIONS)}, got {precision!r}")
        if bias_axis not in (None, "n", "m") or act not in (None, "relu", "gelu"):
            raise ValueError(f"unsupported act={act!r} / bias_axis={bias_axis!r}")
        compute, self.dtype, cuda_type = _PRECISIONS[precision]
        # Stored shapes (row-major): A is (m, k), or (k, m) when transposed; likewise B.
        a_rows, a_cols = (k, m) if trans_a else (m, k)
        b_rows, b_cols = (n, k) if trans_b else (k, n)
        lda, ldb = lda or a_cols, ldb or b_cols
        ldc, ldd = ldc or n, ldd or n
        for name, ld, cols in (("lda", lda, a_cols), ("ldb", ldb, b_cols), ("ldc", ldc, n)):
            if ld < cols:
                raise ValueError(f"{name}={ld} is less than the row length {cols}")
        if ldd < n:
            raise ValueError(f"ldd={ldd} is less than the row length {n}")
        if bias_axis == "m":
            # cuBLASLt's bias runs along its rows, which are our n in the column-major form
            # below; with row-order layouts (rows = our m) cuBLASLt 13.1 has no algorithm.
            raise NotImplementedError("cuBLASLt cannot fuse a per-row (bias_axis='m') bias")
        self.m, self.n, self.k, self.batch = m, n, k, batch
        self._key = {
            "m": m, "n": n, "k": k, "trans_a": trans_a, "trans_b": trans_b,
            "lda": lda, "ldb": ldb, "ldc": ldc, "ldd": ldd, "batch": batch,
            "strides": [stride_a, stride_b, stride_c, stride_d], "beta_nonzero": beta != 0.0,
            "act": act, "bias_axis": bias_axis, "precision": precision,
            "workspace_bytes": workspace_bytes, "align_bytes": align_bytes,
        }  # fmt: skip
        self.workspace_bytes, self.align_bytes = workspace_bytes, align_bytes
        self._has_bias, self._has_c = bias_axis is not None, beta != 0.0
        self._desc = lt.matmul_desc_create(compute, CudaDataType.CUDA_R_32F)
        self._epilogue = _EPILOGUES[(act, self._has_bias)]
        self._set_desc(lt.MatmulDescAttribute.EPILOGUE, self._epilogue)
        self._pref = lt.matmul_preference_create()
        pattr = lt.MatmulPreferenceAttribute
        self._set_pref(pattr.MAX_WORKSPACE_BYTES, workspace_bytes)
        for operand in "ABCD":
            self._set_pref(getattr(pattr, f"MIN_ALIGNMENT_{operand}_BYTES"), align_bytes)
        self._owned: list[int] = []  # layouts, destroyed with the descriptors
        self._finalizer = weakref.finalize(self, _destroy, self._desc, self._pref, self._owned)

        # Column-major cuBLASLt sees a row-major (r x c) matrix as its (c x r) transpose, so
        # it computes D^T = op(B)^T op(A)^T: A and B swap places, m and n swap roles.
        self._la = _layout(cuda_type, batch, b_cols, b_rows, ldb, stride_b)
        self._lb = _layout(cuda_type, batch, a_cols, a_rows, lda, stride_a)
        self._ld = _layout(cuda_type, batch, n, m, ldd, stride_d)
        self._lc = _layout(cuda_type, batch, n, m, ldc, stride_c) if self._has_c else self._ld
        self._owned += [self._la, self._lb, self._ld] + ([self._lc] if self._has_c else [])
        self._set_desc(lt.MatmulDescAttribute.TRANSA, _OP[trans_b])
        self._set_desc(lt.MatmulDescAttribute.TRANSB, _OP[trans_a])
        candidates = self._heuristics(n_candidates if autotune else 1)

        self._alpha = np.array([alpha], np.float32)
        self._beta = np.array([beta], np.float32)
        self._bias_ptr = -1
        self._extents = {
            "a": (batch - 1) * stride_a + (a_rows - 1) * lda + a_cols,
            "b": (batch - 1) * stride_b + (b_rows - 1) * ldb + b_cols,
            "c": (batch - 1) * stride_c + (m - 1) * ldc + n,
            "d": (batch - 1) * stride_d + (m - 1) * ldd + n,
        }
        self.algo_time_us: float | None = None  # GPU time of the chosen algorithm when tuned
        self.candidates_us: list[float] = []  # each timed candidate, in heuristic order
        self.from_cache = False
        self.tune_seconds = 0.0  # host time spent timing candidates (0 when cached)
        self._bind(self._choose(candidates, autotune, cache_dir))

    def run(
        self,
        a_ptr: int,
        b_ptr: int,
        c_ptr: int,
        d_ptr: int,
        bias_ptr: int,
        workspace_ptr: int,
        stream: int,
    ) -> None:
        """Enqueue the GEMM on raw stream handle ``stream``; ``c_ptr`` may be 0 when beta == 0."""
        handle, desc, alpha, beta, algo = self._run_args
        if self._has_bias and bias_ptr != self._bias_ptr:
            self._set_desc(lt.MatmulDescAttribute.BIAS_POINTER, bias_ptr)
            self._bias_ptr = bias_ptr
        c_ptr = c_ptr if self._has_c else d_ptr
        if (a_ptr | b_ptr | c_ptr | d_ptr) & (self.align_bytes - 1):
            raise ValueError(f"LtGemm pointers must be {self.align_bytes}-byte aligned")
        lt.matmul(
            handle, desc, alpha, b_ptr, self._la, a_ptr, self._lb, beta, c_ptr, self._lc,
            d_ptr, self._ld, algo, workspace_ptr, self.workspace_bytes, stream,
        )  # fmt: skip

    def _bind(self, algo: np.ndarray) -> None:
        self._algo = algo  # keeps the buffer behind the pointer alive
        self._run_args = (
            lt_handle(), self._desc, self._alpha.ctypes.data, self._beta.ctypes.data,
            algo.ctypes.data,
        )  # fmt: skip

    def _set_desc(self, attr, value) -> None:
        _set_attr(
            lt.matmul_desc_set_attribute,
            lt.get_matmul_desc_attribute_dtype,
            self._desc,
            attr,
            value,
        )

    def _set_pref(self, attr, value) -> None:
        _set_attr(
            lt.matmul_preference_set_attribute,
            lt.get_matmul_preference_attribute_dtype,
            self._pref,
            attr,
            value,
        )

    def _heuristics(self, count: int) -> np.ndarray:
        results = np.zeros(count, dtype=lt.matmul_heuristic_result_dtype)
        found = np.zeros(1, np.int32)
        try:
            lt.matmul_algo_get_heuristic(
                lt_handle(), self._desc, self._la, self._lb, self._lc, self._ld, self._pref,
                count, results.ctypes.data, found.ctypes.data,
            )  # fmt: skip
        except lt.cuBLASLtError as e:
            if getattr(e, "status", None) != _NOT_SUPPORTED:
                raise
            found[0] = 0
        results = results[: found[0]]
        results = results[results["state"] == 0]
        if len(results) == 0:
            what = f"cuBLASLt has no algorithm for {self._key}"
            fused = self._epilogue != lt.Epilogue.DEFAULT
            raise NotImplementedError(what) if fused else RuntimeError(what)
        return results

    def _choose(self, results: np.ndarray, autotune: bool, cache_dir) -> np.ndarray:
        """The algorithm: from the cache, else the heuristic's best, timed when autotuning."""
        if not autotune:
            return _algo_bytes(results[0])
        from numba import cuda

        dev = cuda.get_current_device()
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        key = dict(self._key, gpu=name, cc=list(dev.compute_capability), lt=lt.get_version())
        text = json.dumps(key, sort_keys=True)
        path = Path(cache_dir) if cache_dir else _default_cache_dir()
        path = path / f"{hashlib.sha256(text.encode()).hexdigest()[:24]}.json"
        try:
            entry = json.loads(path.read_text())
            if entry["key"] == json.loads(text):
                algo = np.frombuffer(bytes.fromhex(entry["algo"]), np.uint64).copy()
                if self._algo_ok(algo):
                    self.algo_time_us, self.from_cache = entry["time_us"], True
                    return algo
        except (OSError, ValueError, KeyError):
            pass
        t0 = time.perf_counter()
        algo, self.algo_time_us = self._tune(results)
        self.tune_seconds = time.perf_counter() - t0
        entry = {
            "key": json.loads(text),
            "algo": algo.tobytes().hex(),
            "time_us": self.algo_time_us,
        }
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(entry, indent=1))
            os.replace(tmp, path)
        except OSError:
            pass  # an unwritable cache only costs a re-tune next time
        return algo

    def _algo_ok(self, algo: np.ndarray) -> bool:
        result = np.zeros(1, dtype=lt.matmul_heuristic_result_dtype)
        try:
            lt.matmul_algo_check(
                lt_handle(), self._desc, self._la, self._lb, self._lc, self._ld,
                algo.ctypes.data, result.ctypes.data,
            )  # fmt: skip
        except lt.cuBLASLtError:
            return False
        return int(result["workspace_size"][0]) <= self.workspace_bytes

    def _tune(self, results: np.ndarray) -> tuple[np.ndarray, float]:
        """Time each candidate on random scratch buffers; keep the fastest."""
        from numba import cuda

        scratch = {
            name: _random_device(size, self.dtype)
            for name, size in self._extents.items()
            if name != "c" or self._has_c
        }
        scratch["bias"] = _random_device(max(self.m, self.n), self.dtype)
        scratch["work"] = cuda.device_array(max(self.workspace_bytes, 1), np.uint8)
        ptr = {name: arr.__cuda_array_interface__["data"][0] for name, arr in scratch.items()}
        stream = cuda.stream()
        args = (*(ptr.get(x, 0) for x in ("a", "b", "c", "d", "bias", "work")), raw_stream(stream))
        start, stop = cuda.event(), cuda.event()
        best: tuple[float, np.ndarray] | None = None
        for result in results:
            algo = _algo_bytes(result)
            self._bind(algo)
            try:
                self.run(*args)
                start.record(stream)
                self.run(*args)
                stop.record(stream)
                stop.synchronize()
            except lt.cuBLASLtError:
                continue
            # Back-to-back runs of a small GEMM measure the host, not the GPU: time a graph.
            reps = max(2, min(20, int(200 / max(start.elapsed_time(stop) * 1e3, 1.0))))
            graph = CudaGraph(stream)
            try:
                graph.capture(lambda reps=reps: [self.run(*args) for _ in range(reps)])
            except (lt.cuBLASLtError, RuntimeError):
                continue
            elapsed = float("inf")
            for _ in range(3):
                start.record(stream)
                graph.replay()
                stop.record(stream)
                stop.synchronize()
                elapsed = min(elapsed, start.elapsed_time(stop) * 1e3 / reps)
            graph.close()
            self.candidates_us.append(elapsed)
            if best is None or elapsed < best[0]:
                best = (elapsed, algo)
        self._bias_ptr = -1
        if best is None:
            raise RuntimeError(f"no cuBLASLt algorithm ran for {self._key}")
        return best[1], best[0]


_BLOCK = 1 << 20  # elements of seeded random data that tuning operands repeat


def _random_device(size: int, dtype) -> object:
    """A device array of ``size`` uniform(-1, 1) values: one seeded block copied up, then
    doubled device to device: a new ResNet-50 batch's operands are 161 MiB at batch 2, 512 MiB
    at 8, whose drawing on the host took 0.11 / 0.42 s on a 2-core machine."""
    from numba import cuda

    block = np.random.default_rng(0).uniform(-1, 1, min(size, _BLOCK)).astype(dtype)
    dev = cuda.device_array(max(size, 1), dtype)
    dev[: block.size].copy_to_device(block)
    done = block.size
    while done < size:
        k = min(done, size - done)
        dev[done : done + k].copy_to_device(dev[:k])
        done += k
    return dev


def _algo_bytes(result: np.void) -> np.ndarray:
    """The 64-byte cublasLtMatmulAlgo_t of a heuristic result, as an owned aligned buffer."""
    return np.frombuffer(result["algo"].tobytes(), np.uint64).copy()
