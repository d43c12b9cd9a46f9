"""The daemon as a user runs it: jobs through the API, an override honoured and
expiring, a SIGKILL, and a restart that finds everything it had committed."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import Api, DaemonProcess, free_port, wait_for

pytestmark = pytest.mark.subprocess

TICK_S = 0.4


@pytest.fixture(params=["sqlite"])
def db_url(request: pytest.FixtureRequest) -> str | None:
    """The daemon's database: its default SQLite file (None), or PostgreSQL."""
    if request.param == "sqlite":
        return None
    database = request.getfixturevalue("postgres_database")
    return str(database.url)


@pytest.fixture
def daemons(tmp_path: Path, db_url: str | None) -> Iterator[Callable[[int, str], DaemonProcess]]:
    started: list[DaemonProcess] = []

    def start(port: int, name: str) -> DaemonProcess:
        daemon = DaemonProcess(tmp_path, port, name, db_url, tick_s=TICK_S)
        started.append(daemon)
        return daemon

    try:
        yield start
    finally:
        for daemon in started:
            daemon.stop()


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_overrides_are_honoured_expire_and_survive_a_sigkill(
    tmp_path: Path, daemons: Callable[[int, str], DaemonProcess]
) -> None:
    port = free_port()
    api = Api(port)
    first = daemons(port, "first")
    wait_for("the API", lambda: api.get("/healthz")["status"] == "ok")
    token = first.api_token()

    # Jobs: mutations need the token.
    job = {"task": "gpt-125m", "job_id": "lm", "min_gpus": 1, "max_gpus": 4, "steps": 10**6}
    assert api.call("POST", "/jobs", job)[0] == 401
    assert api.call("POST", "/jobs", job, token="wrong")[0] == 401
    status, created = api.call("POST", "/jobs", job, token=token)
    assert status == 201, created
    assert created["state"] == "pending"
    other = {"task": "gpt-char", "job_id": "char", "max_gpus": 2, "steps": 10**6}
    assert api.call("POST", "/jobs", other, token=token)[0] == 201
    assert api.call("POST", "/jobs", job, token=token)[0] == 409

    first_decision = wait_for(
        "a policy decision for lm",
        lambda: api.get("/decisions?job=lm")["data"],
    )[0]
    assert first_decision["source"] == "policy"
    assert first_decision["override_id"] is None
    wait_for("lm running", lambda: api.get("/jobs/lm")["state"] == "running")

    # An override: 401 without the token, 422 when infeasible, 201 when it fits.
    pin = {
        "job_id": "lm",
        "layout": {"world_size": 2},
        "compression": {"kind": "topk", "ratio": 0.01},
        "ttl_s": 2.0,
        "reason": "compare top-k",
    }
    assert api.call("POST", "/overrides", pin)[0] == 401
    status, rejected = api.call(
        "POST", "/overrides", {**pin, "layout": {"world_size": 8}}, token=token
    )
    assert status == 422
    assert "allows 1-4" in rejected["detail"][0]["msg"]
    status, override = api.call("POST", "/overrides", pin, token=token)
    assert status == 201, override
    override_id = override["id"]

    honoured = wait_for(
        "the override's decision",
        lambda: [
            d
            for d in api.get("/decisions?job=lm&source=override")["data"]
            if d["override_id"] == override_id
        ],
        timeout_s=3 * TICK_S + 5,
    )[0]
    assert honoured["config"]["layout"]["world_size"] == 2
    assert honoured["config"]["compression"] == {"kind": "topk", "ratio": 0.01, "rank": None}
    assert len(honoured["placement"]["ranks"]) == 2
    explained = api.get(f"/decisions/{honoured['id']}/explain")
    assert explained["override_id"] == override_id
    assert explained["why"].startswith(f"override {override_id}: compare top-k")
    assert explained["alternatives"]

    # At its TTL the policy takes the job back, and the log says so.
    released = wait_for(
        "the policy's decision after the TTL",
        lambda: [
            d
            for d in api.get("/decisions?job=lm&source=policy")["data"]
            if d["id"] > honoured["id"]
        ],
        timeout_s=2.0 + 3 * TICK_S + 5,
    )[0]
    assert f"override {override_id} ended" in released["reason"]
    assert api.get(f"/overrides/{override_id}")["active"] is False

    # A second override, long-lived: active when the daemon dies.
    status, lasting = api.call(
        "POST",
        "/overrides",
        {"job_id": "lm", "precision": {"ffn": "fp32"}, "ttl_s": 3600, "reason": "stay safe"},
        token=token,
    )
    assert status == 201, lasting
    wait_for(
        "the lasting override's decision",
        lambda: (
            api.get("/decisions?job=lm&source=override&limit=1")["data"][0]["override_id"]
            == lasting["id"]
        ),
    )
    time.sleep(2 * TICK_S)
    before = {
        "decisions": api.get("/decisions?limit=1000"),
        "overrides": api.get("/overrides"),
        "policy": api.get("/policies/active"),
        "jobs": {j["job_id"]: j for j in api.get("/jobs")["data"]},
    }

    first.process.send_signal(signal.SIGKILL)
    first.process.wait(timeout=10)
    second = daemons(port, "second")
    wait_for("the API after the restart", lambda: api.get("/readyz")["status"] == "ready")
    assert "API token" not in second.stdout_path.read_text()  # the stored hash is kept

    after_decisions = api.get("/decisions?limit=1000")
    survived = {d["id"]: d for d in after_decisions["data"]}
    for decision in before["decisions"]["data"]:
        assert survived[decision["id"]] == decision
    assert api.get("/overrides") == before["overrides"]
    assert api.get(f"/overrides/{lasting['id']}")["active"] is True
    assert api.get("/policies/active")["version"] == before["policy"]["version"]
    jobs_after = {j["job_id"]: j for j in api.get("/jobs")["data"]}
    assert set(jobs_after) == set(before["jobs"])
    assert jobs_after["lm"]["state"] == "running"
    assert jobs_after["lm"]["progress"] >= before["jobs"]["lm"]["progress"]
    # The token from the first start still works, and the daemon goes on deciding.
    assert api.call("POST", "/jobs", {**other, "job_id": "late"}, token=token)[0] == 201
    wait_for(
        "a decision for the job submitted after the restart",
        lambda: api.get("/decisions?job=late")["data"],
    )
    # The resumed job keeps its honoured override: no second decision for it.
    time.sleep(2 * TICK_S)
    lm_after = api.get("/decisions?job=lm&limit=1000")["data"]
    assert len(lm_after) == len([d for d in before["decisions"]["data"] if d["job_id"] == "lm"])
    events = [
        json.loads(line)
        for line in second.stderr_path.read_text().splitlines()
        if line.startswith("{")
    ]
    assert {"job.resumed"} <= {e["event"] for e in events}
    assert token not in first.stderr_path.read_text() + second.stderr_path.read_text()


