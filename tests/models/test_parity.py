"""ONNX Runtime parity of the three test models, fused and unfused, on the cpu target."""

import numpy as np
import pytest

from pyforge.models import MODELS, cached_model, random_inputs
from tests.helpers import check_against_ort


@pytest.mark.parametrize("fusion", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("name", ["mlp", "ew"])
def test_small_models_match_ort(name, fusion):
    model = MODELS[name](batch=2)
    check_against_ort(model, random_inputs(model, seed=3), fusion=fusion)


@pytest.mark.parametrize("fusion", [True, False], ids=["fused", "unfused"])
def test_resnet50_matches_ort(fusion):
    path = cached_model("resnet50")
    compiled, _ = check_against_ort(path, random_inputs(path, seed=1), fusion=fusion)
    assert compiled.stats["launches"] > 0


@pytest.mark.parametrize("name", ["mlp", "ew", "resnet50"])
def test_fusion_does_not_change_results(name):
    import pyforge

    model = cached_model(name)
    x = random_inputs(model, seed=5)
    fused = pyforge.compile(model, target="cpu").predict(x)
    unfused = pyforge.compile(model, target="cpu", fusion=False).predict(x)
    np.testing.assert_allclose(fused, unfused, rtol=1e-4, atol=1e-5)


def test_fresh_inputs_give_fresh_outputs():
    import pyforge

    model = MODELS["mlp"](batch=1)
    compiled = pyforge.compile(model, target="cpu")
    a = compiled.predict(random_inputs(model, seed=1))
    b = compiled.predict(random_inputs(model, seed=2))
    assert not np.allclose(a, b)
    np.testing.assert_array_equal(compiled.predict(random_inputs(model, seed=1)), a)
