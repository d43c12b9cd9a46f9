"""``GET /api/v1/dashboard``'s cluster map and job configurations, over a database filled
by real ticks of the decision loop: every running rank on its GPU, lost nodes, parked
nodes counted, each job's newest decision (an override's too), the decisions' policy
versions, and each tenant's GPUs held against its quota."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from autotune.api.app import attach_daemon, create_app
from autotune.api.routes.dashboard import JOBS_SHOWN
from autotune.daemon.auth import TokenCheck, hash_token
from autotune.daemon.tick import Daemon, DaemonParts
from autotune.db import Database
from autotune.db import repository as repo
from autotune.db.tables import JobRow
from autotune.demand import NoForecast
from autotune.envs.presets import small_nodes
from autotune.envs.simulator import SimConfig, SimulatedCluster
from autotune.policies.rules import RulesPolicy
from autotune.provisioning import Provisioner

TOKEN = "dashboard-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Cluster:
    """A daemon on the simulated cluster, with its API in the same process."""

    def __init__(
        self, database: Database, sim: SimulatedCluster, provisioner: Provisioner | None = None
    ) -> None:
        self.db = database
        self.sim = sim
        self.daemon = Daemon(
            DaemonParts(db=database, backend=sim, policy=RulesPolicy(), provisioner=provisioner)
        )

    def start(self, ticks: int) -> TestClient:
        self.daemon.start()
        self.ticks(ticks)
        app = create_app(
            db=self.db, telemetry="simulator", token_check=TokenCheck([hash_token(TOKEN)])
        )
        attach_daemon(app, self.daemon)
        return TestClient(app)

    def ticks(self, n: int) -> None:
        for _ in range(n):
            self.daemon.tick()


@pytest.fixture
def cluster(database: Database) -> Iterator[tuple[Cluster, TestClient]]:
    lab = Cluster(database, SimulatedCluster(SimConfig(seed=1, initial_jobs=8, max_jobs=8)))
    with lab.start(ticks=3) as client:
        yield lab, client


def dashboard(client: TestClient) -> dict[str, Any]:
    response = client.get("/api/v1/dashboard")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def newest_taken(client: TestClient, job_id: str) -> dict[str, Any]:
    decision: dict[str, Any] = client.get(
        "/api/v1/decisions", params={"job": job_id, "limit": 1}
    ).json()["data"][0]
    return decision


def test_the_map_puts_each_running_rank_on_its_gpu(
    cluster: tuple[Cluster, TestClient],
) -> None:
    lab, client = cluster
    data = dashboard(client)
    nodes = client.get("/api/v1/cluster").json()
    running = client.get("/api/v1/jobs", params={"state": "running"}).json()["data"]
    assert running
    expected = set()
    for job in running:
        decision = newest_taken(client, job["job_id"])
        for slot in decision["placement"]["ranks"]:
            expected.add(
                (slot["node_id"], slot["gpu_index"], job["job_id"], slot["rank"], slot["gpu_milli"])
            )
    shown = {
        (node["node_id"], h["gpu_index"], h["job_id"], h["rank"], h["gpu_milli"])
        for node in data["cluster"]["nodes"]
        for h in node["held"]
    }
    assert shown == expected
    # Every node the daemon recorded, as /cluster lists them; no GPU held twice over.
    by_id = {n["node_id"]: n for n in nodes["nodes"]}
    assert [n["node_id"] for n in data["cluster"]["nodes"]] == sorted(by_id)
    for node in data["cluster"]["nodes"]:
        assert node["gpu_count"] == by_id[node["node_id"]]["gpu_count"]
        assert node["gpu_model"] == by_id[node["node_id"]]["gpu_model"]
        assert node["state"] == "alive"
        assert sum(h["gpu_milli"] for h in node["held"]) / 1000 == pytest.approx(
            by_id[node["node_id"]]["gpus_allocated"]
        )
        assert all(0 <= h["gpu_index"] < node["gpu_count"] for h in node["held"])
        per_gpu: dict[int, int] = {}
        for h in node["held"]:
            per_gpu[h["gpu_index"]] = per_gpu.get(h["gpu_index"], 0) + h["gpu_milli"]
        assert all(milli <= 1000 for milli in per_gpu.values())
    assert data["cluster"]["gpus_total"] == nodes["gpus_total"] == 32
    assert data["cluster"]["gpus_held"] == pytest.approx(nodes["gpus_allocated"])
    # The newest tick's figures: the capacity; nothing parked without a provisioner.
    with lab.db.session() as session:
        newest = repo.list_metrics(session=session, names=["gpu_utilization"], limit=1)[0]
    assert datetime.fromisoformat(data["cluster"]["at"]) == newest.recorded_at
    assert data["cluster"]["capacity_gpus"] == 32
    assert data["cluster"]["nodes_parked"] is None
    assert data["cluster"]["provisioning_target_gpus"] is None
    assert data["cluster"]["provisioning_recommended_park"] is None


def test_a_lost_node_is_on_the_map_as_lost(cluster: tuple[Cluster, TestClient]) -> None:
    lab, client = cluster
    node = lab.sim.snapshot().nodes[-1]
    with lab.db.session() as session:  # as the loop records a node the backend lost
        assert repo.upsert_nodes(session=session, nodes=[], lost=[node]) == [node.node_id]
    data = dashboard(client)
    shown = {n["node_id"]: n for n in data["cluster"]["nodes"]}
    assert shown[node.node_id]["state"] == "lost"
    assert shown[node.node_id]["lost_at"] is not None
    assert all(n["state"] == "alive" for i, n in shown.items() if i != node.node_id)
    assert data["cluster"]["gpus_total"] == 32 - node.gpu_count


def test_parked_nodes_are_on_the_map_with_the_provisioners_target(database: Database) -> None:
    sim = SimulatedCluster(SimConfig(nodes=tuple(small_nodes()), initial_jobs=1, max_jobs=1))
    lab = Cluster(database, sim, Provisioner(NoForecast()))
    with lab.start(ticks=3) as client:
        data = dashboard(client)
        listed = {n["node_id"]: n["state"] for n in client.get("/api/v1/cluster").json()["nodes"]}
    snapshot = sim.snapshot()
    off = len(snapshot.parked_nodes) + len(snapshot.waking_nodes)
    assert off > 0
    figures = data["cluster"]
    assert figures["nodes_parked"] == off
    shown = {n["node_id"]: n["state"] for n in figures["nodes"]}
    expected = {
        **{n.node_id: "alive" for n in snapshot.nodes},
        **{n.node_id: "parked" for n in snapshot.parked_nodes},
        **{n.node_id: "waking" for n in snapshot.waking_nodes},
    }
    assert shown == expected
    assert listed == expected
    assert figures["gpus_total"] == sum(n.gpu_count for n in snapshot.nodes)
    assert figures["capacity_gpus"] == 16
    assert figures["provisioning_target_gpus"] is not None
    assert 0 < figures["provisioning_target_gpus"] <= 16
    with database.session() as session:
        recommended = repo.list_metrics(
            session=session, names=["provisioning_recommended_park"], limit=1
        )[0].value
    assert figures["provisioning_recommended_park"] == recommended


def test_configs_are_each_jobs_newest_decision_an_overrides_too(
    cluster: tuple[Cluster, TestClient],
) -> None:
    lab, client = cluster
    running = [j["job_id"] for j in client.get("/api/v1/jobs?state=running").json()["data"]]
    pinned = running[0]
    body = {"job_id": pinned, "precision": {"ffn": "fp32"}, "ttl_s": 600, "reason": "check"}
    response = client.post("/api/v1/overrides", json=body, headers=AUTH)
    assert response.status_code == 201, response.text
    override_id = response.json()["id"]
    lab.ticks(1)
    data = dashboard(client)
    jobs = client.get("/api/v1/jobs", params={"limit": JOBS_SHOWN}).json()["data"]
    configs = data["configs"]
    running = [j["job_id"] for j in jobs if j["state"] == "running"]
    assert set(running) <= set(configs)
    assert set(configs) <= {j["job_id"] for j in jobs}  # no decision: no entry
    for job_id, shown in configs.items():
        decision = newest_taken(client, job_id)
        assert shown["decision_id"] == decision["id"]
        assert shown["config"] == decision["config"]
        assert shown["source"] == decision["source"]
        assert shown["policy_version"] == decision["policy_version"]
        assert shown["override_id"] == decision["override_id"]
        assert shown["preempt"] == decision["preempt"]
        ranks = decision["placement"]["ranks"] if decision["placement"] else []
        assert shown["gpus"] == sum(r["gpu_milli"] for r in ranks) / 1000
        assert shown["nodes"] == sorted({r["node_id"] for r in ranks})
    assert configs[pinned]["source"] == "override"
    assert configs[pinned]["override_id"] == override_id
    assert configs[pinned]["config"]["precision"]["ffn"] == "fp32"


def test_decisions_name_their_policy_version_and_the_answer_its_time(
    cluster: tuple[Cluster, TestClient],
) -> None:
    _lab, client = cluster
    data = dashboard(client)
    assert data["decisions"]
    assert {d["policy_version"] for d in data["decisions"]} == {RulesPolicy().version}
    assert all(len(d["reason"]) <= 200 for d in data["decisions"])
    assert datetime.fromisoformat(data["generated_at"]).tzinfo is not None
    schema = client.get("/openapi.json").json()
    answer = schema["paths"]["/api/v1/dashboard"]["get"]["responses"]["200"]
    assert answer["content"]["application/json"]["schema"]["$ref"].endswith("/DashboardPublic")


def test_an_empty_database_gives_an_empty_map(database: Database) -> None:
    with TestClient(create_app(db=database, telemetry="simulator")) as client:
        data = dashboard(client)
    assert data["cluster"] == {
        "nodes": [],
        "gpus_total": 0,
        "gpus_held": 0.0,
        "at": None,
        "capacity_gpus": None,
        "nodes_parked": None,
        "provisioning_target_gpus": None,
        "provisioning_recommended_park": None,
    }
    assert data["configs"] == {}
    assert data["decisions"] == []
    assert data["events"] == []
    # The tenant every database has from migration 0013, holding nothing.
    assert [
        {k: t[k] for k in ("name", "nominal_gpus", "gpus_held", "borrow", "lend", "weight")}
        for t in data["tenants"]
    ] == [
        {
            "name": "default",
            "nominal_gpus": 0,
            "gpus_held": 0.0,
            "borrow": True,
            "lend": True,
            "weight": 1.0,
        }
    ]


def test_tenants_show_the_gpus_they_hold_against_their_quota(
    cluster: tuple[Cluster, TestClient],
) -> None:
    lab, client = cluster
    response = client.post(
        "/api/v1/tenants",
        json={"name": "vision", "gpus_by_model": {"V100": 2}, "gpus": 32, "weight": 2.0},
        headers=AUTH,
    )
    assert response.status_code == 201, response.text
    # One running job becomes vision's (as if its member's token had submitted it).
    moved = client.get("/api/v1/jobs", params={"state": "running"}).json()["data"][0]["job_id"]
    with lab.db.session() as session:
        session.execute(update(JobRow).where(JobRow.job_id == moved).values(tenant="vision"))
    data = dashboard(client)
    tenants = {t["name"]: t for t in data["tenants"]}
    assert [t["name"] for t in data["tenants"]] == ["default", "vision"]
    # What the map shows each tenant's jobs hold, per GPU model.
    expected: dict[str, dict[str, float]] = {"default": {}, "vision": {}}
    for node in data["cluster"]["nodes"]:
        for h in node["held"]:
            held = expected["vision" if h["job_id"] == moved else "default"]
            held[node["gpu_model"]] = held.get(node["gpu_model"], 0.0) + h["gpu_milli"] / 1000
    for name, by_model in expected.items():
        assert tenants[name]["gpus_held"] == pytest.approx(sum(by_model.values()))
        assert tenants[name]["gpus_held_by_model"] == pytest.approx(by_model)
    assert tenants["vision"]["gpus_held"] > 0
    assert tenants["default"]["gpus_held"] > 0
    assert sum(t["gpus_held"] for t in tenants.values()) == pytest.approx(
        data["cluster"]["gpus_held"]
    )
    # Quotas as set: default's is 0 (it borrows all it holds), vision's 32.
    assert {k: tenants["vision"][k] for k in ("nominal_gpus", "borrow", "lend", "weight")} == {
        "nominal_gpus": 32,
        "borrow": True,
        "lend": True,
        "weight": 2.0,
    }
    assert tenants["default"]["nominal_gpus"] == 0
    # One definition: what GET /tenants says.
    assert data["tenants"] == client.get("/api/v1/tenants").json()["data"]
    # A change of quota shows at the next read, though the tick's answer is kept.
    assert dashboard(client) == data
    response = client.patch("/api/v1/tenants/default", json={"gpus": 24}, headers=AUTH)
    assert response.status_code == 200, response.text
    after = {t["name"]: t for t in dashboard(client)["tenants"]}
    assert after["default"]["nominal_gpus"] == 24
    assert after["default"]["gpus_held"] == tenants["default"]["gpus_held"]
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    items = schema["DashboardPublic"]["properties"]["tenants"]["items"]
    assert items["$ref"].endswith("/TenantPublic")


def test_job_events_are_listed_newest_first(database: Database) -> None:
    with database.session() as session:
        repo.record_job_events(
            session=session,
            events=[
                ("a", {"kind": "node_lost", "at": 1.9e9, "nodes": ["n1"], "step": 40}),
                ("b", {"kind": "grad_norm_growth", "at": 1.9e9 + 1, "step": 7}),
            ],
        )
    with TestClient(create_app(db=database, telemetry="simulator")) as client:
        events = dashboard(client)["events"]
    assert [(e["job_id"], e["kind"]) for e in events] == [
        ("b", "grad_norm_growth"),
        ("a", "node_lost"),
    ]
    assert events[1]["detail"] == {"nodes": ["n1"], "step": 40}
