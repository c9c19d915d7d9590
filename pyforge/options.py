"""The options of ``pyforge.compile`` and ``pyforge.load``: typed, documented, checked up front.

A field left ``None`` takes its target's default when the options are resolved for a target;
every name and value is checked before the model is read, and an option its target does not
take is refused (``OptionError``), never ignored.

>>> opts = pyforge.CompileOptions(precision="tf32").resolve("cuda")
>>> opts.layout, opts.specialize
('nhwc', True)
"""

from __future__ import annotations

import difflib
import numbers
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from .errors import OptionError

TARGETS = ("cpu", "cuda")

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: called as each compile stage starts (done=0) and ends
(done=total); "passes" also after each pass, "bind" and "jit" after each step. Stages: import,
passes, lowering, plan, bind, jit."""

# the values each option takes: a tuple of choices, bool, or a (pattern, example) pair
_BOOL = (True, False)
_COUNT = (int, "a positive int")
_SHAPES = (dict, "{input name: shape}, e.g. {'x': (4, 256)}")
_BUCKETS = (dict, "{dim name: sizes}, one dim, e.g. {'seq': [16, 32, 64, 128]}")
_STATE = (dict, "{output name: input name}, e.g. {'present.0.key': 'past_key_values.0.key'}")
_TILE = re.compile(r"\d+x\d+x\d+/\d+x\d+(/s\d+)?")
_VALUES: dict[str, Any] = {
    "layout": ("nchw", "nhwc"),
    "conv": ("im2col", "implicit"),
    "conv_tile": (_TILE, "'64x32x16/4x4' or '64x32x16/4x4/s2' (BMxBNxBK/TMxTN[/sSPLIT])"),
    "precision": ("fp32", "tf32", "fp16"),
    "specialize": _BOOL,
    "fusion": _BOOL,
    "verify": _BOOL,
    "input_shapes": _SHAPES,
    "max_plans": _COUNT,
    "buckets": _BUCKETS,
    "memory_limit": _COUNT,
    "fused_steps": _BOOL,
    "own_gemm": _BOOL,
    "graph": _BOOL,
    "library_epilogues": _BOOL,
    "max_concurrency": _COUNT,
    "optimizer": ("greedy", "egraph"),
    "state": _STATE,
    "attention_rows": _COUNT,
}
# the one target an option applies to, or the one target a value of it needs
_ONLY_ON = {"fused_steps": "cpu", "own_gemm": "cpu", "graph": "cuda", "library_epilogues": "cuda"}
_VALUE_ONLY_ON = {("precision", "tf32"): "cuda", ("precision", "fp16"): "cuda"}
_VALUE_ONLY_ON[("optimizer", "egraph")] = "cpu"  # its kernel costs are measured on cpu only


def _allowed(name: str) -> str:
    spec = _VALUES[name]
    if spec is _BOOL:
        return "True or False"
    if spec is _COUNT:
        return spec[1]
    if isinstance(spec[0], re.Pattern) or spec in (_SHAPES, _BUCKETS, _STATE):
        return spec[1]
    return ", ".join(repr(v) for v in spec)


def _check_value(name: str, value: Any) -> None:
    spec = _VALUES[name]
    if spec is _BOOL:
        ok = isinstance(value, bool)
    elif spec is _COUNT:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    elif spec is _SHAPES:
        ok = isinstance(value, Mapping)
    elif spec is _BUCKETS:
        sizes = next(iter(value.values())) if isinstance(value, Mapping) and len(value) == 1 else []
        ok = isinstance(sizes, (list, tuple)) and bool(sizes) and all(_is_size(d) for d in sizes)
        ok = ok and all(isinstance(k, str) for k in value)
    elif spec is _STATE:  # distinct names, no output aliasing itself or two outputs one input
        pairs = list(value.items()) if isinstance(value, Mapping) else [(0, 0)]
        names = [n for pair in pairs for n in pair]
        ok = all(isinstance(n, str) and n for n in names) and len(set(names)) == len(names)
    elif isinstance(spec[0], re.Pattern):
        ok = isinstance(value, str) and spec[0].fullmatch(value) is not None
    else:
        ok = isinstance(value, str) and value in spec
    if not ok:
        close = []
        if isinstance(value, str) and isinstance(spec[0], str):
            close = difflib.get_close_matches(value.lower(), spec, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise OptionError(
            name, f"{name}={value!r} is not allowed{hint}; {name} takes {_allowed(name)}"
        )


def _check_fields(obj: Any) -> None:
    for f in fields(obj):
        value = getattr(obj, f.name)
        if value is not None:
            _check_value(f.name, value)


def _check_target(target: str | None) -> None:
    if target is not None and target not in TARGETS:
        raise OptionError("target", f"target={target!r} is not allowed; use 'cpu' or 'cuda'")


def _refuse_off_target(obj: Any, target: str) -> None:
    for f in fields(obj):
        value = getattr(obj, f.name)
        if value is None:
            continue
        value_on = _VALUE_ONLY_ON.get((f.name, value)) if isinstance(value, str) else None
        need = _ONLY_ON.get(f.name) or value_on
        if need is not None and need != target:
            raise OptionError(
                f.name, f"{f.name}={value!r} applies to the {need} target only, not {target}"
            )


@dataclass(frozen=True)
class CompileOptions:
    """How ``pyforge.compile`` builds the plan (saved with it; ``load`` cannot change them).

    layout      "nchw" | "nhwc" (cuda default "nhwc": cuBLASLt folds conv epilogues; cpu "nchw")
    conv        "im2col" (default) | "implicit": one implicit-GEMM kernel per channels-last
                conv (needs layout="nhwc")
    conv_tile   "BMxBNxBK/TMxTN[/sSPLIT]", e.g. "64x32x16/4x4": the implicit-GEMM tile
                (needs conv="implicit"; default: chosen per conv)
    precision   "fp32" (default) | "tf32" | "fp16" (tf32 and fp16: cuda only)
    specialize  bake shapes into kernel sources (cuda default True, cpu False: shape-generic
                kernels compiled once and shared across models)
    fusion      fuse ops into kernel groups (default True; False: one kernel per op)
    verify      check the IR after every pass (default True)
    input_shapes  {input name: shape}: fixes those inputs' shapes, and every symbolic dim they
                bind, before any work (default: none; a dim left free is bound by ``predict``)
    max_plans   plans (one per input signature) a model keeps, least recently used evicted
                (default 8)
    buckets     {dim name: sizes}: ``predict`` pads that dim up to the next size and cuts the
                outputs back, so one plan serves every length up to it; pyforge masks each
                op that mixes positions, and refuses the option (naming the node) where it
                cannot make padding exact (``frontend/buckets.py``)
    memory_limit  bytes the plan's arena and weights may take, checked before they are
                allocated (default: 75% of physical memory)
    optimizer   "greedy" (default) | "egraph": cpu only; per GEMM, by branch and bound over its
                kernels' costs measured here at the machine's load (opt/egraph/): GEMMs sharing
                an input merged or apart, own sgemm or OpenBLAS, split over threads or on one
    attention_rows  the longest query one FusedAttention kernel takes where the head is 128
                or wider (cuda default 64: above it GEMMs around a row softmax measured faster,
                Gemma's 1024-token prefill attention 1.93 -> 0.24 ms on the H200; narrower
                heads, fused faster at 128 rows, are fused at every length; cpu: every length)
    state       {output: input}: each pair is one buffer kept across calls (a KV cache), outside
                the arena, never fed; the op making the output (a ScatterND into the input)
                writes it in place; ``predict`` returns it as a view

    >>> pyforge.compile("mlp.onnx", options=pyforge.CompileOptions(fusion=False))
    >>> pyforge.compile("bert.onnx", input_shapes={"input_ids": (1, 128)})
    """

    layout: str | None = None
    conv: str | None = None
    conv_tile: str | None = None
    precision: str | None = None
    specialize: bool | None = None
    fusion: bool | None = None
    verify: bool | None = None
    input_shapes: Mapping[str, tuple[int, ...]] | None = None
    max_plans: int | None = None
    buckets: Mapping[str, tuple[int, ...]] | None = None
    memory_limit: int | None = None
    optimizer: str | None = None
    state: Mapping[str, str] | None = None
    attention_rows: int | None = None

    def __post_init__(self) -> None:
        _check_fields(self)
        if self.state is not None:
            object.__setattr__(self, "state", dict(self.state))
        if self.input_shapes is not None:  # a private copy: the caller's dict may change later
            object.__setattr__(self, "input_shapes", _shapes(self.input_shapes))
        if self.buckets is not None:
            dims = {k: tuple(sorted({int(d) for d in v})) for k, v in self.buckets.items()}
            object.__setattr__(self, "buckets", dims)

    def resolve(self, target: str | None) -> CompileOptions:
        """Every field filled with ``target``'s default; an option the target does not take is
        refused. ``target=None``: no target check, the target-independent defaults (nchw,
        shape-generic kernels), as the pipeline alone needs.

        >>> pyforge.CompileOptions().resolve("cpu").layout
        'nchw'
        """
        _check_target(target)
        if target is not None:
            _refuse_off_target(self, target)
        cuda = target == "cuda"
        r = replace(
            self,
            layout=_default(self.layout, "nhwc" if cuda else "nchw"),
            conv=_default(self.conv, "im2col"),
            precision=_default(self.precision, "fp32"),
            specialize=_default(self.specialize, cuda),
            fusion=_default(self.fusion, True),
            verify=_default(self.verify, True),
            max_plans=_default(self.max_plans, 8),
            optimizer=_default(self.optimizer, "greedy"),
            attention_rows=_default(self.attention_rows, 64 if cuda else 1 << 30),
        )
        if r.conv == "implicit" and r.layout != "nhwc":
            raise OptionError("conv", "conv='implicit' needs layout='nhwc' (it lowers NHWC convs)")
        if r.conv_tile is not None and r.conv != "implicit":
            raise OptionError(
                "conv_tile", "conv_tile is the implicit-GEMM tile: needs conv='implicit'"
            )
        return r


@dataclass(frozen=True)
class RuntimeOptions:
    """How a runtime executes a plan; given to ``compile`` or ``load``. Each applies to one target.

    fused_steps        cpu: a GEMM step's prologue, GEMM and epilogue in one compiled call
                       (default True; False: three calls, for debugging)
    own_gemm           cpu: pyforge's own AVX2 float32 GEMM where the CPU has AVX2 + FMA
                       (default True; False: OpenBLAS through numpy)
    graph              cuda: replay the inference as one captured CUDA graph (default True;
                       False: launch step by step, for debugging)
    library_epilogues  cuda: let cuBLASLt apply bias/Relu epilogues (default True)
    max_concurrency    both: how many ``predict`` calls run at once, each in its own execution
                       context (arena, staging; on cuda a stream and a captured graph), made
                       at first need; further calls wait (default 2 on cpu, 4 on cuda)

    >>> pyforge.load("mlp.plan", target="cpu", runtime=pyforge.RuntimeOptions(own_gemm=False))
    """

    fused_steps: bool | None = None
    own_gemm: bool | None = None
    graph: bool | None = None
    library_epilogues: bool | None = None
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        _check_fields(self)

    def resolve(self, target: str) -> RuntimeOptions:
        """The options of ``target`` with its defaults; one for another target is refused."""
        _check_target(target)
        _refuse_off_target(self, target)
        on = [f.name for f in fields(self) if _ONLY_ON.get(f.name) == target]
        return replace(self, **{n: _default(getattr(self, n), True) for n in on})

    def runtime_kwargs(self, target: str) -> dict[str, Any]:
        """The runtime constructor's keywords for ``target`` (the fields resolved for it)."""
        r = self.resolve(target)
        # max_concurrency left None takes the runtime's own default (cpu 2, cuda 4)
        kw = {f.name: getattr(r, f.name) for f in fields(r) if _ONLY_ON.get(f.name) == target}
        if r.max_concurrency is not None:
            kw["max_concurrency"] = r.max_concurrency
        return kw


