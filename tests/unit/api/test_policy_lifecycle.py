"""Policy versions through the API, followed by real ticks of the decision loop: register
a checkpoint (token, 422 when it does not load), activate it (the daemon swaps at its
next tick, no restart), roll back, shadow one (its decisions stored, never applied, never
a job's current decision), filter decisions by version, and the ``autotune policy``
commands against a served API."""

from __future__ import annotations

import json
import logging
import pickle
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import uvicorn
from fastapi.testclient import TestClient
from helpers import cli, free_port

from autotune.api.app import attach_daemon, create_app
from autotune.daemon.auth import TokenCheck, hash_token
from autotune.daemon.lifecycle import PolicyLifecycle
from autotune.daemon.tick import Daemon, DaemonParts
from autotune.db import Database
from autotune.db import repository as repo
from autotune.envs.simulator import SimConfig, SimulatedCluster
from autotune.policies.rules import RulesPolicy
from autotune.policies.serving import LearnedPolicy, checkpoint_hash, default_policy_checkpoint
from autotune.policies.versions import CheckpointPolicies

TOKEN = "lifecycle-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def perturbed_copy(target: Path, seed: int) -> Path:
    """The shipped checkpoint with its policy's weights moved: another version."""
    shutil.copytree(default_policy_checkpoint(), target)
    state_file = target / "module_state.pkl"
    with state_file.open("rb") as f:
        state = pickle.load(f)  # a state dict of numpy arrays
    rng = np.random.default_rng(seed)
    for key, value in state.items():
        if key.startswith(("encoder.", "logits.")):
            state[key] = (value + rng.normal(0.0, 0.3, value.shape)).astype(value.dtype)
    with state_file.open("wb") as f:
        pickle.dump(state, f)
    return target


@pytest.fixture(scope="module")
def candidate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return perturbed_copy(tmp_path_factory.mktemp("checkpoints") / "candidate", seed=0)


class Lab:
    """A daemon on the shipped learned policy, following the registry, with its API."""

    def __init__(self, database: Database) -> None:
        self.db = database
        self.loader = CheckpointPolicies(round_s=300, epsilon=0.0, seed=0, forecast=False)
        policy = self.loader.build(
            "ppo", str(default_policy_checkpoint()), shadow=False, follow=None
        )
        self.shipped = policy.version
        self.daemon = Daemon(
            DaemonParts(
                db=database,
                backend=SimulatedCluster(SimConfig(seed=1, initial_jobs=6, max_jobs=10)),
                policy=policy,
                fallback=RulesPolicy(),
                lifecycle=PolicyLifecycle(self.loader, database),
            )
        )
        self.daemon.start()
        self.app = create_app(
            db=database, telemetry="simulator", token_check=TokenCheck([hash_token(TOKEN)])
        )
        attach_daemon(self.app, self.daemon)
        self.client = TestClient(self.app)

    def ticks(self, n: int) -> None:
        for _ in range(n):
            self.daemon.tick()

    def post(self, path: str, body: Any = None, status: int = 200) -> Any:
        response = self.client.post(f"/api/v1{path}", json=body, headers=AUTH)
        assert response.status_code == status, response.text
        return response.json()

    def get(self, path: str, **params: Any) -> Any:
        response = self.client.get(f"/api/v1{path}", params=params)
        assert response.status_code == 200, response.text
        return response.json()

    def register(self, checkpoint: Path, name: str, status: int = 201) -> dict[str, Any]:
        result: dict[str, Any] = self.post(
            "/policies", {"checkpoint": str(checkpoint), "name": name}, status
        )
        return result

    def submit(self, job_id: str) -> None:
        body = {"task": "gpt-char", "job_id": job_id, "steps": 100_000, "max_gpus": 2}
        self.post("/jobs", body, 201)


@pytest.fixture
def lab(database: Database) -> Iterator[Lab]:
    lab = Lab(database)
    lab.ticks(3)
    with lab.client:
        yield lab


