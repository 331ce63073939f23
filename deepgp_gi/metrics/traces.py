"""Training traces: a logged ELBO trace averaged over blocks of steps, and the step at which it
has made a given fraction of its improvement (for convergence plots and tables)."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

__all__ = ["smooth_trace", "steps_to_fraction"]


def smooth_trace(steps: Sequence[int], values: Sequence[float], points: int = 200):
    """Average a logged trace over ``points`` consecutive blocks (fewer when the trace is
    shorter)."""
    steps = np.asarray(steps, dtype=float)
    values = np.asarray(values, dtype=float)
    if len(steps) == 0:
        return [], []
    blocks = np.array_split(np.arange(len(steps)), min(points, len(steps)))
    return ([int(steps[b[-1]]) for b in blocks], [float(np.mean(values[b])) for b in blocks])


def steps_to_fraction(
    steps: Sequence[int], values: Sequence[float], fraction: float = 0.99
) -> Optional[int]:
    """First step at which a (smoothed) ELBO trace has made ``fraction`` of its total improvement.

    "Reaching 99% of the final ELBO" is read as ``elbo(t) >= e0 + 0.99 (e_final - e0)`` with ``e0``
    the first and ``e_final`` the last value of the trace (ELBOs change sign, so a plain ratio is
    meaningless). ``e_final`` is the mean of the last 5% of the trace, to damp Monte Carlo noise.
    """
    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        return None
    tail = max(1, len(v) // 20)
    e0, ef = v[0], float(np.mean(v[-tail:]))
    if ef <= e0:
        return None
    threshold = e0 + fraction * (ef - e0)
    hit = np.nonzero(v >= threshold)[0]
    return int(steps[hit[0]]) if len(hit) else None
