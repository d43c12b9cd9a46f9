"""A heterogeneity-aware goodput optimiser for Sia's world, written from Sia's and
Pollux's descriptions (Sia, SOSP'23, section 4; Pollux, OSDI'21, sections 3-4): each
job's GPU type, GPU count and batch size, re-chosen every round.

Every round:

- **Per job, per GPU type.** For each GPU count n up to what the job's batches allow,
  the batch that maximises its goodput on n GPUs of the type packed on the fewest
  nodes: statistical efficiency of the batch this epoch / time per optimizer step on
  that type (``SiaApp``). Sia fits these online from profiles; here they are read from
  the measured physics the job runs on, an upper bound on what a fit knows (as the
  Pollux-style optimiser does, ``autotune.studies.pollux.goodput``).
- **Across jobs.** A job's speed-up on (type, n) is its goodput there over its best
  goodput on one GPU of any type; the allocation minimises sum_j w_j SPEEDUP_j^p with
  p = ``FAIRNESS_P`` (the p-mean family of Pollux's and Sia's fairness), under each
  type's GPU count. Greedy: every job first gets one GPU, in arrival order, of its best
  type with one free (a running job: of the type it runs on, where one is free);
  then, step by step, the move (more GPUs of its type, or a number of another type's)
  that lowers the sum most per GPU it adds (a move that frees GPUs first) is taken
  while one lowers it.
- **Running jobs** given a type and count that raise their goodput keep theirs unless
  the new one's goodput over ``horizon_s`` beats the current one's by more than its
  restart costs (the application's ``rescale_time``); the allocation is then solved
  again around the jobs that keep theirs, until none more is held back. One given less
  is changed (its GPUs go to others). A job that keeps its type and count takes its
  best batch in place; a job left without a GPU is preempted.
- **Weights**: ``goodput-size``'s, (remaining time on one GPU of its best type / 1 h) to
  the power -``exponent`` (0: every job weighs 1).

Placement is the decision step's Planner's, on the chosen type (``PolicyChoice.gpu_models``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final, NamedTuple

from autotune import __version__
from autotune.core import JobConfig, Layout
from autotune.interfaces import ClusterSnapshot, JobStatus, PolicyChoice, PolicyRound
from autotune.studies.pollux.goodput import batch_candidates, size_weight
from autotune.studies.pollux.trace import packed
from autotune.studies.sia.trace import SiaApp

if TYPE_CHECKING:
    from autotune.envs.cluster_env import ClusterEnv

__all__ = ["FAIRNESS_P", "SiaGoodputPolicy"]

FAIRNESS_P: Final = -0.25
"""The p of the objective sum SPEEDUP^p, chosen on Sia's "newTrace" workloads 1-3 (not
the Philly and Helios sets the policy is compared with Sia on): of p in {-1, -0.5,
-0.25}, -0.25 had the lowest average JCT over the three (0.927 h, against 0.936 h at
Sia's -0.5 and 0.943 h at Pollux's -1; not on each: ``bench/RESULTS.md``)."""
COUNTS: Final = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
"""GPU counts a job may be given (all of them would cost a round many times more)."""

Option = tuple[str, int]
"""(GPU model, GPU count)."""


class _Round(NamedTuple):
    active: list[JobStatus]
    tables: dict[str, dict[str, dict[int, tuple[float, int]]]]
    """Per job, per GPU model: ``SiaGoodputPolicy.table``."""
    totals: dict[str, int]
    """GPUs per model."""
    model_of: dict[str, str]
    """Node id -> its GPU model."""
    left: dict[str, float]
    """Per job with measured physics: the progress it has left."""


def _unit(by_model: Mapping[str, Mapping[int, tuple[float, int]]]) -> float:
    """A job's best goodput on one GPU of any type (0: nothing measured on one): what its
    speed-ups are measured against."""
    return max((t[1][0] for t in by_model.values() if 1 in t), default=0.0)


class SiaGoodputPolicy:
    """See the module docstring; it reads the simulated cluster's jobs (their progress
    and measured physics), so one instance serves one run of ``env``."""

    name = "sia-goodput"

    def __init__(
        self,
        env: ClusterEnv,
        *,
        p: float = FAIRNESS_P,
        horizon_s: float = 600.0,
        exponent: float = 0.0,
    ) -> None:
        if p >= 0:
            raise ValueError(f"p={p!r}: the fair objective needs p < 0")
        if exponent < 0:
            raise ValueError(f"exponent={exponent!r}: must be >= 0")
        self.env = env
        self.p = p
        self.horizon_s = horizon_s
        self.exponent = exponent
        self.version = f"sia-goodput-{__version__}"
        self._tables: dict[tuple[str, str, int], dict[int, tuple[float, int]]] = {}

    # -- one job ----------------------------------------------------------------------

    def _physics(self, job_id: str) -> tuple[SiaApp, float] | None:
        sim = self.env.sim
        assert sim is not None
        state = sim.jobs[job_id]
        physics = state.arrival.physics
        return (physics, state.done) if isinstance(physics, SiaApp) else None

    def table(
        self, job: JobStatus, app: SiaApp, model: str, per_node: int, total: int, done: float
    ) -> dict[int, tuple[float, int]]:
        """Per GPU count of ``COUNTS`` (within ``total`` and the job's ``max_gpus``): the
        best progress per second on that many GPUs of ``model`` this epoch, and its batch;
        counts nothing was measured at are left out."""
        on = app.on(model)
        epoch = on.epoch_of(done)
        key = (job.spec.job_id, model, epoch)
        found = self._tables.get(key)
        if found is not None:
            return found
        low, high = on.init_batch, on.max_batch
        batches = batch_candidates(low, high)
        found = {}
        for n in COUNTS:
            if n > min(total, job.spec.max_gpus, high // on.min_local):
                break
            best = (0.0, 0)
            for batch in batches:
                if batch < n * on.min_local:
                    continue
                try:
                    rate = on.rate(packed(n, per_node), batch, epoch)
                except ValueError:  # outside what the traces measured
                    continue
                if rate > best[0]:
                    best = (rate, batch)
            if best[0] > 0:
                found[n] = best
        self._tables[key] = found
        return found

    # -- the round --------------------------------------------------------------------

    def _world(self, snapshot: ClusterSnapshot) -> _Round:
        """The round's active jobs and their goodput tables per GPU type."""
        totals: dict[str, int] = {}
        per_node: dict[str, int] = {}
        model_of: dict[str, str] = {}
        for node in snapshot.nodes:
            if node.gpu_count > 0:
                totals[node.gpu_model] = totals.get(node.gpu_model, 0) + node.gpu_count
                per_node[node.gpu_model] = max(per_node.get(node.gpu_model, 0), node.gpu_count)
                model_of[node.node_id] = node.gpu_model
        active = [j for j in snapshot.jobs if j.state in ("pending", "running")]
        tables: dict[str, dict[str, dict[int, tuple[float, int]]]] = {}
        left: dict[str, float] = {}
        for job in active:
            found = self._physics(job.spec.job_id)
            if found is None:
                continue
            app, done = found
            tables[job.spec.job_id] = {
                model: self.table(job, app, model, per_node[model], totals[model], done)
                for model in totals
                if model in app.types and job.spec.allows(model)
            }
            left[job.spec.job_id] = max(app.work - done, 0.0)
        return _Round(active, tables, totals, model_of, left)

    def weights(self, snapshot: ClusterSnapshot) -> dict[str, float]:
        """Each active job's weight this round: ``size_weight`` of its remaining time on
        one GPU of its best type (1 at exponent 0, or where nothing was measured)."""
        world = self._world(snapshot)
        out: dict[str, float] = {}
        for job in world.active:
            job_id = job.spec.job_id
            unit = _unit(world.tables.get(job_id, {}))
            out[job_id] = (
                size_weight(world.left[job_id] / unit, self.exponent)
                if unit > 0 and self.exponent
                else 1.0
            )
        return out

    def decide(self, snapshot: ClusterSnapshot) -> PolicyRound:
        return PolicyRound(choices=self.allocate(snapshot, self.weights(snapshot)))

    def allocate(
        self, snapshot: ClusterSnapshot, weights: Mapping[str, float] | None = None
    ) -> dict[str, PolicyChoice]:
        """The round's choices with job j's term weighted by ``weights[j]`` (1 if not
        given; must be > 0): what ``decide`` does with ``weights(snapshot)``, and what a
        learned policy's corrected weights go through."""
        weights = weights or {}
        world = self._world(snapshot)
        active, tables = world.active, world.tables
        current: dict[str, Option] = {}
        for job in active:
            if job.state == "running" and job.placement is not None and job.config is not None:
                model = world.model_of[job.placement.ranks[0].node_id]
                current[job.spec.job_id] = (model, job.config.world_size)
        # A change that raises a job's own goodput must pay its restart; one that lowers
        # it frees GPUs for the others and is taken. Jobs held where they are, the rest
        # is allocated again, until no new allocation is held back.
        kept: dict[str, Option] = {}
        alloc = self._allocate(active, tables, weights, world.totals, kept, current)
        for _ in range(len(current)):
            held = {
                job_id: now
                for job_id, now in current.items()
                if job_id not in kept and self._unpaid(job_id, now, alloc.get(job_id), tables)
            }
            if not held:
                break
            kept.update(held)
            alloc = self._allocate(active, tables, weights, world.totals, kept, current)
        return self._choices(active, tables, alloc, current)

    def _unpaid(
        self,
        job_id: str,
        now: Option,
        new: Option | None,
        tables: Mapping[str, Mapping[str, Mapping[int, tuple[float, int]]]],
    ) -> bool:
        """Whether moving a running job from ``now`` to ``new`` raises its goodput by too
        little to pay its restart over ``horizon_s``."""
        if new is None or new == now:
            return False
        table = tables.get(job_id, {})
        have = table.get(now[0], {}).get(now[1], (0.0, 0))[0]
        rate = table[new[0]][new[1]][0]
        restart = self._restart_s(job_id)
        return rate > have > 0 and have * self.horizon_s >= rate * (self.horizon_s - restart)

    def _restart_s(self, job_id: str) -> float:
        found = self._physics(job_id)
        return found[0].restart_s if found is not None else 0.0

    def _term(self, rate: float, unit: float, weight: float) -> float:
        return math.inf if rate <= 0 else weight * float((rate / unit) ** self.p)

    def _allocate(
        self,
        active: Sequence[JobStatus],
        tables: Mapping[str, Mapping[str, Mapping[int, tuple[float, int]]]],
        weights: Mapping[str, float],
        totals: Mapping[str, int],
        fixed: Mapping[str, Option],
        current: Mapping[str, Option],
    ) -> dict[str, Option]:
        """The greedy allocation (see the module docstring), ``fixed`` jobs held where
        they are; a running job's first GPU is of the type it runs on (``current``)
        where one is free, so that a restart buys more than a move."""
        free = dict(totals)
        alloc: dict[str, Option] = {}
        for job_id, (model, n) in fixed.items():
            alloc[job_id] = (model, n)
            free[model] -= n
        units = {job_id: _unit(by_model) for job_id, by_model in tables.items()}
        for job in active:  # one GPU each, best type first, in arrival order
            job_id = job.spec.job_id
            if job_id in alloc or units.get(job_id, 0.0) <= 0:
                continue
            options = [
                (t[1][0], model)
                for model, t in tables[job_id].items()
                if 1 in t and free[model] >= 1
            ]
            if options:
                _, model = max(options)
                runs_on = current.get(job_id, ("", 0))[0]
                if free.get(runs_on, 0) >= 1 and 1 in tables[job_id].get(runs_on, {}):
                    model = runs_on
                alloc[job_id] = (model, 1)
                free[model] -= 1
        while True:
            best: tuple[float, float, str, Option] | None = None
            for job_id, (model, n) in alloc.items():
                if job_id in fixed:
                    continue
                by_model, unit, weight = tables[job_id], units[job_id], weights.get(job_id, 1.0)
                here = self._term(by_model[model][n][0], unit, weight)
                for other, table in by_model.items():
                    room = free[other] + (n if other == model else 0)
                    for m, (rate, _) in table.items():
                        if m > room or (other == model and m <= n):
                            continue
                        gain = here - self._term(rate, unit, weight)
                        if gain <= 0:
                            continue
                        added = m - n
                        score = gain / added if added > 0 else math.inf
                        if best is None or (score, gain) > best[:2]:
                            best = (score, gain, job_id, (other, m))
            if best is None:
                return alloc
            _, _, job_id, (model, m) = best
            old_model, n = alloc[job_id]
            free[old_model] += n
            free[model] -= m
            alloc[job_id] = (model, m)

    def _choices(
        self,
        active: Sequence[JobStatus],
        tables: Mapping[str, Mapping[str, Mapping[int, tuple[float, int]]]],
        alloc: Mapping[str, Option],
        current: Mapping[str, Option],
    ) -> dict[str, PolicyChoice]:
        choices: dict[str, PolicyChoice] = {}
        for job in active:
            job_id = job.spec.job_id
            option = alloc.get(job_id)
            if option is None:
                measured = any(tables.get(job_id, {}).values())
                why = "no GPU left for it this round" if measured else "nothing measured for it"
                choices[job_id] = PolicyChoice(
                    config=None, reason=f"sia-goodput: {why}", preempt=job.state == "running"
                )
                continue
            model, n = option
            rate, batch = tables[job_id][model][n]
            config = job.config
            if current.get(job_id) == option and config and config.batch(job.spec) == batch:
                continue  # as it is
            choices[job_id] = PolicyChoice(
                config=JobConfig(layout=Layout(world_size=n), global_batch=batch),
                reason=f"sia-goodput: {n} {model}, batch {batch}: {rate:.2f} progress/s",
                features={"gpus": float(n), "batch": float(batch), "goodput": rate},
                gpu_models=(model,),
            )
        return choices