def test_register_needs_the_token_and_a_checkpoint_that_loads(
    lab: Lab, candidate: Path, tmp_path: Path
) -> None:
    body = {"checkpoint": str(candidate), "name": "candidate"}
    assert lab.client.post("/api/v1/policies", json=body).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert lab.client.post("/api/v1/policies", json=body, headers=wrong).status_code == 401
    missing = lab.post("/policies", {"checkpoint": str(tmp_path / "none"), "name": "x"}, 422)
    assert "no checkpoint folder" in str(missing)
    relative = lab.post("/policies", {"checkpoint": "runs/ppo", "name": "x"}, 422)
    assert "absolute path" in str(relative)
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "metadata.json").write_text("{not json")
    refused = lab.post("/policies", {"checkpoint": str(junk), "name": "x"}, 422)
    assert refused["detail"][0]["loc"] == ["body", "checkpoint"]
    assert "cannot load an RLModule" in refused["detail"][0]["msg"]
    bad_kind = lab.post("/policies", {**body, "kind": "rules"}, 422)
    assert bad_kind["detail"][0]["loc"] == ["body", "kind"]

    registered = lab.register(candidate, "candidate")
    content = checkpoint_hash(candidate)
    assert registered["version"] == f"ppo-{content[:12]}"
    assert registered["content_hash"] == content
    assert registered["name"] == "candidate"
    assert registered["state"] == "registered"
    # The same content from another folder, under another name, is the same version.
    again = lab.register(shutil.copytree(candidate, tmp_path / "copy"), "again", status=200)
    assert again["version"] == registered["version"]
    assert again["name"] == "candidate"
    listed = {p["version"]: p for p in lab.get("/policies")["data"]}
    assert listed[registered["version"]]["state"] == "registered"
    assert listed[lab.shipped]["state"] == "active"
    assert listed[lab.shipped]["checkpoint_path"]  # recorded, so it can be rolled back to
    assert lab.daemon.policy.version == lab.shipped  # registering decides nothing


def test_activate_swaps_at_the_next_tick_and_rollback_goes_back(lab: Lab, candidate: Path) -> None:
    version = lab.register(candidate, "candidate")["version"]
    assert lab.client.post(f"/api/v1/policies/{version}/activate").status_code == 401
    assert lab.post("/policies/nope-123/activate", status=404)["detail"]
    activated = lab.post(f"/policies/{version}/activate")
    assert activated["state"] == "active"
    assert lab.get("/policies/active")["version"] == version
    before = lab.daemon.policy
    assert before.version == lab.shipped  # nothing changes before the next tick
    history = list(before.encoder._busy)  # type: ignore[attr-defined]
    lab.submit("after-swap")
    report = lab.daemon.tick()
    swapped = lab.daemon.policy
    assert isinstance(swapped, LearnedPolicy)
    assert swapped.version == version
    # The forecast feature's history went over: one more round, not a fresh start.
    assert swapped.encoder._busy[:-1] == history
    assert report.decisions
    assert {d.policy_version for d in report.decisions} == {version}

    mine = lab.get("/decisions", policy_version=version)
    assert mine["count"] == len(report.decisions)
    assert {d["policy_version"] for d in mine["data"]} == {version}
    shipped = lab.get("/decisions", policy_version=lab.shipped)
    assert shipped["count"] > 0
    assert {d["policy_version"] for d in shipped["data"]} == {lab.shipped}
    assert lab.get("/decisions", policy_version="nope")["count"] == 0

    rolled = lab.post("/policies/rollback")
    assert rolled["version"] == lab.shipped
    lab.daemon.tick()
    assert lab.daemon.policy.version == lab.shipped
    nothing = lab.post("/policies/rollback", status=409)
    assert "nothing to roll back to" in nothing["detail"]
    actions = [(e["action"], e["version"]) for e in lab.get("/policies/events")["data"]]
    assert actions[:2] == [("rollback", lab.shipped), ("activate", version)]


def test_a_checkpoint_that_stops_loading_keeps_the_policy_and_says_why(
    lab: Lab, tmp_path: Path
) -> None:
    broken = perturbed_copy(tmp_path / "broken", seed=1)
    version = lab.register(broken, "broken")["version"]
    (broken / "module_state.pkl").unlink()
    lab.post(f"/policies/{version}/activate")
    lab.ticks(2)  # the tick that fails to load it, and one more that does not retry
    assert lab.daemon.policy.version == lab.shipped
    assert lab.daemon.health.ok
    listed = {p["version"]: p for p in lab.get("/policies")["data"]}
    assert listed[lab.shipped]["state"] == "active"
    assert listed[version]["state"] == "registered"
    assert listed[version]["last_error"]
    failures = lab.get("/policies/events", version=version)["data"]
    assert [e["action"] for e in failures].count("activate_failed") == 1
    assert failures[0]["detail"]["kept"] == lab.shipped


