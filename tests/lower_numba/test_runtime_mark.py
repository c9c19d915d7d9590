"""cpu kernels that compile in exec/cpu code (tiles, sgemm's micro-kernel) name its version in
their source, so Numba's disk cache, keyed on a kernel's own source, never runs a stale copy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import helper

from pyforge.compiler import compile_to_plan
from pyforge.exec.steps import kernel_steps
from pyforge.lower_numba import emit
from tests.helpers import make_model
from tests.opt.test_attention import core

F32 = np.float32


def _sources(model) -> dict[str, str]:
    plan, _ = compile_to_plan(model)
    return {s.label: plan.kernels[s.kernel]["cpu"] for s in kernel_steps(plan.steps)}


def test_parallel_and_attention_kernels_carry_the_mark():
    big = make_model(
        [helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("Sigmoid", ["t"], ["y"])],
        [("x", F32, [64, 4096])],
        [("y", F32, [64, 4096])],
    )
    tiled = [src for src in _sources(big).values() if "claim(" in src]
    assert tiled and all(emit.RUNTIME_MARK in src for src in tiled)
    attn = {k: v for k, v in _sources(core()[0]).items() if "FusedAttention" in k}
    assert attn and all(emit.RUNTIME_MARK in src for src in attn.values())


def test_the_mark_follows_the_runtime_sources(monkeypatch):
    before = emit._runtime_mark()
    assert before == emit.RUNTIME_MARK
    real = Path.read_bytes

    def edited(path: Path) -> bytes:
        data = real(path)
        return data + b"\n# edited\n" if path.name == "sgemm.py" else data

    monkeypatch.setattr(Path, "read_bytes", edited)
    assert emit._runtime_mark() != before
