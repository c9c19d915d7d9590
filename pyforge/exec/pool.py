"""Execution contexts for concurrent ``predict`` calls: never two calls in one arena.

A context is what one inference writes (arena, staging buffers; on cuda a stream and a graph).
The pool makes them at first need, up to ``size``; a call finding them all busy waits.

    pool = ContextPool(make_context, size=2, first=ctx0)
    with pool.context() as ctx:
        out = ctx.run(feeds)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class ContextPool:
    def __init__(self, make: Callable[[], Any], size: int, first: Any) -> None:
        if size < 1:
            raise ValueError(f"max_concurrency={size}: needs at least one context")
        self._make = make
        self.size = size
        self.contexts = [first]  # every context made so far, the first (made at bind) first
        self._free = [first]
        self._making = 0  # contexts being made outside the lock: they count against size
        self._cond = threading.Condition()

    @contextmanager
    def context(self) -> Iterator[Any]:
        """A context of this pool that no other call uses until the block ends."""
        ctx = self._acquire()
        try:
            yield ctx
        finally:
            with self._cond:
                self._free.append(ctx)
                self._cond.notify()

    def _acquire(self) -> Any:
        with self._cond:
            while not self._free and len(self.contexts) + self._making >= self.size:
                self._cond.wait()
            if self._free:
                return self._free.pop()
            self._making += 1
        # made outside the lock: binding a context loads kernels and (cuda) captures a graph,
        # and the calls holding the other contexts must be able to hand them back meanwhile
        try:
            ctx = self._make()
        except BaseException:
            with self._cond:
                self._making -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._making -= 1
            self.contexts.append(ctx)
        return ctx
