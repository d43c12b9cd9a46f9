"""A task's statistical efficiency under each gradient compression, measured on real
training: the steps plain fp32 DDP takes to a target loss over the steps the compressed
run takes to it.

For each seed, the dense run trains ``n_steps`` (N) steps; the target is its loss at step
N (the mean of the ``WINDOW`` losses up to it, as every loss here), and its own steps to
the target are the first step whose mean is at or below it (before N where the loss has
flattened). Each compression then trains up to ``limit`` x N steps from the same seed.
Its efficiency is dense steps / its steps to the target; where it does not reach the
target, dense steps to the lowest finite loss it did reach / its steps (the progress it
made, priced in dense steps). The task's efficiency under a compression is the median
over the seeds, at most 1 (a compressed run that beats dense by chance is charged
nothing).

Ranks run as local processes over gloo (``autotune.executor.local``): steps to a loss do
not depend on the network, so this needs no cluster. ``autotune calibrate --efficiency``
saves the result into a calibration's ``statistics``, where the task's profile takes it
(``autotune.catalog.tasks.register_compression_efficiency``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from autotune.core import CompressionSpec, JobConfig, Layout
from autotune.errors import InputError

__all__ = [
    "KEYS",
    "MIN_EFFICIENCY",
    "WINDOW",
    "EfficiencyRun",
    "compression_efficiencies",
    "efficiency_of",
    "reached",
    "smoothed",
]

WINDOW = 10
"""Losses averaged into each step's loss: one step's loss is too noisy to stop on."""
KEYS: Final = ("compression_efficiency", "efficiency_runs", "efficiency_protocol")
"""What a measurement adds to a calibration's figures of its task
(``compression_efficiencies``)."""
MIN_EFFICIENCY = 1e-3
"""The least efficiency a measurement gives (a profile's efficiencies are positive)."""


def smoothed(losses: Sequence[float]) -> list[float]:
    """Each step's mean loss over the ``WINDOW`` steps up to it."""
    return [statistics.fmean(losses[max(0, i - WINDOW + 1) : i + 1]) for i in range(len(losses))]


def reached(curve: Sequence[float], target: float) -> int | None:
    """The first step (1-based) whose smoothed loss is at or below ``target``."""
    return next((i + 1 for i, v in enumerate(curve) if v <= target), None)


@dataclass(frozen=True, slots=True)
class EfficiencyRun:
    """One compressed run against its seed's dense run."""

    compression: str
    seed: int
    target: float
    dense_steps: int
    steps: int | None
    """Its steps to the target; ``None``: not within the limit."""
    final_loss: float
    efficiency: float

    def to_json(self) -> dict[str, Any]:
        return {
            "compression": self.compression,
            "seed": self.seed,
            "target": round(self.target, 6),
            "dense_steps": self.dense_steps,
            "steps": self.steps,
            "final_loss": round(self.final_loss, 6) if math.isfinite(self.final_loss) else None,
            "efficiency": round(self.efficiency, 4),
        }


def efficiency_of(
    name: str, seed: int, dense: Sequence[float], run: Sequence[float]
) -> EfficiencyRun:
    """Compressed curve ``run``'s efficiency against its seed's ``dense`` curve (both
    smoothed); the target is the dense curve's last loss. A compressed run whose loss
    is not finite at its end (it diverged) is priced by the best finite loss it had,
    and at the floor ``MIN_EFFICIENCY`` where it never had one."""
    target = dense[-1]
    if not math.isfinite(target):
        raise InputError(f"{name}, seed {seed}: plain DDP's loss is {target} at step N")
    base = reached(dense, target)
    assert base is not None, "a finite target is reached by the curve that ends at it"
    steps = reached(run, target)
    finite = [v for v in run if math.isfinite(v)]
    if steps is not None:
        value = base / steps
    elif finite:
        # The dense curve reaches any loss above its target before it.
        matched = reached(dense, min(finite))
        assert matched is not None
        value = matched / len(run)
    else:
        value = MIN_EFFICIENCY
    final = run[-1] if math.isfinite(run[-1]) else math.inf
    return EfficiencyRun(
        name, seed, target, base, steps, final, min(1.0, max(MIN_EFFICIENCY, value))
    )


def compression_efficiencies(
    task: str,
    compressions: Sequence[CompressionSpec],
    *,
    batch_size: int | None = None,
    n_steps: int = 150,
    seeds: Sequence[int] = (0, 1, 2),
    dp: int = 2,
    limit: int = 2,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure ``task``'s efficiency under each of ``compressions`` (see the module): the
    median per compression (by its text form, ``str(CompressionSpec)``) and every run."""
    from autotune.catalog.tasks import BUILTIN_TASKS
    from autotune.executor.local import run_local
    from autotune.executor.worker import WorkerSpec

    if n_steps < 2 * WINDOW:
        raise InputError(f"--efficiency-steps must be >= {2 * WINDOW}, not {n_steps}")
    if dp < 2:
        raise InputError("compression needs at least 2 data-parallel ranks")
    if not seeds:
        raise InputError("give at least one seed")
    layout = Layout(dp=dp, world_size=dp)
    builtin = BUILTIN_TASKS.get(task)
    recorded = batch_size or getattr(builtin.shape if builtin else None, "batch_size", None)

    def curve(compression: CompressionSpec, steps: int, seed: int) -> list[float]:
        config = JobConfig(layout=layout, compression=compression)
        spec = WorkerSpec(task=task, config=config, batch_size=batch_size, seed=seed)
        return smoothed(run_local(spec, steps, save=False, timeout_s=3600.0).losses())

    runs: list[EfficiencyRun] = []
    for seed in seeds:
        if progress:
            progress(f"{task} seed {seed}: dense")
        dense = curve(CompressionSpec(), n_steps, seed)
        for spec in compressions:
            if spec.kind == "none":
                continue
            if progress:
                progress(f"{task} seed {seed}: {spec}")
            runs.append(efficiency_of(str(spec), seed, dense, curve(spec, limit * n_steps, seed)))
    names = list(dict.fromkeys(r.compression for r in runs))
    found = {
        "compression_efficiency": {
            name: max(
                MIN_EFFICIENCY,
                round(statistics.median(r.efficiency for r in runs if r.compression == name), 4),
            )
            for name in names
        },
        "efficiency_runs": [r.to_json() for r in runs],
        "efficiency_protocol": {
            "n_steps": n_steps,
            "limit_steps": limit * n_steps,
            "seeds": list(seeds),
            "dp": dp,
            "global_batch": recorded,
            "window": WINDOW,
        },
    }
    assert tuple(found) == KEYS
    return found
