"""Generated inputs for the demo and the benchmarks: Zipf-distributed words.

Deterministic for a seed (``random.Random``, never the built-in ``hash``), so every mode of a
benchmark and every run of the demo see the same words, and results can be checked exactly.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable


def zipf_words(
    count: int, vocabulary: int = 200_000, *, seed: int = 7, exponent: float = 1.1
) -> list[str]:
    """``count`` words ``w<rank>`` drawn with probability proportional to ``rank ** -exponent``."""
    if count < 0:
        raise ValueError("count must be >= 0 and vocabulary >= 1")
    return zipf_sampler(vocabulary, seed=seed, exponent=exponent)(count)


def zipf_sampler(
    vocabulary: int, *, seed: int = 7, exponent: float = 1.1
) -> Callable[[int], list[str]]:
    """``zipf_words`` in instalments, for inputs too large to hold at once: each call
    ``draw(n)`` returns the next ``n`` words (together, the words of one ``zipf_words`` call)."""
    if vocabulary < 1:
        raise ValueError("count must be >= 0 and vocabulary >= 1")
    cumulative = list(itertools.accumulate(rank**-exponent for rank in range(1, vocabulary + 1)))
    ranks = range(1, vocabulary + 1)
    rng = random.Random(seed)

    def draw(count: int) -> list[str]:
        return [f"w{rank}" for rank in rng.choices(ranks, cum_weights=cumulative, k=count)]

    return draw


def batches(words: list[str], count: int) -> list[list[str]]:
    """``words`` cut into ``count`` consecutive batches of near-equal size."""
    size = len(words)
    return [words[i * size // count : (i + 1) * size // count] for i in range(count)]
