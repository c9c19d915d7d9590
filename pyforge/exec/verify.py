"""Checks a loaded plan's slots and steps against each other and the region sizes, before any
kernel is bound: a damaged or hostile plan.json becomes a ``ModelLoadError`` naming the slot or
step and the field, never an out-of-bounds read or write.

Kernels index their tensors without bounds checks, so every size a step hands them must stay
inside that tensor's slot, and every slot inside its region.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import ModelLoadError
from .steps import TENSOR_ARGS, ConvGeometry, EpiloguePattern, GemmStep, KernelStep

if TYPE_CHECKING:
    from .plan import ExecutionPlan

DTYPES = frozenset(
    np.dtype(t)
    for t in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
    + ("float16", "float32", "float64")
)


def _fail(where: str, field: str, why: str) -> ModelLoadError:
    return ModelLoadError(f"plan.json: {where}, field {field!r}: {why}")


def is_count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def check_plan(plan: ExecutionPlan) -> None:
    """Every slot inside its region, every step's tensors known and its sizes inside them."""
    if not is_count(plan.arena_bytes):
        raise _fail("the plan", "arena_bytes", f"{plan.arena_bytes!r} is not a size")
    # a scratch slot (a column matrix the cpu's own sgemm does without) starts a buffer of its
    # own, which the runtime allocates only where a step it binds needs it
    scratch = [s.nbytes for s in plan.slots.values() if s.region == "scratch"]
    sizes = {"arena": plan.arena_bytes, "weights": int(plan.weights.size)}
    sizes["scratch"] = max(scratch, default=0)
    if not is_count(plan.state_bytes):
        raise _fail("the plan", "state_bytes", f"{plan.state_bytes!r} is not a size")
    sizes["state"] = plan.state_bytes
    for out, inp in plan.state.items():  # an output and the input it aliases: one state slot
        a, b = plan.slots.get(out), plan.slots.get(inp) if isinstance(inp, str) else None
        if (
            out not in plan.outputs
            or a is None
            or a.region != "state"
            or a != b
            or inp in plan.inputs
        ):
            raise _fail("the plan", "state", f"{out!r}: {inp!r} is not an output and a state slot")
    for name, slot in plan.slots.items():
        check_slot(name, slot, sizes)
    for field in ("inputs", "outputs"):
        for name in getattr(plan, field):
            if name not in plan.slots:
                raise _fail("the plan", field, f"names {name!r}, which has no slot")
    for name in plan.inputs:  # predict writes inputs: never into the weights every call shares
        if plan.slots[name].region != "arena":
            raise _fail(f"slot {name!r}", "region", "an input must live in the arena")
    for i, step in enumerate(plan.steps):
        where = f"step {i} ({step.label or type(step).__name__})"
        if isinstance(step, GemmStep):
            _check_gemm(plan, step, where)
        else:
            _check_kernel(plan, step, where)


def check_slot(name: str, slot, sizes: dict[str, int]) -> None:
    where = f"slot {name!r}"
    if slot.region not in sizes:
        raise _fail(
            where, "region", f"{slot.region!r} is not 'arena', 'weights', 'scratch' or 'state'"
        )
    if not is_count(slot.offset):
        raise _fail(where, "offset", f"{slot.offset!r} is not a byte offset")
    if not all(is_count(d) for d in slot.shape):
        raise _fail(where, "shape", f"{list(slot.shape)!r} is not a list of sizes")
    try:
        dtype = np.dtype(slot.dtype)
    except TypeError:
        dtype = None
    if dtype not in DTYPES:
        raise _fail(where, "dtype", f"{slot.dtype!r} is not a tensor dtype pyforge uses")
    if slot.offset % dtype.itemsize:
        raise _fail(where, "offset", f"{slot.offset} is not aligned to its {dtype} elements")
    end = slot.offset + slot.nbytes
    if end > sizes[slot.region]:
        raise _fail(
            where,
            "offset",
            f"bytes {slot.offset}..{end} reach past the {slot.region} ({sizes[slot.region]} bytes)",
        )


def _numel(plan: ExecutionPlan, name: object, where: str, field: str) -> int:
    if not isinstance(name, str) or name not in plan.slots:
        raise _fail(where, field, f"names tensor {name!r}, which has no slot")
    return int(np.prod(plan.slots[name].shape, dtype=np.int64))


