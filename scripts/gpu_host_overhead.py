"""Where a cuda ``predict`` with a device input spends its host time (median of N calls each).

    python3 scripts/gpu_host_overhead.py [--n 2000]

Rows: reading the input's ``__cuda_array_interface__``; ``normalise_feeds`` (feed checks);
``runtime.run`` on checked feeds; the whole ``predict``; the graph replay + synchronise alone;
a device-to-device copy of the input + synchronise alone.
"""

from __future__ import annotations

import argparse

from numba import cuda

import pyforge
from benchmarks.peers import measure
from pyforge.exec.plan import normalise_feeds
from pyforge.models import cached_model, random_inputs


def median_us(fn, n: int) -> float:
    return measure(fn, n, warmup=20)["median_ms"] * 1e3


def rows_for(name: str, precision: str, n: int) -> dict[str, float]:
    path = cached_model(name)
    feeds = random_inputs(path, seed=0)
    model = pyforge.compile(path, target="cuda", precision=precision)
    rt = model.runtime
    ((key, host),) = feeds.items()
    dev = cuda.to_device(host)
    checked = normalise_feeds(model.plan, dev)
    dst = rt.views[key]

    def replay():
        rt.graph.replay()
        rt.stream.synchronize()

    def copy():
        dst.copy_to_device(dev.reshape(-1), stream=rt.stream)
        rt.stream.synchronize()

    return {
        "__cuda_array_interface__ read": median_us(lambda: dev.__cuda_array_interface__, n),
        "normalise_feeds": median_us(lambda: normalise_feeds(model.plan, dev), n),
        "runtime.run (checked feeds)": median_us(lambda: rt.run(checked), n),
        "predict (device in/out)": median_us(lambda: model.predict(dev), n),
        "graph replay + sync": median_us(replay, n),
        "input D2D copy + sync": median_us(copy, n),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    args = ap.parse_args()
    for name, precision, n in (("mlp", "fp32", args.n), ("resnet50", "tf32", args.n // 5)):
        for label, us in rows_for(name, precision, n).items():
            print(f"{name} {precision:4s} {label:32s} {us:9.1f} us")


if __name__ == "__main__":
    main()
