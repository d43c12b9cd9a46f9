"""The REST API over a database filled by real ticks of the decision loop."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from autotune.api.app import create_app
from autotune.core import utc_now
from autotune.daemon.tick import Daemon, DaemonParts
from autotune.db import Database
from autotune.db import repository as repo
from autotune.envs.simulator import SimConfig, SimulatedCluster
from autotune.policies.rules import RulesPolicy


@pytest.fixture
def client(database: Database) -> Iterator[TestClient]:
    daemon = Daemon(
        DaemonParts(db=database, backend=SimulatedCluster(SimConfig(seed=1)), policy=RulesPolicy())
    )
    daemon.start()
    for _ in range(8):
        daemon.tick()
    with TestClient(create_app(db=database, telemetry="simulator")) as test_client:
        yield test_client


def test_health_and_openapi(client: TestClient) -> None:
    assert client.get("/api/v1/healthz").json()["status"] == "ok"
    paths = client.get("/openapi.json").json()["paths"]
    assert {
        "/api/v1/healthz",
        "/api/v1/cluster",
        "/api/v1/jobs",
        "/api/v1/jobs/{job_id}",
        "/api/v1/decisions",
        "/api/v1/decisions/{decision_id}",
    } <= set(paths)
    assert client.get("/docs").status_code == 200


def test_cluster_reports_nodes_and_what_running_jobs_hold(client: TestClient) -> None:
    cluster = client.get("/api/v1/cluster").json()
    assert cluster["telemetry"] == "simulator"
    assert cluster["gpus_total"] == 32
    running = client.get("/api/v1/jobs", params={"state": "running"}).json()["data"]
    held = 0.0
    for job in running:
        decisions = client.get("/api/v1/decisions", params={"job": job["job_id"], "limit": 1})
        placement = decisions.json()["data"][0]["placement"]
        held += sum(r["gpu_milli"] for r in placement["ranks"]) / 1000
    assert cluster["gpus_allocated"] == pytest.approx(held)
    assert cluster["jobs"]["running"] == len(running)


def test_jobs_list_filter_and_show(client: TestClient) -> None:
    everything = client.get("/api/v1/jobs").json()
    assert everything["count"] == len(everything["data"]) > 0
    job = everything["data"][0]
    shown = client.get(f"/api/v1/jobs/{job['job_id']}").json()
    assert shown["spec"]["job_id"] == job["job_id"]
    assert client.get("/api/v1/jobs/nope").status_code == 404
    assert client.get("/api/v1/jobs", params={"state": "sleeping"}).status_code == 422


def test_a_running_job_shows_its_online_throughput_fit(client: TestClient) -> None:
    """Every running job has reported measured steps by now: its fit is shown with the
    points it has, whether fitted, the fit error and the coefficients it predicts with."""
    running = client.get("/api/v1/jobs", params={"state": "running"}).json()["data"]
    assert running
    for job in running:
        performance = client.get(f"/api/v1/jobs/{job['job_id']}").json()["performance"]
        assert performance["points"] >= 1
        assert performance["source"] in ("online", "prior")
        assert performance["fitted"] == (performance["source"] == "online")
        assert (performance["fit_error"] is None) != performance["fitted"]
        assert 0 < performance["coefficients"]["mfu"] <= 1


def test_a_jobs_measured_training_quality_is_shown_and_plotted(
    client: TestClient, database: Database
) -> None:
    """What the executor measures of a job's training (loss, noise scale, compression
    fidelity: ``JobMetrics``) is stored as ``job_*`` samples: the job shows the latest
    and the dashboard plots each per job."""
    from autotune.daemon.samples import measured_samples
    from autotune.db import repository as repo
    from autotune.interfaces import JobMetrics, JobStatus

    job = client.get("/api/v1/jobs", params={"state": "running"}).json()["data"][0]
    status = JobStatus(
        spec=_spec(job["job_id"]),
        state="running",
        metrics=JobMetrics(loss=2.5, noise_scale=180.0, compression_cosine=0.93),
    )
    with database.session() as session:
        repo.record_metrics(session=session, values=measured_samples([status]))
    shown = client.get(f"/api/v1/jobs/{job['job_id']}").json()["metrics"]
    assert shown["noise_scale"] == 180.0
    assert shown["compression_cosine"] == 0.93
    quality = client.get("/api/v1/dashboard").json()["quality"]
    assert quality["noise_scale"][job["job_id"]]["value"][-1] == 180.0
    assert quality["compression_cosine"][job["job_id"]]["value"][-1] == 0.93
    assert quality["loss"][job["job_id"]]["value"][-1] == 2.5


def _spec(job_id: str):  # type: ignore[no-untyped-def]
    from autotune.core import JobSpec

    return JobSpec(job_id=job_id)


def test_decisions_pages_filters_and_detail(client: TestClient) -> None:
    first = client.get("/api/v1/decisions", params={"limit": 2}).json()
    assert first["count"] >= 3
    assert len(first["data"]) == 2
    second = client.get("/api/v1/decisions", params={"limit": 2, "offset": 2}).json()
    ids = [d["id"] for d in first["data"] + second["data"]]
    assert ids == sorted(ids, reverse=True)
    assert len(set(ids)) == len(ids)
    detail = client.get(f"/api/v1/decisions/{ids[0]}").json()
    assert detail["source"] == "policy"
    assert detail["applied_at"] is not None
    assert detail["reason"]
    assert detail["config"]["layout"]["world_size"] == len(detail["placement"]["ranks"])
    job = detail["job_id"]
    for_job = client.get("/api/v1/decisions", params={"job": job}).json()
    assert all(d["job_id"] == job for d in for_job["data"])
    later = (utc_now() + timedelta(hours=1)).isoformat()
    assert client.get("/api/v1/decisions", params={"since": later}).json()["count"] == 0
    assert client.get("/api/v1/decisions", params={"source": "override"}).json()["count"] == 0
    assert client.get("/api/v1/decisions", params={"source": "magic"}).status_code == 422
    assert (
        client.get("/api/v1/decisions", params={"since": "2026-01-01T00:00:00"}).status_code == 422
    )
    assert client.get("/api/v1/decisions/999999").status_code == 404


def test_cluster_gives_a_named_node_its_backend_id(database: Database) -> None:
    from autotune.catalog.devices import node_info
    from autotune.db import repository as repo

    ray_id = "ab" * 28
    with database.session() as session:
        repo.upsert_nodes(
            session=session,
            nodes=[
                node_info(
                    "gpu-box-1",
                    gpu_model="A100",
                    gpu_count=2,
                    cpu_milli=8000,
                    memory_mib=1024,
                    backend_node_id=ray_id,
                ),
                node_info("t4-0", gpu_model="T4", gpu_count=1, cpu_milli=8000, memory_mib=1024),
            ],
        )
    with TestClient(create_app(db=database, telemetry="ray")) as client:
        nodes = {n["node_id"]: n for n in client.get("/api/v1/cluster").json()["nodes"]}
    assert nodes["gpu-box-1"]["backend_node_id"] == ray_id
    assert nodes["t4-0"]["backend_node_id"] is None


def test_a_preemptions_explanation_is_its_reason(database: Database) -> None:
    """A preemption is stored with the reason and the features, no configuration chosen
    and no alternatives: its explanation says so instead of failing."""
    from autotune.core import Decision, JobConfig, JobSpec

    with database.session() as session:
        repo.upsert_job(session=session, spec=JobSpec(job_id="p"), state="running")
        (stored,) = repo.create_decisions(
            session=session,
            decisions=[
                (
                    Decision(
                        job_id="p",
                        config=JobConfig.data_parallel(1),
                        placement=None,
                        source="policy",
                        policy_version="test",
                        reason="preempted: for tenant 'a''s quota",
                        preempt=True,
                    ),
                    None,
                    {"preempted": True, "why": "for tenant 'a''s quota", "features": {"x": 1.0}},
                )
            ],
            term=None,
        )
    with TestClient(create_app(db=database, telemetry="simulator")) as client:
        answer = client.get(f"/api/v1/decisions/{stored.decision_id}/explain")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["why"], body["chosen"], body["alternatives"]) == (
        "for tenant 'a''s quota",
        {},
        [],
    )
    assert body["features"] == {"x": 1.0}
