"""Gemma 3 decode with precision="fp16" on cuda: ``TextGenerator.from_config(precision="fp16")``
compiles the float32 decoder so its GEMMs read float16 weights (cuBLASLt fp16, float32
accumulate) while the KV cache stays float32 in place; in the simulator it gives the float32
cpu run's greedy tokens and logits within 1% of their largest; its kernels compile to sm_90 PTX."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

gemma3 = pytest.importorskip("pyforge.generate.gemma3")

SIMULATED = """
import numpy as np, pyforge
from pyforge.generate import gemma3
c = gemma3.Gemma3Config.tiny()
c = gemma3.Gemma3Config(**{**c.__dict__, "vocab": 64, "layers": 2, "hidden": 32, "ffn": 32, "head_dim": 8})
w = gemma3.random_weights(c, seed=1)
out = {}
for target, precision in (("cpu", "fp32"), ("cuda", "fp16")):
    gen = pyforge.TextGenerator.from_config(c, w, target=target, max_context=10, cache="static",
                                            prefill_buckets=None, precision=precision)
    fast = gen.generate([2, 9, 17, 33, 40, 5], max_new_tokens=3).tokens  # next_token's ids
    gen.reset()
    seen, step, gen._next = [], gen._step, False  # the logits every step, greedy on the host
    gen._step = lambda ids, width: seen.append(step(ids, width)) or seen[-1]
    tokens = gen.generate([2, 9, 17, 33, 40, 5], max_new_tokens=3).tokens
    assert fast == tokens, (fast, tokens)
    state = gen.model.runtime.state
    state = state if target == "cpu" else state.copy_to_host()
    out[target] = tokens, np.array(seen), state.view(np.float32)
plan = gen.model.plan
gemms = [s for s in plan.steps if hasattr(s, "m")]
assert gemms and all(np.dtype(plan.slots[s.b].dtype) == np.float16 for s in gemms), "fp16 weights"
assert all(np.dtype(plan.slots[n].dtype) == np.float32 for n in plan.state), "a float32 cache"
print(out["cpu"][0], out["cuda"][0])
assert out["cpu"][0] == out["cuda"][0]
for k in (1, 2):  # logits, then the caches
    want, got = out["cpu"][k], out["cuda"][k]
    err = np.abs(got - want).max() / np.abs(want).max()
    print("relative error", err)
    assert 0 < err < 1e-2
print("fp16 decode ok")
"""


@pytest.mark.sim
@pytest.mark.slow  # 3 steps of 2 layers simulated: ~100 s on a loaded 2-core host
def test_fp16_decode_in_the_simulator_gives_fp32_tokens():
    pytest.importorskip("numba.cuda")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    run = subprocess.run([sys.executable, "-c", SIMULATED], env=env, capture_output=True,
                         text=True, timeout=900, check=False)  # fmt: skip
    assert run.returncode == 0 and "fp16 decode ok" in run.stdout, run.stderr[-3000:]


@pytest.mark.slow
def test_the_fp16_decode_plan_compiles_to_ptx(tmp_path):
    """The cuda fp16 decode plan: every GEMM reads float16 operands, the cache is float32 and
    written in place, and each of its kernels compiles to sm_90 PTX."""
    from pyforge.compiler import compile_to_plan
    from pyforge.options import CompileOptions
    from tests.lower_numba.test_ptx import _ptx_available, _ptx_of

    if not _ptx_available():
        pytest.skip("no numba-cuda with NVVM/NVRTC ([cuda] extra) to compile PTX")
    c = gemma3.Gemma3Config.tiny()
    proto = gemma3.build_decoder(c, gemma3.random_weights(c, seed=2), "fp32", "last", 48, "static")
    shapes = {"input_ids": (1, 1), "position_ids": (1, 1)}
    opts = CompileOptions(state=gemma3.state_map(c), input_shapes=shapes, precision="fp16")
    plan, _ = compile_to_plan(proto, opts.resolve("cuda"))
    gemms = [s for s in plan.steps if hasattr(s, "m")]
    assert len(gemms) == 4 * c.layers + 1  # qkv o gate-up down, and the logits
    for s in gemms:
        assert {np.dtype(plan.slots[t].dtype) for t in (s.a, s.b, s.d)} == {np.dtype("f2")}, s.label
    assert all(np.dtype(plan.slots[n].dtype) == np.float32 and plan.slots[n].region == "state"
               for n in plan.state)  # fmt: skip
    kernels = {s.kernel: s for s in plan.steps if hasattr(s, "kernel")}
    # only o's input is cast; the q and k norms and v's ScatterND read float16 (widened)
    assert sum(s.label.startswith("Cast") for s in plan.steps) == c.layers + 2
    for step in kernels.values():
        assert _ptx_of(plan, step, tmp_path)
