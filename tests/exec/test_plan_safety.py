"""A saved plan is data: damaged or planted files are refused before any of their code runs,
a kernel that is not what pyforge lowers the plan's description to is never imported, and a
kernel cache file that is not the source in hand is never imported."""

import hashlib
import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest

import pyforge
from pyforge.errors import ModelLoadError
from pyforge.exec import kernels
from pyforge.exec.plan import ExecutionPlan, meta_checksum
from pyforge.exec.steps import GemmStep
from pyforge.models import mlp, random_inputs
from tests.exec.test_threads import two_conv


@pytest.fixture(scope="module")
def models():
    return {"mlp": pyforge.compile(mlp(batch=2), target="cpu"), "conv": two_conv_model()}


def two_conv_model():
    return pyforge.compile(two_conv(), target="cpu")


def saved(tmp_path, model) -> str:
    path = str(tmp_path / "plan")
    model.save(path)
    return path


def read_meta(path: str) -> dict:
    with open(os.path.join(path, "plan.json")) as f:
        return json.load(f)


def write_meta(path: str, meta: dict, reseal: bool = True) -> None:
    """plan.json rewritten; ``reseal`` recomputes its checksum, as a hostile editor would."""
    if reseal:
        meta["checksum"] = meta_checksum(meta)
    with open(os.path.join(path, "plan.json"), "w") as f:
        json.dump(meta, f)


def marker_line(marker) -> str:
    return f"\nopen({str(marker)!r}, 'w').write('ran')\n"


def test_planted_line_in_a_saved_kernel_never_runs(tmp_path, models):
    path = saved(tmp_path, models["mlp"])
    marker = tmp_path / "marker"
    name = min(os.listdir(os.path.join(path, "kernels")))
    with open(os.path.join(path, "kernels", name), "a") as f:
        f.write(marker_line(marker))
    with pytest.raises(ModelLoadError, match=f"kernels/{name}.*'size'"):
        pyforge.load(path, target="cpu")
    # the same length, other bytes: the sha256 catches it
    path2 = saved(tmp_path / "b", models["mlp"])
    kfile = Path(path2, "kernels", name)
    src = kfile.read_text()
    planted = (marker_line(marker) + src)[: len(src)]
    kfile.write_text(planted)
    with pytest.raises(ModelLoadError, match=f"kernels/{name}.*'sha256'"):
        pyforge.load(path2, target="cpu")
    assert not marker.exists()


def test_planted_file_in_the_kernel_cache_is_not_imported(tmp_path, models, monkeypatch):
    model = models["mlp"]
    x = random_inputs(mlp(batch=2), seed=5)
    want = model.predict(x)
    cache = tmp_path / "cache"
    monkeypatch.setenv("PYFORGE_CACHE", str(cache))
    monkeypatch.setattr(kernels, "_LOADED", {})
    monkeypatch.setattr(kernels, "_PRIVATE", set())
    marker = tmp_path / "marker"
    planted = marker_line(marker) + "def kernel(*args):\n    pass\n"
    paths = []
    for sources in model.plan.kernels.values():
        if "cpu" in sources:
            p = kernels.kernel_path(sources["cpu"], "cpu")
            os.makedirs(os.path.dirname(p), exist_ok=True)
            Path(p).write_text(planted)
            paths.append((p, sources["cpu"]))
    assert paths
    again = pyforge.compile(mlp(batch=2), target="cpu")
    np.testing.assert_array_equal(again.predict(x), want)
    assert not marker.exists()
    for p, source in paths:
        assert Path(p).read_text() == source  # rewritten with the source in hand
    mode = stat.S_IMODE(os.stat(cache / "kernels" / "cpu").st_mode)
    assert mode == 0o700


def test_an_edited_plan_json_fails_its_checksum(tmp_path, models):
    path = saved(tmp_path, models["mlp"])
    meta = read_meta(path)
    meta["slots"]["x"]["offset"] += 256
    write_meta(path, meta, reseal=False)
    with pytest.raises(ModelLoadError, match="'checksum'"):
        pyforge.load(path, target="cpu")


@pytest.mark.parametrize(
    "edit,says",
    [
        (lambda m: m["kernels"].append("../../../x"), "bad key '../../../x'"),
        (lambda m: m["kernels"].append("/tmp/x"), "bad key '/tmp/x'"),
        (lambda m: m["kernels"].append("a\\b"), "bad key"),
        (lambda m: m["files"].update({"/etc/passwd": {"size": 1, "sha256": "0"}}), "/etc/passwd"),
        (lambda m: m["files"].update({"kernels/../../x.cpu.py": {"size": 1, "sha256": "0"}}), ".."),
    ],
)
def test_names_reaching_outside_the_plan_are_refused(tmp_path, models, edit, says):
    path = saved(tmp_path, models["mlp"])
    meta = read_meta(path)
    edit(meta)
    write_meta(path, meta)
    with pytest.raises(ModelLoadError, match=says.replace("\\", "\\\\")):
        pyforge.load(path, target="cpu")


