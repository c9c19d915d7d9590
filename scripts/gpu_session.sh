#!/usr/bin/env bash
# One GPU call does everything: parity tests, fusion counts, peer benchmark. Run on the device
# machine from the repository root, with the wheels of shared/tools/gpu-wheels.sh in .whl/.
#   bash scripts/gpu_session.sh [quick]
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYFORGE_CACHE=/tmp/pyforge-cache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import numba, numba_cuda, numpy, nvmath, torch; print('numba', numba.__version__, 'numba-cuda', numba_cuda.__version__, 'numpy', numpy.__version__, 'nvmath', nvmath.__version__, 'torch', torch.__version__)" | tee -a "$OUT/gpu.txt"
python3 -m pytest -q -m gpu -p no:cacheprovider tests/exec/test_gpu.py -s 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "max abs|allocated|passed|failed|Error" | tail -40
python3 benchmarks/fusion_report.py --target cuda 2>&1 | grep -v -i warn | tee "$OUT/fusion_cuda.md"
python3 scripts/gpu_profile_steps.py 2>&1 | grep -v -i warn | tee "$OUT/profile_fp32.txt" | head -12
python3 scripts/gpu_profile_steps.py --precision tf32 2>&1 | grep -v -i warn | tee "$OUT/profile_tf32.txt" | head -3
if [ "${1:-}" != "quick" ]; then
  python3 benchmarks/peers.py --runs 200 2>&1 | grep -v -i warn | tee "$OUT/peers.md" | tail -30
fi
