"""Tenants' quotas in the decision step, for every policy: a tenant within its quota gets
back the GPUs others borrowed within two rounds, a tenant that does not borrow or lend
is held to its quota, and a cluster with no quota decides as before. On the daemon with
the simulated cluster and the database's tenants, and on the pure step."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import next_snapshot

from autotune.catalog.tasks import resolve_task
from autotune.core import JobSpec, TenantSpec
from autotune.daemon.tick import Daemon, DaemonParts
from autotune.db import Database
from autotune.db import repository as repo
from autotune.decision.step import decide_for
from autotune.envs.simulator import SimConfig, SimulatedCluster
from autotune.interfaces import Policy
from autotune.policies.rules import RulesPolicy
from autotune.policies.serving import LearnedPolicy


def _submit(db: Database, tenant: str, job_id: str, gpus: int = 4) -> None:
    with db.session() as session:
        record = repo.submit_job(
            session=session,
            spec=JobSpec(
                job_id=job_id,
                model=resolve_task("gpt-char", ()).model,
                min_gpus=gpus,
                max_gpus=gpus,
                tenant=tenant,
            ),
            task={"name": "gpt-char", "steps": 10**7, "origin": "api"},
        )
        assert record is not None


def _held(db: Database) -> dict[str, float]:
    with db.session() as session:
        usage = repo.tenant_usage(session=session)
    return {tenant: sum(by_model.values()) for tenant, by_model in usage.items()}


@pytest.mark.parametrize("policy", ["rules", "ppo"])
def test_a_tenant_gets_its_quota_back_from_borrowers_within_two_rounds(
    database: Database, policy: str
) -> None:
    """``owner`` (16 of the 32 GPUs) is idle while ``others`` (no quota) fill the cluster
    with 4-GPU jobs; then ``owner`` submits 16 GPUs of work: within two decision rounds
    its jobs hold 16 GPUs, taken from borrowed jobs, which wait again."""
    backend = SimulatedCluster(SimConfig(seed=1, initial_jobs=0, max_jobs=0))
    chosen: Policy = RulesPolicy()
    if policy == "ppo":  # the shipped learned policy, on its default checkpoint
        chosen = LearnedPolicy(round_s=backend.config.round_s, forecast=False)
    daemon = Daemon(DaemonParts(db=database, backend=backend, policy=chosen))
    daemon.start()
    with database.session() as session:
        repo.create_tenant(session=session, spec=TenantSpec(name="owner", gpus=16))
        repo.create_tenant(session=session, spec=TenantSpec(name="others"))
    capacity = sum(n.gpu_count for n in backend.observe().nodes)
    assert capacity == 32
    for i in range(capacity // 4):
        _submit(database, "others", f"borrower-{i}")
    for _ in range(3):
        daemon.tick()
    assert _held(database) == {"others": capacity}
    for i in range(4):
        _submit(database, "owner", f"owner-{i}")
    rounds = 0
    while _held(database).get("owner", 0) < 16:
        daemon.tick()
        rounds += 1
        assert rounds <= 2, _held(database)
    print(f"tenant owner holds its 16 GPUs after {rounds} round(s)")
    assert _held(database) == {"owner": 16, "others": capacity - 16}
    with database.session() as session:
        decisions = repo.list_decisions(session=session, limit=100).rows
    preempted = [d for d in decisions if d.decision.preempt]
    assert len(preempted) == 4
    assert all("for tenant 'owner''s quota" in d.decision.reason for d in preempted)
    # the preempted borrowers wait again, saying why
    with database.session() as session:
        waiting = [r for r in repo.list_jobs(session=session, state="pending").rows]
    assert len(waiting) == 4
    assert all(r.spec.tenant == "others" for r in waiting)


def _tenanted_snapshot(tenants: dict[str, TenantSpec], owners: list[str]):  # type: ignore[no-untyped-def]
    """The simulated cluster's first snapshot (six jobs waiting on 32 GPUs), the jobs
    given to ``owners`` in turn, with ``tenants``."""
    snapshot = next_snapshot(SimulatedCluster(SimConfig(seed=0, initial_jobs=6, max_jobs=6)))
    jobs = [
        replace(j, spec=replace(j.spec, tenant=owners[i % len(owners)]))
        for i, j in enumerate(snapshot.jobs)
    ]
    return replace(snapshot, jobs=jobs, tenants=tenants)


def test_no_quota_anywhere_decides_as_without_tenants() -> None:
    bare = _tenanted_snapshot({}, ["default"])
    tenanted = replace(bare, tenants={"default": TenantSpec(name="default")})

    def what(snapshot):  # type: ignore[no-untyped-def]
        round_ = decide_for(snapshot, RulesPolicy(), {}, honoured={})
        return [(d.job_id, d.config, d.placement, d.reason) for d in round_.decisions]

    assert what(tenanted) == what(bare)


def test_a_tenant_that_does_not_borrow_waits_at_its_quota_and_one_that_does_not_lend_keeps_it() -> (
    None
):
    tenants = {
        "small": TenantSpec(name="small", gpus=1, borrow=False),
        "keeper": TenantSpec(name="keeper", gpus=24, lend=False),
    }
    snapshot = _tenanted_snapshot(tenants, ["small"])
    round_ = decide_for(snapshot, RulesPolicy(), {}, honoured={})
    placed = [d for d in round_.decisions if d.placement is not None]
    # rules asks 4 GPUs for each; the first starts on the 1 its quota leaves
    assert [d.placement.world_size for d in placed if d.placement] == [1]
    assert "started on 1 GPU(s), not the 4 asked, for the quota" in placed[0].reason
    waits = [why for why in round_.unplaced.values() if "waits for its quota" in why]
    assert waits
    assert all("does not borrow" in why for why in waits)
    # borrowing tenants find only the 8 GPUs keeper does not keep idle for itself: two of
    # the 4-GPU jobs rules chooses
    borrowing = replace(snapshot, tenants={**tenants, "small": TenantSpec(name="small")})
    round_ = decide_for(borrowing, RulesPolicy(), {}, honoured={})
    held = sum(d.placement.world_size for d in round_.decisions if d.placement is not None)
    assert held == 8
    assert any("no idle GPUs are free to lend" in why for why in round_.unplaced.values())
