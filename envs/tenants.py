"""Tenants in a simulated workload (``autotune eval --tenants``): quotas given as shares
of the cluster, the jobs drawn to tenants, and what each tenant got.

- ``parse_tenant_shares("vision=50,nlp=30,speech=20")``: each tenant's share of the
  cluster's GPUs, in percent: over 0 each, at most 100 in all.
- ``quota_tenants(shares, gpus)``: a ``TenantSpec`` per tenant (it borrows and lends, as
  a tenant does by default), its quota its share of the ``gpus`` rounded by largest
  remainder, so the quotas add up to the rounded total share, never above the cluster
  (50/30/20 % of 64 GPUs: 32, 19 and 13).
- ``draw_tenants(arrivals, shares, seed)``: each job, in submission order, given to a
  tenant by a draw from ``numpy.random.default_rng(seed)`` with the shares as
  probabilities (over their sum where it is under 100): the same jobs for every policy
  and every episode seed.

The decision step enforces the quotas (``autotune.decision.quotas``) once the simulated
cluster carries the tenants (``SimConfig.tenants``), as in the daemon. ``TenantMeter``
measures each tenant's lot over an episode from its rounds (``TenantMeter.observe`` is
``autotune.policies.evaluate.run_episode``'s per-round hook):

- ``quota_gpus``, ``quota_share``: its quota, in GPUs and as a share of the cluster's;
- ``jobs``, ``n_jobs_done``, ``avg_jct_s``: its jobs, those finished, their average
  completion time;
- ``gpu_share``: the GPU-seconds its jobs held over the cluster's in the makespan (the
  tenants' add up to ``gpu_util``), to read against ``quota_share``;
- ``active_s``: seconds in which it had active (pending or running) jobs;
- ``quota_attainment``: over the rounds, the sum of min(held, entitled) over the sum of
  entitled, where entitled = min(quota, the GPUs its active jobs ask for: each its
  ``JobSpec.gpu_request()``, a trace job's request), so only rounds in which it has
  work count; NaN where it was owed nothing;
- ``quota_wait_s``: seconds in which it held less than its entitled GPUs while another
  tenant held more than its own quota: waiting for its quota.

A round's "held" is what the tenant's jobs held while the round ran (the GPU-seconds
they attained in it over its length), its "active jobs" those of the snapshot the round
was decided on.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Final

import numpy as np

from autotune.core import ACTIVE_STATES, MILLI_PER_GPU, TenantSpec
from autotune.envs.simulator import Arrival, SimulatedCluster
from autotune.errors import InputError
from autotune.interfaces import ClusterSnapshot, JobStatus

__all__ = [
    "TENANT_FIGURES",
    "TenantMeter",
    "draw_tenants",
    "parse_tenant_shares",
    "quota_tenants",
]

TENANT_FIGURES: Final = (
    "quota_gpus",
    "quota_share",
    "jobs",
    "n_jobs_done",
    "avg_jct_s",
    "gpu_share",
    "active_s",
    "quota_attainment",
    "quota_wait_s",
)
"""What ``TenantMeter.figures`` reports per tenant (listed in the module docstring)."""

_EPS = 1e-9
_ITEM = re.compile(r"^\s*([^=\s]+)\s*=\s*([^=\s]+)\s*$")
_FORMAT = "NAME=PERCENT, comma-separated (e.g. vision=50,nlp=30,speech=20)"


# -- the tenants of a workload --------------------------------------------------------------


def parse_tenant_shares(text: str) -> dict[str, float]:
    """Tenants and their shares of the cluster's GPUs, in percent, from ``--tenants``'s
    ``NAME=PERCENT,...``; ``InputError`` (one line) for anything else: a malformed item, a
    name a tenant may not have, a name twice, a share not over 0, shares over 100 in all."""
    shares: dict[str, float] = {}
    items = text.split(",")
    for item in items:
        match = _ITEM.match(item)
        if match is None:
            raise InputError(f"--tenants {text!r}: {_FORMAT}")
        name, value = match.groups()
        try:
            share = float(value)
        except ValueError:
            raise InputError(f"--tenants {text!r}: {value!r} is not a percent; {_FORMAT}") from None
        try:
            TenantSpec(name=name)  # one definition of a tenant's name
        except ValueError as exc:
            raise InputError(f"--tenants {text!r}: {exc}") from None
        if name in shares:
            raise InputError(f"--tenants {text!r}: tenant {name!r} is given twice")
        if not (math.isfinite(share) and share > 0):
            raise InputError(f"--tenants {text!r}: {name}'s share must be over 0 percent")
        shares[name] = share
    total = sum(shares.values())
    if total > 100 + _EPS:
        raise InputError(
            f"--tenants {text!r}: the shares add up to {total:g}%, over the cluster's 100%"
        )
    return shares


def quota_tenants(shares: Mapping[str, float], gpus: int) -> tuple[TenantSpec, ...]:
    """A tenant per share (percent of ``gpus``), its quota the share of the GPUs rounded by
    largest remainder: each within one GPU of its exact share, the quotas adding up to
    the rounded total share (at most ``gpus``). Ties go to the tenant named first."""
    exact = {name: share / 100 * gpus for name, share in shares.items()}
    quotas = {name: math.floor(value + _EPS) for name, value in exact.items()}
    target = min(gpus, round(sum(exact.values())))
    by_remainder = sorted(exact, key=lambda name: quotas[name] - exact[name])
    for name in by_remainder[: max(0, target - sum(quotas.values()))]:
        quotas[name] += 1
    return tuple(TenantSpec(name=name, gpus=quotas[name]) for name in shares)


def draw_tenants(
    arrivals: Sequence[Arrival], shares: Mapping[str, float], seed: int
) -> list[Arrival]:
    """``arrivals``, each given to a tenant of ``shares`` (its ``JobSpec.tenant``) by a draw
    seeded by ``seed``, in submission order, the shares as probabilities over their sum."""
    names = list(shares)
    weights = np.array([shares[n] for n in names], dtype=np.float64)
    order = sorted(
        range(len(arrivals)),
        key=lambda i: (arrivals[i].spec.submitted_at, arrivals[i].spec.job_id),
    )
    drawn = np.random.default_rng(seed).choice(
        len(names), size=len(order), p=weights / weights.sum()
    )
    out = list(arrivals)
    for i, pick in zip(order, drawn, strict=True):
        spec = replace(arrivals[i].spec, tenant=names[int(pick)])
        out[i] = replace(arrivals[i], spec=spec)
    return out


# -- what each tenant got -------------------------------------------------------------------


def _gpus(job: JobStatus, count: int) -> float:
    return count * job.spec.gpu_milli / MILLI_PER_GPU


class TenantMeter:
    """Each tenant's lot over one episode (the module docstring's figures), from one
    ``record`` (or ``observe``, from the simulated cluster) per round."""

    def __init__(self, tenants: Iterable[TenantSpec]) -> None:
        self.quotas: dict[str, float] = {t.name: float(t.nominal_gpus) for t in tenants}
        self.held_gpu_s: dict[str, float] = defaultdict(float)
        self.entitled_gpu_s: dict[str, float] = defaultdict(float)
        self.attained_gpu_s: dict[str, float] = defaultdict(float)
        """Of the entitled GPU-seconds, those it held."""
        self.active_s: dict[str, float] = defaultdict(float)
        self.wait_s: dict[str, float] = defaultdict(float)
        self._sim_gpu_s: dict[str, float] = {}

    def record(
        self, *, asked: Mapping[str, float], held: Mapping[str, float], seconds: float
    ) -> None:
        """One round of ``seconds``: the GPUs each tenant's active jobs ask for and the
        GPUs its jobs held."""
        names = set(self.quotas) | set(asked) | set(held)
        above = {n for n in names if held.get(n, 0.0) > self.quotas.get(n, 0.0) + _EPS}
        for name in names:
            mine = held.get(name, 0.0)
            self.held_gpu_s[name] += mine * seconds
            demand = asked.get(name, 0.0)
            if demand <= _EPS:
                continue
            entitled = min(self.quotas.get(name, 0.0), demand)
            self.active_s[name] += seconds
            self.entitled_gpu_s[name] += entitled * seconds
            self.attained_gpu_s[name] += min(mine, entitled) * seconds
            if mine < entitled - _EPS and above - {name}:
                self.wait_s[name] += seconds

    def observe(self, decided_on: ClusterSnapshot, sim: SimulatedCluster) -> None:
        """The round ``sim`` just played, decided on ``decided_on``: each tenant's active
        jobs there ask for their ``gpu_request()``; what it held is the GPU-seconds its
        jobs attained in the round over the round's length."""
        asked: dict[str, float] = defaultdict(float)
        for job in decided_on.by_state(*ACTIVE_STATES):
            asked[job.spec.tenant] += _gpus(job, job.spec.gpu_request())
        attained: dict[str, float] = defaultdict(float)
        for sim_job in sim.jobs.values():
            attained[sim_job.status.spec.tenant] += sim_job.attained_gpu_s
        seconds = sim.config.round_s
        held = {n: (s - self._sim_gpu_s.get(n, 0.0)) / seconds for n, s in attained.items()}
        self._sim_gpu_s = dict(attained)
        self.record(asked=asked, held=held, seconds=seconds)

    def figures(
        self, jobs: Iterable[JobStatus], *, total_gpus: float, makespan_s: float
    ) -> dict[str, dict[str, float]]:
        """Per tenant (those with a quota, then any other that had jobs, by name), the
        module docstring's figures; ``jobs``: every job of the episode as it ended."""
        by_tenant: dict[str, list[JobStatus]] = defaultdict(list)
        for job in jobs:
            by_tenant[job.spec.tenant].append(job)
        names = [*self.quotas, *sorted(set(by_tenant) - set(self.quotas))]
        out: dict[str, dict[str, float]] = {}
        for name in names:
            mine = by_tenant.get(name, [])
            done = [j for j in mine if j.state == "finished" and j.finished_s is not None]
            jct = [(j.finished_s or 0.0) - j.spec.submitted_at for j in done]
            quota = self.quotas.get(name, 0.0)
            entitled = self.entitled_gpu_s.get(name, 0.0)
            out[name] = {
                "quota_gpus": quota,
                "quota_share": quota / total_gpus,
                "jobs": float(len(mine)),
                "n_jobs_done": float(len(done)),
                "avg_jct_s": float(np.mean(jct)) if jct else math.nan,
                "gpu_share": self.held_gpu_s.get(name, 0.0) / (total_gpus * makespan_s),
                "active_s": self.active_s.get(name, 0.0),
                "quota_attainment": (
                    self.attained_gpu_s.get(name, 0.0) / entitled if entitled > 0 else math.nan
                ),
                "quota_wait_s": self.wait_s.get(name, 0.0),
            }
        return out
