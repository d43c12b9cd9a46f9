"""Tenants' GPU quotas in the decision step, for every policy: who may start, who waits,
and which borrowed jobs give their GPUs back.

A tenant (``autotune.core.TenantSpec``) is promised its nominal quota when it has work
for it; GPUs it leaves idle are lent to others (unless it does not lend), and taken back
when its own jobs arrive, by preempting jobs of tenants above their quota (each stops
after a checkpoint and waits again). In the habits of Kueue's cluster queues (nominal
quota, borrowing, preemption to reclaim) and of YARN's capacity scheduler.

One round, after the policy chose (``enforce_quotas``):

1. GPUs held: each tenant's running jobs' placements (jobs the policy preempts this round
   excluded); free: the alive nodes' GPUs no running job holds.
2. Asks, in queue order: each pending job's chosen world size, and each running job's
   growth (a resize to more GPUs).
3. Within quota first: an ask that keeps its tenant within its nominal quota is taken;
   where too few GPUs are free, jobs of tenants above their quota are preempted (the
   tenant furthest above its weighted share first, then lower priority, then the newest
   started) until enough are free. A running job under an override is never preempted
   for a quota, but its GPUs count.
4. Then borrowing, the least served tenant first (GPUs above its quota per unit of
   weight, fair share): an ask beyond its tenant's quota is taken only if the tenant
   borrows and enough GPUs are free besides those non-lending tenants keep idle for
   themselves. Otherwise a pending job starts smaller, on what its quota (or what it may
   borrow) leaves, where its GPU range and chosen tensor and pipeline degrees allow;
   else it waits (a running one keeps its size), with the reason.

Quotas count whole GPUs a job holds or asks for, fractions of a shared GPU as
fractions, over all GPU models (``TenantSpec.nominal_gpus``). A job of a tenant the
cluster does not know is taken as one with no quota that borrows. With no quota anywhere
(and every tenant borrowing and lending) the round is as without tenants: nothing
changes.

GPUs promised on a given model (``TenantSpec.gpus_by_model``, part of the nominal
quota) are kept on that model, in the habit of Kueue's resource flavors. A job runs on
one GPU model, so:

- a waiting job that keeps its tenant within its quota and within what is promised to
  it on a model the job may run on is placed on that model (``QuotaRound.models``: the
  Planner sees only that model's GPUs for it), before the other jobs within their
  quotas; where too few of that model's GPUs are free, jobs of other tenants holding
  more of that model than is promised to them are preempted for it (``plan_on``: never
  one that would leave its tenant below its own promise, and none unless together they
  free enough), even a tenant within its total quota: the promise names the model;
- a job on the model its tenant was promised, while the tenant holds no more of that
  model than promised, is never preempted to give back a total quota;
- GPUs of a model promised to a tenant that does not lend, and left idle by it, are
  kept from other tenants' jobs, and so are the GPUs set aside this round for a job on
  its promised model: another job taken this round is placed only on models that have
  room for it besides those, where any has.

Without a promise on any model, jobs are placed on any model they allow, as the Planner
chooses.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from autotune.core import MILLI_PER_GPU, JobConfig, JobSpec, TenantSpec
from autotune.decision.overrides import pinned_config
from autotune.interfaces import ClusterSnapshot, JobStatus, PolicyChoice

__all__ = ["QuotaRound", "enforce_quotas", "gpus_of"]

_EPS = 1e-9


class _Pinned(Protocol):
    @property
    def pin(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True, slots=True)
class QuotaRound:
    """What the quotas change in a round's choices."""

    preempt: dict[str, str] = field(default_factory=dict)
    """Running jobs to stop (after a checkpoint) so that a tenant within its quota gets
    its GPUs back, with the reason."""
    wait: dict[str, str] = field(default_factory=dict)
    """Pending jobs that wait this round for their tenant's quota, with the reason."""
    keep: dict[str, str] = field(default_factory=dict)
    """Running jobs whose growth is declined (they keep their size), with the reason."""
    borrowing: dict[str, str] = field(default_factory=dict)
    """Jobs taken beyond their tenant's quota on idle GPUs, with a note for the reason."""
    shrink: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Pending jobs started smaller than the policy asked, to fit what their tenant's
    quota (or the idle GPUs it may borrow) leaves: the world size, and a note."""
    models: dict[str, tuple[tuple[str, ...], str]] = field(default_factory=dict)
    """Pending jobs to place only on these GPU models this round (for GPUs promised on
    a model: the job's tenant's promise, or others' kept from it), with a note."""


def gpus_of(spec: JobSpec, world_size: int) -> float:
    """GPUs a job of ``world_size`` ranks holds: whole GPUs, or its share of one."""
    return world_size * spec.gpu_milli / MILLI_PER_GPU


def _asked(job: JobStatus, choice: PolicyChoice, pin: Mapping[str, Any] | None) -> JobConfig:
    """The configuration a job asks for this round: the policy's, with an override's
    pinned fields over it."""
    assert choice.config is not None
    if pin is None:
        return choice.config
    try:
        return pinned_config(choice.config, pin)
    except ValueError:  # the decision step skips such a pin later, with the reason
        return choice.config


def _fitting(job: JobStatus, choice: PolicyChoice, room: float) -> tuple[int, float] | None:
    """The largest world size within ``room`` GPUs that the job allows (at least its
    ``min_gpus``, a multiple of its chosen tensor and pipeline degrees), and the GPUs it
    takes; ``None`` when none fits."""
    assert choice.config is not None
    layout = choice.config.layout
    step = layout.tp * layout.pp
    per_rank = job.spec.gpu_milli / MILLI_PER_GPU
    size = min(int((room + _EPS) / per_rank), job.spec.max_gpus) // step * step
    if size < max(job.spec.min_gpus, step) or size >= layout.world_size:
        return None
    return size, gpus_of(job.spec, size)


def enforce_quotas(
    view: ClusterSnapshot,
    choices: Mapping[str, PolicyChoice],
    overrides: Mapping[str, _Pinned],
    preempted: Mapping[str, PolicyChoice],
) -> QuotaRound:
    """The quotas' changes to a round: ``view`` is the snapshot the policy was asked
    about (its ``tenants`` give the quotas), ``choices`` the policy's choices with a
    configuration for every pending job to plan, ``overrides`` the active ones by job,
    ``preempted`` the running jobs the policy already stops."""
    result = QuotaRound()
    tenants = dict(view.tenants)
    if all(t.nominal_gpus == 0 and t.borrow and t.lend for t in tenants.values()):
        return result  # no quota anywhere: every ask borrows from an idle cluster
    by_model = any(t.gpus_by_model for t in tenants.values())

    def tenant(name: str) -> TenantSpec:
        if name not in tenants:
            tenants[name] = TenantSpec(name=name)
        return tenants[name]

    def promised(name: str, model: str) -> int:
        return tenant(name).gpus_by_model.get(model, 0)

    model_of = {n.node_id: n.gpu_model for n in view.nodes}
    free_on: dict[str, float] = defaultdict(float)
    for node in view.nodes:
        free_on[node.gpu_model] += node.gpu_count
    cluster_models = sorted(m for m, count in free_on.items() if count > 0)
    held: dict[str, float] = defaultdict(float)
    held_on: dict[tuple[str, str], float] = defaultdict(float)  # (tenant, model)
    on: dict[str, dict[str, float]] = {}  # a running job's GPUs per model
    running: list[tuple[JobStatus, float]] = []
    for job in view.by_state("running"):
        if job.placement is None or job.spec.job_id in preempted:
            continue
        gpus = job.placement.gpus
        held[job.spec.tenant] += gpus
        running.append((job, gpus))
        models: dict[str, float] = defaultdict(float)
        for slot in job.placement.ranks:
            models[model_of.get(slot.node_id, "")] += slot.gpu_milli / MILLI_PER_GPU
        on[job.spec.job_id] = models
        for model, count in models.items():
            held_on[job.spec.tenant, model] += count
            free_on[model] -= count
    free = sum(n.gpu_count for n in view.nodes) - sum(held.values())

    asks: list[tuple[JobStatus, float]] = []
    for job in view.queue_order():
        choice = choices.get(job.spec.job_id)
        if choice is None or choice.config is None:
            continue
        pin = overrides[job.spec.job_id].pin if job.spec.job_id in overrides else None
        gpus = gpus_of(job.spec, _asked(job, choice, pin).world_size)
        if job.state == "running":
            if job.placement is None or job.spec.job_id in preempted:
                continue
            gpus -= job.placement.gpus  # its growth; a shrink frees GPUs this round
            if gpus < 0:
                free -= gpus
                continue
        if gpus > _EPS:
            asks.append((job, gpus))

    def above(name: str) -> float:
        """GPUs held above the quota, per unit of weight."""
        spec = tenant(name)
        return (held[name] - spec.nominal_gpus) / spec.weight

    def within_promise(job: JobStatus) -> bool:
        """Whether every model the running job is on is one its tenant holds no more
        of than is promised to it."""
        name = job.spec.tenant
        return all(
            held_on[name, model] <= promised(name, model) + _EPS for model in on[job.spec.job_id]
        )

    def preemptible(job: JobStatus, owner: str) -> bool:
        """Whether a running job may give its GPUs to ``owner``: another tenant's, under
        no override, not preempted already."""
        job_id = job.spec.job_id
        return job.spec.tenant != owner and job_id not in overrides and job_id not in result.preempt

    def stop(job: JobStatus, gpus: float, reason: str) -> None:
        result.preempt[job.spec.job_id] = reason
        held[job.spec.tenant] -= gpus
        for model, count in on[job.spec.job_id].items():
            held_on[job.spec.tenant, model] -= count
            free_on[model] += count

    def reclaim(owner: str, need: float) -> float:
        """Preempt borrowed jobs of other tenants until ``need`` GPUs are free, or none
        is left to preempt; the GPUs freed."""
        freed = 0.0
        while freed < need - _EPS:
            candidates = [
                (job, gpus)
                for job, gpus in running
                if preemptible(job, owner)
                and held[job.spec.tenant] > tenant(job.spec.tenant).nominal_gpus + _EPS
                and not within_promise(job)
            ]
            if not candidates:
                break
            job, gpus = max(
                candidates,
                key=lambda c: (
                    above(c[0].spec.tenant),
                    -c[0].spec.priority,
                    c[0].started_s or 0.0,
                    c[0].spec.job_id,
                ),
            )
            lender = tenant(job.spec.tenant)
            stop(
                job,
                gpus,
                f"for tenant {owner!r}'s quota: tenant {lender.name!r} holds "
                f"{held[lender.name]:g} GPUs, above its quota of {lender.nominal_gpus}, and "
                f"{owner!r} has work within its own ({tenant(owner).nominal_gpus} GPUs)",
            )
            freed += gpus
        return freed

    def plan_on(owner: str, model: str, need: float) -> list[tuple[JobStatus, float]] | None:
        """The running jobs to preempt so that ``need`` GPUs of ``model`` are free for
        ``owner``: jobs on it of other tenants holding more of it than is promised to
        them, never taking one below its promise; the tenant furthest above its weighted
        share first, then the furthest above its promise on the model, and of its jobs
        the smallest that frees enough (else the largest), the lowest priority, the
        newest started. ``None`` when they cannot free enough: nothing is preempted for
        less."""

        def size(c: tuple[JobStatus, float]) -> float:
            return on[c[0].spec.job_id][model]

        def order(c: tuple[JobStatus, float]) -> tuple[float, float, str]:
            """The lowest priority, then the newest started, first."""
            return (c[0].spec.priority, -(c[0].started_s or 0.0), c[0].spec.job_id)

        free_here = free_on[model]
        left = dict(held_on)
        over = dict(held)
        chosen: list[tuple[JobStatus, float]] = []
        taken: set[str] = set()
        while free_here < need - _EPS:
            candidates = [
                (job, gpus)
                for job, gpus in running
                if preemptible(job, owner)
                and job.spec.job_id not in taken
                and (on_model := on[job.spec.job_id].get(model, 0.0)) > 0
                and left[job.spec.tenant, model] - on_model
                >= promised(job.spec.tenant, model) - _EPS
            ]
            if not candidates:
                return None
            lender = max(
                {c[0].spec.tenant for c in candidates},
                key=lambda t: (
                    (over[t] - tenant(t).nominal_gpus) / tenant(t).weight,
                    left[t, model] - promised(t, model),
                    t,
                ),
            )
            mine = [c for c in candidates if c[0].spec.tenant == lender]
            short = need - free_here
            enough = [c for c in mine if size(c) >= short - _EPS]
            job, gpus = (
                min(enough, key=lambda c: (size(c), *order(c)))
                if enough
                else min(mine, key=lambda c: (-size(c), *order(c)))
            )
            chosen.append((job, gpus))
            taken.add(job.spec.job_id)
            for m, count in on[job.spec.job_id].items():
                left[lender, m] -= count
            over[lender] -= gpus
            free_here += on[job.spec.job_id][model]
        return chosen

    def reclaim_on(owner: str, model: str, need: float) -> float:
        """Preempt the jobs ``plan_on`` names (none unless they free enough); the GPUs
        freed, on every model."""
        freed = 0.0
        for job, gpus in plan_on(owner, model, need) or []:
            lender = job.spec.tenant
            stop(
                job,
                gpus,
                f"for tenant {owner!r}'s quota on {model}: tenant {lender!r} holds "
                f"{held_on[lender, model]:g} {model} GPUs, above the "
                f"{promised(lender, model)} promised to it, and {owner!r} has work within "
                f"the {promised(owner, model)} promised to it",
            )
            freed += gpus
        return freed

    def allowed(job: JobStatus) -> list[str]:
        return [m for m in cluster_models if job.spec.allows(m)]

    def promising(job: JobStatus) -> bool:
        """Whether a waiting job may go on a model its tenant was promised."""
        return (
            by_model
            and job.state == "pending"
            and job.spec.job_id not in overrides
            and any(promised(job.spec.tenant, m) > 0 for m in allowed(job))
        )

    def promised_model(job: JobStatus, gpus: float) -> str | None:
        """The model a waiting job goes on for its tenant's promise on it: one the job
        allows with room for it in the promise and GPUs free or to take back, the one
        with the most free GPUs."""
        if not promising(job):
            return None
        name = job.spec.tenant
        fits = [
            m
            for m in allowed(job)
            if held_on[name, m] + gpus <= promised(name, m) + _EPS
            and plan_on(name, m, gpus) is not None
        ]
        return max(fits, key=lambda m: (free_on[m], m)) if fits else None

    def kept_on(model: str, asking: str) -> float:
        """GPUs of ``model`` promised to tenants other than ``asking`` that do not lend
        them, left idle."""
        return sum(
            max(0.0, spec.gpus_by_model.get(model, 0) - held_on[name, model])
            for name, spec in tenants.items()
            if not spec.lend and name != asking
        )

    def narrow(job: JobStatus, gpus: float) -> None:
        """Keep a waiting job taken this round off GPUs set aside on a model (for a job
        on its tenant's promised model, which ``free_on`` no longer counts, or kept idle
        by a tenant that does not lend), where another model it allows has room for it;
        one narrowed to a single model takes its GPUs there."""
        if not by_model or job.state != "pending" or job.spec.job_id in overrides:
            return
        models = allowed(job)
        name = job.spec.tenant
        room = [m for m in models if free_on[m] - kept_on(m, name) >= gpus - _EPS]
        if room and room != models:
            result.models[job.spec.job_id] = (
                tuple(room),
                "placed on " + ", ".join(room) + " (other models' GPUs are promised)",
            )
            if len(room) == 1:
                held_on[name, room[0]] += gpus
                free_on[room[0]] -= gpus

    # Within quota first, in queue order, jobs that go on a model promised to their tenant
    # before the others; preempting borrowers where too few are free.
    beyond: list[tuple[JobStatus, float]] = []
    for job, gpus in [a for a in asks if promising(a[0])] + [
        a for a in asks if not promising(a[0])
    ]:
        name = job.spec.tenant
        if held[name] + gpus > tenant(name).nominal_gpus + _EPS:
            beyond.append((job, gpus))
            continue
        target = promised_model(job, gpus)
        if target is not None:
            free += reclaim_on(name, target, gpus)
            result.models[job.spec.job_id] = (
                (target,),
                f"placed on {target}: within the {promised(name, target)} {target} "
                f"GPUs promised to tenant {name!r}",
            )
            held[name] += gpus
            held_on[name, target] += gpus
            free_on[target] -= gpus
            free -= gpus
            continue
        if free < gpus - _EPS:
            free += reclaim(name, gpus - free)
        narrow(job, gpus)
        held[name] += gpus
        free -= gpus

    # Then borrowing: the least served tenant first (fair share by weight).
    def kept_idle() -> float:
        """Idle nominal GPUs of tenants that do not lend them."""
        return sum(
            max(0.0, spec.nominal_gpus - held[name])
            for name, spec in tenants.items()
            if not spec.lend
        )

    while beyond:
        job, gpus = min(beyond, key=lambda a: above(a[0].spec.tenant))
        beyond.remove((job, gpus))
        name = job.spec.tenant
        spec = tenant(name)
        quota = f"tenant {name!r} holds {held[name]:g} of its {spec.nominal_gpus} GPUs"
        left = min(free, max(0.0, spec.nominal_gpus - held[name]))  # within the quota
        room = max(left, free - kept_idle()) if spec.borrow else left
        if room >= gpus - _EPS:
            result.borrowing[job.spec.job_id] = (
                f"borrows {gpus:g} idle GPU(s) beyond tenant {name!r}'s quota of "
                f"{spec.nominal_gpus} (given back when their owners' jobs arrive)"
            )
            narrow(job, gpus)
            held[name] += gpus
            free -= gpus
            continue
        choice = choices[job.spec.job_id]
        smaller = _fitting(job, choice, room) if job.state == "pending" else None
        if smaller is not None and job.spec.job_id not in overrides:
            size, taken = smaller
            borrowed = taken - left
            result.shrink[job.spec.job_id] = (
                size,
                f"started on {size} GPU(s), not the {gpus:g} asked, for the quota: {quota}"
                + (f", borrowing {borrowed:g} idle" if borrowed > _EPS else ""),
            )
            narrow(job, taken)
            held[name] += taken
            free -= taken
            continue
        if not spec.borrow:
            why = f"{quota} and does not borrow beyond it"
        else:
            why = f"{quota}; {gpus:g} more would borrow, and no idle GPUs are free to lend"
        if job.state == "running":
            result.keep[job.spec.job_id] = f"keeps its size for the quota: {why}"
        else:
            result.wait[job.spec.job_id] = f"waits for its quota: {why}"
    return result
