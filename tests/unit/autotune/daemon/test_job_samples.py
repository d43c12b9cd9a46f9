"""Which jobs' figures a tick stores: a job that started and finished between two ticks
keeps its last figures, as one a tick saw running does; jobs that had ended before the
daemon's first tick are not stored again."""

from __future__ import annotations

from autotune.core import JobSpec, JobState
from autotune.daemon.samples import JobSampler
from autotune.interfaces import ClusterSnapshot, JobMetrics, JobStatus


def _job(job_id: str, state: JobState, rate: float | None = None) -> JobStatus:
    return JobStatus(
        spec=JobSpec(job_id=job_id),
        state=state,
        metrics=JobMetrics(samples_per_s=rate),
    )


def _snapshot(*jobs: JobStatus) -> ClusterSnapshot:
    return ClusterSnapshot(time_s=0.0, nodes=(), jobs=jobs, telemetry="simulator")


def _jobs_in(samples: list[tuple[str, float, str | None]]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for name, _, job in samples:
        assert job is not None
        found.setdefault(job, set()).add(name)
    return found


def test_a_job_that_started_and_ended_between_ticks_keeps_its_figures() -> None:
    sampler = JobSampler(every_s=30.0)
    old = _job("old", "finished", 5.0)
    assert sampler.take(_snapshot(old, _job("a", "pending")), now=0.0) == []  # not again
    # "a" ran and finished between two ticks; "b" was submitted and finished between them.
    later = _snapshot(old, _job("a", "finished", 12.5), _job("b", "finished", 3.0))
    assert _jobs_in(sampler.take(later, now=1.0)) == {
        "a": {"job_samples_per_s"},
        "b": {"job_samples_per_s"},
    }
    assert sampler.take(later, now=2.0) == []  # each job's last figures once


def test_running_jobs_every_interval_and_at_their_end() -> None:
    sampler = JobSampler(every_s=30.0)
    first = sampler.take(_snapshot(_job("r", "running", 10.0)), now=0.0)
    assert _jobs_in(first) == {"r": {"job_samples_per_s"}}  # goodput needs a config
    assert sampler.take(_snapshot(_job("r", "running", 11.0)), now=10.0) == []
    assert sampler.take(_snapshot(_job("r", "running", 12.0)), now=31.0) == [
        ("job_samples_per_s", 12.0, "r")
    ]
    assert sampler.take(_snapshot(_job("r", "failed", 13.0)), now=32.0) == [
        ("job_samples_per_s", 13.0, "r")
    ]
