"""The lowering registry: how each op of the table becomes kernel code, one entry per op and form.

    @lowering("LayerNormalization", "RMSNormalization", form="element")
    def norm_element(node, kb, coords) -> str: ...

    lowering_for(node).emit(node, kb, coords)   # the one lookup lower.py makes

A form says what the lowering emits and how its kernel may fuse (``FORMS``); ``when`` picks
between two lowerings of one op by its attributes (a grouped Conv is summed directly, an
ungrouped one is a GEMM). The templates package registers every lowering on import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import UnsupportedOperatorError
from ..ir import Node
from ..ops import OPS

FORMS = {
    # (node, argument expressions, type name) -> one expression: an elementwise group member
    "scalar": "an expression of the member's arguments, fused into any elementwise kernel",
    # (node, kb, coords) -> the variable holding one output element; an epilogue may follow
    "element": "one output element at the given coordinates; an elementwise epilogue may follow",
    # (node, kb) -> iteration count: a whole body that writes the output itself, no epilogue
    "rows": "a whole body over rows, writing the output itself; nothing fuses after it",
    # (node, prog, d) -> GemmCall computing the op into tensor d; an epilogue may follow
    "gemm": "a GEMM library call (with an optional prologue kernel); an epilogue may follow",
}
EPILOGUE_FORMS = ("element", "gemm")


@dataclass(frozen=True)
class Lowering:
    op: str
    form: str
    emit: Callable
    when: Callable[[Node], bool] | None = None  # None: every node of the op
    rows: Callable[[Node], int] | None = None  # element form: the axis its row statistics span

    def applies(self, node: Node) -> bool:
        return self.when is None or self.when(node)


LOWERINGS: dict[str, list[Lowering]] = {}


def lowering(*ops: str, form: str, when: Callable[[Node], bool] | None = None, rows=None):
    """Register the decorated function as the ``form`` lowering of ``ops``.

    An op the table does not know or a form not in FORMS is a programming error, raised at
    import so that no lowering can sit unreachable."""

    def deco(fn: Callable) -> Callable:
        for op in ops:
            register_lowering(op, form, fn, when, rows)
        return fn

    return deco


def register_lowering(
    op: str, form: str, fn: Callable, when: Callable[[Node], bool] | None = None, rows=None
) -> None:
    if form not in FORMS:
        raise ValueError(f"lowering of {op}: form {form!r} is not one of {sorted(FORMS)}")
    if op not in OPS:
        raise ValueError(f"lowering of {op}: the op table (pyforge.ops.OPS) has no such op")
    entries = LOWERINGS.setdefault(op, [])
    if any(e.when is None for e in entries) or (entries and when is None):
        raise ValueError(f"lowering of {op}: a second lowering needs a ``when`` on each")
    entries.append(Lowering(op, form, fn, when, rows))


def lowering_for(node: Node, forms: tuple[str, ...] = tuple(FORMS)) -> Lowering:
    """The lowering of ``node`` among ``forms``; a typed error naming the node when none."""
    found = [e for e in LOWERINGS.get(node.op, []) if e.applies(node)]
    if len(found) > 1:
        raise ValueError(f"{node.op}: {len(found)} lowerings apply to node {node.name!r}")
    if not found or found[0].form not in forms:
        what = "no lowering" if not found else f"a {found[0].form} lowering, not {'/'.join(forms)}"
        raise UnsupportedOperatorError(node.op, node.name, node.opset, what)
    return found[0]


def forms_of(op: str) -> set[str]:
    """Every form an op lowers in (empty: none registered)."""
    return {e.form for e in LOWERINGS.get(op, [])}
