"""ExecutionPlan: arena layout, weights, ordered steps and kernel sources; saved as plain files.

Saving writes ``plan.json``, ``weights.bin`` and ``kernels/<key>.<target>.py``; loading needs
numpy only (no onnx), so a saved plan runs without the model file. A plan is data: loading
(``plan_files.py``) checks every file against the sizes and sha256 sums in plan.json and every
step against the slots, then has the lowering (passed in by ``pyforge.load``) regenerate the steps
and kernel sources from plan.json's description; only those regenerated sources are imported.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..errors import InputError, ModelLoadError
from .steps import GemmStep, Step

# plan.json's "format": bumped whenever a saved plan's meaning changes; another is refused
FORMAT = 5  # 5: state slots and the state map


@dataclass
class Slot:
    # "arena" | "weights" | "scratch" (offset 0 of a buffer made at need) | "state" (kept
    # across calls, never fed: the runtime's state buffer, shared by a model's plans)
    region: str
    offset: int  # bytes
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass
class ExecutionPlan:
    arena_bytes: int
    slots: dict[str, Slot]
    steps: list[Step]
    # key -> {target: source}; a GEMM's cuda fallback kernel has a "cuda" source only
    kernels: dict[str, dict[str, str]]
    inputs: list[str]
    outputs: list[str]
    weights: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, np.uint8))
    stats: dict[str, Any] = field(default_factory=dict)
    # (tensor, bytes, first step, last step, arena offset): the planner's input and answer, for
    # explain; not saved
    buffers: list[tuple] = field(default_factory=list)
    # the optimised graph the steps and kernels were lowered from (lower_numba/describe.py)
    description: dict[str, Any] | None = field(default=None, repr=False)
    # False when loaded without regenerating its kernels: then none of them may run
    trusted: bool = True
    state: dict[str, str] = field(default_factory=dict)  # output -> the input it aliases
    state_bytes: int = 0

    def signature(self, names: list[str]) -> list[tuple[str, tuple[int, ...], np.dtype]]:
        return [(n, tuple(self.slots[n].shape), np.dtype(self.slots[n].dtype)) for n in names]

    def step_labels(self) -> list[str]:
        """One line per step for reports: the kernel's label, else the step kind."""
        return [s.label or ("gemm" if isinstance(s, GemmStep) else "kernel") for s in self.steps]

    def kernel_source(self, key: str, target: str) -> str:
        """The ``target`` source of kernel ``key``; a plan without it cannot run there."""
        source = self.kernels.get(key, {}).get(target)
        if not self.trusted:
            raise ModelLoadError(
                f"kernel {key!r}: this plan was loaded without regenerating its kernels from "
                "its description, so none is run; load it with pyforge.load"
            )
        if source is None:
            raise ModelLoadError(f"the plan has no {target} source for kernel {key!r}")
        return source

    def save(self, directory: str) -> None:
        """Write plan.json, weights.bin and kernels/; plan.json records every file's size and
        sha256 and its own checksum, which ``load`` checks, and the description its kernels are
        regenerated from."""
        why = (
            "it has no description" if self.description is None else self.description.get("refused")
        )
        if why:
            raise ModelLoadError(f"this plan cannot be saved: {why}")
        os.makedirs(os.path.join(directory, "kernels"), exist_ok=True)
        files = {WEIGHTS: _write(directory, WEIGHTS, self.weights.tobytes())}
        for key, sources in sorted(self.kernels.items()):
            for target, src in sorted(sources.items()):
                name = f"kernels/{key}.{target}.py"
                files[name] = _write(directory, name, src.encode())
        meta = {
            "format": FORMAT,
            "arena_bytes": self.arena_bytes,
            "slots": {k: dict(asdict(s), nbytes=s.nbytes) for k, s in self.slots.items()},
            "steps": [s.to_json() for s in self.steps],
            "inputs": self.inputs,
            "outputs": self.outputs,
            "state": self.state,
            "state_bytes": self.state_bytes,
            "stats": self.stats,
            "kernels": sorted(self.kernels),
            "files": files,
            "description": self.description,
        }
        meta = json.loads(json.dumps(meta))  # as load will read it (int keys become strings)
        meta["checksum"] = meta_checksum(meta)
        with open(os.path.join(directory, "plan.json"), "w") as f:
            json.dump(meta, f, indent=1)

    @classmethod
    def load(cls, directory: str, regenerate: Regenerate | None = None) -> ExecutionPlan:
        """The plan saved in ``directory``, every file checked against plan.json and every step
        against the slots before anything runs (``ModelLoadError`` naming file and field).

        ``regenerate(description, plan)`` gives the steps and kernel sources the description
        lowers to; each must equal the stored one. Without it the plan is data only: reading
        it is fine, running a kernel of it raises."""
        from .plan_files import read_plan

        return read_plan(cls, directory, regenerate)


