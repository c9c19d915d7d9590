"""Per-step time of pyforge's cpu runtime beside ONNX Runtime's per-node profile, ResNet-50 b1.

    python scripts/cpu_steps.py [--runs 20] [--top 25]

Each pyforge step (a conv with its epilogue, a pool...) is timed around its call over ``runs``
inferences (median); ORT's CPU EP runs the same model with profiling on and its node events are
summed by node name (median per run). Both are matched by the ONNX node name of the conv.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import defaultdict

import numpy as np

import pyforge
from pyforge.models import cached_model, random_inputs


def pyforge_steps(path: str, feeds: dict, runs: int) -> dict[str, float]:
    model = pyforge.compile(path, target="cpu")
    rt = model.runtime
    for name, arr in feeds.items():
        rt.views[name][:] = np.ravel(arr)
    labels = model.plan.step_labels()
    times = defaultdict(list)
    for _ in range(3):
        for call in rt.calls:
            call()
    for _ in range(runs):
        for label, call in zip(labels, rt.calls):
            t0 = time.perf_counter()
            call()
            times[label].append(time.perf_counter() - t0)
    if os.environ.get("WARM"):  # each step again, called 10 times in a row (caches warm)
        for label, call in zip(labels, rt.calls):
            ts = []
            for _ in range(10):
                t0 = time.perf_counter()
                call()
                ts.append(time.perf_counter() - t0)
            WARM[label] = float(np.median(ts[2:])) * 1e3
    return {k: float(np.median(v)) * 1e3 for k, v in times.items()}


WARM: dict[str, float] = {}


def ort_nodes(path: str, feeds: dict, runs: int) -> dict[str, float]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.enable_profiling = True
    opts.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    for _ in range(3 + runs):
        sess.run(None, feeds)
    with open(sess.end_profiling()) as f:
        events = json.load(f)
    per = defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per[e["name"][: -len("_kernel_time")]].append(e["dur"] / 1e3)
    return {k: float(np.median(v[-runs:])) for k, v in per.items()}


def _ort_names(node: str) -> list[str]:
    """ORT's CPU EP fuses each conv with its BatchNorm and Relu (NCHWc layout) and names the
    fused node after the last op it took in; the residual Add + Relu may stay a node apart."""
    stem, _, leaf = node.rpartition(".")
    names = {
        "conv1": [f"{stem}.relu1"],
        "conv2": [f"{stem}.relu2"],
        "conv3": [f"{stem}.bn3", f"{stem}.relu3", f"{stem}.add"],
        "0": [f"{stem}.1"],  # downsample.0 -> downsample.1
    }.get(leaf, [node])
    if node == "conv1":
        names = ["relu"]
    return [f"{n}_nchwc" for n in names] + names


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    path = cached_model("resnet50")
    feeds = random_inputs(path, seed=0)
    ours = pyforge_steps(path, feeds, args.runs)
    theirs = ort_nodes(path, feeds, args.runs)
    print(
        f"pyforge steps total {sum(ours.values()):.1f} ms; ORT nodes total {sum(theirs.values()):.1f} ms"
    )
    rows = []
    for label, ms in ours.items():
        node = label.split(" ", 1)[-1].split("/")[0]
        rows.append((ms, label, sum(theirs.get(k, 0.0) for k in _ort_names(node)) or float("nan")))
    rows.sort(key=lambda r: -(r[0] - (0 if np.isnan(r[2]) else r[2])))
    print(f"{'pyforge ms':>10} {'ORT ms':>8}  step (largest gap first)")
    for ms, label, ort_ms in rows[: args.top]:
        warm = f"{WARM[label]:8.3f}" if label in WARM else ""
        print(f"{ms:10.3f} {ort_ms:8.3f} {warm} {label[:90]}")
    print("ORT node names (first 8):", list(theirs)[:8])


if __name__ == "__main__":
    main()
