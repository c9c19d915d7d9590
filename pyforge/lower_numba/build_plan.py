"""Lowering's last stage: a Program becomes an ExecutionPlan (weights, arena offsets, and the
typed steps the runtimes read), every kernel source stored in ``plan.kernels``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import UnsupportedOperatorError
from ..exec.plan import ExecutionPlan, Slot
from ..exec.steps import ConvGeometry, EpiloguePattern, GemmStep, KernelStep, Step, kernel_steps
from ..opt.memory_plan import Buffer, check_no_overlap, plan_memory
from .emit import KernelCall
from .gemm_kernel import gemm_kernel
from .lower import GemmCall, Program

ALIGN = 256


def _base(prog: Program, name: str) -> str:
    return _base_at(prog, name)[0]


def _size(prog: Program, name: str) -> int:
    return int(np.prod(prog.tensors[name].shape))


def _base_at(prog: Program, name: str) -> tuple[str, int]:
    """The tensor whose bytes ``name`` views, and the byte where the view starts."""
    at = 0
    while prog.tensors[name].alias is not None:
        at += prog.tensors[name].offset
        name = prog.tensors[name].alias
    return name, at


def _kernel_step(k: KernelCall, kernels: dict[str, dict[str, str]]) -> KernelStep:
    kernels[k.key] = {"cpu": k.source_cpu, "cuda": k.source_cuda}
    return _as_step(k)


def _as_step(k: KernelCall) -> KernelStep:
    launch = None
    if k.launch:
        launch = (tuple(int(g) for g in k.launch[0]), int(k.launch[1]))
    return KernelStep(
        kernel=k.key,
        n=int(k.n),
        args=tuple((kind, int(v) if kind in ("i", "e") else v) for kind, v in k.args),
        label=k.label,
        inner=int(k.inner),
        launch=launch,
    )


def _gemm_step(g: GemmCall, prog: Program, kernels: dict[str, dict[str, str]]) -> GemmStep:
    fallback = gemm_kernel(g, prog.tensors[g.d].dtype)
    # a cuda-only kernel: the cpu target never runs it (it has numpy's matmul)
    kernels.setdefault(fallback.key, {"cuda": fallback.source_cuda})
    pattern = EpiloguePattern(**g.pattern) if g.pattern else None
    conv = None
    if g.conv:
        conv = ConvGeometry(g.conv["x"], g.conv["col"], tuple(int(v) for v in g.conv["geometry"]))
    return GemmStep(
        a=g.a,
        b=g.b,
        d=g.d,
        m=int(g.m),
        n=int(g.n),
        k=int(g.k),
        lda=int(g.lda),
        ldb=int(g.ldb),
        ldd=int(g.ldd),
        trans_a=bool(g.trans_a),
        trans_b=bool(g.trans_b),
        batch=int(g.batch),
        stride_a=int(g.stride_a),
        stride_b=int(g.stride_b),
        stride_d=int(g.stride_d),
        alpha=float(g.alpha),
        beta=float(g.beta),
        c=g.c,
        ldc=int(g.ldc),
        stride_c=int(g.stride_c),
        label=g.label,
        prologue=_kernel_step(g.prologue, kernels) if g.prologue is not None else None,
        epilogue=_kernel_step(g.epilogue, kernels) if g.epilogue is not None else None,
        pattern=pattern,
        conv=conv,
        fallback=_as_step(fallback),
    )


def typed_steps(prog: Program) -> tuple[list[Step], dict[str, dict[str, str]]]:
    """The program's calls as plan steps, and every kernel source they name."""
    kernels: dict[str, dict[str, str]] = {}
    steps: list[Step] = [
        _gemm_step(s, prog, kernels) if isinstance(s, GemmCall) else _kernel_step(s, kernels)
        for s in prog.steps
    ]
    return steps, kernels


def refuse_float16(prog: Program, steps: list[Step]) -> None:
    """Numba has no float16 on cpu: refuse now, not at run. Cuda kernels read float16 only
    under precision="fp16", where the fp16 pass gives it to ops whose kernels widen every load
    (float16 arithmetic would link NVRTC-built code, which Numba's kernel cache cannot save)."""
    for part in kernel_steps(steps):
        for name in part.tensors():
            if prog.tensors[name].dtype == np.float16:
                op, _, where = part.label.partition(" ")
                raise UnsupportedOperatorError(
                    op, where, None, f"float16 tensor {name!r}: no float16 kernels"
                )