def _check_kernel(plan: ExecutionPlan, step: KernelStep, where: str) -> None:
    if not isinstance(step.kernel, str) or step.kernel not in plan.kernels:
        raise _fail(where, "kernel", f"{step.kernel!r} is not one of the plan's kernels")
    for field in ("n", "inner"):
        if not is_count(getattr(step, field)):
            raise _fail(where, field, f"{getattr(step, field)!r} is not a count")
    largest = 0
    for j, arg in enumerate(step.args):
        if not isinstance(arg, tuple) or len(arg) != 2 or arg[0] not in (*TENSOR_ARGS, "i", "e"):
            raise _fail(where, f"args[{j}]", f"{arg!r} is not a kernel argument")
        kind, value = arg
        if kind in TENSOR_ARGS:
            largest = max(largest, _numel(plan, value, where, f"args[{j}]"))
            if kind == "w" and plan.slots[value].nbytes % 16:
                raise _fail(where, f"args[{j}]", f"{value!r} is not a whole number of 16 bytes")
        elif not isinstance(value, int) or isinstance(value, bool):
            raise _fail(where, f"args[{j}]", f"{value!r} is not an int")
    # a kernel runs one iteration per element of its largest tensor at most (its output, or
    # the input it reduces): more would index past every one of them
    if step.n > max(largest, 1):
        raise _fail(where, "n", f"{step.n} iterations, but its largest tensor has {largest}")
    if step.launch is not None:
        grid, threads = step.launch
        if not (grid and all(1 <= g <= 2**31 - 1 for g in grid) and 1 <= threads <= 1024):
            raise _fail(where, "launch", f"{step.launch!r} is not a cuda grid and block")


_GEMM_INTS = ("m", "n", "k", "lda", "ldb", "ldd", "batch", "stride_a", "stride_b", "stride_d")
_GEMM_INTS += ("ldc", "stride_c")


def _check_gemm(plan: ExecutionPlan, g: GemmStep, where: str) -> None:
    for field in _GEMM_INTS:
        if not is_count(getattr(g, field)):
            raise _fail(where, field, f"{getattr(g, field)!r} is not a count")
    for field in ("trans_a", "trans_b"):
        if not isinstance(getattr(g, field), bool):
            raise _fail(where, field, f"{getattr(g, field)!r} is not true or false")
    for field in ("alpha", "beta"):
        v = getattr(g, field)
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise _fail(where, field, f"{v!r} is not a number")
    if plan.slots.get(g.d) is not None and plan.slots[g.d].region != "arena":
        raise _fail(where, "d", f"the GEMM would write {g.d!r}, a weight")
    m, n, k = g.m, g.n, g.k
    ak = ((k, m), "a", "lda", "stride_a") if g.trans_a else ((m, k), "a", "lda", "stride_a")
    bk = ((n, k), "b", "ldb", "stride_b") if g.trans_b else ((k, n), "b", "ldb", "stride_b")
    dk = ((m, n), "d", "ldd", "stride_d")
    operands = [ak, bk, dk]
    if g.c is not None:
        operands.append(((m, n), "c", "ldc" if g.ldc else "ldd", "stride_c"))
    for (rows, cols), t, ld, stride in operands:
        _reach(plan, g, where, t, getattr(g, t), rows, cols, getattr(g, ld), getattr(g, stride))
    for part in ("prologue", "epilogue", "fallback"):
        kstep = getattr(g, part)
        if kstep is not None:
            if not isinstance(kstep, KernelStep):
                raise _fail(where, part, "is not a kernel step")
            _check_kernel(plan, kstep, f"{where} {part}")
    if g.pattern is not None:
        _check_pattern(plan, g, g.pattern, where)
    if g.conv is not None:
        _check_conv(plan, g.conv, where)


def _reach(plan, g, where, field, name, rows, cols, ld, stride) -> None:
    """The last element a strided-batched operand touches lies inside its slot."""
    size = _numel(plan, name, where, field)
    if g.batch == 0 or rows == 0 or cols == 0:
        return
    last = (g.batch - 1) * stride + (rows - 1) * ld + cols - 1
    if last >= size:
        raise _fail(
            where,
            field,
            f"m={g.m} n={g.n} k={g.k} batch={g.batch} reach element {last} of {name!r}, "
            f"which has {size}",
        )


def _check_pattern(plan, g: GemmStep, pat: EpiloguePattern, where: str) -> None:
    if pat.bias is not None:
        axis = {"m": g.m, "n": g.n, None: g.n}.get(pat.bias_axis)
        if axis is None:
            raise _fail(where, "pattern.bias_axis", f"{pat.bias_axis!r} is not 'm' or 'n'")
        if _numel(plan, pat.bias, where, "pattern.bias") < axis:
            raise _fail(where, "pattern.bias", f"{pat.bias!r} is shorter than {axis}")
    if pat.residual is not None:
        _reach(plan, g, where, "pattern.residual", pat.residual, g.m, g.n, g.ldd, g.stride_d)
    if pat.act not in (None, "relu", "gelu", "relu6"):
        raise _fail(where, "pattern.act", f"{pat.act!r} is not an epilogue activation")


def _check_conv(plan, conv: ConvGeometry, where: str) -> None:
    geo = conv.geometry
    if len(geo) != 14 or not all(is_count(v) for v in geo):
        raise _fail(where, "conv.geometry", f"{list(geo)!r} is not 14 sizes")
    n, c, h, w, kh, kw = geo[:6]
    oh, ow = geo[12], geo[13]
    if _numel(plan, conv.x, where, "conv.x") < n * c * h * w:
        raise _fail(where, "conv.x", f"{conv.x!r} is smaller than its geometry's image")
    if _numel(plan, conv.col, where, "conv.col") < n * c * kh * kw * oh * ow:
        raise _fail(where, "conv.col", f"{conv.col!r} is smaller than its geometry's columns")
