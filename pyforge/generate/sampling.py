"""Choosing the next token from one position's logits: greedy, or sampled with temperature,
top-k and top-p (nucleus), from a seeded generator so a run can be repeated exactly."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import OptionError


@dataclass(frozen=True)
class Sampling:
    """How ``generate`` picks each token; checked once, before any work.

    >>> Sampling(do_sample=True, temperature=0.8, top_k=40, top_p=0.95, seed=0)
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or not self.temperature > 0:
            raise OptionError("temperature", f"temperature={self.temperature!r}: must be > 0")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise OptionError("top_k", f"top_k={self.top_k!r}: must be an int >= 1 or None")
        p = self.top_p
        if p is not None and (not isinstance(p, (int, float)) or not 0 < p <= 1):
            raise OptionError("top_p", f"top_p={p!r}: must be in (0, 1] or None")

    def chooser(self):
        """A function logits (vocab,) -> token id, with its own generator."""
        if not self.do_sample:
            return lambda logits: int(np.argmax(logits))
        rng = np.random.default_rng(self.seed)
        return lambda logits: int(rng.choice(len(logits), p=self.probabilities(logits)))

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        """The distribution sampled from: softmax(logits / T), cut to the top_k most likely and
        to the smallest set whose mass reaches top_p, renormalised."""
        z = np.asarray(logits, np.float64) / self.temperature
        keep = np.ones(z.shape, bool)
        if self.top_k is not None and self.top_k < z.size:
            keep[np.argsort(z)[: z.size - self.top_k]] = False
        z = np.where(keep, z, -np.inf)
        p = np.exp(z - z.max())
        p /= p.sum()
        if self.top_p is not None and self.top_p < 1:
            order = np.argsort(-p, kind="stable")
            mass = np.cumsum(p[order])
            # a token stays while the mass before it is short of top_p (the first always stays)
            cut = order[np.searchsorted(mass, self.top_p, side="left") + 1 :]
            p[cut] = 0
            p /= p.sum()
        return p
