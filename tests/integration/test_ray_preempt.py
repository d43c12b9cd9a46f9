"""Preemption on the Ray backend: a preempted job stops after a checkpoint before another
starts on its ranks, waits without a configuration, and resumes from its checkpoint."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from autotune.catalog.tasks import BUILTIN_TASKS
from autotune.core import CompressionSpec, Decision, JobConfig, JobSpec, TenantSpec
from autotune.decision.step import decide_for
from autotune.interfaces import ClusterSnapshot, JobSubmission, PolicyChoice, PolicyRound

pytestmark = pytest.mark.ray


class _Turns:
    """Runs ``run`` on every slot of the first node and preempts ``stop``."""

    name, version = "turns", "turns-test"

    def __init__(self, run: str, stop: str | None, gpus: int) -> None:
        self.run, self.stop, self.gpus = run, stop, gpus

    def decide(self, snapshot: ClusterSnapshot) -> PolicyRound:
        choices = {
            j.spec.job_id: PolicyChoice(config=None, reason="waits")
            for j in snapshot.by_state("pending")
        }
        if self.stop is not None:
            choices[self.stop] = PolicyChoice(config=None, reason="its turn ended", preempt=True)
        choices[self.run] = PolicyChoice(
            config=JobConfig.data_parallel(self.gpus), reason="its turn"
        )
        return PolicyRound(choices=choices)


def _wait(what: str, check, timeout_s: float = 180.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_preempted_job_stops_before_another_takes_its_ranks_and_resumes(
    local_ray: str, tmp_path: Path
) -> None:
    from autotune.executor.ray_backend import RayBackend

    profile = BUILTIN_TASKS["gpt-char"].profile
    backend = RayBackend(checkpoint_root=tmp_path, checkpoint_every=5, step_timeout_s=120)
    try:
        for name in ("first", "second"):
            backend.submit(
                JobSubmission(
                    spec=JobSpec(
                        job_id=name, model=profile, global_batch=16, min_gpus=1, max_gpus=2
                    ),
                    task="gpt-char",
                    steps=400,
                )
            )
        snapshot = backend.observe()
        slots = max(n.gpu_count for n in snapshot.nodes)
        gpus = min(2, slots)
        backend.apply(decide_for(snapshot, _Turns("first", None, gpus), {}, honoured={}).decisions)

        def stepped() -> bool:
            status = {j.spec.job_id: j for j in backend.observe().jobs}["first"]
            return status.progress * 400 >= 8

        _wait("the first job's steps", stepped)
        snapshot = backend.observe()
        # The first job's ranks are all the second one can have when gpus == slots; in any
        # case the round preempts it and starts the second.
        round_ = decide_for(snapshot, _Turns("second", "first", gpus), {}, honoured={})
        assert [d.job_id for d in round_.decisions if d.preempt] == ["first"]
        backend.apply(round_.decisions)  # returns once "first" has stopped
        jobs = {j.spec.job_id: j for j in backend.observe().jobs}
        assert jobs["first"].state == "pending"
        assert jobs["first"].config is None
        assert jobs["first"].placement is None
        stopped_at = round(jobs["first"].progress * 400)
        assert stopped_at >= 8
        assert jobs["second"].state == "running"
        # Its turn again: it resumes from the checkpoint written when it stopped.
        round_ = decide_for(backend.observe(), _Turns("first", "second", gpus), {}, honoured={})
        backend.apply(round_.decisions)
        events = _wait(
            "the first job to resume",
            lambda: [e for e in backend.job_events("first") if e["kind"] == "resumed"],
        )
        assert events[0]["resumed_from"] == stopped_at
        assert events[0]["steps_redone"] == 0
        # What happens to a job comes out of take_events once, for the daemon to store:
        # the backend's own events (the resume) and what the job's run reports (here a
        # reconfiguration: another gradient compression on the same ranks).
        first = {j.spec.job_id: j for j in backend.observe().jobs}["first"]
        assert first.config is not None
        assert first.placement is not None
        recompressed = replace(first.config, compression=CompressionSpec(kind="int8"))
        backend.apply(
            [
                Decision(
                    job_id="first",
                    config=recompressed,
                    placement=first.placement,
                    source="policy",
                    policy_version="turns-test",
                    reason="recompress",
                )
            ]
        )
        taken: list[tuple[str, dict[str, Any]]] = []

        def reconfigured() -> list[dict[str, Any]]:
            taken.extend(backend.take_events())
            return [e for j, e in taken if j == "first" and e["kind"] == "reconfigured"]

        _wait("the reconfiguration's event", reconfigured)
        mine = [e for j, e in taken if j == "first"]
        assert [e["kind"] for e in mine].count("resumed") == 1
        assert mine == backend.job_events("first")[: len(mine)]
        assert all(isinstance(e["at"], float) for e in mine)
    finally:
        backend.close(timeout_s=60)


def test_a_tenant_gets_its_quota_back_from_a_borrower_in_one_round_on_ray(
    local_ray: str, tmp_path: Path
) -> None:
    """Tenant ``owner`` (a quota of up to 2 slots) is idle while ``others`` (no quota)
    borrows every slot of the node; ``owner`` submits: the next round preempts the
    borrower (after its checkpoint) and starts the owner's job on the freed slots."""
    from autotune.executor.ray_backend import RayBackend
    from autotune.policies.rules import RulesPolicy

    profile = BUILTIN_TASKS["gpt-char"].profile
    backend = RayBackend(checkpoint_root=tmp_path, checkpoint_every=5, step_timeout_s=120)
    try:
        slots = max(n.gpu_count for n in backend.observe().nodes)
        gpus = min(2, slots)
        tenants = {
            "owner": TenantSpec(name="owner", gpus=gpus),
            "others": TenantSpec(name="others"),
        }

        def submit(name: str, tenant: str, size: int) -> None:
            spec = JobSpec(
                job_id=name,
                model=profile,
                global_batch=16,
                min_gpus=size,
                max_gpus=size,
                tenant=tenant,
            )
            backend.submit(JobSubmission(spec=spec, task="gpt-char", steps=400))

        def round_() -> list[str]:
            snapshot = replace(backend.observe(), tenants=tenants)
            decided = decide_for(snapshot, RulesPolicy(), {}, honoured={})
            backend.apply(decided.decisions)  # returns once the preempted have stopped
            return [d.job_id for d in decided.decisions if d.preempt]

        submit("borrower", "others", slots)  # every slot of the node
        assert round_() == []
        _wait(
            "the borrower's steps",
            lambda: {j.spec.job_id: j for j in backend.observe().jobs}["borrower"].progress > 0,
        )
        submit("owned", "owner", gpus)
        started = time.monotonic()
        assert round_() == ["borrower"]
        jobs = {j.spec.job_id: j for j in backend.observe().jobs}
        assert jobs["borrower"].state == "pending"
        assert jobs["owned"].state == "running"
        assert jobs["owned"].placement is not None
        assert jobs["owned"].placement.world_size == gpus
        print(
            f"the owner's job holds its {gpus} GPU slot(s) one round after it was submitted, "
            f"{time.monotonic() - started:.1f} s with the borrower's checkpoint and stop"
        )
    finally:
        backend.close(timeout_s=60)
