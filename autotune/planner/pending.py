"""The pending jobs' demand: per GPU model, the pressure the scarcity cost term
weighs (pending demand spread over the allowed models / their free GPUs), and the
jobs asking for more GPUs than are free for them (step 3)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from autotune.core import MILLI_PER_GPU
from autotune.planner.arrays import BoolArray, FloatArray, IntArray
from autotune.planner.capacity import FreeCapacity
from autotune.planner.jobs import PreparedJob, spans_nodes


def pressure_by_model(jobs: Sequence[PreparedJob], state: FreeCapacity) -> FloatArray:
    """Per GPU model: pending GPU demand that can go there / its free GPUs. Each job's
    demand is spread over its allowed models in proportion to their free capacity."""
    if not jobs:
        return np.zeros(len(state.models))
    allowed = np.array([j.allowed for j in jobs], dtype=bool)
    demand = np.array([j.world * j.spec.gpu_milli / MILLI_PER_GPU for j in jobs])
    return _pressure_from_demand(allowed, demand, state)


def _pressure_from_demand(
    allowed: BoolArray, demand: FloatArray, state: FreeCapacity
) -> FloatArray:
    free = state.free_gpus_by_model()
    if not len(allowed) or not len(free):
        return np.zeros(len(free))
    share = allowed * free[None, :]
    totals = share.sum(axis=1, keepdims=True)
    share = np.divide(share, totals, out=np.zeros_like(share), where=totals > 0)
    result: FloatArray = (share * demand[:, None]).sum(axis=0) / np.maximum(free, 1e-9)
    return result


class PendingJobs:
    """The pending jobs as arrays, in queue order: which are still waiting for a round,
    their demand per model (for the pressure) and their GPU count (for the check that
    they can fit at all)."""

    def __init__(self, jobs: Sequence[PreparedJob], state: FreeCapacity) -> None:
        self.jobs = list(jobs)
        for i, job in enumerate(self.jobs):
            job.index = i
        n, n_models = len(self.jobs), len(state.models)
        self.allowed: BoolArray = np.array([j.allowed for j in self.jobs], dtype=bool).reshape(
            n, n_models
        )
        self.world: IntArray = np.fromiter((j.world for j in self.jobs), dtype=np.int64, count=n)
        milli = np.fromiter((j.spec.gpu_milli for j in self.jobs), dtype=np.int64, count=n)
        self.demand: FloatArray = self.world * milli / MILLI_PER_GPU
        self.milli_values, self.milli_index = np.unique(milli, return_inverse=True)
        self.spans: BoolArray = np.fromiter(
            (spans_nodes(j) for j in self.jobs), dtype=bool, count=n
        )
        """Jobs whose ranks may go to several nodes: all on one GPU model."""
        self.alive: BoolArray = np.ones(n, dtype=bool)
        self.state = state

    def pressure(self) -> FloatArray:
        """``pressure_by_model`` of the jobs still alive, in queue order."""
        alive = self.alive
        if alive.all():
            return _pressure_from_demand(self.allowed, self.demand, self.state)
        return _pressure_from_demand(self.allowed[alive], self.demand[alive], self.state)

    def settle(self, job: PreparedJob) -> None:
        self.alive[job.index] = False

    def cannot_fit(self) -> list[tuple[PreparedJob, int]]:
        """The alive jobs asking for more GPUs than their allowed models have with their
        milli free (a job that may span nodes: than one of its allowed models has), each
        with that count; they are no longer alive."""
        alive = np.nonzero(self.alive)[0]
        if not len(alive):
            return []
        state = self.state
        usable = np.stack([state.usable_gpus_by_model(int(m)) for m in self.milli_values])
        per_model = usable[self.milli_index[alive]] * self.allowed[alive]
        have = np.where(self.spans[alive], per_model.max(axis=1, initial=0), per_model.sum(axis=1))
        short = have < self.world[alive]
        if not short.any():
            return []
        out = [(self.jobs[i], int(h)) for i, h in zip(alive[short], have[short], strict=True)]
        self.alive[alive[short]] = False
        return out
