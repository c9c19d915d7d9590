"""Read a Gemma 3 GGUF file: its config from the metadata, its tensors dequantized to float32.

config, weights, vocab = read_gguf("gemma-3-270m-q4_k_m.gguf")
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ModelLoadError
from .gemma3 import Gemma3Config, weight_shapes


@dataclass(frozen=True)
class VocabInfo:
    """The SentencePiece vocabulary a GGUF carries (token_type: 1 normal, 3 control, 4 user
    defined, 6 byte)."""

    tokens: list[str]
    scores: np.ndarray
    token_type: np.ndarray
    bos_id: int
    eos_id: int
    unk_id: int
    pad_id: int
    add_bos: bool
    add_space_prefix: bool


def _open(path):
    import gguf

    if not Path(path).is_file():
        raise ModelLoadError(f"GGUF file {str(path)!r} does not exist")
    try:
        return gguf.GGUFReader(str(path))
    except (ValueError, OSError, IndexError, KeyError) as err:
        raise ModelLoadError(f"{str(path)!r} is not a readable GGUF file: {err}") from err


def _meta(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise ModelLoadError(f"GGUF metadata key {key!r} is missing")
        return default
    return field.contents()


def read_config(reader) -> Gemma3Config:
    """The architecture from the metadata; what Gemma 3 files do not record (the local RoPE
    base, the sliding pattern, the query scale) takes the value transformers and llama.cpp use."""
    arch = _meta(reader, "general.architecture")
    if arch != "gemma3":
        raise ModelLoadError(f"GGUF architecture {arch!r}: only 'gemma3' is supported")
    if _meta(reader, "gemma3.rope.scaling.type", "none") not in ("none", ""):
        raise ModelLoadError("GGUF key 'gemma3.rope.scaling.type': RoPE scaling is not supported")

    def m(key, default=None):
        return _meta(reader, f"gemma3.{key}", default)

    heads = int(m("attention.head_count"))
    head_dim = int(m("attention.key_length", int(m("embedding_length")) // heads))
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data) if (
        "tokenizer.ggml.tokens" in reader.fields) else int(m("vocab_size"))  # fmt: skip
    return Gemma3Config(
        hidden=int(m("embedding_length")), layers=int(m("block_count")), heads=heads,
        kv_heads=int(m("attention.head_count_kv", heads)), head_dim=head_dim,
        ffn=int(m("feed_forward_length")), vocab=vocab,
        eps=float(str(np.float32(m("attention.layer_norm_rms_epsilon")))),  # 1e-6, not its float32
        window=int(m("attention.sliding_window")), rope_global=float(m("rope.freq_base")),
        rope_local=float(m("rope.freq_base_swa", 10000.0)),
        sliding_pattern=int(m("attention.sliding_window_pattern", 6)),
        query_pre_attn_scalar=float(m("attention.query_pre_attn_scalar", head_dim)),
        context=int(m("context_length")),
    )  # fmt: skip


def read_vocab(path_or_reader) -> VocabInfo:
    reader = path_or_reader if hasattr(path_or_reader, "fields") else _open(path_or_reader)
    if _meta(reader, "tokenizer.ggml.model") != "llama":
        raise ModelLoadError(
            "GGUF 'tokenizer.ggml.model': only a SentencePiece ('llama') vocabulary"
        )

    def tok(key, default=None):
        return _meta(reader, f"tokenizer.ggml.{key}", default)

    tokens = tok("tokens")
    return VocabInfo(
        tokens=tokens, scores=np.asarray(tok("scores", [0.0] * len(tokens)), np.float32),
        token_type=np.asarray(tok("token_type", [1] * len(tokens)), np.int32),
        bos_id=int(tok("bos_token_id")), eos_id=int(tok("eos_token_id")),
        unk_id=int(tok("unknown_token_id", 3)), pad_id=int(tok("padding_token_id", 0)),
        add_bos=bool(tok("add_bos_token", True)), add_space_prefix=bool(tok("add_space_prefix", False)),
    )  # fmt: skip


def read_gguf(path) -> tuple[Gemma3Config, dict[str, np.ndarray], VocabInfo]:
    """(config, float32 weights by GGUF name, numpy-shaped (out, in), vocabulary)."""
    import gguf

    reader = _open(path)
    config = read_config(reader)
    tensors = {t.name: t for t in reader.tensors}
    weights = {}
    for name, shape in weight_shapes(config).items():
        t = tensors.get(name)
        if t is None:
            raise ModelLoadError(f"GGUF tensor {name!r} is missing")
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
        except (NotImplementedError, ValueError) as err:
            raise ModelLoadError(f"GGUF tensor {name!r} ({t.tensor_type.name}): {err}") from err
        if w.size != int(np.prod(shape)):
            raise ModelLoadError(f"GGUF tensor {name!r}: {w.size} values, expected shape {shape}")
        weights[name] = np.ascontiguousarray(w.reshape(shape), np.float32)
    return config, weights, read_vocab(reader)