def test_shadow_decisions_are_stored_never_applied_nor_taken_as_the_jobs(
    lab: Lab, candidate: Path
) -> None:
    version = lab.register(candidate, "candidate")["version"]
    assert lab.client.post(f"/api/v1/policies/{version}/shadow").status_code == 401
    assert lab.post(f"/policies/{lab.shipped}/shadow", status=409)["detail"]
    assert lab.client.get("/api/v1/policies/shadow").status_code == 404
    assert lab.post(f"/policies/{version}/shadow")["state"] == "shadow"
    for n in range(4):
        lab.submit(f"shadowed-{n}")
        lab.daemon.tick()
    assert lab.daemon.policy.version == lab.shipped  # the shadow never decides for real

    shadow = lab.get("/decisions", source="shadow", limit=1000)
    assert shadow["count"] > 0
    for row in shadow["data"]:
        assert row["policy_version"] == version
        assert row["applied_at"] is None
    assert (
        lab.get("/decisions", source="shadow", policy_version=version)["count"] == (shadow["count"])
    )
    taken = lab.get("/decisions", limit=1000)["data"]
    assert taken
    assert all(d["source"] != "shadow" and d["applied_at"] for d in taken)
    explained = lab.get(f"/decisions/{shadow['data'][0]['id']}/explain")
    assert explained["source"] == "shadow"
    assert "predicted_goodput" in explained["chosen"]

    summary = lab.get("/policies/shadow")
    assert summary["version"] == version
    assert summary["active_version"] == lab.shipped
    assert summary["ticks"] == 4
    assert 0.0 <= summary["agreement"] <= 1.0
    assert summary["agreement_recent"] == pytest.approx(summary["agreement"])
    assert summary["predicted_goodput"]["shadow"] > 0
    assert summary["predicted_goodput"]["active"] > 0
    assert summary["decisions"] == shadow["count"]
    dashboard = lab.get("/dashboard")
    assert len(dashboard["shadow"]["agreement"]["value"]) == 4
    assert dashboard["shadow"]["version"] == version
    assert "shadow" in {d["source"] for d in dashboard["decisions"]}

    # A job's current decision is never the shadow's: the cluster's GPUs, an override's
    # base and a restarted daemon all read the newest decision taken.
    with lab.db.session() as session:
        latest = repo.latest_decision_records(session=session)
        newest_shadow: dict[str, int] = {}
        for record in repo.list_decisions(session=session, source="shadow", limit=1000).rows:
            assert record.decision.decision_id is not None
            newest_shadow.setdefault(record.decision.job_id, record.decision.decision_id)
    assert all(r.decision.source != "shadow" for r in latest.values())
    shadowed_later = [
        job_id
        for job_id, shadow_id in newest_shadow.items()
        if job_id in latest and shadow_id > (latest[job_id].decision.decision_id or 0)
    ]
    assert shadowed_later  # for some job the shadow decided after the decision taken
    running = {job["job_id"] for job in lab.get("/jobs", state="running", limit=1000)["data"]}
    held = 0
    for job_id in running:
        placement = latest[job_id].decision.placement
        assert placement is not None
        held += sum(slot.gpu_milli for slot in placement.ranks)
    assert lab.get("/cluster")["gpus_allocated"] == pytest.approx(held / 1000)

    restarted = Daemon(
        DaemonParts(
            db=lab.db,
            backend=(again := SimulatedCluster(SimConfig(seed=1, initial_jobs=6, max_jobs=10))),
            policy=RulesPolicy(),
        )
    )
    restarted.start()
    resumed = {j.spec.job_id: j for j in again.observe().jobs}
    for job_id in shadowed_later:
        if job_id in resumed and latest[job_id].decision.placement is not None:
            assert resumed[job_id].config == latest[job_id].decision.config
    with lab.db.session() as session:
        still = repo.list_decisions(session=session, source="shadow", limit=1000).rows
    assert all(r.applied_at is None for r in still)  # resuming applied none of them

    stopped = lab.client.delete("/api/v1/policies/shadow", headers=AUTH)
    assert stopped.status_code == 200
    assert stopped.json()["version"] == version
    lab.daemon.tick()
    assert lab.get("/decisions", source="shadow")["count"] == shadow["count"]
    assert lab.client.get("/api/v1/policies/shadow").status_code == 404
    assert lab.client.delete("/api/v1/policies/shadow", headers=AUTH).status_code == 404


