"""H200 A/B of the global pool's cuda form (templates/depthwise_cuda.py): EfficientNet-B0 and
MobileNetV2 (torchvision, random weights, batch 1, fp32, input on the device) compiled twice in
one process, PYFORGE_POOL_ROWS=1 (a block per (n, c)) and =0 (a thread per output), timed in
alternated blocks; then the HF rows of peers.py --corpus (the jit.trace graph fallback).

    PYTHONPATH=. python3 scripts/gpu_pool_ab.py [--budget 150]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import corpus_models as cm


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=150)
    ap.add_argument("--models", default="efficientnet_b0,mobilenet_v2")
    ap.add_argument("--peers", default="bert_base,distilbert,gpt2_2l,minilm_l6")
    args = ap.parse_args()
    start = time.perf_counter()
    import torch

    import pyforge

    rows = []
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{name}.onnx"
            cm.torchvision_builder(name)(path)
            x = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
            dev = {"input": torch.from_numpy(x).cuda()}
            models, outs = {}, {}
            for v in ("1", "0"):
                os.environ["PYFORGE_POOL_ROWS"] = v
                t0 = time.perf_counter()
                models[v] = pyforge.compile(
                    str(path), target="cuda", input_shapes={"input": x.shape}
                )
                outs[v] = np.asarray(models[v].predict({"input": x}))
                print(f"{name} rows={v} compiled {time.perf_counter() - t0:.1f} s", flush=True)
            times = {v: [] for v in models}
            for _ in range(40):
                for v, m in models.items():
                    for j in range(3):
                        t0 = time.perf_counter()
                        m.predict(dev)
                        if j:
                            times[v].append(time.perf_counter() - t0)
            diff = float(np.abs(outs["1"] - outs["0"]).max())
            med = {v: float(np.median(t)) * 1e3 for v, t in times.items()}
            rows.append((name, med["1"], med["0"], diff))
    os.environ.pop("PYFORGE_POOL_ROWS", None)
    left = args.budget - (time.perf_counter() - start) - 5
    peers = ""
    if left > 30 and args.peers:
        cmd = [sys.executable, "benchmarks/peers.py", "--corpus", "--target", "cuda",
               "--models", args.peers, "--compile-mode", "off", "--runs", "20",
               "--budget", str(int(left)), "--timeout", "60"]  # fmt: skip
        peers = subprocess.run(cmd, capture_output=True, text=True, check=False).stdout
    print(peers)
    print(f"load {os.getloadavg()[0]:.1f}; {time.perf_counter() - start:.0f} s")
    print("| model | pool rows ms | pool thread ms | rows/thread | max diff |")
    print("|---|---:|---:|---:|---:|")
    for name, a, b, d in rows:
        print(f"| {name} | {a:.3f} | {b:.3f} | {a / b:.2f}x | {d:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
