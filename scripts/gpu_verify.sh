#!/usr/bin/env bash
# The sixth session's GPU-host checks, one part per call (each fits one 10-minute device call):
#   bash scripts/gpu_verify.sh cuda     # gpu tests, new ops' node tests on cuda, new-shape time
#   bash scripts/gpu_verify.sh cpu      # the 10,000-graph fuzz run and the under-load benchmark
#   bash scripts/gpu_verify.sh corpus   # the real-model corpus on cuda
# Run from the repository root on the device machine with the wheels of gpu-wheels.sh in .whl/.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYFORGE_CACHE=${PYFORGE_CACHE:-/tmp/pfcache} PYTHONUNBUFFERED=1
step() { local t=$1; shift; echo "== $* (limit ${t}s)"; timeout "$t" "$@"; }
NEW="layer_normalization|softmax|rms_normalization|group_normalization|instance_norm|conv|attention|rnn|gru|lstm|loop|scan|test_if|nonzero|nonmax|roialign|gridsample|qlinearconv|convinteger|cumprod|lpnorm|compress|unique|softmax_cross|sce_|nllloss|center_crop"
case "${1:-cuda}" in
cuda)
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
  step 180 python3 -m pytest -q -m gpu -p no:cacheprovider tests/exec/test_gpu.py tests/exec/test_threads.py 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "passed|failed|FAILED" | tail -12
  step 175 python3 scripts/gpu_conformance_sample.py --skip-light --n 400 --budget-s 150 --match "$NEW" 2>&1 | grep -v -i warn | tee "$OUT/conformance_new_ops_cuda.txt" | tail -25
  step 90 python3 scripts/gpu_conformance_sample.py --n 200 --budget-s 60 2>&1 | grep -v -i warn | tee "$OUT/conformance_cuda.txt" | tail -8
  step 110 python3 scripts/new_shape_time.py --target cuda 2>&1 | grep -v -i warn | tee "$OUT/new_shape_cuda.txt"
  ;;
fuzz)  # more seeds: bash scripts/gpu_verify.sh fuzz A:B [seconds]
  step "${3:-300}" env NUMBA_NUM_THREADS=1 python3 -m tests.fuzz.run --seeds "$2" --jobs 15 --out "$OUT/fuzz_more.json" 2>&1 | grep -v -i warn | tee "$OUT/fuzz_more.txt" | tail -12
  ;;
cpu)
  nproc | tee "$OUT/cpu.txt"
  step 330 env NUMBA_NUM_THREADS=1 python3 -m tests.fuzz.run --seeds 0:10000 --jobs 15 --out "$OUT/fuzz_summary.json" 2>&1 | grep -v -i warn | tee "$OUT/fuzz.txt" | tail -25
  step 240 python3 benchmarks/under_load.py --cores 2,3 2>&1 | grep -v -i warn | tee "$OUT/under_load.txt" | tail -25
  ;;
corpus)  # bash scripts/gpu_verify.sh corpus [models] [seconds]
  step "${3:-560}" python3 benchmarks/corpus.py --target cuda --isolate --timeout 80 --runs 3 ${2:+--models "$2"} --md "$OUT/corpus_cuda.md" 2>&1 | grep -v -i warn | tee "$OUT/corpus_cuda.txt" | tail -40
  ;;
s7)  # the seventh session's GPU figures: fused attention, Gemma 3 generation, the cpu under load
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
  step 170 python3 benchmarks/attention.py --target cuda --rounds 5 2>&1 | grep -v -i warn | tee "$OUT/attention_cuda.txt" | tail -14
  step 230 python3 benchmarks/generate_gpu.py --quick --budget 200 2>&1 | grep -v -i warn | tee "$OUT/generate_gpu.txt" | tail -12
  step 150 taskset -c 2,3 python3 benchmarks/under_load.py --cores 2,3 --models resnet50,mlp --rounds 4 2>&1 | grep -v -i warn | tee "$OUT/under_load.txt" | tail -12
  ;;
final)  # the last check of a session: fused attention parity on cuda, the gpu tests, more fuzz seeds
  step 80 python3 benchmarks/attention.py --target cuda --rounds 2 --calls 10 2>&1 | grep -v -i warn | tee "$OUT/attention_cuda.txt" | tail -11
  step 140 python3 -m pytest -q -m gpu -p no:cacheprovider tests/exec/test_gpu.py 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "passed|failed|FAILED" | tail -8
  step "${3:-140}" env NUMBA_NUM_THREADS=1 python3 -m tests.fuzz.run --seeds "$2" --jobs 15 --out "$OUT/fuzz_more.json" 2>&1 | grep -v -i warn | tee "$OUT/fuzz_more.txt" | tail -6
  ;;
