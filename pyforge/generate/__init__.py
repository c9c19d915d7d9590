"""Text generation: decoders built from GGUF files, run by pyforge with a KV cache kept between calls.

gen = pyforge.TextGenerator.from_gguf("gemma-3-270m-q4_k_m.gguf")
print(gen.generate("The capital of France is", max_new_tokens=16).text)
"""

from __future__ import annotations


def __getattr__(name: str):
    if name == "TextGenerator":
        from .runtime import TextGenerator

        return TextGenerator
    raise AttributeError(name)
