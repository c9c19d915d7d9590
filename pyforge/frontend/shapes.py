"""Input shapes: each graph input's dims as the file gives them, fixed up front by
``compile(input_shapes=...)`` and bound per call by ``predict``: one signature per plan.

A dim is an int (fixed by the file or by ``input_shapes``), a str (an ONNX ``dim_param``: one
symbol, so every input that names it binds it to one value) or None (no value, no name: free on
its own). A signature is one concrete shape per input.

>>> specs = fix_shapes(input_specs(proto), {"input_ids": (1, 128)})
>>> bind(specs, {"input_ids": (1, 128), "attention_mask": (1, 128)})
{'input_ids': (1, 128), 'attention_mask': (1, 128)}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError, OptionError, ShapeError

Dim = int | str | None


@dataclass(frozen=True)
class InputSpec:
    """One run-time input: name, dims (None when the file gives no shape: any rank) and dtype."""

    name: str
    dims: tuple[Dim, ...] | None
    dtype: np.dtype

    @property
    def free(self) -> bool:
        return self.dims is None or any(not isinstance(d, int) for d in self.dims)


def file_dims(inp: Any) -> tuple[Dim, ...] | None:
    """The dims of a ``ValueInfoProto`` as the file writes them."""
    ttype = inp.type.tensor_type
    if not ttype.HasField("shape"):
        return None
    dims: list[Dim] = []
    for d in ttype.shape.dim:
        if d.HasField("dim_value") and d.dim_value >= 0:  # some exporters write -1 for "any"
            dims.append(int(d.dim_value))
        else:
            dims.append(d.dim_param or None)
    return tuple(dims)


def input_specs(proto: Any) -> list[InputSpec]:
    """The graph's run-time inputs (an initializer listed as an input is a constant, not one)."""
    from .importer import onnx_dtype  # importer calls into this module: import at use

    g = proto.graph
    inits = {t.name for t in g.initializer}
    return [
        InputSpec(i.name, file_dims(i), onnx_dtype(i.type.tensor_type.elem_type))
        for i in g.input
        if i.name not in inits
    ]


def _show(dims: tuple[Dim, ...] | None) -> str:
    if dims is None:
        return "(any shape)"
    return (
        "("
        + ", ".join("?" if d is None else repr(d) for d in dims)
        + ("," * (len(dims) == 1))
        + ")"
    )


def _match(spec: InputSpec, shape: tuple[int, ...], symbols: dict, error: type) -> None:
    """Check ``shape`` against ``spec``'s rank and fixed dims and record its symbols in
    ``symbols`` (symbol -> (size, input, axis)); ``error`` is raised naming input and dim."""

    def fail(msg: str) -> None:
        if error is OptionError:
            raise OptionError("input_shapes", f"input_shapes[{spec.name!r}]: {msg}")
        raise InputError(f"input {spec.name!r} has shape {shape}: {msg}")

    if spec.dims is None:
        return
    if len(shape) != len(spec.dims):
        fail(f"rank {len(shape)}, but the model takes rank {len(spec.dims)}: {_show(spec.dims)}")
    for axis, (want, got) in enumerate(zip(spec.dims, shape)):
        if isinstance(want, int) and want != got:
            fail(f"dim {axis} must be {want} (the model takes {_show(spec.dims)})")
        if isinstance(want, str):
            seen = symbols.setdefault(want, (got, spec.name, axis))
            if seen[0] != got:
                msg = (
                    f"inputs {seen[1]!r} and {spec.name!r} disagree on symbolic dim {want!r}: "
                    f"{seen[1]!r} dim {seen[2]} is {seen[0]}, {spec.name!r} dim {axis} is {got}"
                )
                raise OptionError("input_shapes", msg) if error is OptionError else error(msg)


def _as_shape(name: str, shape: Any) -> tuple[int, ...]:
    try:
        dims = tuple(shape)
    except TypeError:
        dims = None
    if dims is None or not all(isinstance(d, (int, np.integer)) and d >= 0 for d in dims):
        raise OptionError(
            "input_shapes", f"input_shapes[{name!r}]={shape!r}: give a tuple of sizes >= 0"
        )
    return tuple(int(d) for d in dims)


def fix_shapes(specs: list[InputSpec], input_shapes: Mapping[str, Any] | None) -> list[InputSpec]:
    """``specs`` with ``input_shapes`` applied: each named input fixed, and each symbol it binds
    fixed in every input that names it. An unknown name, a wrong rank, a contradicted fixed dim
    or one symbol given two sizes is an ``OptionError`` naming input and dim."""
    if not input_shapes:
        return specs
    by_name = {s.name: s for s in specs}
    unknown = [n for n in input_shapes if n not in by_name]
    if unknown:
        raise OptionError(
            "input_shapes",
            f"input_shapes names {unknown}, not a graph input; the model takes {list(by_name)}",
        )
    symbols: dict[str, tuple[int, str, int]] = {}
    for name, shape in input_shapes.items():
        _match(by_name[name], _as_shape(name, shape), symbols, OptionError)

    def fixed(spec: InputSpec) -> InputSpec:
        if spec.name in input_shapes:
            dims = _as_shape(spec.name, input_shapes[spec.name])
        elif spec.dims is None:
            return spec
        else:
            dims = tuple(
                symbols[d][0] if isinstance(d, str) and d in symbols else d for d in spec.dims
            )
        return InputSpec(spec.name, dims, spec.dtype)

    return [fixed(s) for s in specs]


def default_shapes(specs: list[InputSpec]) -> dict[str, tuple[int, ...]]:
    """The signature compile() builds its first plan for: every free dim as 1 (a batch of one)."""
    return {s.name: tuple(d if isinstance(d, int) else 1 for d in s.dims or ()) for s in specs}


def free_symbols(specs: list[InputSpec]) -> list[str]:
    """The dims left free, as ``input[axis]=symbol`` (for messages)."""
    out = []
    for s in specs:
        for axis, d in enumerate(s.dims or ()):
            if not isinstance(d, int):
                out.append(f"{s.name}[{axis}]={'?' if d is None else d}")
    return out


def bind(specs: list[InputSpec], shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple]:
    """The signature ``predict``'s inputs bring, checked against ``specs``: a wrong rank, a fixed
    dim given another size, or one symbol bound to two sizes is an ``InputError`` naming the
    input(s), the dim and the symbol."""
    symbols: dict[str, tuple[int, str, int]] = {}
    for spec in specs:
        _match(spec, tuple(shapes[spec.name]), symbols, InputError)
    return {s.name: tuple(shapes[s.name]) for s in specs}


def import_dims(inp: Any, input_shapes: Mapping[str, Any] | None) -> tuple[int, ...]:
    """The importer's concrete dims for graph input ``inp``: ``input_shapes``' entry (checked
    against the file's dims), else the file's dims with every free dim as 1."""
    spec = InputSpec(inp.name, file_dims(inp), np.dtype(np.float32))
    if input_shapes and inp.name in input_shapes:
        shape = _as_shape(inp.name, input_shapes[inp.name])
        try:
            _match(spec, shape, {}, OptionError)
        except OptionError as e:
            raise ShapeError("(graph input)", inp.name, str(e)) from None
        return shape
    return default_shapes([spec])[inp.name]
