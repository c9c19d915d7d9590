"""The cuda target: the runtime, its GEMM chooser, the cuBLASLt binding and CUDA graph capture."""

from .runtime import CudaRuntime

__all__ = ["CudaRuntime"]
