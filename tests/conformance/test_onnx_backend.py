"""ONNX's backend conformance suite (node tests + the 9 light model-zoo models) on the cpu target.

A case listed in expected_pass.txt must pass; a case not listed may fail (it is marked xfail) and
is reported when it starts passing, without failing the run. The pass count is printed at the end.
"""

from __future__ import annotations

import warnings

import pytest

from tests.conformance.suite import cases, read_expected, run_case

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # ONNX's case generators divide by zero on purpose
    CASES = {c.name: c for c in cases()}
EXPECTED = read_expected()
RESULTS: dict[str, bool] = {}  # read by conftest.py's summary hook


def _param(name: str):
    marks = [pytest.mark.slow] if CASES[name].kind == "light" else []
    return pytest.param(name, id=name, marks=marks)


@pytest.mark.parametrize("name", [_param(n) for n in CASES])
def test_onnx_backend(name: str) -> None:
    try:
        run_case(CASES[name])
    except Exception as e:
        RESULTS[name] = False
        if name in EXPECTED:
            raise
        pytest.xfail(f"not in expected_pass.txt: {type(e).__name__}: {str(e)[:200]}")
    RESULTS[name] = True
    if name not in EXPECTED:
        print(f"NEWLY PASSING: {name} (add it to tests/conformance/expected_pass.txt)")


def test_expected_list_names_real_cases() -> None:
    assert EXPECTED <= set(CASES), sorted(EXPECTED - set(CASES))[:10]