WEIGHTS = "weights.bin"
Regenerate = Callable[[Any, ExecutionPlan], tuple[list[Step], dict[str, dict[str, str]]]]


def meta_checksum(meta: dict[str, Any]) -> str:
    """sha256 of plan.json's content less its "checksum" field, in one canonical form."""
    body = {k: v for k, v in meta.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _write(directory: str, name: str, data: bytes) -> dict[str, Any]:
    with open(os.path.join(directory, name), "wb") as f:
        f.write(data)
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@dataclass(frozen=True)
class DeviceFeed:
    """A GPU array given to ``predict`` (anything exporting ``__cuda_array_interface__``: Numba,
    CuPy, torch), its interface read once: a Numba device array builds that dict anew on every
    read, ~25 us per predict when read four times."""

    array: Any
    ptr: int | None  # None for the simulator's arrays, which export no interface
    shape: tuple[int, ...]
    dtype: np.dtype
    dense: bool  # C-contiguous
    stream: Any  # the producer stream (CUDA array interface v3), None when ready


def device_feed(x: Any) -> DeviceFeed | None:
    """``x`` as a DeviceFeed when it is a GPU array, else None."""
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is None:
        if not hasattr(x, "__cuda_ndarray__"):  # Numba's simulated device arrays have this
            return None
        return DeviceFeed(x, None, tuple(x.shape), np.dtype(x.dtype), x.is_c_contiguous(), None)
    shape, dtype = tuple(int(d) for d in cai["shape"]), np.dtype(cai["typestr"])
    strides = cai.get("strides")
    dense = strides is None or tuple(strides) == tuple(
        int(np.prod(shape[i + 1 :], dtype=np.int64)) * dtype.itemsize for i in range(len(shape))
    )
    dense = dense or int(np.prod(shape, dtype=np.int64)) <= 1
    return DeviceFeed(x, int(cai["data"][0]), shape, dtype, dense, cai.get("stream"))


def check_feeds(plan: ExecutionPlan, feeds: dict[str, Any]) -> None:
    """Validate predict() inputs against the plan's signature, naming expected and given."""
    names = plan.inputs
    unknown = sorted(set(feeds) - set(names))
    if unknown:
        raise InputError(f"unknown input name(s) {unknown}; the model takes {names}")
    for name, shape, dtype in plan.signature(names):
        if name not in feeds:
            raise InputError(f"missing input {name!r}; the model takes {names}")
        feed = feeds[name]
        if isinstance(feed, DeviceFeed):
            got_shape, got_dtype, dense = feed.shape, feed.dtype, feed.dense
        else:
            arr = np.asarray(feed)
            got_shape, got_dtype, dense = tuple(arr.shape), arr.dtype, True
        if got_shape != shape:
            raise InputError(f"input {name!r} has shape {got_shape}, expected {shape}")
        if got_dtype != dtype:
            raise InputError(f"input {name!r} has dtype {got_dtype}, expected {dtype}")
        if not dense:
            raise InputError(f"device input {name!r} is not C-contiguous: pass a contiguous copy")


def normalise_feeds(plan: ExecutionPlan, x: Any) -> dict[str, Any]:
    """predict()'s argument as a checked name -> array dict; GPU arrays become DeviceFeeds."""
    if not isinstance(x, dict):
        if len(plan.inputs) != 1:
            raise InputError(
                f"the model takes {len(plan.inputs)} inputs {plan.inputs}: pass a dict"
            )
        x = {plan.inputs[0]: x}
    feeds = {}
    for k, v in x.items():
        d = device_feed(v)
        feeds[k] = np.asarray(v) if d is None else d
    check_feeds(plan, feeds)
    return feeds
