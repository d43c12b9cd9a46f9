"""The simulated cluster reports what happens to its jobs (``JobEvents``), as the Ray
backend does: the daemon stores the events and ``autotune job events`` lists them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from helpers import next_snapshot

from autotune.catalog.tasks import resolve_task
from autotune.core import JobSpec, PrecisionMap
from autotune.decision.step import decide_for
from autotune.envs.simulator import SimConfig, SimulatedCluster
from autotune.interfaces import JobSubmission
from autotune.policies.rules import RulesPolicy


def test_divergences_are_reported_as_job_events_as_the_executor_reports_them() -> None:
    """Jobs of a precision-sensitive model started in fp16 diverge now and then; each
    divergence moves the job to the GPU's safer map and is reported once through
    ``take_events``: one ``nonfinite`` per module class that changed, from fp16."""
    cluster = SimulatedCluster(SimConfig(seed=2, initial_jobs=0, max_jobs=0))
    sensitive = replace(resolve_task("gpt-char", ()).model, precision_sensitivity=1.0)
    for i in range(6):
        spec = JobSpec(job_id=f"lm-{i}", model=sensitive, min_gpus=2, max_gpus=2)
        cluster.submit(JobSubmission(spec=spec, task="gpt-char", steps=10**7))
    snapshot = next_snapshot(cluster)
    decisions = decide_for(snapshot, RulesPolicy(), {}, honoured={}).decisions
    fp16 = PrecisionMap.uniform("fp16")
    cluster.apply(
        [replace(d, config=replace(d.config, precision=fp16)) for d in decisions if d.placement]
    )
    taken: list[tuple[str, dict[str, Any]]] = []
    for _ in range(30):
        cluster.run_round()
        taken.extend(cluster.take_events())
    assert len(taken) >= 3, taken
    assert cluster.take_events() == []  # each once
    assert {e["kind"] for _, e in taken} == {"nonfinite"}
    assert {e["from"] for _, e in taken} == {"fp16"}
    assert {e["to"] for _, e in taken} <= {"bf16", "fp32"}
    assert all(e["divergences"] >= 1 and 0 <= e["sim_s"] < cluster.now for _, e in taken)
    diverged = {job_id for job_id, _ in taken}
    # a job that diverged runs its safer map from then on
    for job in cluster.observe().jobs:
        if job.spec.job_id in diverged and job.config is not None:
            assert job.config.precision.ffn != "fp16"


def test_the_same_seed_brings_the_same_jobs_whatever_the_policy_runs() -> None:
    """Two policies compared on one seed schedule the same jobs: the built-in stream's
    arrivals do not depend on how many random events (here divergence draws, which a
    16-bit job takes every round and an fp32 one never) the policy's choices cause."""

    def arrivals(precision: str | None) -> list[tuple[str, str, float]]:
        cluster = SimulatedCluster(
            SimConfig(seed=5, initial_jobs=4, max_jobs=40, mean_interarrival_s=200.0)
        )
        policy = RulesPolicy()
        for _ in range(40):
            snapshot = next_snapshot(cluster)
            decisions = decide_for(snapshot, policy, {}, honoured={}).decisions
            if precision is not None:
                uniform = PrecisionMap.uniform(precision)  # type: ignore[arg-type]
                decisions = [
                    replace(d, config=replace(d.config, precision=uniform)) for d in decisions
                ]
            cluster.apply(decisions)
        jobs = cluster.observe().jobs
        assert any(j.state == "running" for j in jobs)
        return [(j.spec.job_id, j.spec.model.name, j.spec.submitted_at) for j in jobs]  # type: ignore[union-attr]

    as_rules = arrivals(None)  # fp16 for the GPT jobs: a divergence draw every round
    in_fp32 = arrivals("fp32")  # no draw
    assert len(as_rules) == 40
    assert as_rules == in_fp32
