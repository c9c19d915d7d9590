"""Read a Gemma 3 GGUF file: its config from the metadata, its tensors dequantized to float32.

config, weights, vocab = read_gguf("gemma-3-270m-q4_k_m.gguf")
"""

from __future__ import annotations

import struct
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


_SCALAR = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}


class GGUFFile:
    """A GGUF file's metadata and tensor table, parsed with struct over a memory map: gguf's own
    reader makes numpy views per array element, minutes for a 262,144-token vocabulary."""

    def __init__(self, path):
        import mmap

        with open(path, "rb") as f:
            self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.pos = 0
        magic, version, n_tensors, n_kv = self._take("4sIQQ")
        if magic != b"GGUF" or version not in (2, 3):
            raise ValueError(f"magic {magic!r}, version {version}")
        self.fields = {}
        for _ in range(n_kv):
            key = self._str()
            self.fields[key] = self._value(self._take("I")[0])
        infos = []
        for _ in range(n_tensors):
            name, nd = self._str(), self._take("I")[0]
            infos.append((name, self._take(f"{nd}Q"), *self._take("IQ")))
        align = int(self.fields.get("general.alignment", 32))
        start = -(-self.pos // align) * align
        self.tensors = {name: (dims, kind, start + off) for name, dims, kind, off in infos}

    def _take(self, fmt: str) -> tuple:
        out = struct.unpack_from("<" + fmt, self.mm, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return out

    def _str(self) -> str:
        n = self._take("Q")[0]
        self.pos += n
        return self.mm[self.pos - n : self.pos].decode("utf-8")

    def _value(self, kind: int):
        if kind == 8:
            return self._str()
        if kind != 9:
            return self._take(_SCALAR[kind])[0]
        sub, n = self._take("IQ")
        if sub in (8, 9):
            return [self._value(sub) for _ in range(n)]
        values = struct.unpack_from(f"<{n}{_SCALAR[sub]}", self.mm, self.pos)
        self.pos += struct.calcsize(f"<{n}{_SCALAR[sub]}")
        return list(values)

    def tensor(self, name: str) -> np.ndarray:
        """The tensor dequantized to float32, numpy-shaped (ggml's dims reversed)."""
        import gguf

        dims, kind, offset = self.tensors[name]
        qtype = gguf.GGMLQuantizationType(kind)
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        rows, row_bytes = int(np.prod(dims[1:])), dims[0] // block * size
        raw = np.frombuffer(self.mm, np.uint8, rows * row_bytes, offset).reshape(rows, row_bytes)
        return gguf.quants.dequantize(raw, qtype).reshape(dims[::-1])


def _open(path) -> GGUFFile:
    if not Path(path).is_file():
        raise ModelLoadError(f"GGUF file {str(path)!r} does not exist")
    try:
        return GGUFFile(path)
    except (ValueError, OSError, struct.error, KeyError, UnicodeDecodeError) as err:
        raise ModelLoadError(f"{str(path)!r} is not a readable GGUF file: {err}") from err


def _meta(reader: GGUFFile, key: str, default=None):
    value = reader.fields.get(key)
    if value is None:
        if default is None:
            raise ModelLoadError(f"GGUF metadata key {key!r} is missing")
        return default
    return value


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
    vocab = len(reader.fields["tokenizer.ggml.tokens"]) if (
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
    reader = _open(path)
    config = read_config(reader)
    weights = {}
    for name, shape in weight_shapes(config).items():
        if name not in reader.tensors:
            raise ModelLoadError(f"GGUF tensor {name!r} is missing")
        dims, kind, _ = reader.tensors[name]
        if tuple(dims[::-1]) != shape:
            raise ModelLoadError(f"GGUF tensor {name!r}: shape {dims[::-1]}, expected {shape}")
        try:
            w = reader.tensor(name)
        except (NotImplementedError, ValueError, KeyError) as err:
            raise ModelLoadError(f"GGUF tensor {name!r} (ggml type {kind}): {err}") from err
        weights[name] = np.ascontiguousarray(w, np.float32)
    return config, weights, read_vocab(reader)
