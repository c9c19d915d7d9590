"""A model that runs in stages, because a node needs what only the run gives.

``compile`` builds one when the importer raises ``DataDependentError``: a shape, pads or k
computed at run time, or an op whose output shape depends on its data (NonZero,
NonMaxSuppression, Unique, Compress). The first stage is compiled at once; the host then runs
the data-dependent node (numpy) or reads the values the next stage takes as constants, and the
second stage is compiled for each new combination of shapes and values (kept, at most
``max_plans``, least recently used evicted) and may itself be staged. Each stage is an ordinary
plan; what crosses between them goes through host memory. Stages after the first cut get
shape-generic kernels (``specialize=False``, cuda's default being True): their shapes follow the
data (a box count), so specialised sources would differ, and compile, per stage and per run.

Where the stages after the first cut run is ``StagedModel.rest_target``, by default "cpu" for
every model: the arrays cross to the host at the cut anyway, and what follows a data-dependent
node is small and varied (SSDlite's 362 rest stages: NMS tails, box decoding), so a cuda stage
would pay a bind (module load, link, cuBLASLt search per shape, warm-up, graph capture) of
0.5-1 s for a run of microseconds. The first stage (the backbone) runs on the model's target.
Set ``m.rest_target = "cuda"`` before the first ``predict`` to keep every stage on the GPU; a
cpu rest takes the target-independent options (fusion, verify, memory_limit, max_plans, state)
and computes in fp32 whatever the first stage's precision. ``stats["stages"]`` says where each
ran.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import replace
from typing import Any

import numpy as np

from . import errors
from .options import CompileOptions, RuntimeOptions


def _host(a: Any) -> np.ndarray:
    return a.copy_to_host() if hasattr(a, "copy_to_host") else np.asarray(a)


class StagedModel:
    """``predict`` as a CompiledModel's; ``stats["stages"]`` says where the model was cut."""

    def __init__(self, proto, err: errors.DataDependentError, target, options, runtime, specs):
        from . import compile as compile_model
        from .frontend.stages import cut

        self._cut = cut(proto, err)
        self._proto, self._compile = proto, compile_model
        self.target, self._options, self._runtime = target, options, runtime
        self._specs = specs
        self._why = str(err)
        self._names = [s.name for s in specs]
        first = None
        if self._cut.first is not None:
            shapes = {
                k: v for k, v in (options.input_shapes or {}).items() if k in self._cut.first_inputs
            }
            first = compile_model(
                self._cut.first, target, replace(options, input_shapes=shapes), runtime=runtime
            )
        self._first = first
        self._rest: OrderedDict[tuple, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._tally = {"stages compiled": 0, "compile seconds": 0.0}  # nested levels share it
        self.rest_target = "cpu"

    @property
    def rest_target(self) -> str:
        """Where the stages after the first cut are compiled and run ("cpu" or "cuda")."""
        return self._rest_target

    @rest_target.setter
    def rest_target(self, target: str) -> None:
        if target not in ("cpu", "cuda"):
            raise errors.OptionError("rest_target", f"rest_target={target!r}: 'cpu' or 'cuda'")
        if self._rest:
            raise errors.OptionError("rest_target", "set rest_target before the first predict")
        self._rest_target = target

    def _rest_options(self) -> tuple[CompileOptions, RuntimeOptions]:
        o, r = self._options, self._runtime
        if self._rest_target == self.target:
            return replace(o, input_shapes={}, specialize=False), r
        keep = ("fusion", "verify", "memory_limit", "max_plans", "state")
        opts = CompileOptions(**{k: getattr(o, k) for k in keep}, specialize=False)
        run = RuntimeOptions(max_concurrency=r.max_concurrency)
        return opts.resolve(self._rest_target), run.resolve(self._rest_target)

    @property
    def inputs(self):
        from . import TensorSpec

        return [TensorSpec(s.name, s.dims, s.dtype) for s in self._specs]

    @property
    def stage_tally(self) -> dict[str, Any]:
        """Stages compiled after the first cut, at every level, and their wall seconds."""
        return dict(self._tally)

    @property
    def input_names(self) -> list[str]:
        return list(self._names)

    @property
    def output_names(self) -> list[str]:
        return list(self._cut.outputs)

    @property
    def stats(self) -> dict[str, Any]:
        c = self._cut
        return {
            "target": self.target,
            "stages": {
                "first target": self.target,
                "rest target": self._rest_target,
                "cut at": self._why,
                "host op": c.host.op_type if c.host is not None else None,
                "constants": list(c.constants),
                "first": None if self._first is None else self._first.stats,
                "rest plans held": len(self._rest),
                **self._tally,
            },
        }

    def __repr__(self) -> str:
        return f"StagedModel(target={self.target!r}, inputs={self.inputs}, outputs={self.output_names})"

    def _one_plan(self, what: str):
        detail = f"a model run in stages has no single plan to {what} ({self._why})"
        raise errors.UnsupportedOperatorError("(staged model)", "-", None, detail)

    def save(self, directory: Any) -> None:
        self._one_plan("save")

    plan = property(lambda self: self._one_plan("show"))
    runtime = property(lambda self: self._one_plan("run alone"))
    details = property(lambda self: self._one_plan("explain"))

    def predict(self, x: Any) -> Any:
        c = self._cut
        feeds = dict(x) if isinstance(x, dict) else {self._names[0]: x}
        if len(feeds) != len(self._names) or any(n not in feeds for n in self._names):
            raise errors.InputError(f"predict takes inputs {self._names}; got {sorted(feeds)}")
        env = dict(feeds)
        if self._first is not None:
            out = self._first.predict({n: feeds[n] for n in c.first_inputs})
            env.update(out if isinstance(out, dict) else {c.first_outputs[0]: out})
        if c.host is not None:
            from .frontend.stages import host_eval, node_reads

            reads = {n: _host(env[n]) for n in node_reads(c.host) if n in env}
            env.update(host_eval(self._proto, c.host, reads))
        arrays = {n: _host(env[n]) for n in [*c.rest_inputs, *c.constants]}
        key = tuple((n, a.shape, a.dtype.str) for n, a in arrays.items())
        key += tuple(arrays[n].tobytes() for n in c.constants)
        with self._lock:
            rest = self._rest.get(key)
            if rest is None:
                opts, run = self._rest_options()
                t0 = time.perf_counter()
                rest = self._rest[key] = self._compile(
                    c.rest(arrays), self._rest_target, opts, runtime=run
                )
                if isinstance(rest, StagedModel):  # cut again: its own first stage included
                    rest._tally, rest._rest_target = self._tally, self._rest_target
                self._tally["stages compiled"] += 1
                self._tally["compile seconds"] += time.perf_counter() - t0
                while len(self._rest) > self._options.max_plans:
                    self._rest.popitem(last=False)
            self._rest.move_to_end(key)
        out = rest.predict({n: arrays[n] for n in c.rest_inputs} if rest.input_names else {})
        env.update(out if isinstance(out, dict) else {rest.output_names[0]: out})
        result = {n: env[n] for n in c.outputs}
        return result[c.outputs[0]] if len(result) == 1 else result
