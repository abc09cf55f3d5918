"""Random draws whose values are fixed by a seed alone, for data raybench generates.

NumPy keeps a bit generator's raw stream stable across releases, but not what `Generator` makes
of it: `normal`, `gamma`, `integers` and `choice` may change algorithm in any release (NEP 19).
The synthetic scenes, their labels and the chips picked for training are built from these draws
instead, each defined here on PCG64's raw 64-bit words, so a seed gives the same data on any
NumPy. (Transcendental functions may still differ in the last bit between CPUs and releases.)
"""

from __future__ import annotations

import numpy as np

_UNIT = 2.0**-53  # a 53-bit mantissa: the top bits of a word give a double in [0, 1)


class Draws:
    """A seeded stream: `Draws([seed, scene, 7])` as `np.random.default_rng` takes its seeds."""

    def __init__(self, seed: int | list[int]) -> None:
        self._bits = np.random.PCG64(np.random.SeedSequence(seed))

    def _words(self, n: int) -> np.ndarray:
        return np.asarray(self._bits.random_raw(n), dtype=np.uint64)

    def random(self, size: int | tuple[int, ...] | None = None) -> np.ndarray | float:
        """Uniform on [0, 1)."""
        n = 1 if size is None else int(np.prod(size))
        u = (self._words(n) >> np.uint64(11)).astype(np.float64) * _UNIT
        return float(u[0]) if size is None else u.reshape(size)

    def uniform(self, low: float, high: float, size: int | tuple[int, ...] | None = None):
        return low + (high - low) * self.random(size)

    def integers(self, low: int, high: int) -> int:
        """One integer in [low, high); the bias of scaling a double is below 2**-40 here."""
        return low + int(self.random() * (high - low))

    def normal(self, mean: float, sd: float, size: int | tuple[int, ...]) -> np.ndarray:
        """Box-Muller, one variate per pair of uniforms (1 - u keeps the logarithm finite)."""
        u1, u2 = 1.0 - self.random(size), self.random(size)
        return mean + sd * np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)

    def erlang(self, shape: int, scale: float, size: tuple[int, ...]) -> np.ndarray:
        """Gamma with an integer shape: the sum of `shape` unit exponentials, times `scale`."""
        prod = np.ones(size)
        for _ in range(shape):
            prod *= 1.0 - self.random(size)
        return -scale * np.log(prod)

    def choice(self, options: list[str], size: int, p: list[float]) -> np.ndarray:
        """`size` picks from `options` with probabilities `p` (inverse of the cumulative sum)."""
        edges = np.cumsum(p) / np.sum(p)
        idx = np.minimum(np.searchsorted(edges, self.random(size), side="right"), len(p) - 1)
        return np.asarray(options)[idx]

    def sample(self, n: int, k: int) -> np.ndarray:
        """`k` distinct indices of `range(n)`, in random order (the first k of a shuffle)."""
        return np.argsort(self.random(n), kind="stable")[:k]

    def bytes(self, n: int) -> bytes:
        return self._words((n + 7) // 8).tobytes()[:n]
