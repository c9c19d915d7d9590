"""TextGenerator on the tiny Gemma 3 decoder: greedy tokens and logits against a reference loop
in ONNX Runtime with unpadded past, the cross-call cache, reset, sampling, stream, errors."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import pyforge
from pyforge.errors import InputError, ModelLoadError, OptionError
from pyforge.generate.sampling import Sampling

ort = pytest.importorskip("onnxruntime")
gemma3 = pytest.importorskip("pyforge.generate.gemma3")

MAX_CONTEXT = 96  # the tiny config's rotary tables hold 128 positions


class WordTokenizer:
    """Token t is the text ``<t>``; enough for eos, stop strings and ``.text``."""

    bos_id, eos_id, vocab_size = 2, None, 320

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        return [self.bos_id] * add_bos + [int(t) for t in re.findall(r"<(\d+)>", text)]

    def decode(self, ids) -> str:
        return "".join(f"<{t}>" for t in ids)


@pytest.fixture(scope="module")
def decoder():
    config = gemma3.Gemma3Config.tiny()
    return gemma3.build_decoder(config, gemma3.random_weights(config, seed=3), logits="last")


@pytest.fixture(scope="module")
def gen(decoder):
    return pyforge.TextGenerator.from_onnx(
        decoder, WordTokenizer(), target="cpu", max_context=MAX_CONTEXT
    )


@pytest.fixture(scope="module")
def reference(decoder):
    sess = ort.InferenceSession(decoder.SerializeToString())
    return lambda ids, n: ort_greedy(sess, ids, n)


def ort_greedy(sess, ids: list[int], n: int):
    """Greedy decoding with the past exactly as long as the tokens fed (no padding)."""
    names = [o.name for o in sess.get_outputs()]
    past = {i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
            for i in sess.get_inputs() if i.name.startswith("past_key_values")}  # fmt: skip
    tokens, logits, feed, held = [], [], list(ids), 0
    for _ in range(n):
        out = dict(zip(names, sess.run(None, {
            "input_ids": np.array([feed], np.int64),
            "attention_mask": np.ones((1, held + len(feed)), np.int64),
            "position_ids": np.arange(held, held + len(feed))[None], **past})))  # fmt: skip
        held += len(feed)
        past = {k: out[k.replace("past_key_values", "present")] for k in past}
        logits.append(out["logits"][0, -1])
        tokens.append(int(np.argmax(logits[-1])))
        feed = [tokens[-1]]
    return tokens, logits


def prompt(seed: int, n: int) -> list[int]:
    return [2] + [int(t) for t in np.random.default_rng(seed).integers(3, 320, n - 1)]


def recorded(gen, fn):
    """fn()'s result and the logits each step produced (greedy on the host, from the logits:
    the decoder's next_token is not read)."""
    seen, step, was, gen._next = [], gen._step, gen._next, False
    gen._step = lambda ids, width: seen.append(step(ids, width)) or seen[-1]
    try:
        return fn(), seen
    finally:
        del gen._step
        gen._next = was


def test_greedy_matches_ort(gen, reference):
    gen.reset()
    ids = prompt(0, 11)
    result, logits = recorded(gen, lambda: gen.generate(ids, max_new_tokens=24))
    want, want_logits = reference(ids, 24)
    assert result.tokens == want
    assert len(set(want)) > 1  # the model does not just repeat one token
    err = max(np.abs(a - b).max() for a, b in zip(logits, want_logits))
    assert err < 1e-4, err
    assert result.prefill_ms > 0 and result.decode_ms_per_token > 0
    assert result.stop_reason == "length" and result.prompt_tokens == 11
    assert result.text == WordTokenizer().decode(want)


def test_cache_reuse_gives_a_fresh_runs_tokens(gen, reference):
    gen.reset()
    first = gen.generate(prompt(1, 9), max_new_tokens=6)
    assert gen.conversation == prompt(1, 9) + first.tokens[:-1]
    more = prompt(1, 9) + first.tokens + [7, 8, 9]
    again = gen.generate(more, max_new_tokens=12)
    assert again.reused_tokens == 9 + 5  # the prompt and the generated tokens fed back
    assert again.tokens == reference(more, 12)[0]
    gen.reset()
    fresh = gen.generate(more, max_new_tokens=12)
    assert fresh.reused_tokens == 0
    assert fresh.tokens == again.tokens


def test_a_diverging_prompt_reuses_only_the_common_prefix(gen, reference):
    gen.reset()
    gen.generate(prompt(2, 14), max_new_tokens=3)
    other = prompt(2, 6) + [11, 12, 13]
    result = gen.generate(other, max_new_tokens=8)
    assert result.reused_tokens == 6
    assert result.tokens == reference(other, 8)[0]
    same = gen.generate(other, max_new_tokens=8)  # the whole prompt held: its last is fed again
    assert same.reused_tokens == len(other) - 1 and same.tokens == result.tokens


