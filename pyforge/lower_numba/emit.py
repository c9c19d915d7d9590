"""KernelBuilder: one scalar loop body, wrapped as an @njit prange loop or a @cuda.jit grid-stride
kernel. Shapes and strides are run-time int parameters, so one source serves every shape with the
same structure and compiled kernels are shared across models and tests.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .scalar import TYPE_NAMES

HEADER = """\
import math
import numpy as np
from numba import float32 as f32, float64 as f64
from numba.core.types import float16 as f16
from numba import int8 as i8, int32 as i32, int64 as i64, uint8 as u8, boolean as b1
from numba import int16 as i16, uint16 as u16, uint32 as u32, uint64 as u64
"""

_CPU = """\
from numba import njit, prange
{tiles}{helpers}

@njit(parallel={parallel}, cache=True, nogil=True{fast})
def kernel(n, {params}):
{pre}{loop}
"""

# float32 e**x that LLVM vectorises (Numba's math.exp is one libm call per element, no SVML):
# x = k ln2 + r (ln2 in two parts), e**r by its degree-7 Taylor polynomial (|r| <= ln2 / 2:
# about 1e-7 relative), 2**k as two exponent-field halves (so k reaches the subnormals).
# ``fexpz``: the same, 0 below -87 (e**x < 1.7e-38), for sums where such a term is lost anyway
# (Softmax, attention, tanh): a subnormal result takes a microcode assist per element on Intel
# cores, and a masked Softmax row (exp(-3.4e38 - max)) ran 8x slower through fexp.
# np.floor: math.floor gives an int64, and that conversion does not vectorise on AVX2.
FEXP_CPU = """

@njit(inline="always", cache=True, nogil=True)
def fexp(x):
    c = min(max(x, f32(-104.0)), f32(88.8))
    k = np.floor(c * f32(1.4426950408889634) + f32(0.5))
    r = c - k * f32(0.693359375) - k * f32(-2.1219444e-4)
    p = f32(1 / 5040)
    for a in (f32(1 / 720), f32(1 / 120), f32(1 / 24), f32(1 / 6), f32(0.5), f32(1), f32(1)):
        p = p * r + a
    ki = np.int32(k)
    h = ki >> np.int32(1)
    y = p * np.int32((h + np.int32(127)) << np.int32(23)).view(np.float32)
    y = y * np.int32((ki - h + np.int32(127)) << np.int32(23)).view(np.float32)
    return y if x == x else x


@njit(inline="always", cache=True, nogil=True)
def fexpz(x):
    y = fexp(max(x, f32(-87.0)))
    return y if x > f32(-87.0) else (f32(0) if x == x else x)
"""
FEXP_CUDA = "\nfexp = math.exp\nfexpz = math.exp\n"

# float32 erf that vectorises (math.erf is a libm call per element): below 1, x * P(x * x);
# from 1 on, 1 - e**-x*x * Q(1 / (1 + x / 2)), |x| clamped at 4 (erf(4) rounds to 1). Both
# least-squares fits, weighted for relative error; within 1.7e-7 of math.erf in float32.
FERF_CPU = """

@njit(inline="always", cache=True, nogil=True)
def ferf(x):
    a = min(abs(x), f32(4.0))
    u = a * a
    p = f32(-5.6253991e-4)
    for c in (f32(4.9160267e-3), f32(-2.6709955e-2), f32(0.11280131), f32(-0.37612319)):
        p = p * u + c
    p = p * u + f32(1.1283791)
    t = np.true_divide(f32(1.0), f32(1.0) + f32(0.5) * a)
    q = f32(-6.0898215e-2)
    for c in (f32(-3.5456721e-2), f32(0.37702811), f32(0.11858433), f32(0.32462406)):
        q = q * t + c
    q = q * t + f32(0.27479422)
    q = q * t + f32(5.1481777e-4)
    r = a * p if a < f32(1.0) else f32(1.0) - fexp(-u) * q
    return math.copysign(r, x) if x == x else x
"""
FERF_CUDA = "\nferf = math.erf\n"
# float32 tanh that vectorises (math.tanh is a libm call per element): below 0.5 its odd Taylor
# series to x**13 (the next term is under 2e-8 relative), from 0.5 on (1 - e) / (1 + e) with
# e = e**-2|x| (no cancellation there: 1 - e > 0.63); both computed, one selected
FTANH_CPU = """