def _shapes(value: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """``input_shapes`` as {name: tuple of ints}; its names are checked against the model later,
    still before any work (``frontend/shapes.py``)."""
    out = {}
    for name, shape in value.items():
        try:
            dims = tuple(shape)
        except TypeError:
            dims = (None,)
        if not isinstance(name, str) or not all(_is_size(d) for d in dims):
            raise OptionError(
                "input_shapes",
                f"input_shapes[{name!r}]={shape!r}: input_shapes takes "
                "{input name: tuple of sizes >= 0}, e.g. {'x': (4, 256)}",
            )
        out[name] = tuple(int(d) for d in dims)
    return out


def _is_size(d: Any) -> bool:
    return isinstance(d, numbers.Integral) and not isinstance(d, bool) and d >= 0


def _default(value: Any, default: Any) -> Any:
    return default if value is None else value


COMPILE_FIELDS = tuple(f.name for f in fields(CompileOptions))
RUNTIME_FIELDS = tuple(f.name for f in fields(RuntimeOptions))


def unknown_option(name: str, known: tuple[str, ...], where: str) -> OptionError:
    """The error for an option name nobody takes, with the closest known name if any."""
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    groups = [("compile options", COMPILE_FIELDS), ("runtime options", RUNTIME_FIELDS)]
    takes = "; ".join(
        f"{g}: {', '.join(n for n in ns if n in known)}"
        for g, ns in groups
        if any(n in known for n in ns)
    )
    return OptionError(name, f"unknown option {name!r}{hint}; {where} takes {takes}")


def split_options(
    options: CompileOptions | None,
    runtime: RuntimeOptions | None,
    kwargs: Mapping[str, Any],
) -> tuple[CompileOptions, RuntimeOptions]:
    """``compile``'s options object, runtime object and keyword fields as one pair of
    options objects; a keyword that names a field the object already sets differently is
    refused.

    >>> split_options(None, None, {"fusion": False, "graph": False})[1].graph
    False
    """
    options = _typed(options, CompileOptions, "options")
    runtime = _typed(runtime, RuntimeOptions, "runtime")
    known = COMPILE_FIELDS + RUNTIME_FIELDS
    for name in kwargs:
        if name not in known:
            raise unknown_option(name, known, "compile()")
    options = _merge(options, {k: v for k, v in kwargs.items() if k in COMPILE_FIELDS}, "options")
    runtime = _merge(runtime, {k: v for k, v in kwargs.items() if k in RUNTIME_FIELDS}, "runtime")
    return options, runtime


def load_options(
    runtime: RuntimeOptions | None, kwargs: Mapping[str, Any], plan_stats: Mapping[str, Any]
) -> RuntimeOptions:
    """``load``'s runtime options; a compile option is refused (the plan is already built)."""
    runtime = _typed(runtime, RuntimeOptions, "runtime")
    for name, value in kwargs.items():
        if name in COMPILE_FIELDS:
            was = f" (this plan was compiled with {name}={plan_stats.get(name)!r})"
            raise OptionError(
                name,
                f"{name}={value!r} is a compile option: a saved plan is already compiled"
                f"{was if name in plan_stats else ''}; compile the ONNX model again to change it",
            )
        if name not in RUNTIME_FIELDS:
            raise unknown_option(name, RUNTIME_FIELDS, "load()")
    return _merge(runtime, dict(kwargs), "runtime")


def _typed(obj: Any, cls: type, name: str) -> Any:
    if obj is None:
        return cls()
    if not isinstance(obj, cls):
        raise OptionError(name, f"{name}= takes a pyforge.{cls.__name__}, not {type(obj).__name__}")
    return obj


def _merge(obj: Any, kwargs: dict[str, Any], name: str) -> Any:
    for key, value in kwargs.items():
        have = getattr(obj, key)
        if have is not None and have != value:
            raise OptionError(
                key, f"{key} given twice: {name}.{key}={have!r} and {key}={value!r}; pick one"
            )
    return replace(obj, **kwargs)
