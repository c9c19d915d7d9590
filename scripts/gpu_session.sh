#!/usr/bin/env bash
# One GPU call does everything: parity tests, a conformance sample, fusion counts, kernel times,
# the peer benchmark. Run on the device machine from the repository root, with the wheels of
# shared/tools/gpu-wheels.sh in .whl/.
#   bash scripts/gpu_session.sh [quick|checks|peers]
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYFORGE_CACHE=${PYFORGE_CACHE:-$PWD/.cache} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import numba, numba_cuda, numpy, nvmath, torch; print('numba', numba.__version__, 'numba-cuda', numba_cuda.__version__, 'numpy', numpy.__version__, 'nvmath', nvmath.__version__, 'torch', torch.__version__)" | tee -a "$OUT/gpu.txt"
step() { local t=$1; shift; echo "== $* (limit ${t}s)"; timeout "$t" "$@"; }
if [ "${1:-}" != "peers" ]; then
step 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/exec/test_gpu.py -s 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "max abs|allocated|passed|failed|Error" | tail -40
step 100 python3 scripts/gpu_conformance_sample.py --n 300 --budget-s 80 2>&1 | grep -v -i warn | tee "$OUT/conformance_cuda.txt" | tail -12
step 80 python3 scripts/gpu_conformance_sample.py --float16 --skip-light --n 200 --budget-s 60 2>&1 | grep -v -i warn | tee "$OUT/conformance_float16.txt" | tail -30
[ "${1:-}" != "checks" ] && step 60 python3 benchmarks/fusion_report.py --target cuda 2>&1 | grep -v -i warn | tee "$OUT/fusion_cuda.md"
for p in fp32 tf32 fp16; do
  step 50 python3 scripts/gpu_kernel_times.py --precision $p 2>&1 | grep -v -i warn | tee "$OUT/kernels_$p.txt" | head -8
done
fi
if [ "${1:-}" != "quick" ] && [ "${1:-}" != "checks" ]; then
  step 200 python3 benchmarks/peers.py --runs 200 2>&1 | grep -v -i warn | tee "$OUT/peers.md" | tail -40
fi
# the implicit-GEMM conv option on the whole model (its cold compile takes minutes)
[ -z "${1:-}" ] && step 170 python3 scripts/gpu_conv_bench.py --no-convs --modes im2col,implicit 2>&1 | grep -v -i warn | tee "$OUT/implicit.txt" | tail -6
