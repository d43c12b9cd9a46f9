"""Each job's throughput model learned online from the steps its backend reports."""

from __future__ import annotations

import json

from helpers import next_snapshot

from autotune.catalog.applications import catalog_coefficients, coefficients
from autotune.catalog.profiles import MODEL_CATALOG
from autotune.core import JobConfig, JobSpec
from autotune.daemon.performance import JobModels
from autotune.decision.step import decide_for
from autotune.envs.presets import pollux_nodes
from autotune.envs.simulator import Arrival, SimConfig, SimulatedCluster
from autotune.interfaces import PolicyChoice, PolicyRound
from autotune.perf.model import DEFAULT_COEFFICIENTS, Coefficients, Shape, shape_of, step_time

BERT = MODEL_CATALOG["bert"]


class _Gpus:
    """Runs the one job on ``gpus`` GPUs, data parallel."""

    name, version = "gpus", "gpus-test"

    def __init__(self) -> None:
        self.gpus = 1

    def decide(self, snapshot):  # type: ignore[no-untyped-def]
        return PolicyRound(
            choices={
                j.spec.job_id: PolicyChoice(
                    config=JobConfig.data_parallel(self.gpus), reason=f"{self.gpus} GPU(s)"
                )
                for j in snapshot.jobs
                if j.state in ("pending", "running")
                and (j.config is None or j.config.world_size != self.gpus)
            }
        )


def _cluster(true: Coefficients) -> SimulatedCluster:
    arrival = Arrival(
        spec=JobSpec(job_id="bert-0", model=BERT, global_batch=96, min_gpus=1, max_gpus=16),
        work=1e12,
        coeffs=true,
        reference_gpus=4,
    )
    return SimulatedCluster(
        SimConfig(nodes=tuple(pollux_nodes(16)), round_s=60.0, seed=3), arrivals=[arrival]
    )


def test_catalog_coefficients_are_pollux_fits_for_its_apps() -> None:
    assert catalog_coefficients(BERT) == coefficients("bert")
    assert catalog_coefficients(MODEL_CATALOG["gpt-125m"]) == DEFAULT_COEFFICIENTS


def test_a_job_whose_speed_differs_from_the_catalog_is_learned_from_its_steps() -> None:
    """The job really runs at half the catalog's compute utilisation and a third of its
    network efficiency; the simulated backend reports its steps with 5% noise. After it
    has run on 1, 4, 8 and 16 GPUs the fitted model predicts its 12-GPU step time far
    better than the catalog does."""
    prior = coefficients("bert")
    true = _scaled(prior)
    cluster = _cluster(true)
    models = JobModels()
    policy = _Gpus()
    changed_any = False
    for gpus in (1, 4, 8, 16):
        policy.gpus = gpus
        for _ in range(3):
            snapshot = next_snapshot(cluster)
            changed_any |= bool(models.observe(snapshot))
            cluster.apply(decide_for(snapshot, policy, {}, honoured={}).decisions)
    snapshot = next_snapshot(cluster)
    models.observe(snapshot)
    assert changed_any
    model = models.current()["bert-0"]
    assert model.source == "online"
    assert model.points >= 3
    assert model.fit_error is not None
    assert model.fit_error < 0.1
    summary = models.summary("bert-0")
    assert summary is not None
    assert summary["source"] == "online"
    json.dumps(summary)
    job = snapshot.by_state("running")[0]
    assert job.placement is not None
    shape = shape_of(job.placement, {n.node_id: n for n in snapshot.nodes})
    assert shape.gpu_model == "T4"
    twelve = Shape(gpu_model="T4", ranks_per_node=(4, 4, 4), inter_node_gbps=6.25)
    config = JobConfig.data_parallel(12)
    truth = step_time(BERT, config, twelve, 96, coeffs=true).step_s
    fitted = step_time(BERT, config, twelve, 96, coeffs=model.coefficients).step_s
    catalog = step_time(BERT, config, twelve, 96, coeffs=prior).step_s
    assert abs(fitted / truth - 1) < 0.5 * abs(catalog / truth - 1)


def _scaled(prior: Coefficients) -> Coefficients:
    from dataclasses import replace

    return replace(prior, mfu=prior.mfu * 0.5, inter_bw_efficiency=prior.inter_bw_efficiency / 3)


def test_the_explanation_says_which_model_predicted() -> None:
    cluster = _cluster(coefficients("bert"))
    models = JobModels()
    snapshot = next_snapshot(cluster)
    round_ = decide_for(snapshot, _Gpus(), {}, honoured={}, models=models.current())
    explained = round_.why["bert-0"].explanation["performance_model"]
    assert explained["source"] == "catalog"
    assert explained["points"] == 0
    cluster.apply(round_.decisions)
    models.observe(next_snapshot(cluster))  # the first round it ran: nothing to compare with
    models.observe(next_snapshot(cluster))
    assert models.current()["bert-0"].source == "catalog"  # one point: the prior still


def test_ended_jobs_are_forgotten() -> None:
    cluster = _cluster(coefficients("bert"))
    models = JobModels()
    snapshot = next_snapshot(cluster)
    cluster.apply(decide_for(snapshot, _Gpus(), {}, honoured={}).decisions)
    assert models.observe(next_snapshot(cluster)) == []  # no step since it was last seen
    assert models.observe(next_snapshot(cluster)) == ["bert-0"]
    cluster.cancel("bert-0")
    models.observe(next_snapshot(cluster))
    assert models.current() == {}
    assert models.summary("bert-0") is None


def test_a_step_time_counts_only_after_a_step_under_the_current_config() -> None:
    """A backend reports the previous configuration's step until the new one's first
    step: a tick right after a change, or one without progress, feeds nothing."""
    cluster = _cluster(coefficients("bert"))
    models = JobModels()
    policy = _Gpus()
    cluster.apply(decide_for(next_snapshot(cluster), policy, {}, honoured={}).decisions)
    models.observe(next_snapshot(cluster))
    assert models.observe(next_snapshot(cluster)) == ["bert-0"]
    policy.gpus = 4
    snapshot = next_snapshot(cluster)
    models.observe(snapshot)
    cluster.apply(decide_for(snapshot, policy, {}, honoured={}).decisions)
    snapshot = next_snapshot(cluster)  # running on 4 GPUs, its metrics from this round
    assert models.observe(snapshot) == []  # the config changed since the last tick
    stalled = snapshot.jobs[0]
    assert models.observe(snapshot) == []  # no progress since the last tick
    assert stalled.state == "running"
    assert models.observe(next_snapshot(cluster)) == ["bert-0"]
    assert models.summary("bert-0")["points"] == 2  # type: ignore[index]


def test_a_waiting_job_has_nothing_to_learn_from() -> None:
    models = JobModels()
    cluster = _cluster(coefficients("bert"))
    assert models.observe(next_snapshot(cluster)) == []
    assert models.current() == {}