def test_a_daemon_on_the_rules_refuses_registry_changes(database: Database) -> None:
    daemon = Daemon(
        DaemonParts(db=database, backend=SimulatedCluster(SimConfig(seed=1)), policy=RulesPolicy())
    )
    daemon.start()
    app = create_app(
        db=database, telemetry="simulator", token_check=TokenCheck([hash_token(TOKEN)])
    )
    attach_daemon(app, daemon)
    with TestClient(app) as client:
        version = RulesPolicy().version
        refused = client.post(f"/api/v1/policies/{version}/activate", headers=AUTH)
        assert refused.status_code == 409
        assert "--policy rules" in refused.json()["detail"]
        assert client.get("/api/v1/policies").json()["data"][0]["state"] == "active"


def test_the_policy_commands_drive_a_served_api(lab: Lab, candidate: Path) -> None:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(lab.app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    url = f"http://127.0.0.1:{port}"
    try:
        common = ("--url", url, "--token", TOKEN)
        denied = cli("policy", "register", str(candidate), "--name", "c", "--url", url)
        assert denied.exit_code in (1, 2)
        registered = cli("policy", "register", str(candidate), "--name", "c", *common, "--json")
        assert registered.exit_code == 0, registered.stderr
        version = json.loads(registered.stdout)["version"]
        listed = cli("policy", "list", "--url", url, "--json")
        assert listed.exit_code == 0
        states = {p["version"]: p["state"] for p in json.loads(listed.stdout)["data"]}
        assert states[lab.shipped] == "active"
        assert states[version] == "registered"
        assert "policy version(s)" in cli("policy", "list", "--url", url).stdout
        assert cli("policy", "shadow", version, *common).exit_code == 0
        lab.daemon.tick()
        shown = cli("policy", "shadow", "--url", url)
        assert shown.exit_code == 0, shown.stderr
        assert "agreement" in shown.stdout
        assert cli("policy", "shadow", "--stop", *common).exit_code == 0
        assert cli("policy", "activate", version, *common).exit_code == 0
        lab.submit("via-cli")
        lab.daemon.tick()
        assert lab.daemon.policy.version == version
        decisions = cli("decisions", "--policy-version", version, "--url", url, "--json")
        assert decisions.exit_code == 0
        rows = json.loads(decisions.stdout)["data"]
        assert rows
        assert {d["policy_version"] for d in rows} == {version}
        rolled = cli("policy", "rollback", *common)
        assert rolled.exit_code == 0
        assert lab.shipped in rolled.stdout
        again = cli("policy", "rollback", *common)
        assert again.exit_code == 2
        assert "nothing to roll back to" in again.stderr
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_a_restarted_daemon_resumes_the_active_version(
    lab: Lab, candidate: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from types import SimpleNamespace

    from autotune.cli.daemon import _resumed_policy

    settings = SimpleNamespace(round_period_s=300.0, exploration_epsilon=0.05, seed=0)
    # The shipped version is active, with the checkpoint the lifecycle recorded.
    resumed = _resumed_policy(lab.db, settings)
    assert resumed.version == lab.shipped
    moved = shutil.copytree(candidate, tmp_path / "moved")
    version = lab.register(moved, "moved")["version"]
    lab.post(f"/policies/{version}/activate")
    resumed = _resumed_policy(lab.db, settings)
    assert isinstance(resumed, LearnedPolicy)
    assert resumed.version == version
    assert resumed.epsilon == 0.05
    shutil.rmtree(moved)
    with caplog.at_level(logging.WARNING, logger="autotune"):
        assert _resumed_policy(lab.db, settings) is None  # the shipped one starts instead
    assert "policy.resume_failed" in [r.getMessage() for r in caplog.records]
    lab.post(f"/policies/{RulesPolicy().version}/activate")
    assert isinstance(_resumed_policy(lab.db, settings), RulesPolicy)
