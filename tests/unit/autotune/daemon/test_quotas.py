"""Tenants' quotas in the decision step, for every policy: a tenant within its quota gets
back the GPUs others borrowed within two rounds, a tenant that does not borrow or lend
is held to its quota, and a cluster with no quota decides as before. On the daemon with
the simulated cluster and the database's tenants, and on the pure step."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
from helpers import next_snapshot

from autotune.catalog.tasks import resolve_task
from autotune.core import JobConfig, JobSpec, Placement, RankSlot, TenantSpec
from autotune.daemon.tick import Daemon, DaemonParts
from autotune.db import Database
from autotune.db import repository as repo
from autotune.decision.quotas import enforce_quotas
from autotune.decision.step import decide, decide_for
from autotune.envs.simulator import SimConfig, SimulatedCluster
from autotune.interfaces import ClusterSnapshot, JobStatus, Policy, PolicyChoice
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
@pytest.mark.parametrize("promise", ["in-all", "on-A100"])
def test_a_tenant_gets_its_quota_back_from_borrowers_within_two_rounds(
    database: Database, policy: str, promise: str
) -> None:
    """``owner`` (16 of the 32 GPUs, in all or promised on the cluster's 16 A100s) is
    idle while ``others`` (no quota) fill the cluster with 4-GPU jobs; then ``owner``
    submits 16 GPUs of work: within two decision rounds its jobs hold 16 GPUs (the A100s
    where they were promised), taken from borrowed jobs, which wait again."""
    backend = SimulatedCluster(SimConfig(seed=1, initial_jobs=0, max_jobs=0))
    chosen: Policy = RulesPolicy()
    if policy == "ppo":  # the shipped learned policy, on its default checkpoint
        chosen = LearnedPolicy(round_s=backend.config.round_s, forecast=False)
    daemon = Daemon(DaemonParts(db=database, backend=backend, policy=chosen))
    daemon.start()
    with database.session() as session:
        quota = {"gpus": 16} if promise == "in-all" else {"gpus_by_model": {"A100": 16}}
        repo.create_tenant(session=session, spec=TenantSpec(name="owner", **quota))
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
    print(f"tenant owner ({promise}) holds its 16 GPUs after {rounds} round(s)")
    assert _held(database) == {"owner": 16, "others": capacity - 16}
    if promise == "on-A100":
        with database.session() as session:
            assert repo.tenant_usage(session=session)["owner"] == {"A100": 16}
    with database.session() as session:
        decisions = repo.list_decisions(session=session, limit=100).rows
    preempted = [d for d in decisions if d.decision.preempt]
    assert len(preempted) == 4
    where = "'s quota" + ("" if promise == "in-all" else " on A100")
    assert all(f"for tenant 'owner'{where}" in d.decision.reason for d in preempted)
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


# GPUs promised on a given model (``TenantSpec.gpus_by_model``) are kept on that model.

_NODES = SimulatedCluster(SimConfig(seed=0, initial_jobs=0, max_jobs=0)).observe().nodes
"""A100 (a100-0, a100-1: 8 each), V100M32 (v100-0: 8), T4 (t4-0, t4-1: 4 each)."""


def _running(
    job_id: str, tenant: str, node: str, first_gpu: int, started_s: float, n: int = 4
) -> JobStatus:
    """An ``n``-GPU job of ``tenant`` running on GPUs ``first_gpu..`` of ``node``."""
    ranks = tuple(RankSlot(rank=r, node_id=node, gpu_index=first_gpu + r) for r in range(n))
    return JobStatus(
        spec=JobSpec(job_id=job_id, min_gpus=n, max_gpus=n, tenant=tenant),
        state="running",
        config=JobConfig.data_parallel(n),
        placement=Placement(job_id=job_id, ranks=ranks),
        started_s=started_s,
    )


def _pending(
    job_id: str,
    tenant: str,
    at: float = 100.0,
    n: int = 4,
    gpu_types: tuple[str, ...] | None = None,
) -> JobStatus:
    spec = JobSpec(
        job_id=job_id, min_gpus=n, max_gpus=n, tenant=tenant, submitted_at=at, gpu_types=gpu_types
    )
    return JobStatus(spec=spec, state="pending")


def _full_cluster(tenant: str) -> list[JobStatus]:
    """``tenant``'s 4-GPU jobs on all 32 GPUs, the one on v100-0's first GPUs started
    first and the one on a100-1's last GPUs last."""
    where = [("v100-0", 0), ("v100-0", 4), ("t4-0", 0), ("t4-1", 0)]
    where += [(n, g) for n in ("a100-0", "a100-1") for g in (0, 4)]
    return [
        _running(f"{tenant}-{i}", tenant, node, gpu, started_s=float(i))
        for i, (node, gpu) in enumerate(where)
    ]


def _snapshot(jobs: list[JobStatus], tenants: list[TenantSpec]) -> ClusterSnapshot:
    return ClusterSnapshot(
        time_s=200.0,
        nodes=_NODES,
        jobs=jobs,
        telemetry="simulator",
        tenants={t.name: t for t in tenants},
    )


def _asks(snapshot: ClusterSnapshot) -> dict[str, PolicyChoice]:
    """Its GPUs, data parallel, for every waiting job."""
    return {
        j.spec.job_id: PolicyChoice(config=JobConfig.data_parallel(j.spec.min_gpus), reason="asked")
        for j in snapshot.by_state("pending")
    }


def test_a_quota_promised_on_a_model_takes_that_models_gpus_back_and_places_the_job_there() -> None:
    """``vision`` is promised 4 V100M32 GPUs; ``others`` (no quota) fill the cluster.
    ``vision``'s 4-GPU job preempts the newest of the jobs on V100M32 and is planned
    there; a quota of 4 in all instead takes the newest started job, on an A100."""
    tenants = [TenantSpec(name="vision", gpus_by_model={"V100M32": 4}), TenantSpec(name="others")]
    snapshot = _snapshot([*_full_cluster("others"), _pending("v-0", "vision")], tenants)
    quota = enforce_quotas(snapshot, _asks(snapshot), {}, {})
    assert list(quota.preempt) == ["others-1"]  # on v100-0, started after others-0
    assert "for tenant 'vision''s quota on V100M32" in quota.preempt["others-1"]
    assert quota.models["v-0"][0] == ("V100M32",)
    round_ = decide(snapshot, _asks(snapshot), {}, honoured={}, policy_version="test")
    placed = {d.job_id: d for d in round_.decisions if d.placement is not None}
    placement = placed["v-0"].placement
    assert placement is not None
    assert placement.nodes == ("v100-0",)
    assert "within the 4 V100M32 GPUs promised to tenant 'vision'" in placed["v-0"].reason
    in_all = _snapshot(snapshot.jobs, [TenantSpec(name="vision", gpus=4), tenants[1]])
    quota = enforce_quotas(in_all, _asks(in_all), {}, {})
    assert list(quota.preempt) == ["others-7"]
    assert not quota.models


def test_a_job_within_its_tenants_promise_on_a_model_is_not_preempted_for_a_total_quota() -> None:
    """``x`` (4 GPUs in all, promised on T4) holds its T4 job and borrows an A100 one;
    ``y`` is within its quota of 28 and wants 4 more with the cluster full: the borrowed
    A100 job gives them back, though the T4 one started later."""
    tenants = [
        TenantSpec(name="x", gpus=4, gpus_by_model={"T4": 4}),
        TenantSpec(name="y", gpus=28),
    ]
    jobs = [
        _running("x-a100", "x", "a100-0", 0, started_s=1.0),
        _running("x-t4", "x", "t4-0", 0, started_s=9.0),
        *[
            _running(f"y-{n}-{g}", "y", n, g, started_s=2.0)
            for n, g in [("a100-0", 4), ("a100-1", 0), ("a100-1", 4), ("v100-0", 0)]
        ],
        _running("y-v100-4", "y", "v100-0", 4, started_s=2.0),
        _running("y-t4", "y", "t4-1", 0, started_s=2.0),
        _pending("y-new", "y"),
    ]
    snapshot = _snapshot(jobs, tenants)
    quota = enforce_quotas(snapshot, _asks(snapshot), {}, {})
    assert list(quota.preempt) == ["x-a100"]
    # without the promise, the newest started of x's jobs goes
    bare = _snapshot(jobs, [TenantSpec(name="x", gpus=4), tenants[1]])
    assert list(enforce_quotas(bare, _asks(bare), {}, {}).preempt) == ["x-t4"]


def test_gpus_promised_to_a_tenant_that_does_not_lend_are_kept_from_borrowers() -> None:
    """``keeper`` is promised both T4 machines and lends nothing; ``others``' eight 4-GPU
    jobs borrow the other 24 GPUs, none on a T4."""
    tenants = [
        TenantSpec(name="keeper", gpus_by_model={"T4": 8}, lend=False),
        TenantSpec(name="others"),
    ]
    snapshot = _snapshot([_pending(f"o-{i}", "others", float(i)) for i in range(8)], tenants)
    round_ = decide(snapshot, _asks(snapshot), {}, honoured={}, policy_version="test")
    placed = [d.placement for d in round_.decisions if d.placement is not None]
    assert len(placed) == 6
    assert not any(node.startswith("t4") for p in placed for node in p.nodes)
    assert len(round_.unplaced) == 2


def test_a_promise_on_models_beyond_the_quota_is_named() -> None:
    assert "more than the quota of 8" in str(
        TenantSpec(name="t", gpus=8, gpus_by_model={"A100": 8, "T4": 4}).overpromised()
    )
    assert TenantSpec(name="t", gpus_by_model={"A100": 8, "T4": 4}).overpromised() is None
    assert TenantSpec(name="t", gpus_by_model={"A100": 8, "T4": 4}).nominal_gpus == 12


def test_a_reclaim_on_a_model_takes_no_job_below_its_tenants_promise_and_stops_no_more() -> None:
    """``y`` is promised 4 A100s and holds 5 (jobs of 4 and of 1); ``z`` holds the other
    11, all promised to it. ``x``'s 1-GPU job on its promised A100 takes ``y``'s 1-GPU
    job, not the newer 4-GPU one, which would leave ``y`` short of its promise."""
    tenants = [
        TenantSpec(name="x", gpus_by_model={"A100": 1}),
        TenantSpec(name="y", gpus=16, gpus_by_model={"A100": 4}),
        TenantSpec(name="z", gpus=16, gpus_by_model={"A100": 11}),
    ]
    jobs = [
        _running("y-one", "y", "a100-0", 0, started_s=1.0, n=1),
        _running("y-four", "y", "a100-0", 1, started_s=9.0),
        _running("z-three", "z", "a100-0", 5, started_s=2.0, n=3),
        _running("z-eight", "z", "a100-1", 0, started_s=2.0, n=8),
        _pending("x-1", "x", n=1, gpu_types=("A100",)),
    ]
    snapshot = _snapshot(jobs, tenants)
    quota = enforce_quotas(snapshot, _asks(snapshot), {}, {})
    assert list(quota.preempt) == ["y-one"]
    assert quota.models["x-1"][0] == ("A100",)
    # Where the jobs that may go cannot free enough, none goes: 4 of y's 5 A100s are
    # under an override, and x now asks for 2.
    two = _snapshot([*jobs[:4], _pending("x-2", "x", n=2, gpu_types=("A100",))], tenants)
    two = replace(
        two, tenants={**two.tenants, "x": TenantSpec(name="x", gpus_by_model={"A100": 2})}
    )

    quota = enforce_quotas(two, _asks(two), {"y-four": SimpleNamespace(pin={})}, {})
    assert not any("quota on A100" in why for why in quota.preempt.values())
