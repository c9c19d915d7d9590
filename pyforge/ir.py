"""The SSA graph IR: every Value has a static shape and dtype and exactly one producer."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import IRVerificationError


@dataclass(eq=False)
class Value:
    """A tensor: produced by one node, or a graph input, or a constant (``const`` set)."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    const: np.ndarray | None = None
    producer: Node | None = field(default=None, repr=False)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    def __repr__(self) -> str:
        kind = "const " if self.const is not None else ""
        return f"%{self.name}:{kind}{np.dtype(self.dtype).name}{list(self.shape)}"


@dataclass(eq=False)
class Node:
    """One operation. ``attrs`` are already normalised by the frontend (plain Python values).

    A ``Fused`` node (made by fusion) carries its ``group``; its inputs and outputs are the
    group's values that cross the group's border."""

    op: str
    inputs: list[Value | None]
    outputs: list[Value]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    opset: int = 0
    group: FusedGroup | None = field(default=None, repr=False)

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def __repr__(self) -> str:
        outs = ", ".join(map(repr, self.outputs))
        ins = ", ".join("None" if v is None else f"%{v.name}" for v in self.inputs)
        extra = f" {self.attrs}" if self.attrs else ""
        head = f"{outs} = {self.op}({ins}){extra}  # {self.name}"
        if self.group is None:
            return head
        return "\n".join([head] + [f"    {line}" for line in self.group.lines()])


@dataclass(eq=False)
class FusedGroup:
    """What fusion puts in one kernel: ``members`` in order, the ``anchor`` first when there is
    one (a GEMM, conv, window, reduction or row op), then its elementwise epilogue."""

    members: list[Node]
    anchor: Node | None

    @property
    def epilogue(self) -> list[Node]:
        return self.members[1:] if self.anchor is not None else self.members

    def lines(self) -> list[str]:
        return [("anchor " if m is self.anchor else "") + repr(m) for m in self.members]


class ConstCache:
    """What one model's compiles share, whatever the input shapes: its initializers as read-only
    arrays, and each fold over read-only constants (BatchNorm into a conv, say), keyed by the
    identity of the arrays it reads. Only read-only arrays are keys, so a key's bytes cannot
    change under it; the cache holds them, so their ids are never reused."""

    def __init__(self) -> None:
        self.initializers: dict[str, np.ndarray] = {}
        self._folds: dict[tuple, tuple[tuple, Any]] = {}
        self.folds_computed = 0  # misses; a new shape of a cached model adds none

    def fold(self, compute: Any, params: tuple, arrays: tuple[np.ndarray, ...]) -> Any:
        """``compute(*params, *arrays)``, a tuple of new arrays, made once: a later call with
        the same function, hashable ``params`` and read-only arrays gets the same (read-only)
        arrays back."""
        if not all(isinstance(a, np.ndarray) and not a.flags.writeable for a in arrays):
            return compute(*params, *arrays)  # a writeable array could change: no safe key
        key = (compute, params, *map(id, arrays))
        hit = self._folds.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], arrays)):
            return hit[1]
        out = compute(*params, *arrays)
        for a in out:
            a.flags.writeable = False
        self._folds[key] = (arrays, out)
        self.folds_computed += 1
        return out


class Graph:
    """An ordered list of nodes over Values, with named inputs and outputs; ``cache`` is the
    model's ConstCache when the importer was given one (else this graph's own)."""

    def __init__(self, name: str = "graph"):
        self.name = name
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.nodes: list[Node] = []
        self._counter = itertools.count()
        self.cache = ConstCache()

    # -- construction --------------------------------------------------------------------------
    def fresh_name(self, hint: str) -> str:
        return f"{hint}__{next(self._counter)}"

    def constant(self, array: np.ndarray, hint: str = "const") -> Value:
        array = np.asarray(array, order="C")  # keeps 0-d arrays 0-d
        return Value(self.fresh_name(hint), tuple(array.shape), array.dtype, const=array)

    def add_node(self, node: Node, index: int | None = None) -> Node:
        for out in node.outputs:
            out.producer = node
        if index is None:
            self.nodes.append(node)
        else:
            self.nodes.insert(index, node)
        return node

    # -- queries -------------------------------------------------------------------------------
    def consumers(self) -> dict[int, list[Node]]:
        """Map id(Value) -> nodes that read it (graph outputs are not nodes)."""
        users: dict[int, list[Node]] = {}
        for node in self.nodes:
            for v in node.inputs:
                if v is not None:
                    users.setdefault(id(v), []).append(node)
        return users

    def replace_uses(self, old: Value, new: Value) -> None:
        for node in self.nodes:
            node.inputs = [new if v is old else v for v in node.inputs]
        self.outputs = [new if v is old else v for v in self.outputs]

    # -- checking ------------------------------------------------------------------------------
    def verify(self) -> None:
        """Check SSA (one producer each), topological order, and that shapes are static ints."""
        defined: set[int] = {id(v) for v in self.inputs}
        names: set[str] = set()
        for v in self.inputs:
            self._check_value(v, names)
        for node in self.nodes:
            for v in node.inputs:
                if v is None or v.const is not None:
                    continue
                if id(v) not in defined:
                    raise IRVerificationError(
                        f"node {node.name!r} ({node.op}) reads %{v.name} before it is defined"
                    )
            if node.group is not None:
                self._check_group(node)
            for out in node.outputs:
                if id(out) in defined:
                    raise IRVerificationError(f"%{out.name} is defined twice (node {node.name!r})")
                if out.producer is not node:
                    raise IRVerificationError(f"%{out.name} has a stale producer link")
                self._check_value(out, names)
                defined.add(id(out))
        for v in self.outputs:
            if v.const is None and id(v) not in defined:
                raise IRVerificationError(f"graph output %{v.name} is never produced")

    @staticmethod
    def _check_group(node: Node) -> None:
        """A group's members read only the group's inputs, constants and earlier members, and
        every value the group exports is made by a member."""
        group = node.group
        if group.anchor is not None and group.anchor is not group.members[0]:
            raise IRVerificationError(f"group {node.name!r}: its anchor is not its first member")
        seen = {id(v) for v in node.inputs if v is not None}
        for m in group.members:
            for v in m.inputs:
                if v is not None and v.const is None and id(v) not in seen:
                    raise IRVerificationError(
                        f"group {node.name!r}: member {m.name!r} ({m.op}) reads %{v.name}, "
                        "which is neither a group input nor made by an earlier member"
                    )
            seen.update(id(o) for o in m.outputs)
        made = {id(o) for m in group.members for o in m.outputs}
        for out in node.outputs:
            if id(out) not in made:
                raise IRVerificationError(f"group {node.name!r} exports %{out.name}, never made")

    @staticmethod
    def _check_value(v: Value, names: set[str]) -> None:
        if v.name in names:
            raise IRVerificationError(f"two values are named {v.name!r}")
        names.add(v.name)
        if not all(isinstance(d, int) and d >= 0 for d in v.shape):
            raise IRVerificationError(f"%{v.name} has a non-static shape {v.shape}")

    def __str__(self) -> str:
        lines = [f"graph {self.name}("]
        lines += [f"    {v!r}," for v in self.inputs]
        lines.append("):")
        lines += [f"  {n!r}" for n in self.nodes]
        lines.append("  return " + ", ".join(f"%{v.name}" for v in self.outputs))
        return "\n".join(lines)
