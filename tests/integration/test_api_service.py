"""The API's write side and its service endpoints, over a database filled by real ticks
of the decision loop: auth, malformed requests, overrides, cancellation, explain,
policies, forecast, metrics, readiness and the dashboard's page and payload (rendered in
a browser by ``test_dashboard_browser.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from helpers import cli
from sqlalchemy import text

from autotune.api.app import attach_daemon, create_app
from autotune.daemon.auth import (
    StoredTokenCheck,
    TokenCheck,
    ensure_token,
    hash_token,
    rotate_token,
)
from autotune.daemon.tick import Daemon, DaemonParts
from autotune.db import Database
from autotune.db import repository as repo
from autotune.envs.simulator import SimConfig, SimulatedCluster
from autotune.policies.rules import RulesPolicy

TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Service:
    def __init__(self, database: Database) -> None:
        self.daemon = Daemon(
            DaemonParts(
                db=database,
                backend=SimulatedCluster(SimConfig(seed=1, initial_jobs=6, max_jobs=6)),
                policy=RulesPolicy(),
            )
        )
        self.daemon.start()
        self.app = create_app(
            db=database,
            telemetry="simulator",
            token_check=TokenCheck([hash_token(TOKEN)]),
            task_modules=["labtasks"],
            max_body_bytes=4096,
        )
        attach_daemon(self.app, self.daemon)  # as serve() does
        self.client = TestClient(self.app)

    def ticks(self, n: int) -> None:
        for _ in range(n):
            self.daemon.tick()

    def submit(self, **body: Any) -> dict[str, Any]:
        response = self.client.post("/api/v1/jobs", json=body, headers=AUTH)
        assert response.status_code == 201, response.text
        result: dict[str, Any] = response.json()
        return result


@pytest.fixture
def service(database: Database) -> Iterator[Service]:
    svc = Service(database)
    svc.ticks(3)
    with svc.client:
        yield svc


# --- auth -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer nope"}, {"Authorization": f"Basic {TOKEN}"}],
    ids=["none", "wrong", "not-bearer"],
)
def test_mutations_need_the_bearer_token(service: Service, headers: dict[str, str]) -> None:
    client = service.client
    job = {"task": "gpt-char", "job_id": "x"}
    assert client.post("/api/v1/jobs", json=job, headers=headers).status_code == 401
    override = {"job_id": "job-00000", "precision": {"ffn": "fp32"}, "ttl_s": 5, "reason": "r"}
    assert client.post("/api/v1/overrides", json=override, headers=headers).status_code == 401
    assert client.delete("/api/v1/jobs/job-00000", headers=headers).status_code == 401
    assert client.delete("/api/v1/overrides/1", headers=headers).status_code == 401
    assert client.get("/api/v1/jobs", headers=headers).status_code == 200  # reads are open
    assert client.get("/api/v1/jobs/x").status_code == 404  # nothing was created


def test_the_token_is_generated_once_and_stored_only_as_a_hash(database: Database) -> None:
    check, token = ensure_token(database, None)
    assert token is not None
    assert len(token) >= 40
    first = check(token)
    assert first is not None
    assert (first.tenant, first.role, first.token_name) == ("default", "admin", "first")
    assert check(token + "x") is None
    again, shown = ensure_token(database, None)
    assert shown is None
    assert again(token) == first
    with database.engine.connect() as connection:
        dump = "\n".join(connection.connection.iterdump())
    assert token not in dump
    assert hash_token(token) in dump
    # AUTOTUNE_TOKEN: an admin of default stored nowhere, beside the stored tokens
    configured, shown = ensure_token(database, "from-settings")
    assert shown is None
    who = configured("from-settings")
    assert who is not None
    assert (who.role, who.token_id) == ("admin", None)
    assert configured(token) == first


def test_a_rotated_token_replaces_the_old_one_in_a_running_api(
    database: Database, tmp_path: Path
) -> None:
    check, old = ensure_token(database, None)
    assert old is not None
    assert isinstance(check, StoredTokenCheck)
    check.refresh_s = 0.0  # read the stored hashes at every request
    app = create_app(db=database, telemetry="simulator", token_check=check)
    body = {"task": "gpt-char", "steps": 10}
    with TestClient(app) as client:
        auth = {"Authorization": f"Bearer {old}"}
        assert client.post("/api/v1/jobs", json=body, headers=auth).status_code == 201
        record, new = rotate_token(database)
        assert client.post("/api/v1/jobs", json=body, headers=auth).status_code == 401
        auth = {"Authorization": f"Bearer {new}"}
        assert client.post("/api/v1/jobs", json=body, headers=auth).status_code == 201
    with database.session() as session:
        ((digest, stored),) = repo.usable_tokens(session=session)
    assert digest == hash_token(new)
    assert stored.token_id == record.token_id
    assert stored.rotated_at is not None


def test_token_rotate_shows_the_new_token_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    missing = cli("token", "rotate", "--data-dir", str(tmp_path / "none"))
    assert missing.exit_code == 2
    assert "start the daemon first" in missing.stderr
    database = Database(url)
    database.upgrade()
    _, first = ensure_token(database, None)
    rotated = cli("token", "rotate", "--db", url)
    assert rotated.exit_code == 0, rotated.stderr
    token = rotated.stdout.strip().rsplit(" ", 1)[-1]
    assert token != first
    check = StoredTokenCheck(database)
    assert check(token)
    assert first is not None
    assert not check(first)
    database.dispose()


# --- malformed requests ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"task": "gpt-char", "min_gpus": "4"}, 422, "min_gpus"),
        ({"task": "gpt-char", "min_gpus": 0}, 422, "min_gpus"),
        ({"task": "gpt-char", "max_gpus": 10**9}, 422, "max_gpus"),
        ({"task": "gpt-char", "min_gpus": 4, "max_gpus": 2}, 422, "max_gpus"),
        ({"task": "gpt-char", "priority": 1.5}, 422, "priority"),
        ({"task": "gpt-char", "colour": "blue"}, 422, "colour"),
        ({"task": "gpt-char", "constraints": {"gpu_typos": ["A100"]}}, 422, "gpu_typos"),
        ({"task": "gpt-char", "constraints": {"gpu_milli": 500}, "max_gpus": 2}, 422, "gpu_milli"),
        ({"task": "gpt-char", "job_id": "../etc"}, 422, "job_id"),
        ({"task": "/tmp/evil.py:Task"}, 422, "task"),
        ({"task": "os:system"}, 422, "task"),
        ({"task": "labtasks_evil.mod:Task"}, 422, "task"),
        ({"task": "gpt-char", "steps": None}, 422, "steps"),
        ({}, 422, "task"),
        ({"task": "x" * 5000}, 413, "body"),
    ],
)
def test_malformed_jobs_get_a_4xx_naming_the_field(
    service: Service, body: dict[str, Any], status: int, field: str
) -> None:
    response = service.client.post("/api/v1/jobs", json=body, headers=AUTH)
    assert response.status_code == status, response.text
    assert field in response.text


def test_bodies_that_are_not_json_or_too_big_by_stream_are_4xx(service: Service) -> None:
    client = service.client
    bad = client.post(
        "/api/v1/jobs", content=b"{not json", headers={**AUTH, "Content-Type": "application/json"}
    )
    assert bad.status_code == 422
    assert "JSON" in bad.text

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams in
        yield b'{"task": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}'

    streamed = client.post(
        "/api/v1/jobs", content=chunks(), headers={**AUTH, "Content-Type": "application/json"}
    )
    assert streamed.status_code == 413
    assert client.get("/api/v1/decisions", params={"limit": "many"}).status_code == 422
    assert client.get("/api/v1/decisions/abc").status_code == 422


def test_allow_listed_module_tasks_are_accepted_without_importing_them(service: Service) -> None:
    job = service.submit(task="labtasks.vision:ResNetTask", job_id="mod-job")
    assert job["task"] == {"name": "labtasks.vision:ResNetTask", "steps": 1000, "origin": "api"}
    assert job["spec"]["model"] is None  # opaque until a backend loads it
    service.ticks(1)  # the simulated cluster cannot simulate what it has no profile of
    rejected = service.client.get("/api/v1/jobs/mod-job").json()
    assert rejected["state"] == "failed"
    assert "needs a model profile" in rejected["state_reason"]


# --- overrides ------------------------------------------------------------------------


def running_job(service: Service) -> dict[str, Any]:
    running = service.client.get("/api/v1/jobs", params={"state": "running"}).json()["data"]
    assert running
    job: dict[str, Any] = running[0]
    return job


@pytest.mark.parametrize(
    ("pin", "reason"),
    [
        ({"layout": {"world_size": 64}}, "the job allows"),
        ({"layout": {"world_size": 3, "tp": 2}}, "not divisible"),
        ({"precision": {"norm": "fp8"}}, "normalisation cannot run in fp8"),
        ({"compression": {"kind": "topk"}}, "topk needs a ratio"),
        ({"placement": [{"node_id": "nowhere-0", "gpu_index": 0}]}, "does not exist"),
        ({"placement": [{"node_id": "a100-0", "gpu_index": 99}]}, "does not exist"),
    ],
)
def test_infeasible_overrides_are_rejected_with_the_reason(
    service: Service, pin: dict[str, Any], reason: str
) -> None:
    job = running_job(service)
    body = {"job_id": job["job_id"], "ttl_s": 60, "reason": "test", **pin}
    response = service.client.post("/api/v1/overrides", json=body, headers=AUTH)
    assert response.status_code == 422, response.text
    assert reason in response.text
    assert service.client.get("/api/v1/overrides").json()["count"] == 0


def test_overrides_that_break_memory_or_gpu_type_are_rejected(service: Service) -> None:
    service.submit(task="gpt-char", job_id="a100-only", constraints={"gpu_types": ["A100"]})
    service.submit(task="gpt-1.3b", job_id="big", global_batch=1)
    one_t4 = [{"node_id": "t4-0", "gpu_index": 0}]
    cases = [
        ("a100-only", {"placement": one_t4}, "rank 0 on T4"),  # not an allowed GPU model
        ("big", {"placement": one_t4}, "out of memory on t4-0"),
    ]
    for job_id, pin, reason in cases:
        body = {"job_id": job_id, "ttl_s": 60, "reason": "test", **pin}
        response = service.client.post("/api/v1/overrides", json=body, headers=AUTH)
        assert response.status_code == 422, response.text
        assert reason in response.text
        assert response.json()["detail"][0]["loc"] == ["body", "placement"]
    fits = {"job_id": "big", "placement": [{"node_id": "a100-1", "gpu_index": 0}]}
    response = service.client.post(
        "/api/v1/overrides", json={**fits, "ttl_s": 60, "reason": "fits"}, headers=AUTH
    )
    assert response.status_code == 201, response.text
    nothing = {"job_id": "big", "ttl_s": 60, "reason": "test"}
    assert service.client.post("/api/v1/overrides", json=nothing, headers=AUTH).status_code == 422
    ghost = {"job_id": "ghost", "ttl_s": 60, "reason": "t", "precision": {"ffn": "fp32"}}
    assert service.client.post("/api/v1/overrides", json=ghost, headers=AUTH).status_code == 404


def test_a_pinned_placement_is_applied_then_released_to_the_policy(service: Service) -> None:
    job = running_job(service)
    job_id = job["job_id"]
    world = job_world = len(
        service.client.get("/api/v1/decisions", params={"job": job_id, "limit": 1}).json()["data"][
            0
        ]["placement"]["ranks"]
    )
    assert job_world >= 1
    # The last GPUs of the second A100 node, whoever holds them now.
    slots = [{"node_id": "a100-1", "gpu_index": 7 - i} for i in range(world)]
    body = {"job_id": job_id, "placement": slots, "ttl_s": 600, "reason": "keep off a100-0"}
    response = service.client.post("/api/v1/overrides", json=body, headers=AUTH)
    assert response.status_code == 201, response.text
    override_id = response.json()["id"]
    report = service.daemon.tick()
    honoured = [d for d in report.decisions if d.job_id == job_id]
    assert honoured
    assert honoured[0].source == "override"
    assert honoured[0].placement is not None
    assert [(s.node_id, s.gpu_index) for s in honoured[0].placement.ranks] == [
        (s["node_id"], s["gpu_index"]) for s in slots
    ]
    listed = service.client.get("/api/v1/decisions", params={"source": "override"}).json()
    assert listed["data"][0]["override_id"] == override_id
    # Honoured once: the next tick keeps it without a new decision.
    assert job_id not in {d.job_id for d in service.daemon.tick().decisions}
    assert service.client.get("/api/v1/overrides", params={"active": True}).json()["count"] == 1
    deleted = service.client.delete(f"/api/v1/overrides/{override_id}", headers=AUTH)
    assert deleted.status_code == 200
    assert deleted.json()["active"] is False
    released = [d for d in service.daemon.tick().decisions if d.job_id == job_id]
    assert released
    assert released[0].source == "policy"
    assert f"override {override_id} ended" in released[0].reason
    assert service.client.get("/api/v1/overrides", params={"active": False}).json()["count"] == 1


# --- jobs -----------------------------------------------------------------------------


def test_submitted_jobs_run_and_can_be_cancelled(service: Service) -> None:
    service.submit(task="gpt-char", job_id="mine", min_gpus=1, max_gpus=2, steps=10**7)
    service.ticks(1)
    assert service.client.get("/api/v1/jobs/mine").json()["state"] == "running"
    response = service.client.delete("/api/v1/jobs/mine", headers=AUTH)
    assert response.status_code == 202
    assert response.json()["cancel_requested"] is True
    service.ticks(1)
    job = service.client.get("/api/v1/jobs/mine").json()
    assert job["state"] == "cancelled"
    assert service.client.delete("/api/v1/jobs/mine", headers=AUTH).status_code == 409
    held = service.client.get("/api/v1/cluster").json()
    placements = service.daemon.backend.observe().by_state("running")
    assert "mine" not in {j.spec.job_id for j in placements}
    assert held["jobs"]["cancelled"] == 1


# --- explain, policies, forecast, metrics, readiness ----------------------------------


def test_explain_names_features_alternatives_and_why(service: Service) -> None:
    decision = service.client.get("/api/v1/decisions", params={"limit": 1}).json()["data"][0]
    explained = service.client.get(f"/api/v1/decisions/{decision['id']}/explain").json()
    assert {"free_gpus", "waiting_jobs", "gpu_utilization"} <= set(explained["features"])
    goodputs = [a["predicted_goodput"] for a in explained["alternatives"]]
    assert goodputs == sorted(goodputs, reverse=True)
    assert goodputs
    assert explained["chosen"]["predicted_goodput"] > 0
    assert "predicted goodput" in explained["why"]
    assert service.client.get("/api/v1/decisions/424242/explain").status_code == 404


def test_policies_list_the_active_version(service: Service) -> None:
    policies = service.client.get("/api/v1/policies").json()
    assert policies["count"] == 1
    active = service.client.get("/api/v1/policies/active").json()
    assert active["active"] is True
    assert active["kind"] == "rules"


def test_forecast_shows_the_demand_the_ticks_recorded(service: Service) -> None:
    """Every tick records the cluster's GPU demand and capacity; with no forecaster
    chain (an app built without one) ``NoForecast`` answers: no arrival expected, the
    peak is the demand now."""
    service.ticks(5)
    forecast = service.client.get("/api/v1/forecast", params={"minutes": 60}).json()
    with service.daemon.db.session() as session:
        demand = repo.list_metrics(session=session, names=["gpu_demand"], limit=1)[0].value
        capacity = repo.list_metrics(session=session, names=["gpu_capacity"], limit=1)[0].value
    assert demand > 0
    assert forecast["predictor"] == "none"
    assert forecast["fallback_reasons"] == []
    assert forecast["capacity_gpus"] == capacity == 32
    assert 1 <= len(forecast["points"]) <= 2  # 8 ticks within a minute or two
    assert forecast["points"][-1]["demand_gpus"] == demand
    assert forecast["now"]["15"] == {"p_arrival": 0.0, "q50": demand, "q90": demand, "q95": demand}


def test_metrics_count_decisions_ticks_and_requests(service: Service) -> None:
    service.ticks(2)
    decisions = service.client.get("/api/v1/decisions", params={"source": "policy"}).json()
    body = service.client.get("/metrics").text
    assert f'autotune_decisions_total{{source="policy"}} {float(decisions["count"])}' in body
    assert "autotune_tick_duration_seconds_count 5.0" in body  # 3 in the fixture
    assert 'autotune_api_request_duration_seconds_count{method="GET",route="/decisions"' in body
    assert "autotune_job_goodput{job=" in body
    assert 'autotune_jobs{state="running"}' in body
    assert service.client.get("/api/v1/metrics").status_code == 200


def test_readiness_needs_the_database_and_a_policy(service: Service, tmp_path: Path) -> None:
    assert service.client.get("/healthz").json()["status"] == "ok"
    assert service.client.get("/readyz").status_code == 200
    assert service.client.get("/api/v1/readyz").json() == {
        "status": "ready",
        "database": True,
        "policy_version": service.daemon.policy.version,
        "tick": {
            "ok": True,
            "consecutive_failures": 0,
            "failures_total": 0,
            "last_error": None,
            "last_failure_at": None,
            "fallback": False,
            "fallback_policy": None,
            "paused": None,
            "paused_since": None,
        },
        "leader": None,  # one daemon on its own: no leader lease
        "reasons": [],
    }
    fresh = Database(f"sqlite:///{tmp_path / 'fresh.db'}")
    fresh.upgrade()
    with TestClient(create_app(db=fresh, telemetry="simulator")) as client:
        response = client.get("/api/v1/readyz")
        assert response.status_code == 503
        assert response.json()["database"] is True
        assert response.json()["reasons"] == ["no active policy version"]
        assert response.json()["tick"] is None  # no decision loop attached to this app
        with fresh.engine.begin() as connection:
            connection.execute(text("DROP TABLE policy_versions"))
        assert client.get("/api/v1/readyz").json()["database"] is False
    fresh.dispose()


def test_cluster_names_its_telemetry_sources(service: Service) -> None:
    from autotune.daemon.telemetry import PsutilTelemetry

    service.app.state.host_telemetry = (PsutilTelemetry(),)
    cluster = service.client.get("/api/v1/cluster").json()
    assert cluster["telemetry_sources"] == ["simulator", "psutil"]
    readings = cluster["hosts"][0]["readings"]
    assert readings["cpu_count"] >= 1
    assert 0 < readings["memory_used_bytes"] < readings["memory_total_bytes"]


# --- dashboard ------------------------------------------------------------------------


def test_dashboard_is_self_contained(service: Service) -> None:
    page = service.client.get("/").text
    assert '<script src="/static/plotly.min.js">' in page
    assert "http://" not in page
    assert "https://" not in page
    script = service.client.get("/static/plotly.min.js")
    assert script.status_code == 200
    assert len(script.content) > 1_000_000
    data = service.client.get("/api/v1/dashboard").json()
    assert data["predictor"] == data["demand"]["predictor"] == "none"
    assert data["demand"]["demand_gpus"]
    assert data["demand"]["capacity_gpus"] == 32
    everything = service.client.get("/api/v1/decisions").json()["count"]
    assert len(data["decisions"]) == everything  # the first tick's included
    assert data["goodput"]


def test_two_overrides_pinning_one_gpu_apply_one_and_say_why_not_the_other(
    service: Service,
) -> None:
    service.submit(task="gpt-char", job_id="first", steps=10**7)
    service.submit(task="gpt-char", job_id="second", steps=10**7)
    service.ticks(1)
    same_gpu = [{"node_id": "t4-1", "gpu_index": 3}]
    ids = []
    for job_id in ("first", "second"):
        body = {"job_id": job_id, "placement": same_gpu, "ttl_s": 600, "reason": "mine"}
        response = service.client.post("/api/v1/overrides", json=body, headers=AUTH)
        assert response.status_code == 201, response.text
        ids.append(response.json()["id"])
    report = service.daemon.tick()  # must not over-commit the GPU (the cluster checks)
    honoured = {d.job_id: d for d in report.decisions if d.source == "override"}
    assert len(honoured) == 1
    winner = next(iter(honoured))
    loser = "second" if winner == "first" else "first"
    assert "not applied: its pinned GPUs are not free" in report.unplaced[loser]
    assert (
        service.client.get(f"/api/v1/jobs/{loser}")
        .json()["state_reason"]
        .startswith(f"override {ids[1] if loser == 'second' else ids[0]} not applied")
    )


def test_no_request_body_gets_a_5xx(service: Service) -> None:
    """Random JSON in every field of the write endpoints: always a 2xx or 4xx."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=20),
        st.sampled_from(["fp8", "topk", "a100-0", "t4-1", "gpt-char", "job-00000", "A100"]),
    )
    values = st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
        max_leaves=8,
    )
    job_fields = ["task", "job_id", "steps", "global_batch", "min_gpus", "max_gpus"]
    job_fields += ["priority", "constraints"]
    override_fields = ["job_id", "layout", "precision", "compression", "placement"]
    override_fields += ["ttl_s", "reason"]

    @settings(
        max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(
        job=st.dictionaries(st.sampled_from(job_fields), values),
        override=st.dictionaries(st.sampled_from(override_fields), values),
        slot=st.fixed_dictionaries(
            {"node_id": st.sampled_from(["a100-0", "t4-1", "x"]), "gpu_index": st.integers(-1, 9)}
        ),
    )
    def check(job: dict[str, Any], override: dict[str, Any], slot: dict[str, Any]) -> None:
        response = service.client.post("/api/v1/jobs", json=job, headers=AUTH)
        assert response.status_code < 500, response.text
        override = {"job_id": "job-00000", "ttl_s": 60, "reason": "r", **override}
        response = service.client.post("/api/v1/overrides", json=override, headers=AUTH)
        assert response.status_code < 500, response.text
        pinned = {"job_id": "job-00000", "ttl_s": 5, "reason": "r", "placement": [slot]}
        response = service.client.post("/api/v1/overrides", json=pinned, headers=AUTH)
        assert response.status_code < 500, response.text

    check()