# --- the command-line client ----------------------------------------------------------


def test_cli_client_submits_lists_explains_overrides_and_cancels(
    tmp_path: Path, daemons: Callable[[int, str], DaemonProcess]
) -> None:
    from typer.testing import CliRunner

    from autotune.cli import app

    port = free_port()
    api = Api(port)
    daemon = daemons(port, "cli")
    wait_for("the API", lambda: api.get("/healthz")["status"] == "ok")
    token = daemon.api_token()
    url = f"http://127.0.0.1:{port}"
    runner = CliRunner()

    def run(*args: str, env: dict[str, str] | None = None) -> Any:
        result = runner.invoke(app, [*args, "--url", url], env=env or {"AUTOTUNE_TOKEN": token})
        assert result.exit_code == 0, (args, result.output)
        if "--json" in args:
            return json.loads(result.stdout)
        return result.stdout

    submitted = run(
        "job",
        "submit",
        "gpt-char",
        "--id",
        "c1",
        "--max-gpus",
        "2",
        "--steps",
        "1000000000",
        "--json",
    )
    assert submitted["job_id"] == "c1"
    assert "c1" in run("job", "list")  # the table
    decision = wait_for(
        "a decision for c1", lambda: run("decisions", "--job", "c1", "--json")["data"]
    )[0]
    explained = run("decisions", "--explain", str(decision["id"]), "--json")
    assert explained["decision_id"] == decision["id"]
    assert "alternatives on the same GPUs" in run("decisions", "--explain", str(decision["id"]))
    override = run(
        "override",
        "set",
        "c1",
        "--ttl",
        "600",
        "--reason",
        "try int8",
        "--compression",
        "int8",
        "--precision",
        "ffn=fp32",
        "--json",
    )
    assert override["pin"] == {"precision": {"ffn": "fp32"}, "compression": {"kind": "int8"}}
    assert run("override", "list", "--active", "--json")["count"] == 1
    wait_for(
        "the override's decision",
        lambda: run("decisions", "--job", "c1", "--source", "override", "--json")["count"],
    )
    assert "c1" in run("job", "show", "c1")
    assert run("override", "clear", str(override["id"]), "--json")["active"] is False
    assert run("job", "cancel", "c1", "--json")["cancel_requested"] is True
    wait_for("c1 cancelled", lambda: run("job", "show", "c1", "--json")["state"] == "cancelled")

    # Errors: one line, exit 2 for what the API rejects, 1 when there is no daemon.
    no_token = runner.invoke(app, ["job", "submit", "gpt-char", "--url", url], env={})
    assert no_token.exit_code == 2
    assert no_token.stderr.startswith("error: this needs the API token")
    rejected = runner.invoke(
        app, ["job", "submit", "/etc/passwd", "--url", url], env={"AUTOTUNE_TOKEN": token}
    )
    assert rejected.exit_code == 2
    assert rejected.stderr.count("\n") == 1
    assert "422: body.task" in rejected.stderr
    wrong = runner.invoke(
        app, ["job", "cancel", "c1", "--url", url], env={"AUTOTUNE_TOKEN": "wrong"}
    )
    assert wrong.exit_code == 2
    assert "401" in wrong.stderr
    nobody = runner.invoke(app, ["job", "list", "--url", f"http://127.0.0.1:{free_port()}"])
    assert nobody.exit_code == 1
    assert "cannot reach the daemon" in nobody.stderr