def test_reset_starts_a_fresh_conversation(gen):
    gen.generate(prompt(3, 5), max_new_tokens=2)
    assert gen.conversation
    gen.reset()
    assert gen.conversation == []
    assert gen.generate(prompt(3, 5), max_new_tokens=2).reused_tokens == 0


def test_str_prompt_eos_and_stop(gen, reference):
    gen.reset()
    ids = prompt(4, 8)
    want = reference(ids, 10)[0]
    text = WordTokenizer().decode(ids[1:])
    assert gen.generate(text, max_new_tokens=10).tokens == want  # BOS added by encode
    gen.eos_id = want[4]
    try:
        cut = gen.generate(ids, max_new_tokens=10)
    finally:
        gen.eos_id = None
    assert cut.stop_reason == "eos" and cut.tokens == want[: want.index(want[4])]
    stopped = gen.generate(ids, max_new_tokens=10, stop=f"<{want[2]}>")
    assert stopped.stop_reason == "stop" and stopped.tokens == want[: want.index(want[2]) + 1]
    assert stopped.text == WordTokenizer().decode(want[: want.index(want[2])])


def test_stream_yields_generates_tokens(gen):
    gen.reset()
    ids = prompt(5, 7)
    streamed = list(gen.stream(ids, max_new_tokens=9, do_sample=True, seed=4, top_k=20))
    gen.reset()
    assert streamed == gen.generate(ids, max_new_tokens=9, do_sample=True, seed=4, top_k=20).tokens


def test_sampling_with_a_seed_repeats(gen):
    ids = prompt(6, 6)
    runs = [
        gen.generate(ids, 12, do_sample=True, temperature=1.5, seed=s).tokens for s in (1, 1, 2)
    ]
    assert runs[0] == runs[1] and runs[0] != runs[2]
    assert (
        gen.generate(ids, 12, do_sample=True, top_k=1, seed=9).tokens
        == gen.generate(ids, 12).tokens
    )


def test_top_k_and_top_p_cut_the_distribution():
    logits = np.random.default_rng(0).standard_normal(50).astype(np.float32) * 3
    p = Sampling(do_sample=True, top_k=5).probabilities(logits)
    assert set(np.flatnonzero(p)) == set(np.argsort(logits)[-5:])
    q = Sampling(do_sample=True, top_p=0.6).probabilities(logits)
    full = Sampling(do_sample=True).probabilities(logits)
    kept = np.flatnonzero(q)
    order = np.argsort(-full)
    assert set(kept) == set(order[: len(kept)])  # the most likely tokens
    assert full[kept].sum() >= 0.6 > full[order[: len(kept) - 1]].sum()  # and no more than needed
    assert np.isclose(q.sum(), 1) and np.isclose(p.sum(), 1)
    hot = Sampling(do_sample=True, temperature=0.25).probabilities(logits)
    assert hot.max() > full.max()
    draws = [Sampling(do_sample=True, top_k=3, seed=1).chooser()(logits) for _ in range(3)]
    assert len(set(draws)) == 1 and draws[0] in np.argsort(logits)[-3:]


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"max_new_tokens": 0}, OptionError),
        ({"temperature": 0.0, "do_sample": True}, OptionError),
        ({"top_p": 1.5}, OptionError),
        ({"top_k": 0}, OptionError),
        ({"stop": [""]}, OptionError),
        ({"beams": 4}, OptionError),
        ({"prompt": []}, InputError),
        ({"prompt": [2, "x"]}, InputError),
        ({"prompt": [2] * (MAX_CONTEXT + 1)}, InputError),
    ],
)
def test_bad_arguments_raise_pyforge_errors(gen, kwargs, error):
    args = {"prompt": [2, 5, 6], "max_new_tokens": 4, **kwargs}
    with pytest.raises(error, match=next(iter(kwargs)) if error is OptionError else "prompt"):
        gen.generate(**args)
    with pytest.raises(error):
        gen.stream(**args)  # checked at the call, not at the first token


def test_str_prompt_without_tokenizer_and_a_non_decoder(decoder):
    from onnx import helper

    from tests.helpers import make_model

    gen = pyforge.TextGenerator.__new__(pyforge.TextGenerator)
    gen.tokenizer, gen.max_context = None, 8
    with pytest.raises(InputError, match="tokenizer"):
        gen.generate("hello")
    mlp = make_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [("x", np.float32, (1, 4))],
        [("y", np.float32, (1, 4))],
    )
    with pytest.raises(ModelLoadError, match="past_key_values"):
        pyforge.TextGenerator.from_onnx(mlp, target="cpu")
    with pytest.raises(OptionError, match="max_context"):
        pyforge.TextGenerator.from_onnx(decoder, target="cpu", max_context=1)


def test_the_context_limit_stops_generation(decoder):
    gen = pyforge.TextGenerator.from_onnx(decoder, target="cpu", max_context=20)
    result = gen.generate(prompt(7, 16), max_new_tokens=10)
    assert result.stop_reason == "max_context" and len(result.tokens) == 5
    assert len(gen.conversation) == 20


