"""The model behind a served endpoint: pyforge's ``CompiledModel`` or an ONNX Runtime session
(``backend="pyforge" | "ort"``, the A/B switch), with ``predict`` for one request and
``batch_predict`` for many: requests of one shape are stacked along the batch dim, run in the
model's batch sizes (1, 2, 4, ... up to ``max_batch_size``; a partial batch padded to the next
size) and the outputs split back. No Ray here: the deployment and the sweep's in-process mode
both use it.

>>> engine = Engine("mlp_dynamic.onnx", backend="pyforge", max_batch_size=8)
>>> ys = engine.batch_predict([{"x": x1}, {"x": x2}])   # one run at batch 2
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import errors

BACKENDS = ("pyforge", "ort")
_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(bool)": np.bool_,
    "tensor(float16)": np.float16,
    "tensor(uint8)": np.uint8,
    "tensor(int8)": np.int8,
}


@dataclass(frozen=True)
class Spec:
    """One input: its name, dims (an int is fixed; a str or None is free) and dtype."""

    name: str
    dims: tuple
    dtype: np.dtype


def batch_sizes(max_batch_size: int) -> list[int]:
    """The plan sizes: powers of two below ``max_batch_size``, then it (``[1, 2, 4, 6]`` for 6)."""
    if max_batch_size < 1:
        raise errors.OptionError(
            "max_batch_size", f"max_batch_size must be >= 1: got {max_batch_size}"
        )
    sizes = [1 << k for k in range(max_batch_size.bit_length()) if 1 << k < max_batch_size]
    return [*sizes, max_batch_size]


@dataclass(frozen=True)
class ServeConfig:
    """How one model is served; checked by ``start`` before Ray starts."""

    backend: str = "pyforge"
    target: str | None = None
    replicas: int = 1
    max_batch_size: int = 32
    batch_wait_ms: float = 0.0  # a wait before a batch that is not full
    fill_wait_ms: float = 0.0  # under load: a wait for as many requests as the last batch had
    inline_ms: float = 1.0  # a batch expected to run in under this runs on the event loop
    max_queued: int = 256  # per caller (the HTTP proxy): beyond it, 503
    max_body_bytes: int = 64 << 20
    cpus_per_replica: float = 1.0
    gpus_per_replica: float = 0.0
    threads: int | None = None  # ORT intra-op threads (pyforge: NUMBA_NUM_THREADS)
    warm_length: int = 16  # free dims after the batch (sequence length) in the warm-up plans
    max_context: int = 2048  # a decoder's (for /generate)
    tokenizer: str | None = None  # an ONNX decoder's: a GGUF file holding its vocabulary
    access_log: bool = False  # Serve's line per request in the proxy and replica logs
    direct: bool = False  # each replica serves HTTP on host:port itself, no Ray proxy

    def logging(self) -> dict:
        """Serve's ``logging_config`` for the proxy and the replicas."""
        return {"enable_access_log": self.access_log}

    def check(self) -> None:
        """An ``OptionError`` naming the first bad field."""
        if self.backend not in BACKENDS:
            raise errors.OptionError(
                "backend", f"backend must be one of {BACKENDS}: got {self.backend!r}"
            )
        batch_sizes(self.max_batch_size)
        for name in ("replicas", "max_queued", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise errors.OptionError(name, f"{name} must be >= 1: got {getattr(self, name)}")
        for name in ("batch_wait_ms", "fill_wait_ms", "inline_ms"):
            if getattr(self, name) < 0:
                raise errors.OptionError(name, f"{name} must be >= 0: got {getattr(self, name)}")


class Engine:
    """A model that answers ``predict(inputs)`` and ``batch_predict([inputs, ...])``: inputs
    and outputs are dicts name -> numpy array, each request carrying its own rows on axis 0."""

    def __init__(
        self,
        model: str | bytes,
        backend: str = "pyforge",
        max_batch_size: int = 32,
        target: str | None = None,
        threads: int | None = None,
    ):
        if backend not in BACKENDS:
            raise errors.OptionError(
                "backend", f"backend must be one of {BACKENDS}: got {backend!r}"
            )
        self.backend = backend
        self.name = model if isinstance(model, str) else "<bytes>"
        self.sizes = batch_sizes(max_batch_size)
        if backend == "pyforge":
            self._open_pyforge(model, target)
        else:
            self._open_ort(model, threads)
        free = [s for s in self.specs if not s.dims or isinstance(s.dims[0], int)]
        self.batched = not free  # every input's axis 0 is a free (batch) dim
        if not self.batched:
            self.sizes = [1]
        self.padded_rows = 0  # rows run as padding, over this engine's life

    def _open_pyforge(self, model: str | bytes, target: str | None) -> None:
        import pyforge

        # one plan per batch size and request shape; a few shapes (sequence lengths) besides
        self._model = pyforge.compile(model, target, max_plans=4 * len(self.sizes))
        self.specs = [Spec(s.name, tuple(s.shape), np.dtype(s.dtype)) for s in self._model.inputs]
        self.output_names = self._model.output_names
        self.target = self._model.target

    def _open_ort(self, model: str | bytes, threads: int | None) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        self._session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        self.specs = [
            Spec(i.name, tuple(i.shape), np.dtype(_ORT_TYPES.get(i.type, np.float32)))
            for i in self._session.get_inputs()
        ]
        self.output_names = [o.name for o in self._session.get_outputs()]
        self.target = "cpu"

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.backend == "ort":
            return dict(zip(self.output_names, self._session.run(None, feeds)))
        out = self._model.predict(feeds)
        return out if isinstance(out, dict) else {self.output_names[0]: out}

    def check(self, inputs: Any, *, cast: bool = False) -> dict[str, np.ndarray]:
        """The request's inputs as arrays, or an ``InputError`` saying what is wrong; ``cast``
        converts values to the input's dtype (JSON lists), else the dtype must match."""
        if not isinstance(inputs, dict):
            if len(self.specs) != 1:
                raise errors.InputError(f"model takes inputs {self.input_names}: give a dict")
            inputs = {self.specs[0].name: inputs}
        names = set(inputs)
        if names != set(self.input_names):
            missing, extra = (
                sorted(set(self.input_names) - names),
                sorted(names - set(self.input_names)),
            )
            raise errors.InputError(
                f"model takes inputs {self.input_names}: missing {missing}, unknown {extra}"
            )
        return {s.name: self._check_one(s, inputs[s.name], cast) for s in self.specs}

    def _check_one(self, spec: Spec, value: Any, cast: bool) -> np.ndarray:
        try:
            a = np.asarray(value, dtype=spec.dtype if cast else None)
        except (ValueError, TypeError, OverflowError) as e:
            raise errors.InputError(f"input {spec.name!r}: not a {spec.dtype} array: {e}") from None
        if a.dtype != spec.dtype:
            raise errors.InputError(
                f"input {spec.name!r} has dtype {a.dtype}, expected {spec.dtype}"
            )
        if a.ndim != len(spec.dims):
            raise errors.InputError(
                f"input {spec.name!r} has shape {a.shape}, expected rank {len(spec.dims)} {spec.dims}"
            )
        for axis, (got, want) in enumerate(zip(a.shape, spec.dims)):
            if isinstance(want, int) and got != want:
                raise errors.InputError(
                    f"input {spec.name!r} has shape {a.shape}, expected {spec.dims}: dim {axis} "
                    f"must be {want}"
                )
        if self.batched and a.shape[0] < 1:
            raise errors.InputError(f"input {spec.name!r} has no rows (shape {a.shape})")
        return a

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.specs]

    def predict(self, inputs: Any) -> dict[str, np.ndarray]:
        """One request, run alone (its own rows, no padding)."""
        return self._run(self.check(inputs))

    def batch_predict(self, requests: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """Many checked requests: grouped by shape, stacked, run in plan sizes, split back."""
        if not self.batched:
            return [self._run(r) for r in requests]
        results: list[Any] = [None] * len(requests)
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(requests):
            key = tuple((a.shape[1:], a.dtype.str) for a in r.values())
            groups.setdefault(key, []).append(i)
        for members in groups.values():
            rows = [len(next(iter(requests[i].values()))) for i in members]
            stacked = {
                n: np.concatenate([requests[i][n] for i in members]) for n in self.input_names
            }
            outs = self._run_rows(stacked, sum(rows))
            start = 0
            for i, n in zip(members, rows):
                results[i] = {k: v[start : start + n] for k, v in outs.items()}
                start += n
        return results

    def _run_rows(self, feeds: dict[str, np.ndarray], total: int) -> dict[str, np.ndarray]:
        """``total`` rows through plans of at most the largest size, the last chunk padded (with
        copies of its first row, a valid input for any model) to the next size."""
        parts: list[dict[str, np.ndarray]] = []
        for start in range(0, total, self.sizes[-1]):
            n = min(self.sizes[-1], total - start)
            size = next(s for s in self.sizes if s >= n)
            chunk = {k: v[start : start + n] for k, v in feeds.items()}
            if size > n:
                self.padded_rows += size - n
                chunk = {
                    k: np.concatenate([v, np.repeat(v[:1], size - n, 0)]) for k, v in chunk.items()
                }
            out = self._run(chunk)
            for name, a in out.items():
                if np.shape(a)[:1] != (size,):
                    raise errors.InputError(
                        f"output {name!r} has shape {np.shape(a)}: its axis 0 does not follow "
                        f"the batch ({size}), so this model cannot be batched; serve it with "
                        "max_batch_size=1"
                    )
            parts.append({k: np.asarray(v)[:n] for k, v in out.items()})
        if len(parts) == 1:
            return parts[0]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def warm_up(self, example: dict[str, np.ndarray]) -> None:
        """Build (or load) every batch size's plan for this request shape, before traffic."""
        one = {k: v[:1] for k, v in self.check(example).items()}
        for size in self.sizes:
            self._run({k: np.repeat(v, size, 0) for k, v in one.items()})


def example_inputs(engine: Engine, seed: int = 0, rows: int = 1, free: int = 16) -> dict:
    """Seeded inputs of ``rows`` rows for the engine's model: free dims after axis 0 take
    ``free``; a mask is all ones, token type ids in [0, 2), other integers in [0, 100)."""
    rng = np.random.default_rng(seed)
    out = {}
    for s in engine.specs:
        shape = [rows] + [d if isinstance(d, int) else free for d in s.dims[1:]]
        if "mask" in s.name:
            out[s.name] = np.ones(shape, s.dtype)
        elif np.issubdtype(s.dtype, np.integer):
            out[s.name] = rng.integers(0, 2 if "type" in s.name else 100, shape).astype(s.dtype)
        else:
            out[s.name] = rng.standard_normal(shape).astype(s.dtype)
    return out
