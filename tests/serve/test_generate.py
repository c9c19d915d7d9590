"""``POST /generate`` on a real Ray Serve: the tiny Gemma 3 GGUF streams the same tokens as a
direct ``TextGenerator.generate``, one JSON line per token and a last line with the stop reason
and timings; requests queue (never two in one cache); bad options get 400 with pyforge's text."""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest

from .common import free_port, post

pytest.importorskip("ray.serve")
pytest.importorskip("gguf")
pytestmark = pytest.mark.slow  # Ray's start and the decoder's compile: over 90 s on 2 loaded cores


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from pyforge.generate.gemma3 import Gemma3Config, random_weights
    from pyforge.serve import deployment
    from pyforge.serve.generation import start_generator
    from tests.generate.conftest import write_tiny_gguf

    config = Gemma3Config.tiny()
    path = tmp_path_factory.mktemp("serve_gen") / "tiny-gemma3.gguf"
    write_tiny_gguf(path, config, random_weights(config, seed=0))
    port = free_port()
    try:
        start_generator(str(path), host="127.0.0.1", port=port, num_cpus=8, target="cpu",
                        cpus_per_replica=0.5, max_context=256)  # fmt: skip
        ingress = free_port()  # the same decoder, its replica serving HTTP itself (no proxy)
        start_generator(str(path), host="127.0.0.1", port=ingress, name="gen-direct",
                        route_prefix="/direct", target="cpu", cpus_per_replica=0.5,
                        max_context=256, direct=True)  # fmt: skip
        yield {"url": f"http://127.0.0.1:{port}/generate", "path": path,
               "ingress": f"http://127.0.0.1:{ingress}/generate"}  # fmt: skip
    finally:
        deployment.stop()


@pytest.fixture(scope="module")
def direct(served):
    import pyforge

    return pyforge.TextGenerator.from_gguf(served["path"], target="cpu", max_context=256)


def stream(url: str, request: dict) -> tuple[str, list[dict]]:
    req = urllib.request.Request(url, data=json.dumps(request).encode())
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.headers["content-type"], [json.loads(line) for line in r]


CASES = [
    {"prompt": "hello world", "max_new_tokens": 12},
    {"prompt": [2, 300, 301, 17], "max_new_tokens": 9, "do_sample": True, "top_k": 20, "seed": 3},
    {"prompt": "the", "max_new_tokens": 6, "do_sample": True, "temperature": 0.7, "seed": 11},
]


@pytest.mark.parametrize("case", CASES)
def test_streams_the_tokens_of_a_direct_generate(served, direct, case):
    kind, lines = stream(served["url"], case)
    direct.reset()
    opts = {k: v for k, v in case.items() if k not in ("prompt", "max_new_tokens")}
    want = direct.generate(case["prompt"], case["max_new_tokens"], **opts)
    assert kind.startswith("application/x-ndjson")
    *tokens, last = lines
    assert [t["token"] for t in tokens] == want.tokens and want.tokens
    assert last["text"] == want.text  # the pieces are for display: bytes may join up later
    assert all(isinstance(t["text"], str) for t in tokens)
    assert last["done"] and last["tokens"] == want.tokens
    assert last["stop_reason"] == want.stop_reason and last["prompt_tokens"] == want.prompt_tokens
    assert last["prefill_ms"] > 0 and last["total_ms"] >= last["queue_ms"] >= 0
    assert last["decode_ms_per_token"] > 0


def test_direct_ingress_streams_the_same_tokens(served, direct):
    case = CASES[1]
    kind, lines = stream(served["ingress"], case)
    direct.reset()
    opts = {k: v for k, v in case.items() if k not in ("prompt", "max_new_tokens")}
    want = direct.generate(case["prompt"], case["max_new_tokens"], **opts)
    assert kind.startswith("application/x-ndjson")
    assert [t["token"] for t in lines[:-1]] == want.tokens and lines[-1]["tokens"] == want.tokens


def test_concurrent_requests_each_get_their_own_answer(served, direct):
    cases = [{"prompt": [2, 100 + i, 40], "max_new_tokens": 8} for i in range(4)]
    got: dict = {}
    threads = [
        threading.Thread(target=lambda i=i: got.update({i: stream(served["url"], cases[i])[1]}))
        for i in range(len(cases))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    for i, case in enumerate(cases):
        direct.reset()
        assert got[i][-1]["tokens"] == direct.generate(case["prompt"], 8).tokens
    assert any(lines[-1]["queue_ms"] > lines[-1]["prefill_ms"] for lines in got.values())


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"prompt": "hi", "max_new_tokens": 0}, "max_new_tokens=0"),
        ({"prompt": "hi", "temperature": -1.0}, "temperature=-1.0: must be > 0"),
        ({"prompt": "hi", "top_p": 2}, "top_p=2"),
        ({"prompt": "hi", "beam": 4}, "generate takes no option 'beam'"),
        ({"prompt": {"a": 1}}, "prompt must be a str or a list of int ids"),
        ({"prompt": [1] * 300}, "the prompt has 300 tokens"),
        ({"max_new_tokens": 3}, '{"prompt"'),
    ],
)
def test_bad_options_get_400_with_the_error_text(served, body, words):
    status, text = post(served["url"], json.dumps(body).encode())
    assert status == 400, text
    assert words in json.loads(text)["error"]


def test_bad_json_and_unknown_route(served):
    status, text = post(served["url"], b"{oops")
    assert status == 400 and "body is not JSON" in json.loads(text)["error"]
    status, text = post(served["url"].replace("/generate", "/predict"), b"{}")
    assert status == 404 and "POST /generate" in json.loads(text)["error"]
