"""What the pattern rewrites (attention.py, norms.py) ask of a graph: who reads a value, whether
a pattern may swallow it, and the value of a scalar constant."""

from __future__ import annotations

from ..ir import Graph, Value


def scalar(v: Value | None) -> float | None:
    """The value of a one-element constant, else None."""
    if v is None or v.const is None or v.size != 1:
        return None
    return float(v.const.reshape(()))


class Match:
    def __init__(self, graph: Graph) -> None:
        self.users = graph.consumers()
        self.outputs = {id(v) for v in graph.outputs}

    def private(self, v: Value) -> bool:
        """Read by one node and not a graph output: the pattern may swallow it."""
        return len(self.users.get(id(v), [])) == 1 and id(v) not in self.outputs
