"""A Pollux-style goodput optimiser, written from the paper's description (Qiao et al.,
"Pollux: Co-adaptive Cluster Scheduling for Goodput-Optimized Deep Learning", OSDI'21,
sections 3-4), for the Pollux-compatible mode: the knobs Pollux has, each job's GPU
count and batch size, fp32, data parallel.

Every round:

- **Per job (Pollux's agent).** For each GPU count n, the batch size that maximises the
  job's goodput on n GPUs packed onto the fewest nodes: progress per second =
  statistical efficiency of the batch (its gradient noise, this epoch) / time per
  optimizer step (with gradient accumulation past the largest local batch), over the
  batch sizes between the application's smallest and largest validated ones (ncf at
  the one GPU and batch Pollux's artifact gives it, ``POLLUX_FIXED_JOBS``). Pollux's
  agent fits this model online from the job's steps; here it reads the measured
  physics the job runs on (``Arrival.physics``), an upper bound on what the fit knows.
- **Across jobs (Pollux's scheduler).** SPEEDUP_j(n) = goodput_j(n) / goodput_j(1);
  GPUs go to maximise the p-mean of the speed-ups, (sum_j SPEEDUP_j(n_j)^p / J)^(1/p)
  with p = -1 (the paper's default), i.e. to minimise sum_j SPEEDUP_j^p: every waiting
  job first gets one GPU in arrival order while GPUs last, then, step by step, the job
  and larger GPU count that lower the sum most per GPU added take them (a greedy descent
  that looks past counts where a job's goodput dips, such as a second node before a
  third; the paper searches the allocations with a genetic algorithm). A running job
  keeps its allocation unless the new one raises its speedup by more than the restart
  costs over ``horizon_s`` (Pollux's re-allocation penalty), and a job left without a
  GPU is preempted. A job that keeps its GPU count takes its best batch for it in place
  (no restart, as Pollux's agent re-chooses the batch every epoch).
- **Tenants' quotas** (``ClusterSnapshot.tenants``; Pollux has none). A tenant is owed
  its quota, or what its active jobs ask for where that is less (each job its
  ``JobSpec.gpu_request()``, as ``autotune.envs.tenants.TenantMeter`` counts its
  entitlement). GPUs owed to a tenant it does not hold yet are kept back from the other
  tenants' jobs (their first GPU and their growth) while the owed tenant's jobs have a
  move that gains; once none has, they are lent to all. So the fair objective shares
  what is left after every tenant's quota, instead of sizing a borrower's jobs up at a
  quota owner's expense (the decision step only preempts for a quota what a policy asks
  for, and this policy asks for allocations that fit).
- **Placement** is the decision step's Planner's, not Pollux's.

Jobs without measured physics (the default world) get their requested GPUs, as
``static`` gives them.

**Weights.** ``allocate(snapshot, weights)`` weighs job j's term by w_j (sum_j w_j
SPEEDUP_j^p; 1 when not given): a heavier job gets GPUs sooner. ``SizedGoodputPolicy``
(``goodput-size``) sets w_j = (remaining_j / 1 h)^-0.5 from the job's remaining time on
one GPU at its best batch (remaining progress to its last epoch / that rate): a job
near its end is worth finishing, which lowers the average completion time (the
remaining work is known from the epochs a job declares; Pollux's scheduler does not
use it). The learned policy of the Pollux-compatible mode chooses these weights
(``autotune.studies.pollux.env.WEIGHT_RANGE``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from autotune import __version__
from autotune.core import JobConfig
from autotune.interfaces import ClusterSnapshot, JobStatus, PolicyChoice, PolicyRound
from autotune.studies.pollux.trace import TraceApp, packed, trace_of

if TYPE_CHECKING:
    from autotune.envs.cluster_env import ClusterEnv

__all__ = [
    "SIZE_EXPONENT",
    "GoodputPolicy",
    "SizedGoodputPolicy",
    "batch_candidates",
    "size_weight",
]

FAIRNESS_P: Final = -1.0
"""Pollux's p: the objective sum SPEEDUP^p; -1 weighs a job's speed-up inversely, so no
job is starved for another's gain."""
SIZE_EXPONENT: Final = 0.5
"""``goodput-size``'s weight is (remaining time / 1 h) to the power -SIZE_EXPONENT (its
default; ``SizedGoodputPolicy(exponent=...)``)."""
BATCH_CANDIDATES: Final = 12
"""Batch sizes tried per GPU count: geometric between the smallest and largest validated."""


