"""The e-graph: e-classes of equivalent e-nodes, hash-consed, merged through a union-find and
rebuilt to congruence closure (two e-nodes with the same op, payload and child classes are one).

>>> eg = EGraph()
>>> a, b = eg.add(ENode("a")), eg.add(ENode("b"))
>>> fa, fb = eg.add(ENode("f", (a,))), eg.add(ENode("f", (b,)))
>>> eg.union(a, b); eg.rebuild(); eg.find(fa) == eg.find(fb)
True
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class ENode:
    """An operation over e-classes; ``payload`` tells apart leaves (a tensor, a constant)."""

    op: str
    children: tuple[int, ...] = ()
    payload: Hashable = None


class EGraph:
    def __init__(self) -> None:
        self.parent: list[int] = []
        self.classes: dict[int, set[ENode]] = {}  # canonical id -> its e-nodes (canonical)
        self.memo: dict[ENode, int] = {}  # hash-cons: canonical e-node -> its class
        self.uses: dict[int, list[tuple[ENode, int]]] = {}  # class -> e-nodes that read it
        self.pending: list[int] = []

    def find(self, c: int) -> int:
        root = c
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[c] != root:  # path compression
            self.parent[c], c = root, self.parent[c]
        return root

    def canonical(self, n: ENode) -> ENode:
        return ENode(n.op, tuple(self.find(c) for c in n.children), n.payload)

    def add(self, n: ENode) -> int:
        n = self.canonical(n)
        if n in self.memo:
            return self.find(self.memo[n])
        c = len(self.parent)
        self.parent.append(c)
        self.classes[c] = {n}
        self.memo[n] = c
        self.uses[c] = []
        for ch in set(n.children):
            self.uses[ch].append((n, c))
        return c

    def union(self, a: int, b: int) -> bool:
        """Merge two classes (congruence is restored by ``rebuild``); False if already one."""
        a, b = self.find(a), self.find(b)
        if a == b:
            return False
        if len(self.classes[a]) < len(self.classes[b]):
            a, b = b, a
        self.parent[b] = a
        self.classes[a] |= self.classes.pop(b)
        self.uses[a] += self.uses.pop(b)
        self.pending.append(a)
        return True

    def rebuild(self) -> None:
        """Re-canonicalise the e-nodes that read merged classes; merge those that now agree."""
        while self.pending:
            todo, self.pending = {self.find(c) for c in self.pending}, []
            for c in todo:
                self._repair(self.find(c))
        for c in list(self.classes):
            self.classes[c] = {self.canonical(n) for n in self.classes[c]}

    def _repair(self, c: int) -> None:
        seen: dict[ENode, int] = {}
        entries, self.uses[c] = self.uses[c], []
        for n, owner in entries:
            self.memo.pop(n, None)
            n = self.canonical(n)
            owner = self.find(owner)
            if n in seen and self.find(seen[n]) != owner:
                self.union(seen[n], owner)
                owner = self.find(owner)
            seen[n] = owner
            self.memo[n] = owner
        self.uses[self.find(c)] += seen.items()

    def nodes(self, c: int) -> set[ENode]:
        return self.classes[self.find(c)]

    def class_ids(self) -> Iterator[int]:
        return iter(self.classes)

    @property
    def size(self) -> int:
        return sum(len(ns) for ns in self.classes.values())
