"""``autotune.client`` against a live daemon (``autotune daemon`` in a child process on
the built-in simulated cluster): every route through its typed method, cursor pages as
iterators, and the API's errors as exceptions with the server's reason."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import Api, DaemonProcess, free_port, wait_for

from autotune.api.schemas import JobCreate, JobPublic, OverrideCreate
from autotune.client import (
    Client,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    UnauthorizedError,
    UnreachableError,
)

pytestmark = pytest.mark.subprocess


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A daemon's URL and API token."""
    tmp_path: Path = tmp_path_factory.mktemp("client")
    port = free_port()
    # Goodput sampled at every tick: a running job has metric samples to page through.
    daemon = DaemonProcess(
        tmp_path, port, "client", tick_s=0.3, env={"AUTOTUNE_JOB_METRICS_EVERY_S": "0"}
    )
    try:
        wait_for("the API", lambda: Api(port).get("/healthz")["status"] == "ok", timeout_s=60)
        yield f"http://127.0.0.1:{port}", daemon.api_token()
    finally:
        daemon.stop()


def test_jobs_decisions_and_metrics_page_through_typed_iterators(live: tuple[str, str]) -> None:
    url, token = live
    with Client(url, token) as api:
        submitted = [
            api.submit_job(JobCreate(task="gpt-char", job_id=f"it{i}", steps=10**9, max_gpus=2))
            for i in range(3)
        ]
        assert all(isinstance(job, JobPublic) and job.state == "pending" for job in submitted)
        # A mapping is sent as it is: the server validates it.
        api.submit_job({"task": "gpt-char", "job_id": "it3", "steps": 10**9})

        # One job per page: the iterator follows the cursors across four pages.
        assert api.jobs_page(limit=1).next is not None
        ids = [job.job_id for job in api.jobs(page_size=1)]
        assert sorted(ids) == ["it0", "it1", "it2", "it3"]
        assert api.job("it1").spec["max_gpus"] == 2

        wait_for("it0 running", lambda: api.job("it0").state == "running")
        decision = wait_for("decisions for it0", lambda: list(api.decisions(job="it0")))[0]
        assert decision.job_id == "it0"
        assert api.decision(decision.id) == decision
        explained = api.explain(decision.id)
        assert explained.decision_id == decision.id
        assert explained.why

        samples = wait_for(
            "two goodput samples",
            lambda: (s := list(api.job_metrics("it0", name="job_goodput", page_size=1)))[1:] and s,
        )
        assert {s.name for s in samples} == {"job_goodput"}
        assert all(s.job_id == "it0" for s in samples)
        assert [s.recorded_at for s in samples] == sorted(
            (s.recorded_at for s in samples), reverse=True
        )

        cancelled = api.cancel_job("it3")
        assert cancelled.cancel_requested


def test_overrides_policies_and_cluster_reads(live: tuple[str, str]) -> None:
    url, token = live
    with Client(url, token) as api:
        api.submit_job(JobCreate(task="gpt-char", job_id="ov", steps=10**9, max_gpus=2))
        created = api.create_override(
            OverrideCreate.model_validate(
                {
                    "job_id": "ov",
                    "ttl_s": 600,
                    "reason": "try int8",
                    "compression": {"kind": "int8"},
                }
            )
        )
        assert created.pin == {"compression": {"kind": "int8"}}
        assert [o.id for o in api.overrides(job="ov", active=True)] == [created.id]
        assert api.override(created.id).active
        ended = api.delete_override(created.id)
        assert not ended.active
        assert [o.id for o in api.overrides(job="ov", active=False)] == [created.id]

        active = api.active_policy()
        assert active.active
        assert active.version in {p.version for p in api.policies().data}
        assert any(e.version == active.version for e in api.policy_events())
        with pytest.raises(NotFoundError, match="no shadow policy"):
            api.shadow()

        cluster = api.cluster()
        assert cluster.nodes
        assert cluster.gpus_total == sum(node.gpu_count for node in cluster.nodes)
        assert api.forecast(minutes=5).predictor
        assert sum(api.dashboard(samples=10, minutes=5).jobs.values()) >= 1
        assert "autotune_" in api.metrics_text()


def test_errors_are_exceptions_with_the_servers_reason(live: tuple[str, str]) -> None:
    url, token = live
    job = {"task": "gpt-char", "job_id": "dup", "steps": 10}
    with Client(url, token) as api:
        api.submit_job(job)
        with pytest.raises(ConflictError) as conflict:
            api.submit_job(job)
        assert conflict.value.status == 409
        with pytest.raises(InvalidRequestError) as invalid:
            api.submit_job({"task": "/etc/passwd"})
        assert invalid.value.status == 422
        assert invalid.value.reason.startswith("body.task")
        with pytest.raises(NotFoundError, match="no job 'missing'"):
            api.job("missing")
    with Client(url, "wrong") as api, pytest.raises(UnauthorizedError):
        api.cancel_job("dup")
    with Client(url, token="") as api, pytest.raises(UnauthorizedError):
        api.submit_job(job)
    with (
        Client(f"http://127.0.0.1:{free_port()}", retries=0) as nobody,
        pytest.raises(UnreachableError, match="cannot reach the daemon"),
    ):
        nobody.health()


def test_an_iterator_fetches_pages_only_as_far_as_it_is_read(live: tuple[str, str]) -> None:
    url, token = live
    with Client(url, token) as api:
        for i in range(3):
            api.submit_job({"task": "gpt-char", "job_id": f"lazy{i}", "steps": 10})
        first_two = list(itertools.islice(api.jobs(page_size=1), 2))
        assert len(first_two) == 2
        assert first_two[0].job_id != first_two[1].job_id
