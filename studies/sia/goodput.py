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
- **Across types** (only where the world runs one job across GPU types,
  ``ClusterSnapshot.mixes_models``): for every two types a job may use, each split of
  ``COUNTS`` GPUs across them at its best batch (``SiaApp.mixed_step``) is one more
  option, kept where it beats every option on one type with as many GPUs or fewer; the
  choice names the split (``PolicyChoice.gpu_split``).
- **Weights**: ``goodput-size``'s, (remaining time on one GPU of its best type / 1 h) to
  the power -``exponent`` (0: every job weighs 1).

Placement is the decision step's Planner's, on the chosen type (``PolicyChoice.gpu_models``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Final, NamedTuple

from autotune import __version__
from autotune.core import JobConfig, Layout
from autotune.interfaces import ClusterSnapshot, JobStatus, PolicyChoice, PolicyRound
from autotune.studies.pollux.goodput import batch_candidates, size_weight
from autotune.studies.pollux.trace import packed
from autotune.studies.sia.trace import SiaApp, SiaTypeApp

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

Option = tuple[tuple[str, int], ...]
"""``(GPU model, GPUs)`` per model a job runs on, in order of model name: one pair for a
job on one type, two for a job across types."""
Table = dict[Option, tuple[float, int]]
"""Per option a job may be given: its best progress per second there, and the batch."""


def _gpus(option: Option) -> int:
    return sum(n for _, n in option)


def _one(model: str, n: int) -> Option:
    return ((model, n),)


class _Round(NamedTuple):
    active: list[JobStatus]
    tables: dict[str, Table]
    """Per job: ``SiaGoodputPolicy.table`` of every GPU model, and ``mixed_table``'s
    options where the world runs jobs across types."""
    totals: dict[str, int]
    """GPUs per model."""
    model_of: dict[str, str]
    """Node id -> its GPU model."""
    left: dict[str, float]
    """Per job with measured physics: the progress it has left."""


def _unit(table: Mapping[Option, tuple[float, int]]) -> float:
    """A job's best goodput on one GPU of any type (0: nothing measured on one): what its
    speed-ups are measured against."""
    return max((v[0] for o, v in table.items() if _gpus(o) == 1), default=0.0)


def _best_batch(batches: Sequence[int], rate: Callable[[int], float]) -> tuple[float, int]:
    """The batch of ``batches`` with the highest ``rate`` (the first of equals) and that
    rate; batches the traces did not measure (``ValueError``) are passed over; (0, 0)
    where none was measured."""
    best = (0.0, 0)
    for batch in batches:
        try:
            found = rate(batch)
        except ValueError:  # outside what the traces measured
            continue
        if found > best[0]:
            best = (found, batch)
    return best


def _rate_on(on: SiaTypeApp, ranks: tuple[int, ...], epoch: int, batch: int) -> float:
    return on.rate(ranks, batch, epoch)


def _rate_across(
    app: SiaApp, parts: Option, ranks: tuple[int, ...], epoch: int, batch: int
) -> float:
    on = app.on(parts[0][0])
    return on.gain(batch, epoch) / app.mixed_step(parts, ranks, batch).step_s


def _held(job: JobStatus, model_of: Mapping[str, str]) -> Option:
    """The option a running job holds (empty for one that is not running)."""
    if job.state != "running" or job.placement is None:
        return ()
    return tuple(job.placement.ranks_by_model(model_of).items())


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
        self._mixed: dict[tuple[str, tuple[str, ...], int, int], Table] = {}
        self._last: tuple[ClusterSnapshot, _Round] | None = None

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
            ranks = packed(n, per_node)
            best = _best_batch(
                [b for b in batches if b >= n * on.min_local],
                partial(_rate_on, on, ranks, epoch),
            )
            if best[0] > 0:
                found[n] = best
        self._tables[key] = found
        return found

    def mixed_table(
        self,
        job: JobStatus,
        app: SiaApp,
        models: tuple[str, str],
        per_node: Mapping[str, int],
        totals: Mapping[str, int],
        done: float,
    ) -> Table:
        """Per split of ``COUNTS`` GPUs of the two ``models`` (within each one's total and,
        together, the job's ``max_gpus``): the best progress per second of the job across
        the two types this epoch (``SiaApp.mixed_step``, each type's GPUs packed on its
        fewest nodes) and its batch; splits nothing was measured for are left out."""
        on = app.on(models[0])
        epoch = on.epoch_of(done)
        # The same for every job of the application at its size limit (one run's cluster).
        key = (app.name, models, epoch, job.spec.max_gpus)
        found = self._mixed.get(key)
        if found is not None:
            return found
        batches = batch_candidates(on.init_batch, on.max_batch)
        found = {}
        a, b = models
        for na in COUNTS:
            if na > totals[a]:
                break
            for nb in COUNTS:
                if nb > totals[b] or na + nb > job.spec.max_gpus:
                    break
                parts = tuple(sorted(((a, na), (b, nb))))  # as ``_held`` names it
                ranks = packed(na, per_node[a]) + packed(nb, per_node[b])
                best = _best_batch(
                    batches,
                    partial(_rate_across, app, parts, ranks, epoch),
                )
                if best[0] > 0:
                    found[parts] = best
        self._mixed[key] = found
        return found

    # -- the round --------------------------------------------------------------------

    def _world(self, snapshot: ClusterSnapshot) -> _Round:
        """The round's active jobs and their goodput tables: per GPU type, and across two
        types where the world runs jobs so (``ClusterSnapshot.mixes_models``); built once
        per snapshot (``weights`` and ``allocate`` of one round share it)."""
        if self._last is not None and self._last[0] is snapshot:
            return self._last[1]
        found = self._build(snapshot)
        self._last = (snapshot, found)
        return found

    def _build(self, snapshot: ClusterSnapshot) -> _Round:
        totals: dict[str, int] = {}
        per_node: dict[str, int] = {}
        model_of: dict[str, str] = {}
        for node in snapshot.nodes:
            if node.gpu_count > 0:
                totals[node.gpu_model] = totals.get(node.gpu_model, 0) + node.gpu_count
                per_node[node.gpu_model] = max(per_node.get(node.gpu_model, 0), node.gpu_count)
                model_of[node.node_id] = node.gpu_model
        active = [j for j in snapshot.jobs if j.state in ("pending", "running")]
        tables: dict[str, Table] = {}
        left: dict[str, float] = {}
        for job in active:
            found = self._physics(job.spec.job_id)
            if found is None:
                continue
            app, done = found
            models = [m for m in totals if m in app.types and job.spec.allows(m)]
            table: Table = {
                _one(model, n): v
                for model in models
                for n, v in self.table(
                    job, app, model, per_node[model], totals[model], done
                ).items()
            }
            if snapshot.mixes_models and job.spec.max_gpus > 1:
                # Across types only where that beats every one type with as many GPUs
                # or fewer: what mixing adds is room beyond one type's GPUs. A running
                # job's own split stays, so that a move from it pays its restart.
                runs_on = _held(job, model_of)
                best_by: dict[int, float] = {}
                for option, (rate, _) in table.items():
                    best_by[_gpus(option)] = max(best_by.get(_gpus(option), 0.0), rate)
                for i, a in enumerate(models):
                    for b in models[i + 1 :]:
                        for option, v in self.mixed_table(
                            job, app, (a, b), per_node, totals, done
                        ).items():
                            n = _gpus(option)
                            beaten = max((r for k, r in best_by.items() if k <= n), default=0)
                            if v[0] > beaten or option == runs_on:
                                table[option] = v
            tables[job.spec.job_id] = table
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
            if job.config is not None and (runs_on := _held(job, world.model_of)):
                current[job.spec.job_id] = runs_on
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
        tables: Mapping[str, Mapping[Option, tuple[float, int]]],
    ) -> bool:
        """Whether moving a running job from ``now`` to ``new`` raises its goodput by too
        little to pay its restart over ``horizon_s``."""
        if new is None or new == now:
            return False
        table = tables.get(job_id, {})
        have = table.get(now, (0.0, 0))[0]
        rate = table[new][0]
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
        tables: Mapping[str, Mapping[Option, tuple[float, int]]],
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
        for job_id, option in fixed.items():
            alloc[job_id] = option
            for model, n in option:
                free[model] -= n
        units = {job_id: _unit(table) for job_id, table in tables.items()}
        for job in active:  # one GPU each, best type first, in arrival order
            job_id = job.spec.job_id
            if job_id in alloc or units.get(job_id, 0.0) <= 0:
                continue
            options = [
                (v[0], option[0][0])
                for option, v in tables[job_id].items()
                if _gpus(option) == 1 and free[option[0][0]] >= 1
            ]
            if options:
                _, model = max(options)
                runs_on = current.get(job_id, ())
                if len(runs_on) == 1:
                    on = runs_on[0][0]
                    if free.get(on, 0) >= 1 and _one(on, 1) in tables[job_id]:
                        model = on
                alloc[job_id] = _one(model, 1)
                free[model] -= 1
        while True:
            best: tuple[float, float, str, Option] | None = None
            for job_id, now in alloc.items():
                if job_id in fixed:
                    continue
                table, unit, weight = tables[job_id], units[job_id], weights.get(job_id, 1.0)
                here = self._term(table[now][0], unit, weight)
                n = _gpus(now)
                held = dict(now)
                for option, (rate, _) in table.items():
                    m = _gpus(option)
                    if any(k > free[model] + held.get(model, 0) for model, k in option):
                        continue
                    if (
                        m <= n
                        and set(dict(option)) <= set(held)
                        and all(k <= held[model] for model, k in option)
                    ):
                        continue  # fewer GPUs of what it holds: never a gain to take
                    gain = here - self._term(rate, unit, weight)
                    if gain <= 0:
                        continue
                    added = m - n
                    score = gain / added if added > 0 else math.inf
                    if best is None or (score, gain) > best[:2]:
                        best = (score, gain, job_id, option)
            if best is None:
                return alloc
            _, _, job_id, option = best
            for model, n in alloc[job_id]:
                free[model] += n
            for model, n in option:
                free[model] -= n
            alloc[job_id] = option

    def _choices(
        self,
        active: Sequence[JobStatus],
        tables: Mapping[str, Mapping[Option, tuple[float, int]]],
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
            n = _gpus(option)
            rate, batch = tables[job_id][option]
            config = job.config
            if current.get(job_id) == option and config and config.batch(job.spec) == batch:
                continue  # as it is
            where = " + ".join(f"{k} {model}" for model, k in option)
            if len(option) > 1:
                alone = max(
                    (v[0] for o, v in tables[job_id].items() if len(o) == 1 and _gpus(o) <= n),
                    default=0.0,
                )
                where += f" (the best on one type with as many GPUs or fewer: {alone:.2f})"
            choices[job_id] = PolicyChoice(
                config=JobConfig(layout=Layout(world_size=n), global_batch=batch),
                reason=f"sia-goodput: {where}, batch {batch}: {rate:.2f} progress/s",
                features={"gpus": float(n), "batch": float(batch), "goodput": rate},
                gpu_models=tuple(model for model, _ in option),
                gpu_split=option if len(option) > 1 else None,
            )
        return choices
