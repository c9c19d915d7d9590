"""benchmarks/peers.py --corpus: the table's arithmetic, the budget stop, and one small torch
model end to end where torch is installed."""

from __future__ import annotations

import importlib.util

import pytest

from benchmarks import peers_corpus as pc


def test_named_models_first_and_no_ort_variants():
    names = pc.torch_models()
    assert names[: len(pc.FIRST)] == list(pc.FIRST)
    assert "minilm_l6_qdyn" not in names and "magika" not in names and "block" not in names
    assert pc.run_dims(pc.entry("bert_base")) == {"batch": 1, "seq": 128}
    assert pc.run_dims(pc.entry("gpt2_2l_past"))["seq"] == 1  # a decode step keeps its shape


def test_table_ratios_geomean_and_failed_rows():
    rows = [
        {"model": "a", "ms": {"pyforge": 2.0, "ORT CPU": 1.0}, "parity": 1e-6,
         "parity_rel": "1.0e-07 rel", "status": "ok", "compile_s": 3.0, "torch_compile_s": 41.0},
        {"model": "b", "ms": {"pyforge": 1.0, "ORT CPU": 4.0}, "parity": 2e-6,
         "parity_rel": "2.0e-07 rel", "status": "ok"},
        {"model": "c", "status": "pyforge fails: UnsupportedOpError: Foo"},
    ]  # fmt: skip
    text = pc.table(rows)
    lines = text.splitlines()
    assert "| a |" in lines[2] and "2.00x" in lines[2] and "1.0e-06" in lines[2]
    assert "3.0 (torch.compile 41)" in lines[2]
    assert "0.25x" in lines[3]
    assert "| c |" in lines[4] and "UnsupportedOpError" in lines[4]
    assert "0.71x (n=2)" in lines[5]  # sqrt(2 * 0.25)


def test_parity_reports_shape_and_count_mismatch():
    import numpy as np

    a = np.ones((2, 3), np.float32)
    assert pc.parity([a], [a + 0.5])[0] == pytest.approx(0.5)
    assert "shape" in pc.parity([a], [a.T])[1]
    assert pc.parity([a, a], [a])[0] is None


def test_budget_stops_cleanly(capsys):
    assert pc.main(["--models", "resnet18,bert_base", "--budget", "0"]) == 0
    out = capsys.readouterr().out
    assert out.count("not run: budget spent") == 2 and "geometric mean" in out


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="needs torch and transformers",
)
def test_one_small_model_end_to_end(tmp_path, capsys):
    md = tmp_path / "t.md"
    args = ["--corpus", "--models", "electra_small", "--runs", "2", "--md", str(md)]
    assert pc.main(args) == 0
    row = next(ln for ln in md.read_text().splitlines() if ln.startswith("| electra_small"))
    head = next(ln for ln in md.read_text().splitlines() if ln.startswith("| model"))
    cells = dict(zip(head.split(" | "), row.split(" | ")))
    assert cells["status |"].strip(" |") == "ok", row
    assert float(cells["parity vs torch"].split()[0]) < 1e-3
    for system in ("pyforge ms", "ORT CPU ms", "PyTorch eager ms"):
        assert float(cells[system]) > 0
    assert cells["pyforge/PyTorch eager"].endswith("x")


def test_graph_of_falls_back_to_the_trace_when_capture_copies_host_tensors():
    """A module whose capture fails (an HF model's host-tensor copy) is graphed from its trace;
    one that captures is graphed as it is. A stand-in torch: no GPU here."""
    import contextlib
    from types import SimpleNamespace

    state = {"capturing": False, "calls": []}

    @contextlib.contextmanager
    def capture(graph):
        state["capturing"] = True
        try:
            yield
        finally:
            state["capturing"] = False

    stream = SimpleNamespace(wait_stream=lambda s: None)
    cuda = SimpleNamespace(
        Stream=lambda: stream, current_stream=lambda: stream, synchronize=lambda: None,
        stream=lambda s: contextlib.nullcontext(), graph=capture,
        CUDAGraph=lambda: SimpleNamespace(replay=lambda: state["calls"].append("replay")),
    )  # fmt: skip

    def hf(x):
        if state["capturing"]:
            raise RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture")
        return x

    traced = []
    torch = SimpleNamespace(
        cuda=cuda, no_grad=contextlib.nullcontext, inference_mode=lambda on: contextlib.nullcontext(),
        jit=SimpleNamespace(trace=lambda net, args, **kw: traced.append(net) or (lambda x: x + 1)),
    )  # fmt: skip
    child = pc.Child("m")
    replay, out = pc.graph_of(torch, hf, (1,), child)
    assert traced == [hf] and out == 2 and "jit.trace" in child.row["notes"][0]
    assert state["calls"] == ["replay"]  # once at capture, so ``out`` holds the graph's results
    replay()
    assert state["calls"] == ["replay", "replay"]
    child = pc.Child("m")
    _, out = pc.graph_of(torch, lambda x: x * 3, (2,), child)
    assert out == 6 and len(traced) == 1 and not child.row["notes"]
