"""Robust location and spread of per-member samples, shared by the peer rules (:mod:`.peers`,
:mod:`.shift`, :mod:`.dp`): the interquartile mean and range per member, and the median over
members of that range as a standard deviation."""

from __future__ import annotations

import numpy as np


def iqm_iqr(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``x`` [members, samples]: (interquartile mean: the mean of the middle half,
    accumulated in float64; interquartile range) — one sort of contiguous rows."""
    k = x.shape[1]
    q = k // 4
    srt = np.sort(x, axis=1)
    return srt[:, q : k - q].sum(axis=1, dtype=np.float64) / (k - 2 * q), srt[:, k - 1 - q] - srt[:, q]


def median_spread(iqr: np.ndarray) -> float:
    """The median over members of their interquartile range (``iqr``: :func:`iqm_iqr`'s), / 1.349:
    a robust standard deviation of the members' samples."""
    iq = sorted(iqr.tolist())
    n = len(iq)
    return (iq[n // 2] if n % 2 else (iq[n // 2 - 1] + iq[n // 2]) / 2) / 1.349
