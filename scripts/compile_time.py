"""Compile time on the cpu: compile, predict at a corpus model's two shapes, total (wall/cpu s).

    python scripts/compile_time.py ppocr_v4_det [ssdlite320_mobilenet_v3_large ...]

Models are the corpus's (benchmarks/corpus.py, its cache); needs the corpus venv for builders.
Use a fresh PYFORGE_CACHE for a cold figure and run again for a warm one.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyforge
from benchmarks import corpus


def main(names: list[str]) -> None:
    for name in names:
        entry = corpus.ENTRIES[name]
        path = corpus.model_path(entry)
        feeds = [corpus.make_feeds(path, entry, run, seed=run + 1) for run in (0, 1)]
        w0, c0 = time.perf_counter(), time.process_time()
        model = pyforge.compile(str(path), target="cpu")
        out = [("compile", time.perf_counter() - w0, time.process_time() - c0)]
        for i, f in enumerate(feeds):
            w, c = time.perf_counter(), time.process_time()
            model.predict(f)
            out.append((f"predict{i}", time.perf_counter() - w, time.process_time() - c))
        out.append(("total", time.perf_counter() - w0, time.process_time() - c0))
        print(name, "  ".join(f"{k} {a:.1f}/{b:.1f}" for k, a, b in out), "(wall/cpu s)")


if __name__ == "__main__":
    main(sys.argv[1:])