s9)  # the ninth session's first call: gpu tests, Gemma 3 generation with the in-place KV cache, a decode profile
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
  step 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/exec/test_gpu.py tests/exec/test_threads.py 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "passed|failed|FAILED|Error" | tail -12
  step 250 python3 benchmarks/generate_gpu.py --quick --budget 230 2>&1 | grep -v -i warn | tee "$OUT/generate_gpu.txt" | tail -14
  step 130 python3 scripts/profile_decode.py --ctx 256 --new 24 --top 20 2>&1 | grep -v -i warn | tee "$OUT/profile_decode.txt" | tail -45
  ;;
s9b)  # the ninth session's second call: decode with the per-row attention kernel, new-shape time
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
  step 80 python3 benchmarks/attention.py --target cuda --rounds 2 --calls 10 2>&1 | grep -v -i warn | tee "$OUT/attention_cuda.txt" | tail -11
  step 220 python3 benchmarks/generate_gpu.py --quick --budget 200 2>&1 | grep -v -i warn | tee "$OUT/generate_gpu.txt" | tail -10
  step 120 python3 scripts/profile_decode.py --ctx 256 --new 24 --top 12 2>&1 | grep -v -i warn | tee "$OUT/profile_decode.txt" | grep -A14 -E "^--- device|cache, cuda" | tail -34
  step 100 python3 scripts/new_shape_time.py --target cuda 2>&1 | grep -v -i warn | tee "$OUT/new_shape_cuda.txt" | tail -6
  ;;
s9c)  # the ninth session's last call: decode and a 1024-token prefill with the 512-thread per-row kernel, more corpus rows on cuda
  step 200 python3 benchmarks/generate_gpu.py --caches static --skip compile --new 32 --rounds 2 --budget 180 2>&1 | grep -v -i warn | tee "$OUT/generate_gpu.txt" | tail -8
  step 90 python3 scripts/profile_decode.py --ctx 256 --new 24 --top 8 2>&1 | grep -v -i warn | tee "$OUT/profile_decode.txt" | grep -A9 -E "^--- device|cache, cuda" | tail -24
  step 200 python3 benchmarks/corpus.py --target cuda --isolate --timeout 60 --runs 3 --models block,bert_base,llama_tiny,qwen2_tiny,mobilenet_v3_small,regnet_y_400mf,shufflenet_v2_x1_0 --md "$OUT/corpus_cuda.md" 2>&1 | grep -v -i warn | tee "$OUT/corpus_cuda.txt" | tail -14
  ;;