def batch_candidates(low: int, high: int) -> list[int]:
    """The batch sizes a goodput optimiser tries: ``BATCH_CANDIDATES`` geometric steps
    from ``low`` to ``high`` (the smallest and largest validated batches)."""
    ratio = (high / low) ** (1 / (BATCH_CANDIDATES - 1))
    return sorted({round(low * ratio**i) for i in range(BATCH_CANDIDATES)} | {high})


class GoodputPolicy:
    """See the module docstring. It reads the simulated cluster's jobs (their measured
    physics), as ``oracle`` does; one instance serves one run."""

    name = "goodput"

    def __init__(
        self,
        env: ClusterEnv,
        *,
        p: float = FAIRNESS_P,
        restart_s: float = 30.0,
        horizon_s: float = 600.0,
    ) -> None:
        if p >= 0:
            raise ValueError(f"p={p!r}: the fair objective needs p < 0")
        self.env = env
        self.p = p
        self.restart_s = restart_s
        self.horizon_s = horizon_s
        self.version = f"goodput-{__version__}"
        self._tables: dict[tuple[str, int], list[tuple[float, int]]] = {}

    # -- one job: goodput per GPU count ---------------------------------------------

    def _table(
        self, job: JobStatus, trace: TraceApp, cap: int, per_node: int
    ) -> list[tuple[float, int]]:
        """Index n: (best progress per second on n GPUs, its batch); index 0 unused."""
        sim = self.env.sim
        assert sim is not None
        epoch = trace.epoch_of(sim.jobs[job.spec.job_id].done)
        key = (job.spec.job_id, epoch)
        hit = self._tables.get(key)
        if hit is not None and len(hit) > cap:
            return hit
        low, high = trace.init_batch, trace.max_batch
        batches = batch_candidates(low, high)
        if trace.fixed is not None:  # ncf: Pollux's one batch (its one GPU is max_gpus)
            batches = [trace.fixed[1]]
        table: list[tuple[float, int]] = [(0.0, 0)]
        for n in range(1, cap + 1):
            best = (0.0, 0)
            for batch in batches:
                if batch < n * trace.min_local:
                    continue  # under the smallest local batch measured
                try:
                    rate = trace.rate(packed(n, per_node), batch, epoch)
                except ValueError:  # outside what the traces measured
                    continue
                if rate > best[0]:
                    best = (rate, batch)
            table.append(best)
        self._tables[key] = table
        return table

    # -- the round ------------------------------------------------------------------

    def goodput_tables(self, snapshot: ClusterSnapshot) -> dict[str, list[tuple[float, int]]]:
        """Goodput tables of the active jobs with measured physics, by job id."""
        sim = self.env.sim
        assert sim is not None
        total = sum(n.gpu_count for n in snapshot.nodes)
        per_node = max((n.gpu_count for n in snapshot.nodes), default=1)
        tables: dict[str, list[tuple[float, int]]] = {}
        for job in snapshot.jobs:
            if job.state not in ("pending", "running"):
                continue
            trace = trace_of(sim.jobs[job.spec.job_id].arrival)
            if trace is None:
                continue
            cap = min(total, job.spec.max_gpus, trace.max_batch // trace.min_local)
            tables[job.spec.job_id] = self._table(job, trace, cap, per_node)
        return tables

    def remaining_s(self, snapshot: ClusterSnapshot) -> dict[str, float]:
        """Each active job's remaining time on one GPU at its best batch for its current
        epoch (jobs with measured physics only)."""
        sim = self.env.sim
        assert sim is not None
        out: dict[str, float] = {}
        for job_id, table in self.goodput_tables(snapshot).items():
            state = sim.jobs[job_id]
            trace = trace_of(state.arrival)
            assert trace is not None
            left = max(trace.target_progress - state.done, 0.0)
            out[job_id] = left / table[1][0] if len(table) > 1 and table[1][0] > 0 else math.inf
        return out

    def decide(self, snapshot: ClusterSnapshot) -> PolicyRound:
        return PolicyRound(choices=self.allocate(snapshot))

    def allocate(
        self, snapshot: ClusterSnapshot, weights: Mapping[str, float] | None = None
    ) -> dict[str, PolicyChoice]:
        """The round's choices with job j's term weighted by ``weights[j]`` (1 if not
        given; must be > 0)."""
        weights = weights or {}
        total = sum(n.gpu_count for n in snapshot.nodes)
        active = [j for j in snapshot.jobs if j.state in ("pending", "running")]
        tables = self.goodput_tables(snapshot)
        alloc = {j.spec.job_id: 0 for j in active}
        free = total
        # Jobs without measured physics: their requested GPUs, first come first served.
        for job in active:
            if job.spec.job_id not in tables:
                want = job.spec.gpu_request()
                if want <= free:
                    alloc[job.spec.job_id] = want
                    free -= want
        # Tenants' quotas: GPUs kept back for a tenant below what it is owed
        # (``_owed``) go to no other tenant's job while it has a move for them.
        tenant_of = {j.spec.job_id: j.spec.tenant for j in active}
        owed = _owed(snapshot, active, tables)
        held: dict[str, int] = defaultdict(int)
        for job in active:
            held[job.spec.tenant] += alloc[job.spec.job_id]

        def kept(name: str) -> int:
            """GPUs kept back for tenants other than ``name``."""
            return sum(max(0, due - held[t]) for t, due in owed.items() if t != name)

        # Everyone one GPU, in arrival order, while GPUs last (a tenant's job beyond
        # what the others are owed only).
        def first_gpus(reserve: bool) -> None:
            """One GPU each to the jobs without one that gain from it, in arrival order."""
            nonlocal free
            for job in active:
                table = tables.get(job.spec.job_id)
                if alloc[job.spec.job_id] or table is None or len(table) < 2 or table[1][0] <= 0:
                    continue
                if free > (kept(job.spec.tenant) if reserve else 0):
                    alloc[job.spec.job_id] = 1
                    held[job.spec.tenant] += 1
                    free -= 1

        first_gpus(reserve=True)
        # Then GPUs where the fair objective gains most per GPU. A job's goodput need not
        # grow GPU by GPU (a second node can cost more than it adds until a third
        # helps), so each step considers every larger count the free GPUs allow. Once no
        # owed tenant has a move left, what was kept back for it is free for all.
        reserve = bool(owed)
        while free > 0:
            best_gain, best_move = 0.0, None
            for job_id, table in tables.items():
                n = alloc[job_id]
                if n == 0:
                    continue
                room = free - kept(tenant_of[job_id]) if reserve else free
                weight = weights.get(job_id, 1.0)
                here = weight * self._term(table, n)
                for m in range(n + 1, min(len(table), n + room + 1)):
                    if table[m][0] <= 0:
                        continue
                    gain = (here - weight * self._term(table, m)) / (m - n)
                    if gain > best_gain:
                        best_gain, best_move = gain, (job_id, m)
            if best_move is None:
                if not reserve:
                    break
                reserve = False  # nothing owed can use them: lend them,
                first_gpus(reserve=False)  # first to the jobs kept waiting for them
                continue
            job_id, m = best_move
            free -= m - alloc[job_id]
            held[tenant_of[job_id]] += m - alloc[job_id]
            alloc[job_id] = m
        return self._choices(active, tables, alloc)

    def _term(self, table: list[tuple[float, int]], n: int) -> float:
        """SPEEDUP(n)^p, which the allocation minimises summed over jobs (with p < 0 that
        maximises the p-mean of the speed-ups, Pollux's fitness); a job without a GPU has
        speed-up 0, an infinite term."""
        if n == 0:
            return math.inf
        return float((table[n][0] / table[1][0]) ** self.p)

    def _choices(
        self,
        active: list[JobStatus],
        tables: dict[str, list[tuple[float, int]]],
        alloc: dict[str, int],
    ) -> dict[str, PolicyChoice]:
        choices: dict[str, PolicyChoice] = {}
        for job in active:
            job_id = job.spec.job_id
            n = alloc[job_id]
            table = tables.get(job_id)
            if n == 0:
                why = "goodput: no GPU left for it this round"
                choices[job_id] = PolicyChoice(
                    config=None, reason=why, preempt=job.state == "running"
                )
                continue
            if table is None:  # no measured physics: as requested, set once
                if job.state == "pending":
                    choices[job_id] = PolicyChoice(
                        config=JobConfig.data_parallel(n),
                        reason="goodput: requested GPUs (no measured physics)",
                    )
                continue
            rate, batch = table[n]
            features = {"gpus": float(n), "batch": float(batch), "goodput": rate}
            current = job.config
            if job.state == "running" and current is not None:
                now = current.world_size
                have = table[now][0] if now < len(table) else 0.0
                # A move pays the restart: worth it only if the gain over the horizon
                # exceeds what the downtime loses.
                keep = have * self.horizon_s >= rate * (self.horizon_s - self.restart_s)
                if now == n and current.batch(job.spec) == batch:
                    continue
                # Growing must pay its restart; a new batch on the same GPUs does not
                # (it changes in place, as Pollux's agent re-chooses it).
                if keep and now < n:
                    continue
            choices[job_id] = PolicyChoice(
                config=JobConfig(layout=JobConfig.data_parallel(n).layout, global_batch=batch),
                reason=f"goodput: {n} GPU(s), batch {batch}: {rate:.2f} progress/s",
                features=features,
            )
        return choices


def _owed(
    snapshot: ClusterSnapshot,
    active: list[JobStatus],
    tables: Mapping[str, list[tuple[float, int]]],
) -> dict[str, int]:
    """GPUs each tenant with a quota is owed this round: its quota, or what its active
    jobs ask for (each its ``JobSpec.gpu_request()``, at most the GPU counts its goodput
    table covers) where that is less; what ``autotune.envs.tenants.TenantMeter`` counts
    as its entitlement. Empty with no quota anywhere."""
    asked: dict[str, int] = defaultdict(int)
    for job in active:
        table = tables.get(job.spec.job_id)
        cap = len(table) - 1 if table is not None else job.spec.gpu_request()
        asked[job.spec.tenant] += min(job.spec.gpu_request(), cap)
    return {
        name: min(spec.nominal_gpus, asked[name])
        for name, spec in snapshot.tenants.items()
        if spec.nominal_gpus > 0 and asked[name] > 0
    }


def size_weight(remaining_s: float, exponent: float = SIZE_EXPONENT) -> float:
    """``goodput-size``'s weight of a job with ``remaining_s`` seconds left on one GPU:
    (remaining / 1 h)^-exponent, the remaining time taken as at least a minute."""
    return float((max(remaining_s, 60.0) / 3600.0) ** -exponent)


class SizedGoodputPolicy(GoodputPolicy):
    """``goodput`` with each job weighted by ``size_weight`` of its remaining time (see
    the module docstring); ``last_weights`` keeps the newest round's weights."""

    name = "goodput-size"

    def __init__(
        self, env: ClusterEnv, *, exponent: float = SIZE_EXPONENT, **kwargs: float
    ) -> None:
        super().__init__(env, **kwargs)
        if exponent < 0:
            raise ValueError(f"exponent={exponent!r}: must be >= 0 (0: every job weighs 1)")
        self.exponent = exponent
        self.version = f"goodput-size-{__version__}"
        self.last_weights: dict[str, float] = {}

    def weights(self, snapshot: ClusterSnapshot) -> dict[str, float]:
        """Each active job's weight this round: ``size_weight`` of its remaining time."""
        return {
            job_id: size_weight(left, self.exponent)
            for job_id, left in self.remaining_s(snapshot).items()
        }

    def decide(self, snapshot: ClusterSnapshot) -> PolicyRound:
        self.last_weights = self.weights(snapshot)
        return PolicyRound(choices=self.allocate(snapshot, self.last_weights))
