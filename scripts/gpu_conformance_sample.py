"""Run a seeded sample of the cpu-passing ONNX backend cases on the cuda target, plus the light
ResNet-50, within a time budget; print pass counts and the failures.

    python3 scripts/gpu_conformance_sample.py [--budget-s 240] [--n 300]
"""

from __future__ import annotations

import argparse
import random
import re
import time
import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from tests.conformance.suite import cases, read_expected, run_case


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=float, default=240)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--skip-light", action="store_true")
    ap.add_argument("--match", default=None, help="only the cases whose name matches this regex")
    ap.add_argument(
        "--float16", action="store_true", help="instead: every float16 node case (no cpu kernels)"
    )
    args = ap.parse_args()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        all_cases = {c.name: c for c in cases()}
    expected = sorted(n for n in read_expected() if all_cases[n].kind == "node")
    if args.match:  # every node case it matches; those failing on cpu are skipped below
        expected = sorted(
            n for n, c in all_cases.items() if c.kind == "node" and re.search(args.match, n)
        )
    sample = random.Random(0).sample(expected, min(args.n, len(expected)))
    if args.float16:
        expected = sorted(
            n for n, c in all_cases.items() if c.kind == "node" and "float16" in n.lower()
        )
        sample = expected[: args.n]
    t0 = time.time()
    try:
        if not args.skip_light:
            run_case(all_cases["test_resnet50"], device="CUDA")
            print("light resnet50 on cuda: pass", flush=True)
    except Exception as e:  # noqa: BLE001  (a failing case is counted, not fatal)
        print(f"light resnet50 on cuda: FAIL {type(e).__name__}: {str(e)[:200]}", flush=True)
    passed, failed, ran = 0, [], 0
    for name in sample:
        if time.time() - t0 > args.budget_s:
            break
        if args.match:
            try:
                run_case(all_cases[name], device="CPU")
            except Exception:  # noqa: BLE001, S112  (not a cuda question: fails on cpu too)
                continue
        ran += 1
        try:
            run_case(all_cases[name], device="CUDA")
            passed += 1
        except Exception as e:  # noqa: BLE001  (a failing case is counted, not fatal)
            failed.append(f"{name}: {type(e).__name__}: {str(e)[:120]}")
    print("\n".join(failed[:40]))
    print(
        f"node tests on cuda: {passed} passed of {ran} run ({len(sample)} sampled from the "
        f"{len(expected)} {'float16 cases' if args.float16 else 'that pass on cpu'}) "
        f"in {time.time() - t0:.0f} s"
    )


if __name__ == "__main__":
    main()
