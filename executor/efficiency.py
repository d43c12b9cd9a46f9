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
over the seeds (``task_efficiency``), above 1 only where the compressed run reached the
target in fewer steps than dense on every seed, of at least two: one that beats dense
on some seeds is charged nothing for it, one that beats it on all is credited (top-k 1%
on gpt-char: 1.3-3.5x on every seed, at 2 ranks and at 4).

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
from typing import TYPE_CHECKING, Any, Final

from autotune.core import MAX_COMPRESSION_EFFICIENCY, CompressionSpec, JobConfig, Layout
from autotune.errors import InputError

if TYPE_CHECKING:
    from autotune.executor.local import LocalRun

__all__ = [
    "KEYS",
    "MIN_EFFICIENCY",
    "WINDOW",
    "EfficiencyRun",
    "compression_efficiencies",
    "efficiency_of",
    "noise_scale_of",
    "reached",
    "smoothed",
    "task_efficiency",
]

WINDOW = 10
"""Losses averaged into each step's loss: one step's loss is too noisy to stop on."""
KEYS: Final = (
    "compression_efficiency",
    "efficiency_runs",
    "run_noise_scale",
    "efficiency_protocol",
)
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
        name,
        seed,
        target,
        base,
        steps,
        final,
        min(MAX_COMPRESSION_EFFICIENCY, max(MIN_EFFICIENCY, value)),
    )


def task_efficiency(values: Sequence[float]) -> float:
    """A task's efficiency under a compression from its runs' (one per seed): their
    median, above 1 only where every run, of at least two, beat dense SGD (a run faster
    than dense on one seed and slower on another is charged nothing for it)."""
    if not values:
        raise ValueError("no runs")
    middle = statistics.median(values)
    if len(values) >= 2 and min(values) > 1:
        return middle
    return min(1.0, middle)


def noise_scale_of(run: LocalRun) -> float | None:
    """The gradient noise scale ``run`` measured by its last step, in samples: Pollux's
    estimator fed as ``JobRunner`` feeds it (each step's gradient figures and the
    samples of all its replicas); ``None`` before it has enough measurements. A run's
    first steps measure a smaller scale than its later ones (the gradient's signal
    shrinks as the loss falls): the calibration's 20-step runs put gpt-char's at 1.6-4.4
    samples, where halving its batch took 1.7x the steps to the target."""
    from autotune.executor.quality import NoiseScale

    noise = NoiseScale()
    for number, step in enumerate(zip(*run.reports, strict=True), start=1):
        quality = next((r.quality for r in step if r.quality is not None), None)
        if quality is not None:
            replicas = sum(1 for r in step if r.samples)
            noise.record(quality, sum(r.samples or 0 for r in step), replicas, number)
    return noise.reported


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

    def train(compression: CompressionSpec, steps: int, seed: int) -> LocalRun:
        config = JobConfig(layout=layout, compression=compression)
        spec = WorkerSpec(task=task, config=config, batch_size=batch_size, seed=seed)
        return run_local(spec, steps, save=False, timeout_s=3600.0)

    def curve(compression: CompressionSpec, steps: int, seed: int) -> list[float]:
        return smoothed(train(compression, steps, seed).losses())

    runs: list[EfficiencyRun] = []
    noise: list[float] = []
    for seed in seeds:
        if progress:
            progress(f"{task} seed {seed}: dense")
        reference = train(CompressionSpec(), n_steps, seed)
        dense = smoothed(reference.losses())
        measured = noise_scale_of(reference)
        if measured is not None:
            noise.append(measured)
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
                round(task_efficiency([r.efficiency for r in runs if r.compression == name]), 4),
            )
            for name in names
        },
        "efficiency_runs": [r.to_json() for r in runs],
        "run_noise_scale": round(statistics.median(noise), 3) if noise else None,
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