def build_plan(
    prog: Program,
    float16: bool = False,
    state: dict[str, str] | None = None,
    like: Sequence[ExecutionPlan] = (),
) -> ExecutionPlan:
    """Assign weights and arena offsets (liveness-planned) and type the steps; ``float16``
    allows float16 tensors in kernels (precision="fp16" on cuda), else they are refused.
    ``state`` {output: input}: each pair one slot of the "state" region, outside the arena.
    ``like``: plans (of the same model) whose weights array this one takes, not a copy, when
    its constants are the same bytes at the same offsets."""
    steps, kernels = typed_steps(prog)
    if not float16:
        refuse_float16(prog, steps)
    slots, weights, sources = _weight_slots(prog, like)
    # a conv whose windows the cpu's own sgemm reads in place needs no column matrix there: it
    # is not planned into the arena, and a runtime that needs it after all makes it at bind
    scratch = {
        s.conv.col for s in steps if isinstance(s, GemmStep) and s.conv and s.conv.reads_windows()
    }
    for name in scratch:
        info = prog.tensors[name]
        slots[name] = Slot("scratch", 0, tuple(info.shape), info.dtype.str)
    state_bytes = 0
    for out, inp in (state or {}).items():  # both names one buffer, kept across calls
        info = prog.tensors[inp]
        slots[inp] = slots[out] = Slot("state", state_bytes, tuple(info.shape), info.dtype.str)
        state_bytes += -(-slots[inp].nbytes // ALIGN) * ALIGN
    buffers, inplace = _live_ranges(prog, steps, scratch | set(slots))
    mem = plan_memory(buffers, ALIGN, inplace)
    # cheap (one pass over conflict lists), so every plan ever built is checked, tests included
    check_no_overlap(buffers, mem.offsets, ALIGN, inplace)
    for name, info in prog.tensors.items():
        base, at = _base_at(prog, name)
        if base in mem.offsets:
            slots[name] = Slot("arena", mem.offsets[base] + at, tuple(info.shape), info.dtype.str)
        elif base in slots and name != base:
            s = slots[base]
            slots[name] = Slot(s.region, s.offset + at, tuple(info.shape), s.dtype)
    plan = ExecutionPlan(
        mem.arena_bytes,
        slots,
        steps,
        kernels,
        [n for n in prog.inputs if n not in (state or {}).values()],  # state is never fed
        list(prog.outputs),
        weights,
        state=dict(state or {}),
        state_bytes=state_bytes,
    )
    plan.buffers = [(b.key, b.size, b.start, b.end, mem.offsets[b.key]) for b in buffers]
    plan.weight_sources = sources  # not saved: what a later plan's build compares against
    plan.stats.update(
        steps=len(steps),
        kernels=len(kernel_steps(steps)),  # GEMM fallbacks not counted: cuBLASLt is the rule
        gemms=sum(isinstance(s, GemmStep) for s in steps),
        arena_bytes=mem.arena_bytes,
        naive_bytes=mem.naive_bytes,
        lower_bound_bytes=mem.lower_bound_bytes,
        memory_strategy=mem.strategy,
        weights_bytes=len(weights),
        scratch_bytes=max((slots[n].nbytes for n in scratch), default=0),  # if made at all
        state_bytes=state_bytes,  # kept across calls, one buffer for every plan of a model
    )
    return plan


def _weight_slots(
    prog: Program, like: Sequence[ExecutionPlan] = ()
) -> tuple[dict[str, Slot], np.ndarray, dict[str, np.ndarray]]:
    """Every constant laid out, ALIGN-aligned, in one weights buffer (each copied in once, or
    a plan of ``like``'s buffer when it holds the same bytes there); and the read-only
    constants among them, which a later build may take as equal by identity alone."""
    slots: dict[str, Slot] = {}
    end = 0
    for name, info in prog.tensors.items():
        if info.const is not None and info.alias is None:
            off = -(-end // ALIGN) * ALIGN
            slots[name] = Slot("weights", off, tuple(info.shape), info.dtype.str)
            end = off + slots[name].nbytes
    consts = {name: prog.tensors[name].const for name in slots}
    sources = {n: a for n, a in consts.items() if not a.flags.writeable}
    for other in like:
        if _holds(other, slots, consts, end):
            return slots, other.weights, other.weight_sources
    weights = np.zeros(end, np.uint8)
    for name, s in slots.items():
        weights[s.offset : s.offset + s.nbytes].view(s.dtype)[:] = np.ravel(consts[name])
    return slots, weights, sources


def _holds(
    plan: ExecutionPlan, slots: dict[str, Slot], consts: dict[str, np.ndarray], end: int
) -> bool:
    """Whether ``plan``'s weights array holds each constant at its slot: the same read-only
    array it was built from, or equal values."""
    known = getattr(plan, "weight_sources", None)
    if known is None or plan.weights.nbytes != end:
        return False
    for name, s in slots.items():
        if plan.slots.get(name) != s:
            return False
        a = consts[name]
        if known.get(name) is a:
            continue  # read-only, so unchanged since that plan copied it
        there = plan.weights[s.offset : s.offset + s.nbytes].view(s.dtype).reshape(s.shape)
        if not np.array_equal(there, np.asarray(a, s.dtype)):
            return False
    return True


def _live_ranges(
    prog: Program, steps: list[Step], scratch: set[str]
) -> tuple[list[Buffer], list[tuple[str, str]]]:
    """The arena's buffers (first and last step each is live; none for ``scratch``) and the
    (source, destination) pairs a pointwise kernel may compute in place."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}

    def touch(name: str, i: int) -> None:
        base = _base(prog, name)
        if prog.tensors[base].const is not None or base in scratch:
            return
        first.setdefault(base, i)
        first[base] = min(first[base], i)
        last[base] = max(last.get(base, i), i)

    for name in prog.inputs:
        touch(name, 0)
    for i, step in enumerate(steps):
        for name in step.tensors():
            touch(name, i)
    for name in prog.outputs:
        touch(name, len(steps))
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
                    (s, at), d = _base_at(prog, src), _base(prog, dst)
                    # element i of d may only overwrite element i of s: equal item sizes
                    same = prog.tensors[s].dtype.itemsize == prog.tensors[d].dtype.itemsize
                    # and src is all of s: a view at an offset would read what d overwrote
                    same = same and at == 0 and _size(prog, s) == _size(prog, src)
                    if s in last and last[s] == i and first.get(d) == i and s != d and same:
                        inplace.append((s, d))
    return buffers, inplace
