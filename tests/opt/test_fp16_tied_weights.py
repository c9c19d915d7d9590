"""precision="fp16" holds a tied embedding once: the Gather reads the float16 copy the logits
GEMM reads (widened at the load) instead of keeping the float32 table beside it."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from pyforge.compiler import CompileOptions, compile_to_plan
from tests.helpers import make_model

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)


def _tied(vocab: int = 64, hidden: int = 16):
    r = np.random.default_rng(5)
    table = numpy_helper.from_array(r.standard_normal((vocab, hidden)).astype(np.float32), "E")
    nodes = [
        helper.make_node("Gather", ["E", "ids"], ["h"], name="embed"),
        helper.make_node("Gemm", ["h", "E"], ["logits"], transB=1, name="logits"),
    ]
    inputs = [("ids", np.int64, [3])]
    return make_model(nodes, inputs, [("logits", np.float32, [3, vocab])], [table])


def test_a_tied_table_is_held_once_in_float16():
    vocab, hidden = 64, 16
    plan32, _ = compile_to_plan(_tied(vocab, hidden), CompileOptions().resolve("cuda"))
    plan16, _ = compile_to_plan(
        _tied(vocab, hidden), CompileOptions(precision="fp16").resolve("cuda")
    )
    table = vocab * hidden
    assert plan32.weights.nbytes >= table * 4
    # one float16 table and nothing else of its size: half the float32 plan's bytes or less
    assert table * 2 <= plan16.weights.nbytes < table * 4
    tables = [
        s for s in plan16.slots.values() if s.region == "weights" and s.shape == (vocab, hidden)
    ]
    assert [np.dtype(s.dtype) for s in tables] == [F16]
