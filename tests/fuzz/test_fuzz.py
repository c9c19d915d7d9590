"""Differential fuzzing in the suite: a fixed seed set, the known findings, an opt-in long run.

A failing seed reproduces with ``python -m tests.fuzz.minimize --seed N``; the long run is
``PYFORGE_FUZZ_N=10000 pytest tests/fuzz -m slow`` (``PYFORGE_FUZZ_OUT=DIR`` keeps the models).
"""

from __future__ import annotations

import os

import pytest

from .gen import generate
from .known import HITS, KNOWN
from .minimize import rebuild
from .run import BUGS, classify, fuzz

# the seeds CI runs. Measured from a cold kernel cache on the shared 2-core machine: 160 seeds
# and the known cases took 300 s, 133 took 596 s while four other test runs shared the cores;
# 100 seeds should take 3-4 minutes on an idle one. A seed that hits a known finding is left
# out until it is fixed (known.HITS); its minimised graph runs in test_known
CI_SEEDS = [s for s in range(100) if s not in HITS]


@pytest.mark.parametrize("seed", CI_SEEDS)
def test_seed(seed):
    case = generate(seed)
    res = classify(case.model, case.feeds)
    assert res.cls not in BUGS, (
        f"seed {seed}: {res.cls} ({'/'.join(res.variants)}): {res.detail}\n"
        f"minimise it: python -m tests.fuzz.minimize --seed {seed}"
    )


@pytest.mark.parametrize(
    "known",
    [
        pytest.param(
            k,
            marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason=k.reason),
            id=f"seed{k.seed}-{k.op}",
        )
        for k in KNOWN
    ],
)
def test_known(known):
    case = generate(known.seed)
    model, feeds = rebuild(case.model, case.feeds, known.cut)
    res = classify(model, feeds)
    assert res.cls not in BUGS, f"{res.cls} ({'/'.join(res.variants)}): {res.detail}"


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("PYFORGE_FUZZ_N"), reason="opt-in: set PYFORGE_FUZZ_N=10000 (graphs)"
)
def test_fuzz_long():
    n = int(os.environ["PYFORGE_FUZZ_N"])
    start = int(os.environ.get("PYFORGE_FUZZ_START", "100000"))
    tally = fuzz(range(start, start + n), os.environ.get("PYFORGE_FUZZ_OUT"), minimize=True)
    print(tally.table())
    known_ops = {(k.cls, k.op) for k in KNOWN}
    new = {key: n for key, n in tally.by_class_op.items() if key[0] in BUGS}
    new = {key: n for key, n in new.items() if key not in known_ops}
    assert not new, f"findings not in known.py: {new}\n{tally.table()}"
