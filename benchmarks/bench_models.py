"""asv benchmarks: predict latency and compile counts for mlp, ew and resnet50, fusion on/off.

    asv run --python=same --quick        # or: asv continuous main HEAD

`time_*` is the steady-state ``predict`` latency; `track_*` are launches per inference, arena
bytes, ops after optimisation and seconds to the first result (compile + first run, with the
kernel disk cache in ``$PYFORGE_CACHE`` warm after the first compile). The cpu target always
runs; cuda joins when a GPU is usable.
"""

from __future__ import annotations

import time

import pyforge
from pyforge.models import cached_model, random_inputs

MODELS = ["mlp", "ew", "resnet50"]
TARGETS = ["cpu"] + (["cuda"] if pyforge.default_target() == "cuda" else [])
FUSION = [True, False]
PARAMS = (MODELS, TARGETS, FUSION)
PARAM_NAMES = ["model", "target", "fusion"]


def _compile(name: str, target: str, fusion: bool) -> tuple[pyforge.CompiledModel, dict, float]:
    path = cached_model(name)
    feeds = random_inputs(path, seed=0)
    t0 = time.perf_counter()
    model = pyforge.compile(path, target=target, fusion=fusion)
    model.predict(feeds)  # Numba compiles (or loads) each kernel at its first call
    return model, feeds, time.perf_counter() - t0


class Predict:
    """Latency of one ``predict`` call after warm-up."""

    params = PARAMS
    param_names = PARAM_NAMES
    timeout = 600

    def setup_cache(self) -> list[str]:
        return [cached_model(name) for name in MODELS]  # generate every model once

    def setup(self, _paths, name: str, target: str, fusion: bool) -> None:
        self.model, self.feeds, _ = _compile(name, target, fusion)

    def time_predict(self, _paths, name: str, target: str, fusion: bool) -> None:
        self.model.predict(self.feeds)


class Compiled:
    """Counts from compiling each (model, target, fusion) once, in ``setup_cache``."""

    params = PARAMS
    param_names = PARAM_NAMES
    timeout = 600

    def setup_cache(self) -> dict[tuple[str, str, bool], dict]:
        stats = {}
        for name in MODELS:
            for target in TARGETS:
                for fusion in FUSION:
                    model, _, seconds = _compile(name, target, fusion)
                    stats[name, target, fusion] = dict(model.stats, first_result_s=seconds)
        return stats

    def track_launches(self, stats, name: str, target: str, fusion: bool) -> int:
        return stats[name, target, fusion]["launches"]

    track_launches.unit = "launches"

    def track_arena_bytes(self, stats, name: str, target: str, fusion: bool) -> int:
        return stats[name, target, fusion]["arena_bytes"]

    track_arena_bytes.unit = "bytes"

    def track_ops_after_optimisation(self, stats, name: str, target: str, fusion: bool) -> int:
        return stats[name, target, fusion]["ops_out"]

    track_ops_after_optimisation.unit = "ops"

    def track_compile_seconds(self, stats, name: str, target: str, fusion: bool) -> float:
        return stats[name, target, fusion]["first_result_s"]

    track_compile_seconds.unit = "seconds"
