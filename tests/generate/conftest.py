"""Tiny Gemma 3 decoders with random weights, and a tiny GGUF file holding one (F32, Q8_0, Q5_0)."""

from __future__ import annotations

import numpy as np
import pytest

from pyforge.generate.gemma3 import Gemma3Config, build_decoder, random_weights

# a SentencePiece-like vocabulary of the tiny config's 320 tokens: specials, 256 byte tokens, pieces
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
PIECES = ["\n", "\n\n", "  ", "   ", "<tag>", "▁", "h", "e", "l", "o", "w", "r", "d", "a", "t",
          "he", "ll", "hell", "hello", "▁w", "or", "ld", "▁wor", "▁world", "▁t", "▁the", "at", "▁a"]  # fmt: skip
TYPES = {"\n": 4, "\n\n": 4, "  ": 4, "   ": 4, "<tag>": 4}


def tiny_vocab(size: int):
    tokens = SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + PIECES
    types = [3] * len(SPECIALS) + [6] * 256 + [TYPES.get(p, 1) for p in PIECES]
    tokens += [f"<unused{i}>" for i in range(size - len(tokens))]
    types += [5] * (size - len(types))
    return tokens, types


def write_tiny_gguf(path, config: Gemma3Config, weights: dict[str, np.ndarray]) -> dict[str, str]:
    """Write ``weights`` as a gemma3 GGUF; returns each tensor's stored type."""
    import gguf

    c, q = config, gguf.GGMLQuantizationType
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_context_length(c.context)
    w.add_embedding_length(c.hidden)
    w.add_block_count(c.layers)
    w.add_feed_forward_length(c.ffn)
    w.add_head_count(c.heads)
    w.add_head_count_kv(c.kv_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_layer_norm_rms_eps(c.eps)
    w.add_rope_freq_base(c.rope_global)
    w.add_rope_freq_base_swa(c.rope_local)
    w.add_sliding_window(c.window)
    w.add_sliding_window_pattern(c.sliding_pattern)
    tokens, types = tiny_vocab(c.vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(len(tokens))])
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    stored = {}
    for name, a in weights.items():
        kind = q.F32 if a.ndim == 1 else (q.Q5_0 if "ffn_" in name else q.Q8_0)
        w.add_tensor(name, a if kind == q.F32 else gguf.quants.quantize(a, kind), raw_dtype=kind)
        stored[name] = kind.name
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return stored


def decoder_feeds(config: Gemma3Config, ids, past=None, pad: int = 0, seed: int = 0):
    """Feeds for new tokens ``ids`` after ``past`` (a previous call's outputs, or none), with ``pad``
    unused rows of random values (mask 0) after the valid ones, as the decoder contract allows."""
    rng = np.random.default_rng(seed)
    ids = np.asarray(ids, np.int64)
    b, s = ids.shape
    valid = 0 if past is None else past["present.0.key"].shape[2]
    mask = np.concatenate([np.ones((b, valid)), np.zeros((b, pad)), np.ones((b, s))], 1)
    feeds = {
        "input_ids": ids,
        "attention_mask": mask.astype(np.int64),
        "position_ids": np.tile(np.arange(valid, valid + s, dtype=np.int64), (b, 1)),
    }
    for i in range(config.layers):
        for t in ("key", "value"):
            old = (
                np.zeros((b, config.kv_heads, 0, config.head_dim), np.float32)
                if past is None
                else past[f"present.{i}.{t}"]
            )
            junk = rng.standard_normal((b, config.kv_heads, pad, config.head_dim))
            feeds[f"past_key_values.{i}.{t}"] = np.concatenate([old, junk.astype(np.float32)], 2)
    return feeds


@pytest.fixture(scope="session")
def tiny_config() -> Gemma3Config:
    return Gemma3Config.tiny()


@pytest.fixture(scope="session")
def tiny_weights(tiny_config):
    return random_weights(tiny_config, seed=0)


@pytest.fixture(scope="session")
def tiny_decoder(tiny_config, tiny_weights):
    """The tiny decoder as an onnx.ModelProto (logits for every position)."""
    return build_decoder(tiny_config, tiny_weights)


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory, tiny_config, tiny_weights):
    """Path of a GGUF holding the tiny config, its random weights and a tiny vocabulary."""
    pytest.importorskip("gguf")
    path = tmp_path_factory.mktemp("gguf") / "tiny-gemma3.gguf"
    write_tiny_gguf(path, tiny_config, tiny_weights)
    return path
