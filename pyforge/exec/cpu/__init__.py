"""The cpu target: the runtime, its GEMM chooser, pyforge's own AVX2 sgemm and its operand
packing, the CBLAS drivers, and the row-copy im2col."""

import os

# Numba's OpenMP threads wait for work spinning GOMP_SPINCOUNT pauses, then sleep. A pause takes
# ~29 ns of CPU here, so libgomp's default (300,000) spins ~9 ms: a waiting thread keeps its
# core, and a parallel region whose other thread shares a core with another process stalls for
# that process's time slice. 1000 spins (~29 us) cover the gaps between steps (a driver call
# costs ~2 us); on a loaded machine 10,000 cost ResNet-50 1.45x ORT against 1.02x (BENCHMARKS).
# It must be set before Numba starts its thread pool (libgomp reads it once), and never over
# the user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT.
WAIT_SPINS = "1000"
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = WAIT_SPINS

from .runtime import CpuRuntime

__all__ = ["CpuRuntime"]