@njit(inline="always", cache=True, nogil=True)
def ftanh(x):
    a = abs(x)
    u = x * x
    p = f32(-929569 / 638512875)
    for c in (21844 / 6081075, -1382 / 155925, 62 / 2835, -17 / 315, 2 / 15, -1 / 3):
        p = p * u + f32(c)
    e = fexpz(f32(-2.0) * a)
    big = math.copysign(np.true_divide(f32(1.0) - e, f32(1.0) + e), x)
    return x * (f32(1.0) + u * p) if a < f32(0.5) else big
"""


def cpu_helpers(src: str) -> str:
    """The vectorised helpers (fexp, ferf, ftanh) a cpu kernel body calls, after the fexp they
    use."""
    erf, tanh = "ferf(" in src, "ftanh(" in src
    head = FEXP_CPU if erf or tanh or "fexp(" in src or "fexpz(" in src else ""
    return head + (FERF_CPU if erf else "") + (FTANH_CPU if tanh else "")


def cuda_helpers(src: str) -> str:
    tanh = "\nftanh = math.tanh\n" if "ftanh(" in src else ""
    return (
        (FEXP_CUDA if "fexp(" in src or "fexpz(" in src else "")
        + (FERF_CUDA if "ferf(" in src else "")
        + tanh
    )


# a parallel loop: tiles claimed from an atomic counter (exec/cpu/tiles.py), so a thread kept
# off its core by another process delays one tile, not its static share of the loop
def _runtime_mark() -> str:
    """A comment naming the exec/cpu modules a cpu kernel compiles in (Numba inlines what it
    imports from them, and its disk cache keys on the kernel's own source alone): a changed
    tiles, sgemm or pack gives every such kernel a new source, so a stale copy never runs."""
    digest = hashlib.sha1()
    for name in ("tiles.py", "sgemm.py", "pack.py"):
        digest.update((Path(__file__).parent.parent / "exec" / "cpu" / name).read_bytes())
    return f"# pyforge.exec.cpu {digest.hexdigest()[:16]}\n"


RUNTIME_MARK = _runtime_mark()
_TILES = RUNTIME_MARK + "from pyforge.exec.cpu.tiles import claim, threads, tiling\n"
_TILED = """\
    parts = threads()
    per, tiles, nxt = tiling({count}, parts)
    for _ in prange(parts):
{setup}        t = claim(nxt)
        while t < tiles:
            for {var} in range(t * per, min({count}, t * per + per)):
{body}
            t = claim(nxt)"""

_CUDA_ROWS = """\
from numba import cuda


@cuda.jit(cache=True)
def kernel(n, {params}):
{pre}    rows = n // max({inner}, 1)
    j0 = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    o = cuda.blockIdx.y
    while o < rows:
{outer}
        j = j0
        while j < {inner}:
            i = o * {inner} + j
{body}
            j += cuda.blockDim.x * cuda.gridDim.x
        o += cuda.gridDim.y
"""

_CUDA = """\
from numba import cuda


@cuda.jit(cache=True)
def kernel(n, {params}):
{pre}    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < n:
{body}
        i += step
"""


ROW_MIN = 256  # shortest inner run worth a row of threads
ROW_THREADS = 256  # cuda: one block per row of a row-statistics kernel (a power of 2)
ROW_UNROLL = 8  # cpu: partial folds of a row statistic in flight (a power of 2)
# fewest loop iterations worth cpu threads: ~0.1 ms of a simple elementwise body on one core,
# against a parallel region's few us on a quiet machine and 0.2-2 ms to wake a thread that
# another process keeps off its core on a loaded one
PARALLEL_MIN = 1 << 17


class _Specialize:
    """While on, shapes and strides are baked into kernel sources instead of passed at run time:
    a kernel per shape (more compiling), but constant divisors (much cheaper index math)."""

    on = False

    def __call__(self, on: bool) -> _Specialize:
        self._saved, _Specialize.on = _Specialize.on, on
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        _Specialize.on = self._saved


SPECIALIZE = _Specialize()


def contiguous_strides(shape: tuple[int, ...]) -> list[int]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return strides[::-1]


def broadcast_strides(in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> list[int]:
    """Element strides of an input read at output coordinates (0 on broadcast axes)."""
    pad = (1,) * (len(out_shape) - len(in_shape)) + tuple(in_shape)
    strides = contiguous_strides(pad)
    # a size-1 axis adds nothing whatever the output's size (its coordinate is 0 where that is
    # 1 too), so a source does not change with whether a batch axis is 1
    return [0 if d == 1 else s for d, s in zip(pad, strides)]


@dataclass
class KernelCall:
    """A compiled-kernel step: source text, its key, and the run-time arguments in order."""

    source_cpu: str
    source_cuda: str
    key: str
    n: int
    # ("t", tensor name) | ("w", tensor name: as 16-byte elements on cuda) | ("i", int)
    # | ("e", 0): the step's int32 error word (cuda index checks; a dummy on cpu)
    args: list[tuple[str, object]]
    label: str = ""
    inner: int = 0  # > 0: iterations are rows x inner (a 2-d launch on cuda)
    writes: list[str] = field(default_factory=list)
    pointwise_reads: list[str] = field(default_factory=list)  # read only at the written index
    # cuda: an explicit (grid, threads per block) for kernels written for one launch shape
    # (tiled, shared memory); None: the grid-stride launch every other kernel takes
    launch: tuple | None = None
    workspace: int = 0  # floats of an arena buffer lowering adds as the last argument


@dataclass
class KernelBuilder:
    """Collects parameters and body lines; ``i`` is the flat output index of the loop."""

    label: str
    params: list[str] = field(default_factory=list)
    args: list[tuple[str, object]] = field(default_factory=list)
    lines: list = field(default_factory=list)  # str, or (cpu form, cuda form)
    _tensors: dict[str, str] = field(default_factory=dict)
    _counter: int = 0
    inner: str | None = None  # the int param holding the inner run length (rows x inner loop)
    inner_value: int = 0
    inner_from: int = -1  # the first axis of the inner run
    inner_dims: list = field(default_factory=list)  # int params of the inner run's dims
    outer_lines: list = field(default_factory=list)  # coordinates of the row, once per row
    checks: list[str] = field(default_factory=list)  # cpu lines run before the loop
    setup: list[str] = field(default_factory=list)  # cpu lines run once per thread (scratch)
    hoisted: list[str] = field(default_factory=list)  # both targets: lines run before the loop
    error_word: bool = False  # cuda: the kernel takes an int32 error word ("e" argument)
    row_block: bool = False  # rows split where the caller asked: on cuda one block per row
    contract: bool = False  # cpu: a multiply then an add may be one fused multiply-add

    def check_range(
        self, src: str, count: int, dim: str, message: str, step: int = 1, start: int = 0
    ) -> None:
        """cpu: before the loop, raise IndexError(message) when any ``src[t * step + start]``
        (t < count) is outside [-dim, dim). One pass over the index tensor, not a test per output
        element (an index is often read by many elements), and the loop itself stays parallel
        (a raise inside it would make Numba run it serially). ``message`` is a str expression
        of the kernel's params. Cuda kernels cannot raise: ``guard_index`` checks there."""
        at = "t" if step == 1 else f"t * {self.int_param(step, 'st')}"
        at += f" + {start}" if start else ""
        n = self.int_param(count, "N")
        self.checks += [
            "nbad = 0",
            f"for t in prange({n}):",
            f"    if {src}[{at}] < -{dim} or {src}[{at}] >= {dim}:",
            "        nbad += 1",
            "if nbad > 0:",
            f"    raise IndexError({message})",
        ]

    def guard_index(self, var: str, dim: str) -> None:
        """cuda: an index ``var`` (negatives already wrapped) outside [0, dim) sets the kernel's
        error word and reads element 0 instead of memory past the tensor; the runtime raises
        IndexRangeError after the run. cpu: ``check_range`` raised before the loop already."""
        if not self.error_word:
            self.error_word = True
            self.params.append("err")
            self.args.append(("e", 0))
        self.emit("# index range: checked before the loop", cuda=f"if {var} < 0 or {var} >= {dim}:")
        self.emit("#", 1, cuda="err[0] = 1")
        self.emit("#", 1, cuda=f"{var} = 0")

    def tmp(self, prefix: str = "v") -> str:
        self._counter += 1
        return f"{prefix}{self._counter}"

    def tensor(self, name: str) -> str:
        if name not in self._tensors:
            p = f"t{len(self._tensors)}"
            self._tensors[name] = p
            self.params.append(p)
            self.args.append(("t", name))
        return self._tensors[name]

    def int_param(self, value: int, hint: str = "k") -> str:
        if SPECIALIZE.on:  # a literal: LLVM turns division by it into multiply and shift
            return str(int(value))
        p = f"{hint}{len(self.params)}"
        self.params.append(p)
        self.args.append(("i", int(value)))
        return p

    def scalar(self, name: str) -> str:
        """A variable holding tensor ``name``'s one element, read once before the loop: a
        trained scale as a run-time value rather than a literal in the source, so the layers
        of one structure share one compiled kernel."""
        var = f"{self.tensor(name)}s"
        line = f"{var} = {self.tensor(name)}[0]"
        if line not in self.hoisted:
            self.hoisted.append(line)
        return var

    def emit(self, line: str, indent: int = 0, cuda: str | None = None) -> None:
        """Add a body line; ``cuda`` gives a different form of it for the cuda kernel."""
        pad = "    " * indent
        self.lines.append(pad + line if cuda is None else (pad + line, pad + cuda))

    # -- rows form: statistics once per row (at the row loop's level), then the row's elements

    def at_row(self) -> _RowLevel:
        """``with kb.at_row():`` emits once per row, before the loop over the row's elements."""
        return _RowLevel(self)

    def row_reduce(
        self,
        acc: str,
        init: str,
        combine: str,
        term: str,
        L: str,
        at: str,
        t: str = "f32",
        keep="",
        at_cpu="",
        keep_cpu="",
    ) -> None:
        """At row level: ``acc`` = ``combine`` ({a}, {v}) folded over ``term`` ({v}: the element
        ``at`` + j, j < L, and {j}: that j; ``at`` is "t0[b1 + "). cpu: one contiguous pass,
        ROW_UNROLL partial folds in flight (a single one waits out each add's latency); cuda:
        each thread of the row's block a strided part, then a tree in shared memory; every thread
        holds the result.
        ``keep`` ("t1[b1 + "): each term is also stored there, for the element loop to reuse
        (on cuda the thread that stores an element is the one that later writes it). ``at_cpu``:
        the cpu's ``at`` where it differs (a view of the row, "r1[": its index j is never
        negative, so no negative-index wrap keeps the loop from vectorising); ``keep_cpu``
        likewise for ``keep``."""
        j, tid, U = self.tmp("j"), "cuda.threadIdx.x", ROW_UNROLL
        parts = [f"{acc}_{u}" for u in range(U)]

        stored = keep_cpu or keep  # cpu: the terms stored first, then folded as they are

        def fold(a: str, at_j: str, cpu: bool = False) -> list[str]:
            x = self.tmp("x")
            src = (stored if keep else at_cpu or at) if cpu else at
            lines = [f"    {x} = {src}{at_j}]"]
            if cpu and keep:
                return lines + [f"    {a} = {combine.format(a=a, v=x)}"]
            val = term.format(v=x, j=f"({at_j})")
            if keep:  # the term in a local, not read back from the store (may alias the input)
                e = self.tmp("e")
                lines += [f"    {e} = {val}", f"    {keep}{at_j}] = {e}"]
                val = e
            return lines + [f"    {a} = {combine.format(a=a, v=val)}"]

        cpu = [f"{', '.join(parts)} = {', '.join([init] * U)}"]
        if keep:  # cpu: the terms in a loop of their own, which vectorises (unrolled, it did not:
            # Softmax's exp pass ran 3x slower), then the partial folds over what it stored
            x = self.tmp("x")
            cpu += [f"for {j} in range({L}):", f"    {x} = {at_cpu or at}{j}]",
                    f"    {stored}{j}] = {term.format(v=x, j=j)}"]  # fmt: skip
        cpu.append(f"for {j} in range(0, {L} - {U - 1}, {U}):")
        for u, a in enumerate(parts):
            cpu += fold(a, f"{j} + {u}" if u else j, True)
        cpu += [f"for {j} in range({L} - {L} % {U}, {L}):", *fold(parts[0], j, True)]
        while len(parts) > 1:
            parts = [
                f"({combine.format(a=parts[k], v=parts[k + 1])})" for k in range(0, len(parts), 2)
            ]
        cpu.append(f"{acc} = {parts[0]}")
        sh, w, y, warps = self.tmp("sh"), self.tmp("w"), self.tmp("y"), ROW_THREADS // 32
        cuda = [f"{acc} = {init}", f"for {j} in range({tid}, {L}, {ROW_THREADS}):"]
        cuda += fold(acc, j)
        if t in ("f32", "f64", "i32", "i64"):  # the types warp shuffles move
            # each warp's lanes by shuffles, then every thread folds the warps' partials in
            # order: two barriers, where a tree in shared memory took one per level
            cuda += [
                f"{w} = 16",
                f"while {w} > 0:",
                f"    {y} = cuda.shfl_xor_sync(0xFFFFFFFF, {acc}, {w})",  # once: a collective
                f"    {acc} = {combine.format(a=acc, v=y)}",
                f"    {w} //= 2",
                f"{sh} = cuda.shared.array({warps}, {t})",
                f"if {tid} % 32 == 0:",
                f"    {sh}[{tid} // 32] = {acc}",
                "cuda.syncthreads()",
                f"{acc} = {sh}[0]",
                f"for {w} in range(1, {warps}):",
                f"    {y} = {sh}[{w}]",
                f"    {acc} = {combine.format(a=acc, v=y)}",
                "cuda.syncthreads()",  # every thread has read them before the next row's
            ]
        else:
            cuda += [
                f"{sh} = cuda.shared.array({ROW_THREADS}, {t})",
                f"{sh}[{tid}] = {acc}",
                "cuda.syncthreads()",
                f"{w} = {ROW_THREADS // 2}",
                f"while {w} > 0:",
                f"    if {tid} < {w}:",
                f"        {sh}[{tid}] = {combine.format(a=f'{sh}[{tid}]', v=f'{sh}[{tid} + {w}]')}",
                "    cuda.syncthreads()",
                f"    {w} //= 2",
                f"{acc} = {sh}[0]",
                "cuda.syncthreads()",  # every thread has read it before the next row's tree
            ]
        with self.at_row():
            self.lines += [(ln, None) for ln in cpu] + [(None, ln) for ln in cuda]

    def coords(
        self, shape: tuple[int, ...], flat: str = "i", split: int | None = None
    ) -> list[str]:
        """Emit the decomposition of ``flat`` into coordinates of ``shape``.

        The first decomposition of the loop index splits the shape into outer rows (from ``o``)
        and an inner run of at least ROW_MIN elements (from ``j``): the loop is then rows x
        inner on both targets, outer coordinates are loop-invariant in the inner loop, and a
        broadcast operand that only needs outer coordinates costs no division per element.
        """
        if not shape:
            return []
        if flat != "i" or self.inner is not None or (len(shape) < 2 and split is None):
            return self._decompose(shape, flat)
        # ``split``: the caller's rows (a rows-form kernel's statistics are per row)
        self.row_block = split is not None
        if split is None:
            split = len(shape) - 1
            while split > 0 and int(np.prod(shape[split:])) < ROW_MIN:
                split -= 1
        self.inner_value, self.inner_from = int(np.prod(shape[split:])), split
        self.inner = self.int_param(self.inner_value, "IN")
        # outer coordinates go at the row loop's level: a division may raise, so LLVM will not
        # hoist it out of an inner loop that might run zero times
        body, self.lines = self.lines, self.outer_lines
        outer = self._decompose(shape[:split], "o") if split else []
        self.lines = body
        # cpu: one nested loop per inner dim, so no coordinate needs a division;
        # cuda: one thread per element of the run, coordinates divided out of j
        self.inner_dims = [self.int_param(d, "D") for d in shape[split:]]
        names = [self.tmp("c") for _ in self.inner_dims]
        rem = "j"
        for axis in range(len(names) - 1, -1, -1):
            if axis == 0:
                self.emit(f"{names[0]} = q0", cuda=f"{names[0]} = {rem}")
                break
            nxt = self.tmp("r")
            d = self.inner_dims[axis]
            self.emit(f"{names[axis]} = q{axis}", cuda=f"{names[axis]} = {rem} % {d}")
            self.emit(f"{nxt} = 0", cuda=f"{nxt} = {rem} // {d}")
            rem = nxt
        return outer + names

    def _decompose(self, shape: tuple[int, ...], flat: str) -> list[str]:
        if not shape:
            return []
        names = [self.tmp("c") for _ in shape]
        rem = flat
        for axis in range(len(shape) - 1, 0, -1):
            d = self.int_param(shape[axis], "d")
            nxt = self.tmp("r")
            self.emit(f"{names[axis]} = {rem} % {d}")
            self.emit(f"{nxt} = {rem} // {d}")
            rem = nxt
        self.emit(f"{names[0]} = {rem}")
        return names

    def offset(self, strides: list[int], coords: list[str]) -> str:
        terms = []
        for s, c in zip(strides, coords):
            if s == 0:
                continue
            terms.append(c if s == 1 else f"{c} * {self.int_param(s, 's')}")
        return " + ".join(terms) or "0"

    def _body(self, target: int, indent: str) -> str:
        return self._lines(self.lines, target, indent)

    def _cpu_body(self, indent: str) -> str:
        """The cpu body, its direct ``[i]`` reads and writes through an unsigned copy of ``i``:
        Numba then skips the negative-index wrap, which keeps LLVM from vectorising the loop
        (Numba's own prange does the same for its loop index)."""
        body = self._body(0, indent)
        return f"{indent}iu = u64(i)\n" + body.replace("[i]", "[iu]") if "[i]" in body else body

    @staticmethod
    def _lines(lines: list, target: int, indent: str) -> str:
        forms = (ln if isinstance(ln, str) else ln[target] for ln in lines)
        return "\n".join(indent + ln for ln in forms if ln is not None)

    def build(self, n: int, parallel: bool | None = None) -> KernelCall:
        # threads pay only on large loops, and a parallel (parfor) compile costs several times
        # a serial one: small kernels, the bulk of ONNX's node tests, are compiled serial
        parallel = n >= PARALLEL_MIN if parallel is None else parallel
        params = ", ".join(self.params)
        hoisted = "".join(f"    {line}\n" for line in self.hoisted)
        pre = hoisted + "".join(f"    {line}\n" for line in self.checks)
        ind = " " * (16 if parallel else 8)  # the tiled loop nests the body 2 levels deeper
        if self.inner is None:
            var, count, it = "i", "n", self._cpu_body(ind)
            cuda = _CUDA.format(params=params, body=self._body(1, "        "), pre=hoisted)
        else:
            var, count, loops, j = "o", "rows", "", "0"
            pre += f"    rows = n // max({self.inner}, 1)\n"
            for k, d in enumerate(self.inner_dims):
                loops += ind + "    " * k + f"for q{k} in range({d}):\n"
                j = f"q{k}" if k == 0 else f"({j}) * {d} + q{k}"
            pad = ind + "    " * len(self.inner_dims)
            loops += f"{pad}i = o * {self.inner} + {j}\n"
            it = self._lines(self.outer_lines, 0, ind) + "\n" + loops + self._cpu_body(pad)
            outer = self._lines(self.outer_lines, 1, "        ")
            # a run over every axis (a small tensor) is the whole loop: n, not a literal holding
            # the batch (that would give every batch size its own cuda source)
            whole = self.inner_from == 0 and self.inner_value == int(n)
            cuda = _CUDA_ROWS.format(
                params=params,
                body=self._body(1, "            "),
                inner="n" if whole else self.inner,
                outer=outer,
                pre=hoisted,
            )
        loop = f"    for {var} in prange({count}):\n{it}"
        if parallel:
            setup = "".join(f"        {line}\n" for line in self.setup)
            loop = _TILED.format(count=count, var=var, body=it, setup=setup)
        else:
            pre += "".join(f"    {line}\n" for line in self.setup)
        tiles = _TILES if parallel else ""
        helpers = cpu_helpers(loop)
        # where fexp / ferf are inlined, their polynomials as fused multiply-adds: no less exact,
        # and without it each step is a multiply and an add (EfficientNet's SiLU 0.40 -> 0.26 ms)
        fast = ', fastmath={"contract"}' if helpers or self.contract else ""
        cpu = _CPU.format(
            params=params,
            parallel=parallel,
            pre=pre,
            tiles=tiles,
            loop=loop,
            helpers=helpers,
            fast=fast,
        )
        cpu = HEADER + "\n" + cpu
        cuda = HEADER + cuda_helpers(cuda) + "\n" + cuda
        key = hashlib.sha1(cpu.encode() + cuda.encode()).hexdigest()[:16]
        call = KernelCall(cpu, cuda, key, int(n), list(self.args), self.label, self.inner_value)
        if self.row_block:  # the block's threads share each row's statistics
            call.launch = ((1, max(1, min(int(n) // max(self.inner_value, 1), 65535))), ROW_THREADS)
        return call


class _RowLevel:
    def __init__(self, kb: KernelBuilder) -> None:
        self.kb = kb

    def __enter__(self) -> None:
        self.kb.lines, self.kb.outer_lines = self.kb.outer_lines, self.kb.lines

    def __exit__(self, *exc) -> None:
        self.kb.lines, self.kb.outer_lines = self.kb.outer_lines, self.kb.lines


def type_name(dtype: np.dtype) -> str:
    return TYPE_NAMES[np.dtype(dtype)]
