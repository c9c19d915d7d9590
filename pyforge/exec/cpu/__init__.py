"""The cpu target: the runtime, its GEMM chooser, pyforge's own AVX2 sgemm and its operand
packing, the CBLAS drivers, and the row-copy im2col."""

from .runtime import CpuRuntime

__all__ = ["CpuRuntime"]
