"""Shared test setup: a per-session kernel/model cache and the gpu marker's skip rule."""

import os

import pytest

os.environ.setdefault("PYFORGE_CACHE", os.path.join(os.path.dirname(__file__), "..", ".cache"))


def pytest_collection_modifyitems(config, items):
    from pyforge import default_target

    for item in items:  # under xdist (--dist loadgroup) one worker runs every Ray Serve test
        if "tests/serve/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.xdist_group("ray"))
    if default_target() == "cuda":
        return
    skip = pytest.mark.skip(reason="needs a real CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
