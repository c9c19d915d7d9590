"""Fusion and memory-planning report: ops, launches and arena bytes per model, fusion on and off.

    python benchmarks/fusion_report.py [--target cpu|cuda]

Prints the markdown table that BENCHMARKS.md quotes (no timing: these are counts).
"""

from __future__ import annotations

import argparse
import sys

import pyforge
from pyforge.models import MODELS, cached_model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--models", default="mlp,ew,resnet50")
    args = ap.parse_args(argv)
    print(f"target: {args.target}\n")
    print(
        "| model | fusion | ops in/out | launches per inference (kernels + GEMMs) | arena | naive | lower bound | arena / bound |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        assert name in MODELS, name
        for fusion in (True, False):
            s = pyforge.compile(cached_model(name), target=args.target, fusion=fusion).stats
            print(
                f"| {name} | {'on' if fusion else 'off'} | {s['ops_in']} / {s['ops_out']} "
                f"| {s['launches']} ({s['launches'] - s['gemms']} + {s['gemms']}) | {s['arena_bytes']:,} "
                f"| {s['naive_bytes']:,} | {s['lower_bound_bytes']:,} "
                f"| {s['arena_bytes'] / max(s['lower_bound_bytes'], 1):.3f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
