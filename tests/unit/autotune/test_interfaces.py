"""A job's measured figures are typed (``JobMetrics``) and reach the daemon's store as the
same ``job_<name>`` samples, by name, as floats; the backend's own goodput is not one."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from autotune.core import JobSpec
from autotune.daemon.samples import measured_samples
from autotune.interfaces import JobMetrics, JobStatus


def test_only_the_figures_that_are_set_are_given_by_name_as_floats() -> None:
    metrics = JobMetrics(step_time_s=0.5, loss=2.25, bytes_sent=4096, nan_events=0, oom=True)
    assert list(metrics.measured()) == [
        ("bytes_sent", 4096.0),
        ("loss", 2.25),
        ("nan_events", 0.0),
        ("oom", 1.0),
        ("step_time_s", 0.5),
    ]
    assert all(type(value) is float for _, value in metrics.measured())
    assert list(JobMetrics().measured()) == []


def test_job_metrics_are_frozen_and_pickle() -> None:
    metrics = JobMetrics(samples_per_s=120.0, power_watts=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        metrics.loss = 1.0  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(metrics)) == metrics


def test_the_daemon_stores_the_measured_figures_as_job_samples() -> None:
    spec = JobSpec(job_id="j1")
    status = JobStatus(
        spec=spec,
        state="running",
        metrics=JobMetrics(goodput=9.0, samples_per_s=12.5, step_time_s=0.4, power_watts=250.0),
    )
    assert measured_samples([status]) == [
        ("job_power_watts", 250.0, "j1"),
        ("job_samples_per_s", 12.5, "j1"),
        ("job_step_time_s", 0.4, "j1"),
    ]