GPT2 = """
import sys, torch, transformers
torch.manual_seed(0)
cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512)
net = transformers.GPT2LMHeadModel._from_config(cfg, attn_implementation="eager").eval()
class Step(torch.nn.Module):
    def __init__(s):
        super().__init__(); s.net = net
    def forward(s, input_ids, attention_mask, position_ids, *past):
        cache = transformers.DynamicCache()
        for i in range(2):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = s.net(input_ids=input_ids, attention_mask=attention_mask,
                    position_ids=position_ids, past_key_values=cache, use_cache=True)
        layers = out.past_key_values.layers
        return (out.logits, *[t for l in layers for t in (l.keys, l.values)])
past = [f"past_key_values.{i}.{k}" for i in range(2) for k in ("key", "value")]
present = [n.replace("past_key_values", "present") for n in past]
axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "total"},
        "position_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"},
        **{n: {0: "batch", 2: "past"} for n in past}, **{n: {0: "batch", 2: "total"} for n in present}}
args = (torch.tensor([[5, 6]]), torch.ones(1, 6, dtype=torch.int64), torch.tensor([[4, 5]]),
        *[torch.randn(1, 4, 4, 16) for _ in past])
torch.onnx.export(Step(), args, sys.argv[1], input_names=["input_ids", "attention_mask",
                  "position_ids", *past], output_names=["logits", *present], dynamic_axes=axes,
                  opset_version=17, dynamo=False)
"""


@pytest.mark.slow
def test_gpt2_exported_by_transformers(tmp_path):
    """Any decoder in the layout: GPT-2 (4 kv heads, so the cache moves rows as it grows)."""
    venv = os.environ.get("PYFORGE_CORPUS_PYTHON", "/work/venv-corpus/bin/python")
    if not shutil.which(venv):
        pytest.skip(f"no python with torch and transformers at {venv} (PYFORGE_CORPUS_PYTHON)")
    path = tmp_path / "gpt2.onnx"
    subprocess.run([venv, "-c", GPT2, str(path)], check=True, capture_output=True, timeout=600)
    gen = pyforge.TextGenerator.from_onnx(path, target="cpu", max_context=160)
    sess = ort.InferenceSession(str(path))
    ids = prompt(8, 20)
    result, logits = recorded(gen, lambda: gen.generate(ids, max_new_tokens=70))
    want, want_logits = ort_greedy(sess, ids, 70)
    assert result.tokens == want
    assert max(np.abs(a - b).max() for a, b in zip(logits, want_logits)) < 1e-4
    more = ids + result.tokens + [1, 2, 3]
    assert gen.generate(more, max_new_tokens=5).tokens == ort_greedy(sess, more, 5)[0]


def test_cli_generate_streams_ids_and_prints_the_timings(decoder, tmp_path, capsys):
    from pyforge.cli import main

    path = tmp_path / "decoder.onnx"
    path.write_bytes(decoder.SerializeToString())
    argv = ["generate", str(path), "--prompt", ",".join(map(str, prompt(9, 6))), "--ids"]
    argv += ["--max-new-tokens", "5", "--target", "cpu", "--max-context", "64"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    sess = ort.InferenceSession(decoder.SerializeToString())
    assert out.split() == [str(t) for t in ort_greedy(sess, prompt(9, 6), 5)[0]]
    assert "prefill" in err and "ms/token" in err
    assert main(["generate", str(path), "--prompt", "hello"]) == 1  # no tokenizer for text
    assert "--tokenizer" in capsys.readouterr().err


DEVICE_CACHE = """
import numpy as np
from numba import cuda
from pyforge.generate.runtime import _Cache, _Layout
lay = _Layout(layers=1, kv_heads=2, head_dim=3, dtype=np.dtype(np.float32), inputs=())
host, dev = _Cache(lay, 16, device=False), _Cache(lay, 16, device=True)
rng = np.random.default_rng(0)
for n, stride, pad, on_device in [(3, 4, 1, False), (1, 4, 0, True), (2, 8, 0, True)]:
    rows = host.stride + pad + n
    outs = {f"present.0.{k}": rng.standard_normal((1, 2, rows, 3)).astype(np.float32)
            for k in ("key", "value")}
    host.append(outs, host.stride + pad, list(range(n)), stride)
    dev.append({k: cuda.to_device(v) if on_device else v for k, v in outs.items()},
               dev.stride + pad, list(range(n)), stride)
    for name, want in host.past().items():
        got = dev.past()[name].copy_to_host()
        assert got.shape == want.shape == (1, 2, stride, 3), (got.shape, want.shape)
        assert np.array_equal(got[:, :, : len(host.tokens)], want[:, :, : len(host.tokens)])
print("device cache ok")
"""


def test_device_cache_layout_in_simulator():
    """The cuda cache (device buffers, rows moved as the stride grows) holds the cpu one's rows."""
    pytest.importorskip("numba.cuda")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    run = subprocess.run(
        [sys.executable, "-c", DEVICE_CACHE],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0 and "device cache ok" in run.stdout, run.stderr[-2000:]
