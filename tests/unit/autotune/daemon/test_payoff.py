"""A running job is reconfigured only when the change pays for its restart on the backend
and its last change showed a measured gain (``autotune.decision.payoff``), for every
policy; where the backend does not measure its restart cost, nothing is weighed."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import next_snapshot

from autotune.core import CompressionSpec, JobConfig, PrecisionMap
from autotune.decision.payoff import RESTART_MARGIN, payoff
from autotune.decision.step import decide, decide_for
from autotune.envs.simulator import SimConfig, SimulatedCluster
from autotune.interfaces import (
    ClusterSnapshot,
    ConfigChange,
    JobMetrics,
    JobStatus,
    PolicyChoice,
)
from autotune.policies.rules import RulesPolicy


def _running() -> tuple[ClusterSnapshot, JobStatus]:
    """A cluster with a data-parallel job running on several GPUs, as the rules placed
    it, and that job."""
    cluster = SimulatedCluster(SimConfig(seed=2, initial_jobs=6, max_jobs=6))
    snapshot = next_snapshot(cluster)
    cluster.apply(decide_for(snapshot, RulesPolicy(), {}, honoured={}).decisions)
    snapshot = next_snapshot(cluster)
    job = next(
        j
        for j in snapshot.by_state("running")
        if j.config is not None and j.config.layout.dp > 1 and j.spec.model is not None
    )
    return snapshot, job


def _with(snapshot: ClusterSnapshot, job: JobStatus, **changes: object) -> ClusterSnapshot:
    changed = replace(job, **changes)  # type: ignore[arg-type]
    return replace(
        snapshot, jobs=[changed if j.spec.job_id == job.spec.job_id else j for j in snapshot.jobs]
    )


def _compressed(config: JobConfig) -> JobConfig:
    return replace(config, compression=CompressionSpec(kind="powersgd", rank=4))


def _change(snapshot: ClusterSnapshot, job: JobStatus, new: JobConfig):  # type: ignore[no-untyped-def]
    choice = PolicyChoice(config=new, reason="the policy prefers it")
    return decide(snapshot, {job.spec.job_id: choice}, {}, honoured={}, policy_version="test")


def test_a_change_that_does_not_pay_for_its_restart_is_declined_with_the_arithmetic() -> None:
    snapshot, job = _running()
    new = _compressed(job.config)  # type: ignore[arg-type]
    nodes = {n.node_id: n for n in snapshot.nodes}
    arithmetic = payoff(job, new, nodes, restart_s=1.0)
    assert not isinstance(arithmetic, str)
    # A restart dearer than what the change can save over the job's remaining work.
    costly = max(1.0, abs(arithmetic.saved_s)) * 10
    round_ = _change(replace(snapshot, restart_s=costly), job, new)
    job_id = job.spec.job_id
    assert job_id not in {d.job_id for d in round_.decisions}
    reason = round_.declined[job_id]
    assert "does not pay for its restart" in reason
    assert f"restart of {costly:.1f} s x {RESTART_MARGIN:g}" in reason


def test_a_change_that_pays_is_decided_with_the_arithmetic_in_its_explanation() -> None:
    snapshot, job = _running()
    # Nearly all of a long job ahead, and a restart that costs nothing much.
    long_job = replace(job, progress=0.0, steps=10_000_000)
    snapshot = _with(replace(snapshot, restart_s=1e-6), job, progress=0.0, steps=10_000_000)
    nodes = {n.node_id: n for n in snapshot.nodes}
    for new in (
        _compressed(job.config),  # type: ignore[arg-type]
        replace(job.config, precision=PrecisionMap.uniform("bf16")),  # type: ignore[arg-type]
        replace(job.config, compression=CompressionSpec(kind="int8")),  # type: ignore[arg-type]
    ):
        arithmetic = payoff(long_job, new, nodes, restart_s=1e-6)
        assert not isinstance(arithmetic, str)
        if arithmetic.saved_s > 0:
            break
    else:
        pytest.fail("no change is predicted to be faster")
    round_ = _change(snapshot, job, new)
    decision = next(d for d in round_.decisions if d.job_id == job.spec.job_id)
    assert decision.config == new
    assert "it pays for its restart" in decision.reason
    shown = round_.why[job.spec.job_id].explanation["reconfiguration"]
    assert shown["pays"] is True
    assert shown["saved_s"] == pytest.approx(shown["current_s"] - shown["new_s"], abs=1e-2)


def test_a_job_is_not_changed_again_before_its_last_change_measured_a_gain() -> None:
    snapshot, job = _running()
    assert job.config is not None
    before = _compressed(job.config)
    new = replace(job.config, precision=PrecisionMap.uniform("bf16"))
    cheap = replace(snapshot, restart_s=1e-9)
    waiting = ConfigChange(previous=before, at_s=0.0, samples_per_s_before=100.0)
    round_ = _change(_with(cheap, job, last_change=waiting), job, new)
    assert "is not measured yet" in round_.declined[job.spec.job_id]
    worse = replace(waiting, samples_per_s_after=50.0)
    rates = JobMetrics(samples_per_s=50.0)
    round_ = _change(_with(cheap, job, last_change=worse, metrics=rates), job, new)
    assert "measured no gain" in round_.declined[job.spec.job_id]
    # Going back to what it ran before is allowed: that was measured.
    round_ = _change(_with(cheap, job, last_change=worse, metrics=rates), job, before)
    assert job.spec.job_id not in round_.declined


def test_a_job_with_no_measured_step_is_not_changed() -> None:
    snapshot, job = _running()
    unmeasured = _with(
        replace(snapshot, restart_s=1e-9), job, metrics=JobMetrics(), samples_per_s=0.0
    )
    round_ = _change(unmeasured, job, _compressed(job.config))  # type: ignore[arg-type]
    assert "no measured step yet" in round_.declined[job.spec.job_id]


def test_without_a_measured_restart_cost_nothing_is_weighed() -> None:
    snapshot, job = _running()
    assert snapshot.restart_s is None, "the simulated cluster charges its own restart_s"
    new = _compressed(job.config)  # type: ignore[arg-type]
    other = replace(new, precision=PrecisionMap.uniform("bf16"))
    stale = ConfigChange(previous=other, at_s=0.0, samples_per_s_before=1.0)
    round_ = _change(_with(snapshot, job, last_change=stale), job, new)
    decision = next(d for d in round_.decisions if d.job_id == job.spec.job_id)
    assert decision.config == new
    assert "reconfiguration" not in round_.why[job.spec.job_id].explanation


def test_a_larger_batch_is_weighed_with_the_noise_scale_the_job_measured() -> None:
    """The catalog's profile may know no noise scale (every batch free); once the job
    measured one, a 4x batch is charged its statistical efficiency there, Pollux's
    (phi + M0) / (phi + M): predicted slower than the catalog says, by exactly that."""
    snapshot, job = _running()
    assert job.config is not None
    assert job.spec.model is not None
    nodes = {n.node_id: n for n in snapshot.nodes}
    batch = job.config.batch(job.spec)
    bigger = replace(job.config, global_batch=4 * batch)
    long_job = replace(job, progress=0.0, steps=10_000_000)
    assumed = payoff(long_job, bigger, nodes, restart_s=1.0)
    phi = 0.5 * batch
    measured_job = replace(long_job, metrics=replace(job.metrics, noise_scale=phi))
    measured = payoff(measured_job, bigger, nodes, restart_s=1.0)
    assert not isinstance(assumed, str)
    assert not isinstance(measured, str)
    profile = measured_job.profile
    assert profile is not None
    assert profile.noise_scale == phi
    m0 = profile.reference_batch
    own = job.spec.model.with_noise_scale(None)
    assert own == job.spec.model  # nothing measured: the catalog's
    now_eff, then_eff = (phi + m0) / (phi + batch), (phi + m0) / (phi + 4 * batch)
    catalog_ratio = assumed.new_s / assumed.current_s
    expected = catalog_ratio * (now_eff / then_eff)
    if job.spec.model.noise_scale > 0:  # the catalog charged its own noise scale
        c = job.spec.model.noise_scale
        expected *= ((c + m0) / (c + 4 * batch)) / ((c + m0) / (c + batch))
    assert measured.new_s / measured.current_s == pytest.approx(expected, rel=1e-6)
    assert measured.new_s / measured.current_s > catalog_ratio


def test_an_explanation_says_which_efficiency_was_measured_and_which_assumed() -> None:
    from autotune.decision.explain import explain_decision

    snapshot, job = _running()
    assert job.config is not None
    assert job.placement is not None
    nodes = {n.node_id: n for n in snapshot.nodes}

    def explained(metrics: JobMetrics) -> dict[str, object]:
        return explain_decision(
            spec=job.spec,
            config=job.config,  # type: ignore[arg-type]
            placement=job.placement,  # type: ignore[arg-type]
            nodes=nodes,
            features={},
            why="test",
            metrics=metrics,
        )["statistical_efficiency"]

    assumed = explained(JobMetrics())
    assert assumed["batch"]["source"] == "assumed (catalog noise scale)"  # type: ignore[index]
    measured = explained(JobMetrics(noise_scale=12.0, compression_cosine=0.9))
    batch = measured["batch"]  # type: ignore[index]
    assert batch["source"] == "measured noise scale"
    assert batch["noise_scale"] == 12.0
    global_batch = job.config.batch(job.spec)
    m0 = job.spec.model.reference_batch  # type: ignore[union-attr]
    assert batch["value"] == round((12.0 + m0) / (12.0 + global_batch), 4)
    compression = measured["compression"]  # type: ignore[index]
    assert compression["source"] == "assumed (catalog constant)"
    assert compression["measured_cosine"] == 0.9
