"""The PassManager: named Graph -> Graph passes, each timed, verified and optionally dumped."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from ..ir import Graph

Pass = Callable[[Graph], Graph]
PASSES: dict[str, Pass] = {}


def register_pass(name: str) -> Callable[[Pass], Pass]:
    def deco(fn: Pass) -> Pass:
        PASSES[name] = fn
        return fn

    return deco


class PassManager:
    """Runs passes in order; ``verify`` checks the IR after each, PYFORGE_DUMP_IR dumps it."""

    def __init__(
        self,
        names: list[str],
        verify: bool = True,
        on_pass: Callable[[str, int, int], None] | None = None,
        bound: dict[str, Pass] | None = None,
    ):
        self.names = names
        self.verify = verify
        self.on_pass = on_pass  # (pass name, passes done, passes in all), after each pass
        self.passes = {**PASSES, **(bound or {})}  # bound: passes made for one compile
        self.timings: dict[str, float] = {}
        self.op_counts: list[tuple[str, int]] = []

    def run(self, graph: Graph) -> Graph:
        dump_dir = os.environ.get("PYFORGE_DUMP_IR")
        self.op_counts = [("import", len(graph.nodes))]
        if dump_dir:
            os.makedirs(dump_dir, exist_ok=True)
            _dump(dump_dir, 0, "import", graph)
        for i, name in enumerate(self.names, start=1):
            t0 = time.perf_counter()
            graph = self.passes[name](graph)
            # a pass listed twice (const_fold) reports its total
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t0
            if self.verify:
                graph.verify()
            self.op_counts.append((name, len(graph.nodes)))
            if dump_dir:
                _dump(dump_dir, i, name, graph)
            if self.on_pass is not None:
                self.on_pass(name, i, len(self.names))
        return graph


def _dump(directory: str, index: int, name: str, graph: Graph) -> None:
    with open(os.path.join(directory, f"{index:02d}_{name}.txt"), "w") as f:
        f.write(str(graph) + "\n")
