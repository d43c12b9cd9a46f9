"""Batch shares by measured speed: a data-parallel job on devices of different speeds
gives each rank a share of the global batch in proportion to how fast it computes, so
that no rank waits for a slower one at every gradient reduction.

A synchronous step lasts as long as its slowest rank's forward and backward. With even
shares on a device twice as fast as its peer, the fast one idles half the step; with
shares proportional to speed both finish together. ``BatchBalancer`` measures each rank's
compute time (``RankStep.compute_time_s``: until its gradients were ready, without the
wait for its peers) over a window of steps, takes each rank's seconds per sample at its
current share, and moves the shares to the proportions of the ranks' speeds when that
makes the slowest rank's predicted compute time shorter by more than ``MIN_GAIN`` and by
more than the noise of the measurement (``NOISE_Z``); while the gain is above
``MIN_GAIN`` but within the noise, it measures longer.
Because a step also has a fixed cost that does not shrink with the share, one move
rarely lands exactly; the next windows correct it, and the rule stops once the next move
would save less than ``MIN_GAIN``. The ranks' gradients are averaged by samples
(``WorkerSpec.batch_shares``), so the update is the same as with even shares: the
global batch, its samples and the loss per sample do not change, only where each sample
is computed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from autotune.executor.tasks import split_batch

__all__ = ["BLOCKS", "MAX_WINDOW", "MIN_GAIN", "NOISE_Z", "WARMUP_STEPS", "WINDOW", "BatchBalancer"]

WARMUP_STEPS = 2
"""Steps not measured after a start or a move (the first step's allocations, caches of
the new batch shapes)."""
WINDOW = 8
"""Steps measured before the shares are first judged."""
BLOCKS = 4
"""The window's blocks of consecutive steps whose means give the noise."""
MAX_WINDOW = 32
"""Steps a judgement may wait for while the figures are too noisy to decide (the oldest
are dropped beyond it)."""
MIN_GAIN = 0.05
"""A move must shorten the slowest rank's predicted compute time by more than this
share."""
NOISE_Z = 3.0
"""And by more than this many standard errors of the noisiest rank's mean compute time
(relative, by batch means: ``_relative_error``): until it does, the window grows. In
simulation, with steps +-10% noisy, bimodal, or stalled one in three to seven steps, and
even speeds, four ranks' shares move about once in 5,000 steps; a rank twice as slow as
its peer is found in 9 to 28 steps."""


class BatchBalancer:
    """The shares of ``global_batch`` for ``replicas`` data-parallel ranks, each at least
    ``least`` samples (a rank's micro-batches), starting from ``shares`` (weights; even
    without). ``observe`` each step's per-rank compute seconds; it returns the new sample
    counts when they move."""

    def __init__(
        self,
        global_batch: int,
        replicas: int,
        *,
        least: int = 1,
        shares: Sequence[float] | None = None,
    ) -> None:
        self.global_batch, self.least = global_batch, least
        self.counts = split_batch(global_batch, list(shares or [1.0] * replicas), least=least)
        self._times: list[Sequence[float]] = []
        self._skip = WARMUP_STEPS
        self.last: dict[str, Any] = {}
        """The figures the last judgement used (``seconds_per_sample``, ``compute_s``,
        ``predicted_s``), for the move's event."""

    @property
    def even(self) -> bool:
        return len(set(self.counts)) == 1

    def observe(self, compute_s: Sequence[float]) -> tuple[int, ...] | None:
        """One step's compute seconds, one per rank; the new counts when they move."""
        if len(compute_s) != len(self.counts):
            raise ValueError(f"{len(compute_s)} compute times for {len(self.counts)} ranks")
        if self._skip:
            self._skip -= 1
            return None
        self._times.append(tuple(compute_s))
        if len(self._times) < WINDOW:
            return None
        columns = list(zip(*self._times, strict=True))
        # Means, not medians: a device shared or throttled by a CPU quota is slow in
        # bursts (a step in four or eight stalls), and the mean is what the job pays.
        means = [statistics.fmean(column) for column in columns]
        if min(means) <= 0:
            self._times.clear()
            return None
        noise = max(_relative_error(column, m) for column, m in zip(columns, means, strict=True))
        per_sample = [m / n for m, n in zip(means, self.counts, strict=True)]
        target = split_batch(self.global_batch, [1.0 / x for x in per_sample], least=self.least)
        now = max(means)
        predicted = max(x * n for x, n in zip(per_sample, target, strict=True))
        gain = 1.0 - predicted / now
        self.last = {
            "seconds_per_sample": [round(x, 6) for x in per_sample],
            "compute_s": [round(m, 4) for m in means],
            "predicted_s": round(predicted, 4),
            "noise": round(noise, 4),
            "steps": len(columns[0]),
        }
        if target == self.counts or gain <= MIN_GAIN:
            self._times.clear()
            return None
        if gain <= NOISE_Z * noise:  # it may pay: measure longer
            if len(self._times) >= MAX_WINDOW:
                del self._times[0]
            return None
        self.counts = target
        self._times.clear()
        self._skip = WARMUP_STEPS
        return target


def _relative_error(times: Sequence[float], mean: float) -> float:
    """The standard error of ``mean`` relative to it, by batch means: the spread of the
    means of ``BLOCKS`` blocks of consecutive steps. A CPU quota or a shared device
    stalls a rank every few steps in a rhythm; steps so correlated make the plain
    standard error (spread / sqrt(steps)) far too large, and block means absorb the
    rhythm once a block spans it (the blocks grow with the window)."""
    size = len(times) // BLOCKS
    recent = times[len(times) - size * BLOCKS :]
    blocks = [statistics.fmean(recent[i * size : (i + 1) * size]) for i in range(BLOCKS)]
    return statistics.stdev(blocks) / math.sqrt(BLOCKS) / mean
