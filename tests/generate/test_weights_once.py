"""Every plan of a Gemma 3 TextGenerator (prefill buckets and the decode step) holds one copy of
the weights: the decode step's one-row GEMMs must not get weights of their own (merged matrices
that the prefill plans lack), or a model is held twice."""

from __future__ import annotations

import numpy as np
import pytest

gemma3 = pytest.importorskip("pyforge.generate.gemma3")


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_prefill_and_decode_plans_share_one_weights_array(target):
    from pyforge.compiler import CompileOptions, compile_to_plan

    c = gemma3.Gemma3Config.tiny()
    m = gemma3.build_decoder(c, gemma3.random_weights(c, seed=2), "fp32", "last", 16, "static")
    weights = []
    for seq in (1, 4):  # the decode step, a prompt bucket
        shapes = {"input_ids": (1, seq), "position_ids": (1, seq)}
        opts = CompileOptions(state=gemma3.state_map(c), input_shapes=shapes).resolve(target)
        plan, _ = compile_to_plan(m, opts)
        weights.append(plan.weights)
    assert weights[0].nbytes and np.array_equal(weights[0], weights[1])


def test_a_generator_binds_its_plans_on_one_weights_array():
    c = gemma3.Gemma3Config.tiny()
    gen = pyforge_gen(c)
    gen.generate([2, 7, 9, 11, 4], max_new_tokens=3)
    arrays = {id(b.plan.weights) for b in gen.model._plans.values()}
    assert len(gen.model._plans) >= 2 and len(arrays) == 1


def pyforge_gen(c):
    import pyforge

    w = gemma3.random_weights(c, seed=2)
    return pyforge.TextGenerator.from_config(c, w, target="cpu", max_context=16, cache="static")