s10)  # the tenth session: corpus models side by side (bash scripts/gpu_verify.sh s10 MODELS [seconds] [jobs]); wheel models from .corpus/
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
  [ -d .corpus ] && mkdir -p "${PYFORGE_CORPUS:=/tmp/corpus}" && cp .corpus/*.onnx "$PYFORGE_CORPUS"/ 2>/dev/null; export PYFORGE_CORPUS
  for f in .corpus/*.f16; do [ -e "$f" ] && python3 scripts/corpus_pack.py unpack "$f" "$PYFORGE_CORPUS/$(basename "$f" .f16).onnx"; done
  step "${3:-540}" python3 benchmarks/corpus.py --target cuda --isolate --jobs "${4:-8}" --timeout 400 --runs 3 --models "$2" --md "$OUT/corpus_cuda.md" 2>&1 | grep -v -i warn | tee "$OUT/corpus_cuda.txt" | grep -v "^|" | tail -60
  ;;
h3)  # issue 19: decode attention split over blocks, reading only the kept keys (contexts 256 and 1216)
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
  step 70 python3 benchmarks/attention.py --target cuda --rounds 2 --calls 10 2>&1 | grep -v -i warn | tee "$OUT/attention_cuda.txt" | tail -11
  step 200 python3 benchmarks/generate_gpu.py --caches static --skip compile --new 32 --rounds 2 --budget 180 2>&1 | grep -v -i warn | tee "$OUT/generate_gpu.txt" | tail -8
  for c in 256 1216; do
    step 100 python3 scripts/profile_decode.py --ctx $c --new 24 --top 8 2>&1 | grep -v -i warn | tee "$OUT/profile_decode_$c.txt" | grep -A9 -E "^--- device|cache, cuda" | tail -24
  done
  ;;
h6)  # issue 19: wide-head prefill attention (K/V tiles shared by 16 query rows) vs the per-row kernel; Gemma 3 prompts 5/128/1024
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
  step 170 python3 benchmarks/prefill_attention.py --rounds 5 --calls 10 2>&1 | grep -v -i warn | tee "$OUT/prefill_attention.txt" | tail -8
  step 70 python3 benchmarks/attention.py --target cuda --rounds 3 --calls 10 --only prefill_d256,decode 2>&1 | grep -v -i warn | tee "$OUT/attention_cuda.txt" | tail -8
  step 240 python3 benchmarks/generate_gpu.py --caches static --skip compile --new 8 --rounds 2 --budget 220 2>&1 | grep -v -i warn | tee "$OUT/generate_gpu.txt" | tail -8
  ;;
s10b)  # the tenth session's last call: split-K decode attention, fp16 decode, prefill, new-shape time (corpus rows run beside it: see README)
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
  step 50 python3 benchmarks/attention.py --target cuda --rounds 2 --calls 10 2>&1 | grep -v -i warn | tee "$OUT/attention_cuda.txt" | tail -11
  step 220 python3 benchmarks/generate_gpu.py --caches static --new 32 --precision fp32,fp16 --skip compile --rounds 2 --budget 200 2>&1 | grep -v -i warn | tee "$OUT/generate_gpu.txt" | tail -14
  step 100 python3 benchmarks/generate_gpu.py --quick --ctx 256 --new 32 --caches static --precision fp32,fp16 --skip eager,compile --rounds 3 --budget 80 --profile 2>&1 | grep -v -i warn | tee "$OUT/generate_gpu_256.txt" | tail -30
  step 100 python3 scripts/new_shape_time.py --target cuda --batches 1,2,4,8 --fresh-cache --runs 100 --algos 2>&1 | grep -v -i warn | tee "$OUT/new_shape_cuda.txt" | tail -16
  ;;
sce)  # the SoftmaxCrossEntropyLoss/NLLLoss cases that raised IndexRangeError on the H200
  step 120 python3 scripts/gpu_conformance_sample.py --skip-light --n 60 --budget-s 100 --match "sce_|nllloss" 2>&1 | grep -v -i warn | tee "$OUT/sce_cuda.txt" | tail -8
  ;;
s11a)  # the eleventh session's first call: H8's decode plan timed (fp32, fp16 at 1216), then SSDlite's cuda corpus row
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
  step 230 python3 benchmarks/generate_gpu.py --caches static --new 32 --precision fp32,fp16 --skip eager,compile --rounds 2 --budget 210 2>&1 | grep -v -i warn | tee "$OUT/generate_gpu.txt" | tail -14
  step 60 python3 benchmarks/generate_gpu.py --quick --ctx 256 --new 16 --caches static --precision fp32 --skip eager,compile --rounds 1 --budget 50 --profile 2>&1 | grep -v -i warn | tee "$OUT/generate_gpu_profile.txt" | tail -30
  step 330 python3 benchmarks/corpus.py --target cuda --isolate --timeout 320 --runs 3 --models ssdlite320_mobilenet_v3_large --md "$OUT/corpus_cuda.md" 2>&1 | grep -v -i warn | tee "$OUT/corpus_cuda.txt" | tail -12
  ;;
s11b)  # the eleventh session: SSDlite after the shape-generic rest stages, all-MiniLM-L6-v2 (fp16-rounded copy from .corpus), decode memory
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
  [ -d .corpus ] && mkdir -p "${PYFORGE_CORPUS:=/tmp/corpus}"; export PYFORGE_CORPUS
  for f in .corpus/*.f16; do [ -e "$f" ] && python3 scripts/corpus_pack.py unpack "$f" "$PYFORGE_CORPUS/$(basename "$f" .f16).onnx"; done
  step 300 python3 benchmarks/corpus.py --target cuda --isolate --timeout 290 --runs 3 --models ssdlite320_mobilenet_v3_large --md "$OUT/corpus_ssdlite.md" 2>&1 | grep -v -i warn | tee "$OUT/corpus_ssdlite.txt" | tail -6
  step 150 python3 benchmarks/corpus.py --target cuda --isolate --timeout 140 --runs 3 --models all_minilm_l6_v2 --md "$OUT/corpus_allminilm.md" 2>&1 | grep -v -i warn | tee "$OUT/corpus_allminilm.txt" | tail -6
  for p in fp32 fp16; do
    step 70 python3 scripts/decode_memory.py --precision $p 2>&1 | grep -v -i warn | tee "$OUT/decode_memory_$p.txt" | tail -12
  done
  ;;
s11c)  # the eleventh session: SSDlite with host rest stages; decode after merged GEMMs + GQA attention kernel; attention alone; fp16 memory
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
  step 280 python3 benchmarks/corpus.py --target cuda --isolate --timeout 250 --runs 3 --models ssdlite320_mobilenet_v3_large --md "$OUT/corpus_ssdlite.md" 2>&1 | grep -v -i warn | tee "$OUT/corpus_ssdlite.txt" | tail -6
  step 60 python3 benchmarks/attention.py --target cuda --only gemma_dec256,gemma_dec256_short,gemma_dec1216 --rounds 5 --calls 50 2>&1 | grep -v -i warn | tee "$OUT/attention_gemma.txt" | tail -8
  step 170 python3 benchmarks/generate_gpu.py --caches static --new 32 --precision fp32,fp16 --skip eager,compile --rounds 2 --budget 150 --profile 2>&1 | grep -v -i warn | tee "$OUT/generate_gpu.txt" | tail -44
  step 50 python3 scripts/decode_memory.py --precision fp16 2>&1 | grep -v -i warn | tee "$OUT/decode_memory_fp16.txt" | tail -12
  ;;
s11d)  # the eleventh session's last call: decode after reverting the GQA kernel; peers.py --corpus against PyTorch on the H200
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
  step 110 python3 benchmarks/generate_gpu.py --caches static --new 32 --precision fp32,fp16 --skip eager,compile --rounds 2 --budget 90 2>&1 | grep -v -i warn | tee "$OUT/generate_gpu.txt" | tail -5
  step 240 python3 benchmarks/peers.py --corpus --target cuda --budget 220 --timeout 110 --compile-mode off --md "$OUT/peers_corpus_cuda.md" 2>&1 | grep -v -i warn | tee "$OUT/peers_corpus_cuda.txt" | tail -20
  ;;
s12a)  # the twelfth session's first call: device memory after the merged weights (de37f13), decode profile at 1216
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
  for p in fp32 fp16; do
    step 80 python3 scripts/decode_memory.py --precision $p 2>&1 | grep -v -i warn | tee "$OUT/decode_memory_$p.txt" | tail -12
  done
  step 150 python3 benchmarks/generate_gpu.py --quick --caches static --new 32 --precision fp32,fp16 --skip eager,compile --rounds 1 --budget 130 --profile 2>&1 | grep -v -i warn | tee "$OUT/generate_gpu_profile.txt" | tail -60
  ;;
s12b)  # the twelfth session: run-ahead greedy decode (next_token on the device) against host greedy, alternated
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
  step 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/generate/test_static_cache.py tests/lower_numba/test_argmax_rows.py 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "passed|failed|FAILED|Error" | tail -12
  step 260 python3 benchmarks/generate_gpu.py --caches static --new 32 --precision fp32,fp16 --skip eager,compile --rounds 2 --budget 240 --host-greedy 2>&1 | grep -v -i warn | tee "$OUT/generate_gpu.txt" | tail -12
  ;;
s12c)  # the twelfth session: global pool rows / depthwise interior A/B and HF peers rows (gpu_speed); decode profile with next_token
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
  step 150 python3 scripts/gpu_pool_ab.py --budget 140 2>&1 | grep -v -i warn | tee "$OUT/gpu_pool_ab.txt" | tail -30
  step 80 python3 benchmarks/generate_gpu.py --quick --ctx 256 --new 16 --caches static --precision fp32 --skip eager,compile --rounds 1 --budget 60 --profile 2>&1 | grep -v -i warn | tee "$OUT/generate_gpu_profile.txt" | tail -24
  ;;
s12d)  # the twelfth session's last call: decode attention variants; decode with the two-round pick (row and w8 attention); EfficientNet/MobileNetV2 peers rows with pool rows
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
  step 150 python3 benchmarks/attention.py --target cuda --variants row,w4,w8,w8k64 --only gemma_dec256,gemma_dec256_short,gemma_dec1216,prefill_gemma_1024_causal,prefill_gemma_1024_window512 2>&1 | grep -v -i warn | tee "$OUT/attention_variants.txt" | tail -16
  for v in row w8; do
    step 140 env PYFORGE_DECODE_ATTN=$v python3 benchmarks/generate_gpu.py --caches static --new 32 --precision fp32,fp16 --skip eager,compile --rounds 2 --budget 120 $([ $v = row ] && echo --profile) 2>&1 | grep -v -i warn | tee "$OUT/generate_gpu_$v.txt" | tail -26
  done
  step 100 python3 benchmarks/peers.py --corpus --target cuda --models efficientnet_b0,mobilenet_v2 --budget 90 --timeout 60 --compile-mode off --md "$OUT/peers_cnn.md" 2>&1 | grep -v -i warn | tee "$OUT/peers_cnn.txt" | tail -8
  ;;
s13a)  # the thirteenth session: decode with ResidualRMSNorm junctions and K/V scatter siblings against the last tree (BASE, w8 attention); prefill with attention as GEMMs past 64 query rows
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
  step 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/generate/test_static_cache.py tests/generate/test_fp16_decode.py 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "passed|failed|FAILED|Error" | tail -12
  G="benchmarks/generate_gpu.py --caches static --new 32 --skip eager,compile"
  if [ -n "${BASE:-}" ]; then
    step 100 env PYFORGE_DECODE_ATTN=w8 PYFORGE_CACHE=/tmp/pfcache_base PYTHONPATH=/tmp/site:$BASE bash -c "cd $BASE && python3 $G --precision fp32 --rounds 1 --budget 80" 2>&1 | grep -v -i warn | tee "$OUT/generate_gpu_base.txt" | tail -14
  fi
  step 150 python3 $G --precision fp32,fp16 --rounds 2 --budget 130 2>&1 | grep -v -i warn | tee "$OUT/generate_gpu_new.txt" | tail -14
  step 110 env PYFORGE_ATTN_MAX_SQ=64 python3 $G --precision fp32,fp16 --rounds 1 --budget 90 2>&1 | grep -v -i warn | tee "$OUT/generate_gpu_sq64.txt" | tail -14
  ;;
s13b)  # the thirteenth session: fused attention against GEMMs + softmax by query length (attention_rows); where a 1024-token prefill goes; transformer peers rows
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
  step 170 python3 benchmarks/attention.py --target cuda --rounds 5 --calls 20 --only minilm,bert_layer,attn,prefill_d256 2>&1 | grep -v -i warn | tee "$OUT/attention_rows.txt" | tail -16
  step 130 python3 benchmarks/generate_gpu.py --caches static --new 16 --skip eager,compile --precision fp32,fp16 --rounds 1 --budget 100 --profile --profile-prefill 1024 2>&1 | grep -v -i warn | tee "$OUT/generate_gpu_profile.txt" | tail -80
  step 240 python3 benchmarks/peers.py --corpus --target cuda --models bert_base,distilbert,vit_b_16,gpt2_2l,minilm_l6 --budget 230 --timeout 100 --compile-mode off --md "$OUT/peers_tr.md" 2>&1 | grep -v -i warn | tee "$OUT/peers_tr.txt" | tail -14
  ;;
s13c)  # the thirteenth session: the in-place ScatterND one thread per updated element, row reductions by warp shuffles; decode/prefill with profiles; transformer peers again
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
  step 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/generate/test_static_cache.py tests/generate/test_fp16_decode.py tests/lower_numba/test_argmax_rows.py 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "passed|failed|FAILED|Error" | tail -12
  step 170 python3 benchmarks/generate_gpu.py --caches static --new 32 --skip eager,compile --precision fp32,fp16 --rounds 2 --budget 140 --profile --profile-prefill 1024 2>&1 | grep -v -i warn | tee "$OUT/generate_gpu_profile.txt" | tail -80
  step 220 python3 benchmarks/peers.py --corpus --target cuda --models minilm_l6,bert_base,distilbert,vit_b_16,gpt2_2l --budget 210 --timeout 100 --compile-mode off --md "$OUT/peers_tr.md" 2>&1 | grep -v -i warn | tee "$OUT/peers_tr.txt" | tail -12
  ;;
s14a)  # the fourteenth session: decode attention's split (keys a part) at 9 / 512 / 1088 of 1216 keys; the decode profile; the whole decode with 128 keys a part
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
  step 150 python3 benchmarks/attention.py --target cuda --variants w8,w8k64,w8k128,w8k256 --only gemma_dec1216_short,gemma_dec1216_window,gemma_dec1216 2>&1 | grep -v -i warn | tee "$OUT/attn_split.txt" | tail -14
  step 170 python3 benchmarks/generate_gpu.py --caches static --new 32 --skip eager,compile --precision fp32,fp16 --rounds 2 --budget 140 --profile 2>&1 | grep -v -i warn | tee "$OUT/generate_w8.txt" | tail -60
  step 150 env PYFORGE_DECODE_ATTN=w8k128 python3 benchmarks/generate_gpu.py --caches static --new 32 --skip eager,compile --precision fp32,fp16 --rounds 2 --budget 120 2>&1 | grep -v -i warn | tee "$OUT/generate_w8k128.txt" | tail -14
  ;;
esac
