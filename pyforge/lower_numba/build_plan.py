"""Lowering's last stage: a Program becomes an ExecutionPlan (weights, arena offsets, steps)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np

from ..exec.plan import ExecutionPlan, Slot
from ..opt.memory_plan import Buffer, check_no_overlap, plan_memory
from .emit import KernelCall
from .lower import GemmCall, Program

ALIGN = 256


def _base(prog: Program, name: str) -> str:
    while prog.tensors[name].alias is not None:
        name = prog.tensors[name].alias
    return name


def _step_tensors(step: KernelCall | GemmCall) -> list[str]:
    if isinstance(step, GemmCall):
        names = [t for t in (step.a, step.b, step.c, step.d) if t]
        for k in (step.prologue, step.epilogue):
            names += _step_tensors(k) if k is not None else []
        if step.pattern:
            names += [t for t in (step.pattern["bias"], step.pattern["residual"]) if t]
        return names
    return [v for kind, v in step.args if kind in ("t", "w")]


def _kernel_step(k: KernelCall, kernels: dict[str, dict[str, str]]) -> dict[str, Any]:
    kernels[k.key] = {"cpu": k.source_cpu, "cuda": k.source_cuda}
    launch = {"launch": [[int(g) for g in k.launch[0]], int(k.launch[1])]} if k.launch else {}
    return {
        "kind": "kernel",
        "kernel": k.key,
        "n": k.n,
        "inner": k.inner,
        "label": k.label,
        "args": [list(a) for a in k.args],
        **launch,
    }


def build_plan(prog: Program) -> ExecutionPlan:
    """Assign weights and arena offsets (liveness-planned) and serialise the steps."""
    slots: dict[str, Slot] = {}
    weights = bytearray()
    for name, info in prog.tensors.items():
        if info.const is not None and info.alias is None:
            off = -(-len(weights) // ALIGN) * ALIGN
            weights.extend(b"\0" * (off - len(weights)))
            weights.extend(np.ascontiguousarray(info.const, info.dtype).tobytes())
            slots[name] = Slot("weights", off, tuple(info.shape), info.dtype.str)

    first: dict[str, int] = {}
    last: dict[str, int] = {}

    def touch(name: str, i: int) -> None:
        base = _base(prog, name)
        if prog.tensors[base].const is not None:
            return
        first.setdefault(base, i)
        first[base] = min(first[base], i)
        last[base] = max(last.get(base, i), i)

    for name in prog.inputs:
        touch(name, 0)
    for i, step in enumerate(prog.steps):
        for name in _step_tensors(step):
            touch(name, i)
    for name in prog.outputs:
        touch(name, len(prog.steps))

    buffers = [
        Buffer(
            n,
            max(prog.tensors[n].dtype.itemsize * int(np.prod(prog.tensors[n].shape)), 1),
            first[n],
            last[n],
        )
        for n in first
    ]
    inplace = []
    for i, step in enumerate(prog.steps):
        if isinstance(step, KernelCall):
            for src in step.pointwise_reads:
                for dst in step.writes:
                    s, d = _base(prog, src), _base(prog, dst)
                    # element i of d may only overwrite element i of s: equal item sizes
                    same = prog.tensors[s].dtype.itemsize == prog.tensors[d].dtype.itemsize
                    if s in last and last[s] == i and first.get(d) == i and s != d and same:
                        inplace.append((s, d))
    mem = plan_memory(buffers, ALIGN, inplace)
    # cheap (one pass over conflict lists), so every plan ever built is checked, tests included
    check_no_overlap(buffers, mem.offsets, ALIGN, inplace)
    for name, info in prog.tensors.items():
        base = _base(prog, name)
        if base in mem.offsets:
            slots[name] = Slot("arena", mem.offsets[base], tuple(info.shape), info.dtype.str)
        elif base in slots and name != base:
            s = slots[base]
            slots[name] = Slot(s.region, s.offset, tuple(info.shape), s.dtype)

    steps: list[dict[str, Any]] = []
    kernels: dict[str, dict[str, str]] = {}
    for step in prog.steps:
        if isinstance(step, GemmCall):
            d = {f.name: getattr(step, f.name) for f in fields(step)}
            for part in ("prologue", "epilogue"):
                d[part] = _kernel_step(d[part], kernels) if d[part] is not None else None
            steps.append({"kind": "gemm", **d})
        else:
            steps.append(_kernel_step(step, kernels))
    plan = ExecutionPlan(
        mem.arena_bytes,
        slots,
        steps,
        kernels,
        list(prog.inputs),
        list(prog.outputs),
        np.frombuffer(bytes(weights), np.uint8).copy(),
    )
    plan.buffers = [(b.key, b.size, b.start, b.end, mem.offsets[b.key]) for b in buffers]
    gemms = [s for s in steps if s["kind"] == "gemm"]
    plan.stats.update(
        steps=len(steps),
        kernels=len(steps)
        - len(gemms)
        + sum(bool(g["prologue"]) + bool(g["epilogue"]) for g in gemms),
        gemms=len(gemms),
        arena_bytes=mem.arena_bytes,
        naive_bytes=mem.naive_bytes,
        lower_bound_bytes=mem.lower_bound_bytes,
        memory_strategy=mem.strategy,
        weights_bytes=len(weights),
    )
    return plan