@pytest.mark.parametrize("damage", ["half", "empty", "enlarged", "missing", "flipped"])
def test_damaged_weights_are_refused(tmp_path, models, damage):
    path = saved(tmp_path, models["mlp"])
    wfile = Path(path, "weights.bin")
    data = wfile.read_bytes()
    if damage == "missing":
        os.remove(wfile)
    else:
        changed = {
            "half": data[: len(data) // 2],
            "empty": b"",
            "enlarged": data + b"\0" * 1024,
            "flipped": data[:100] + bytes([data[100] ^ 1]) + data[101:],
        }[damage]
        wfile.write_bytes(changed)
    field = {"missing": "missing", "flipped": "'sha256'"}.get(damage, "'size'")
    with pytest.raises(ModelLoadError, match=f"weights.bin.*{field}"):
        pyforge.load(path, target="cpu")


def _gemm(meta: dict) -> dict:
    return next(s for s in meta["steps"] if s["kind"] == "gemm")


@pytest.mark.parametrize(
    "edit,says",
    [
        (lambda m: m["slots"]["fc1.weight"].update(offset=10**7), "slot 'fc1.weight'.*'offset'"),
        (lambda m: m["slots"]["fc1.bias"].update(offset=2), "slot 'fc1.bias'.*'offset'.*align"),
        (lambda m: m["slots"]["x"].update(offset=m["arena_bytes"]), "slot 'x'.*past the arena"),
        (lambda m: m["slots"]["fc1.weight"].update(dtype="<f8"), "'fc1.weight'.*'dtype'"),
        (lambda m: m["slots"]["fc1.weight"].update(dtype="|O", nbytes=0), "'dtype'"),
        (lambda m: m["slots"]["fc1.weight"].update(shape=[512, 512]), "'fc1.weight'.*'shape'"),
        (lambda m: m["slots"]["x"].update(shape=[-2, 256], nbytes=-2048), "'x'.*'shape'"),
        (lambda m: m["slots"]["x"].update(region="weights"), "'x'.*'region'"),
        (lambda m: m["slots"]["x"].update(region="elsewhere"), "'x'.*'region'"),
        (lambda m: _gemm(m).update(b="nothing"), "step 0.*'b'.*'nothing'"),
        (lambda m: _gemm(m).update(m=4096), "step 0.*field 'a'"),
        (lambda m: _gemm(m).update(k=4096), "step 0.*field 'a'"),
        (lambda m: _gemm(m).update(ldd=10**6), "step 0.*field 'd'"),
        (lambda m: _gemm(m).update(batch=3, stride_b=10), "step 0.*field 'b'"),
        (lambda m: _gemm(m).update(m="1"), "step 0.*'m'"),
        (lambda m: _gemm(m)["epilogue"].update(n=10**6), "step 0.*epilogue.*'n'"),
        (lambda m: _gemm(m)["epilogue"].update(kernel="../x"), "step 0.*'kernel'"),
        (lambda m: m["steps"][0].update(kind="shell"), "step 0 is malformed"),
        (lambda m: m["inputs"].append("nothing"), "'inputs'.*'nothing'"),
    ],
)
def test_slots_and_steps_are_checked_before_anything_runs(tmp_path, models, edit, says):
    path = saved(tmp_path, models["mlp"])
    meta = read_meta(path)
    assert meta["steps"][0]["kind"] == "gemm"
    edit(meta)
    write_meta(path, meta)
    with pytest.raises(ModelLoadError, match=says):
        pyforge.load(path, target="cpu")


def test_conv_geometry_and_im2col_are_checked(tmp_path, models):
    model = models["conv"]
    assert any(isinstance(s, GemmStep) and s.conv for s in model.plan.steps)
    path = saved(tmp_path, model)
    x = random_inputs(two_conv(), seed=2)
    np.testing.assert_array_equal(pyforge.load(path, target="cpu").predict(x), model.predict(x))
    meta = read_meta(path)
    conv = next(s for s in meta["steps"] if s["kind"] == "gemm" and s["conv"])
    conv["conv"]["geometry"][1] *= 4  # four times the channels the image holds
    write_meta(path, meta)
    with pytest.raises(ModelLoadError, match="conv.x"):
        pyforge.load(path, target="cpu")


def _reseal_kernel(path: str, name: str, source: str) -> None:
    """A kernel file rewritten and plan.json's size, sha256 and checksum made to match it."""
    data = source.encode()
    Path(path, "kernels", name).write_bytes(data)
    meta = read_meta(path)
    meta["files"][f"kernels/{name}"] = {
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    write_meta(path, meta)


@pytest.mark.parametrize("model", ["mlp", "conv"])
def test_a_kernel_rewritten_with_its_checksums_never_runs(tmp_path, models, model):
    path = saved(tmp_path, models[model])
    marker = tmp_path / "marker"
    name = min(n for n in os.listdir(os.path.join(path, "kernels")) if n.endswith(".cpu.py"))
    _reseal_kernel(path, name, marker_line(marker) + Path(path, "kernels", name).read_text())
    with pytest.raises(
        ModelLoadError, match=f"kernels/{name}: kernel '{name[:-7]}'.*not the source"
    ):
        pyforge.load(path, target="cpu")
    # read without its lowering, the plan is data: binding it runs none of its kernels
    plan = ExecutionPlan.load(path)
    with pytest.raises(ModelLoadError, match="without regenerating"):
        pyforge.CompiledModel(plan, "cpu")
    assert not marker.exists()


def _members(meta: dict) -> list[dict]:
    return [m for n in meta["description"]["nodes"] for m in n.get("group", {}).get("members", [])]


def _rename_value(meta: dict, old: str, new: str) -> None:
    values = meta["description"]["values"]
    values[new] = values.pop(old)
    for n in meta["description"]["nodes"] + _members(meta):
        n["inputs"] = [new if v == old else v for v in n["inputs"]]
        n["outputs"] = [new if v == old else v for v in n["outputs"]]


def _hostile(marker) -> str:
    return f"1); import os; os.system('touch {marker}'); ("


@pytest.mark.parametrize(
    "edit,says",
    [
        (lambda m, h: _members(m)[0]["attrs"].update(mode=h), "'fc1' \\(Gemm\\) attribute 'mode'"),
        (lambda m, h: _members(m)[0]["attrs"].update(alpha=[[h]]), "attribute 'alpha'"),
        (lambda m, h: _members(m)[0]["attrs"].update(alpha={"code": h}), "attribute 'alpha'"),
        (lambda m, h: _members(m)[0]["attrs"].update({h: 1}), "node 'fc1' \\(Gemm\\)"),
        (lambda m, h: _members(m)[2].update(op=h), "field 'op'"),
        (lambda m, h: _members(m)[2].update(op="Exec"), "'relu1' \\(Exec\\).*not an op"),
        (lambda m, h: _members(m)[2].update(name=h), "not an allowed string"),
        (lambda m, h: _rename_value(m, "relu1", h), "value name"),
        (lambda m, h: m["description"]["values"]["x"].update(shape=["1", 256]), "'x'.*'shape'"),
        (lambda m, h: m["description"]["values"]["x"].update(dtype="|O"), "'x'.*dtype"),
        (lambda m, h: m["description"]["values"]["x"].update(shape=[3, 256]), "'x'.*slot"),
        (lambda m, h: m["description"]["options"].update(conv_tile=h), "conv_tile"),
        (lambda m, h: m["description"].update(nodes=[h]), "node"),
    ],
)
def test_a_description_that_is_not_strictly_typed_is_refused(tmp_path, models, edit, says):
    path = saved(tmp_path, models["mlp"])
    marker = tmp_path / "marker"
    meta = read_meta(path)
    edit(meta, _hostile(marker))
    write_meta(path, meta)
    with pytest.raises(ModelLoadError, match=f"description.*{says}"):
        pyforge.load(path, target="cpu")
    assert not marker.exists()


@pytest.mark.parametrize(
    "edit,says",
    [  # each well typed, and lowered to code that is not the plan's
        (lambda m: _members(m)[2].update(op="Sigmoid"), "description' lowers to kernel"),
        (lambda m: _members(m)[0]["attrs"].update(alpha=2.0), "lowers to kernel.*Gemm fc1"),
        (lambda m: m["description"]["nodes"][0].update(name="relu9"), "step 0 is not what"),
        (lambda m: m["description"]["values"]["fc1.weight"].update(shape=[256, 512]), "slot"),
        (lambda m: _members(m)[1]["inputs"].reverse(), "does not lower|lowers to kernel"),
    ],
)
def test_a_description_the_plan_was_not_lowered_from_is_refused(tmp_path, models, edit, says):
    path = saved(tmp_path, models["mlp"])
    meta = read_meta(path)
    edit(meta)
    write_meta(path, meta)
    with pytest.raises(ModelLoadError, match=says):
        pyforge.load(path, target="cpu")


def test_a_graph_with_names_a_description_cannot_hold_is_not_saved(tmp_path):
    model = mlp(batch=1)
    model.graph.node[-1].name = "fc3 'quoted'"
    compiled = pyforge.compile(model, target="cpu")
    x = random_inputs(model, seed=4)
    assert np.all(np.isfinite(compiled.predict(x)))  # it runs here; only saving is refused
    with pytest.raises(ModelLoadError, match="cannot be saved.*fc3 'quoted'"):
        compiled.save(tmp_path / "plan")
