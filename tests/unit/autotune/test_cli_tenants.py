"""``autotune tenant``, the API's ``autotune token`` commands, ``autotune audit`` and
``autotune job events`` against the real API (served in this process over a temporary
SQLite database): what they send, what they print (tables for people, ``--json``, the
new token's secret once on stdout), and their errors: one line, exit 2 for what the API
or the command line rejects, 1 when no daemon answers."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import typer.main
import uvicorn
from click.testing import CliRunner, Result
from helpers import free_port

from autotune.api.app import create_app
from autotune.cli import app
from autotune.daemon.auth import StoredTokenCheck, hash_token
from autotune.db import Database

ADMIN = "tenants-admin-token-0123456789"

# The whole command tree, built once (typer builds it again at each invocation otherwise).
AUTOTUNE = typer.main.get_command(app)

Run = Callable[..., Result]


@pytest.fixture
def url(database: Database) -> Iterator[str]:
    """The API over ``database``, served on a free port: the configured ``ADMIN`` token
    (an admin of tenant default) and the tokens it issues."""
    api = create_app(
        db=database,
        telemetry="simulator",
        token_check=StoredTokenCheck(database, configured=[hash_token(ADMIN)]),
    )
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(api, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "the API did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def run(url: str) -> Run:
    """``autotune ARGS --url URL`` with ``token`` as $AUTOTUNE_TOKEN (None: no token)."""
    runner = CliRunner()

    def invoke(*args: str, token: str | None = ADMIN) -> Result:
        return runner.invoke(AUTOTUNE, [*args, "--url", url], env={"AUTOTUNE_TOKEN": token})

    return invoke


def ok(result: Result) -> Any:
    """The JSON a successful ``--json`` command printed."""
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def refused(result: Result, code: int = 2) -> str:
    """The one line of an error, after checking the exit code."""
    assert result.exit_code == code, result.output
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: ")
    return result.stderr


# --- tenants --------------------------------------------------------------------------


def test_tenants_are_created_listed_shown_and_updated(run: Run) -> None:
    created = ok(
        run(
            "tenant",
            "create",
            "team-a",
            "--gpus-by-model",
            "A100=4",
            "--gpus-by-model",
            "H100=2",
            "--no-lend",
            "--weight",
            "2",
            "--json",
        )
    )
    assert created["gpus"] == 0
    assert created["gpus_by_model"] == {"A100": 4, "H100": 2}
    assert created["nominal_gpus"] == 6
    assert (created["borrow"], created["lend"], created["weight"]) == (True, False, 2.0)
    plain = run("tenant", "create", "team-b", "--gpus", "3")
    assert plain.exit_code == 0, plain.output
    assert "created tenant team-b (3 GPUs)" in plain.stdout

    listed = ok(run("tenant", "list", "--json", token=None))  # reads need no token
    assert [t["name"] for t in listed["data"]] == ["default", "team-a", "team-b"]
    table = run("tenant", "list", token=None).stdout
    assert "3 tenant(s)" in table
    assert "A100=4" in table
    shown = run("tenant", "show", "team-a")
    assert shown.exit_code == 0
    assert "6 (A100=4" in shown.stdout
    assert ok(run("tenant", "show", "team-b", "--json"))["nominal_gpus"] == 3

    # What is not given keeps its value; --gpus-by-model replaces the per-model quota.
    updated = ok(run("tenant", "update", "team-a", "--gpus", "8", "--json"))
    assert updated["gpus"] == 8
    assert updated["gpus_by_model"] == {"A100": 4, "H100": 2}
    assert (updated["lend"], updated["weight"]) == (False, 2.0)
    changes = ("--no-borrow", "--lend", "--gpus-by-model", "A100=1")
    updated = ok(run("tenant", "update", "team-a", *changes, "--json"))
    assert updated["gpus_by_model"] == {"A100": 1}
    assert (updated["borrow"], updated["lend"], updated["gpus"]) == (False, True, 8)
    assert "updated tenant team-b" in run("tenant", "update", "team-b", "--weight", "0.5").stdout


def test_tenant_commands_say_what_is_wrong_in_one_line(run: Run, database: Database) -> None:
    assert "409" in refused(run("tenant", "create", "default"))
    assert "404" in refused(run("tenant", "show", "nobody"))
    assert "404" in refused(run("tenant", "update", "nobody", "--gpus", "1"))
    assert "422: body.weight" in refused(run("tenant", "create", "team-c", "--weight", "0"))
    assert "use MODEL=N" in refused(run("tenant", "create", "team-c", "--gpus-by-model", "A100"))
    twice = ("--gpus-by-model", "A100=1", "--gpus-by-model", "A100=2")
    assert "'A100' given twice" in refused(run("tenant", "create", "team-c", *twice))
    assert "nothing to change" in refused(run("tenant", "update", "default"))
    assert "needs the API token" in refused(run("tenant", "create", "team-c", token=None))
    assert "401" in refused(run("tenant", "create", "team-c", token="not-a-token"))
    assert ok(run("tenant", "list", "--json"))["data"][-1]["name"] == "default"  # none made


def test_no_daemon_is_exit_1() -> None:
    nobody = CliRunner().invoke(
        AUTOTUNE, ["tenant", "list", "--url", f"http://127.0.0.1:{free_port()}"]
    )
    assert "cannot reach the daemon" in refused(nobody, 1)


# --- tokens ---------------------------------------------------------------------------


def _secret(result: Result) -> str:
    """The secret ``token create`` printed: the end of its one line on stdout."""
    assert result.exit_code == 0, result.output
    (line,) = result.stdout.splitlines()
    assert "shown once" in line
    return line.rsplit(": ", 1)[1]


def test_tokens_are_issued_listed_asked_who_they_are_and_revoked(run: Run) -> None:
    ok(run("tenant", "create", "team-a", "--json"))
    issued = run("token", "create", "--tenant", "team-a", "--role", "member", "--name", "ci")
    secret = _secret(issued)
    assert issued.stdout.startswith("token 1 (member of team-a; shown once")
    assert "token revoke 1" in issued.stderr  # the note is not in what a script reads

    who = run("token", "whoami", token=secret)
    assert who.exit_code == 0, who.output
    assert "token 1 (ci): member of tenant team-a" in who.stdout
    assert ok(run("token", "whoami", "--json", token=secret)) == {
        "tenant": "team-a",
        "role": "member",
        "token_id": 1,
        "token_name": "ci",
    }
    assert "admin of tenant default" in run("token", "whoami").stdout
    # --token wins over $AUTOTUNE_TOKEN.
    assert ok(run("token", "whoami", "--token", secret, "--json"))["token_id"] == 1
    # A member's job is its tenant's; only an admin's token names another tenant.
    job = ok(run("job", "submit", "gpt-char", "--json", token=secret))
    assert job["tenant"] == "team-a"
    assert "403" in refused(run("job", "submit", "gpt-char", "--tenant", "default", token=secret))
    assert ok(run("job", "submit", "gpt-char", "--tenant", "team-a", "--json"))["tenant"] == (
        "team-a"
    )

    viewer = ok(
        run(
            "token",
            "create",
            "--tenant",
            "default",
            "--role",
            "viewer",
            "--expires-in-s",
            "3600",
            "--json",
        )
    )
    assert viewer["token"]
    assert viewer["expires_at"] is not None
    assert viewer["created_by"] is None  # issued with the configured token
    assert [t["id"] for t in ok(run("token", "list", "--json"))["data"]] == [1, 2]
    only = ok(run("token", "list", "--tenant", "team-a", "--json"))["data"]
    assert [(t["id"], t["role"], t["name"]) for t in only] == [(1, "member", "ci")]
    assert all("token" not in t for t in only)  # no secrets in a listing
    table = run("token", "list").stdout
    assert "2 token(s)" in table
    assert "usable" in table

    # Only an admin's token manages tokens.
    assert "403" in refused(run("token", "list", token=secret))
    assert "403" in refused(
        run("token", "create", "--tenant", "team-a", "--role", "admin", token=secret)
    )
    assert "422" in refused(run("token", "create", "--tenant", "nobody", "--role", "viewer"))
    bad_role = run("token", "create", "--tenant", "team-a", "--role", "boss")
    assert bad_role.exit_code == 2
    assert "boss" in bad_role.stderr

    revoked = ok(run("token", "revoke", "1", "--json"))
    assert revoked["usable"] is False
    assert revoked["revoked_at"] is not None
    assert "token" not in revoked
    assert "401" in refused(run("token", "whoami", token=secret))  # at once
    assert [t["id"] for t in ok(run("token", "list", "--json"))["data"]] == [2]
    every = ok(run("token", "list", "--revoked", "--json"))["data"]
    assert [(t["id"], t["usable"]) for t in every] == [(1, False), (2, True)]
    assert "revoked" in run("token", "list", "--revoked").stdout
    assert "404" in refused(run("token", "revoke", "99"))
    assert "revoked token 2 (viewer of default)" in run("token", "revoke", "2").stdout
    assert "needs the API token" in refused(run("token", "whoami", token=None))


# --- the audit log --------------------------------------------------------------------


def test_the_audit_log_says_who_changed_what_page_by_page(run: Run) -> None:
    ok(run("tenant", "create", "team-a", "--json"))
    member = _secret(run("token", "create", "--tenant", "team-a", "--role", "member"))
    refused(run("tenant", "update", "team-a", "--gpus", "9", token=member))  # 403, logged
    ok(run("tenant", "update", "team-a", "--gpus", "2", "--json"))

    page = ok(run("audit", "--json"))
    assert page["count"] == 4
    rows = [(e["method"], e["path"], e["status"], e["token_id"]) for e in page["data"]]
    assert rows == [
        ("PATCH", "/api/v1/tenants/team-a", 200, None),
        ("PATCH", "/api/v1/tenants/team-a", 403, 1),
        ("POST", "/api/v1/tokens", 201, None),
        ("POST", "/api/v1/tenants", 201, None),
    ]
    assert page["data"][1]["tenant"] == "team-a"
    mine = ok(run("audit", "--token-id", "1", "--json"))["data"]
    assert [(e["status"], e["role"]) for e in mine] == [(403, "member")]
    assert [e["status"] for e in ok(run("audit", "--tenant", "team-a", "--json"))["data"]] == [403]

    first = ok(run("audit", "--limit", "3", "--json"))
    assert [e["id"] for e in first["data"]] == [4, 3, 2]
    table = run("audit", "--limit", "3")
    assert table.exit_code == 0, table.output
    assert f"next page: --cursor {first['next']}" in table.stdout
    assert "PATCH" in table.stdout
    rest = ok(run("audit", "--limit", "3", "--cursor", first["next"], "--json"))
    assert [e["id"] for e in rest["data"]] == [1]
    assert rest["next"] is None

    assert "403" in refused(run("audit", token=member))
    assert "needs the API token" in refused(run("audit", token=None))


def test_a_jobs_events_are_listed_oldest_first_by_kind(run: Run, database: Database) -> None:
    from autotune.core import JobSpec
    from autotune.db import repository as repo

    with database.session() as session:
        repo.submit_job(session=session, spec=JobSpec(job_id="j"), task={"name": "gpt-char"})
        repo.record_job_events(
            session=session,
            events=[
                ("j", {"kind": "node_lost", "at": 1.9e9, "nodes": ["n1"], "step": 40}),
                ("j", {"kind": "resumed", "at": 1.9e9 + 5, "step": 31, "steps_redone": 9}),
            ],
        )
    listed = ok(run("job", "events", "j", "--json"))
    assert [e["kind"] for e in listed["data"]] == ["node_lost", "resumed"]
    assert listed["data"][1]["detail"] == {"step": 31, "steps_redone": 9}
    table = run("job", "events", "j", "--kind", "resumed")
    assert table.exit_code == 0, table.output
    assert "1 event(s) of job j" in table.stdout
    assert "steps_redone=9" in table.stdout
    assert "node_lost" not in table.stdout
    assert "no job 'nope'" in refused(run("job", "events", "nope"))
