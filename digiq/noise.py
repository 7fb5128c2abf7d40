"""Sampling noise keyed per row: every sampled token's random draw from its own key, none from a shared stream.

A stream shared by a batch (``torch.rand`` over batch x vocabulary) ties each
sample to everything else in the batch: its size, its order, how the work is
split over workers and machines. Here a sample's noise is a function of keys
that name it (an episode's seed and step, a state and a candidate index) and
of the token's position, so a sample is the same alone, in any batch and on
any worker. The draws are counter-based: a 64-bit hash (SplitMix64's
finaliser, a bijection that spreads every input bit over every output bit)
of the key and the position, with no generator state to carry.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["noise_key", "row_streams", "token_uniforms"]

_MASK64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # SplitMix64's increment: consecutive positions land far apart


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 words (wrapping multiplication is the point, hence no overflow warnings)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _fold(key: np.ndarray, part: np.ndarray) -> np.ndarray:
    """``key`` with ``part`` folded in; chained, not symmetric: (a, b) and (b, a) give different keys."""
    return _mix64(key ^ part)


def noise_key(*parts: int) -> int:
    """One 64-bit key from integers (a seed, an episode, a step...), the same in every process and run."""
    key = np.array([_GOLDEN])
    for part in parts:
        key = _fold(key, np.uint64(int(part) & _MASK64))
    return int(key[0])


def row_streams(noise: Sequence[int], n: int) -> np.ndarray:
    """(len(noise) * n,) uint64: the stream of sample ``j`` of row ``i`` at ``i * n + j``, keyed by (noise[i], j)."""
    keys = np.repeat(np.array([int(k) & _MASK64 for k in noise], np.uint64), n)
    return _fold(keys, np.tile(np.arange(n, dtype=np.uint64), len(noise)))


def token_uniforms(streams: np.ndarray, t: int) -> np.ndarray:
    """The uniform in [0, 1) of token ``t`` of each stream (53 random bits, as a float64 holds)."""
    with np.errstate(over="ignore"):
        bits = _mix64(streams + np.uint64(t + 1) * _GOLDEN)
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53
