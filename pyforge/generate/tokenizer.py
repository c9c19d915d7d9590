"""The SentencePiece-BPE tokenizer a GGUF vocabulary describes, run by the `tokenizers` library.

    tok = from_gguf("gemma-3-270m-q4_k_m.gguf")
    tok.decode(tok.encode("Hello world")[1:])  # 'Hello world'

Built as transformers builds it from a GGUF, so both give the same ids: spaces become "▁", no
prefix space; the merges are recovered from the vocabulary, ranked by the token they make in
file order (Gemma's stored scores do not follow its merge order); bytes not in the vocabulary
fall back to <0xNN> tokens; control tokens (type 3) and user-defined ones (type 4) match whole.
"""

from __future__ import annotations

from .gguf import VocabInfo, read_vocab

CONTROL, USER_DEFINED = 3, 4


class Tokenizer:
    def __init__(self, vocab: VocabInfo):
        from tokenizers import AddedToken, decoders, normalizers
        from tokenizers import Tokenizer as Backend
        from tokenizers.models import BPE

        # a whitespace-run token is stored as real spaces; the text reaches BPE as "▁"s
        spelled = vocab.tokens
        tokens = ["▁" * len(t) if " " in t and not t.strip() else t for t in spelled]
        index = {t: i for i, t in enumerate(tokens)}
        merges = [
            (t[:k], t[k:])
            for t in sorted(index, key=index.get)
            for k in range(len(t) - 1, 0, -1)
            if t[:k] in index and t[k:] in index
        ]
        unk = tokens[vocab.unk_id]
        model = BPE(vocab=index, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True)
        self.backend = Backend(model)
        self.backend.normalizer = normalizers.Replace(" ", "▁")
        self.backend.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        )
        kinds = vocab.token_type
        self.backend.add_special_tokens(
            [
                AddedToken(t, normalized=False, special=True)
                for t, k in zip(spelled, kinds)
                if k == CONTROL
            ]
        )
        self.backend.add_tokens(  # a respelled whitespace run is left to BPE
            [
                AddedToken(t, normalized=False)
                for t, k in zip(spelled, kinds)
                if k == USER_DEFINED and t in index
            ]
        )
        self.bos_id, self.eos_id, self.vocab_size = vocab.bos_id, vocab.eos_id, len(tokens)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        ids = self.backend.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids, skip_special: bool = True) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special)


def from_gguf(path) -> Tokenizer:
    return Tokenizer(read_vocab(path))
