"""Schemathesis against the live OpenAPI of a real daemon: ``autotune daemon`` in a child
process on the simulated cluster, and ``schemathesis run`` (its command line, as the manual
shows it in ``docs/operating/api.md``) over every operation, in its coverage, fuzzing and
stateful phases, with every check but two. No answer may be a 5xx, no check may fail and
no tick may fail meanwhile.

The configuration (``CONFIG``, the manual's ``schemathesis.toml``) says what is left out
and why: the two checks whose premise the API does not share by design or cannot meet for
a bug outside the API's routes, and, per operation, the 422 a schema-valid request may get
for a rule OpenAPI cannot state. How often schema-valid bodies are accepted is measured
besides (``ACCEPTED``), so a schema that documents less than the API enforces still fails
here.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
import schemathesis
from helpers import REPO, Api, DaemonProcess, free_port, wait_for
from hypothesis import HealthCheck, Phase, given, settings

from autotune.api.app import create_app
from autotune.api.schemas import JobCreate
from autotune.db import Database

TOKEN = "schemathesis-0123456789abcdef"
OPTIONS = (
    "--phases examples,coverage,fuzzing,stateful --seed 1 --max-examples 100 --workers 1 "
    "--generation-database none --request-timeout 10"
)
"""Those of ``schemathesis run``, as the manual gives them: every phase, a fixed seed, at
most 100 cases per operation and phase (about 2,700 in all; at 150 the run took close to
3 minutes of the test suite on two cores)."""
ACTIVE_JOBS = ("st-0", "st-1", "st-2")
"""Submitted before the run, too long to finish in it: the jobs overrides pin."""

CONFIG = """\
checks.enabled = true
# DELETE /jobs/{job_id} cancels the job, DELETE /overrides/{override_id} ends the
# override: both stay readable, by design
checks.use_after_free.enabled = false
# A 405's Allow names the methods of one route of the path, not all (api/app.py)
checks.allow_header_conformance.enabled = false
# A body over max_body_bytes is refused unread, with 413
checks.negative_data_rejection.expected-statuses = [
    "400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx",
]
# Jobs submitted first (steps 1e9, so they stay active), for overrides to pin
dictionaries.active-jobs.values = ["st-0", "st-1", "st-2"]

# Rules a schema cannot state (each field's description says them): a cursor the listing
# did not hand out, max_gpus below min_gpus, an override the job or cluster cannot run, a
# checkpoint that does not load, a tenant that does not exist, GPUs promised on given
# models beyond the tenant's quota in all
[[operations]]
include-name = [
    "GET /api/v1/jobs", "GET /api/v1/jobs/{job_id}/metrics",
    "GET /api/v1/jobs/{job_id}/events", "GET /api/v1/decisions", "GET /api/v1/audit",
    "POST /api/v1/jobs", "POST /api/v1/overrides", "POST /api/v1/policies",
    "POST /api/v1/tokens", "POST /api/v1/tenants", "PATCH /api/v1/tenants/{name}",
]
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "404", "409", "413", "422"]

[[operations]]
include-name = "POST /api/v1/overrides"
parameters = { "body.job_id" = { dictionary = "active-jobs", probability = 0.8 } }
"""

MEMBER_CONFIG = (
    CONFIG.replace(  # the member's 403, where the job is another tenant's or the route an admin's
        'expected-statuses = ["2xx", "401", "404", "409", "413", "422"]',
        'expected-statuses = ["2xx", "401", "403", "404", "409", "413", "422"]',
    )
    + """
[[operations]]
include-name = "DELETE /api/v1/jobs/{job_id}"
parameters = { "path.job_id" = { dictionary = "active-jobs", probability = 0.8 } }
"""
)
"""The same, for a run with another tenant's member token: cancellations aimed at the
active jobs (the default tenant's) too, as the overrides are."""
MEMBER_OPTIONS = (
    "--phases examples,coverage,fuzzing,stateful --seed 2 --max-examples 25 --workers 1 "
    "--generation-database none --request-timeout 10 --include-method POST "
    "--include-method PATCH --include-method DELETE"
)
"""Every mutating operation, 25 cases per operation and phase."""

ACCEPTED = {"/api/v1/jobs": 0.8, "/api/v1/overrides": 0.25}
"""Least share of 100 schema-valid bodies (the same ones every run) the API must accept, of
those it judges (a 409, a job id taken, is no judgement): 88% and 32% when written. The
rest break rules no schema can state: max_gpus below min_gpus; for an override (of a 1-2
GPU job), GPUs the cluster does not have, a world size the job does not allow, degrees
that do not multiply out with the job's own."""


def schemathesis_command() -> list[str]:
    """The ``schemathesis`` entry point beside this Python (a dev dependency)."""
    script = Path(sys.executable).parent / "schemathesis"
    if not script.exists():
        pytest.fail("schemathesis is not installed: pip install -e '.[dev]' (the dev extra)")
    return [str(script)]


def run_arguments(
    url: str, config: Path, report: Path, *, token: str = TOKEN, options: str = OPTIONS
) -> list[str]:
    """``schemathesis ... run`` as the manual gives it, plus where the report goes."""
    return [
        *schemathesis_command(),
        "--config-file",
        str(config),
        "run",
        f"{url}/openapi.json",
        *options.split(),
        "-H",
        f"Authorization: Bearer {token}",
        "--no-color",
        "--report",
        "json",
        "--report-json-path",
        str(report),
    ]


def run_schemathesis(
    port: int,
    where: Path,
    name: str,
    config: str,
    *,
    token: str = TOKEN,
    options: str = OPTIONS,
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], str]:
    """``schemathesis run`` against the daemon on ``port`` with ``config`` (written to
    ``where/name.toml``): the finished process, its JSON report and the tail of what it
    printed."""
    path = where / f"{name}.toml"
    path.write_text(config)
    report_path = where / f"{name}.json"
    run = subprocess.run(
        run_arguments(f"http://127.0.0.1:{port}", path, report_path, token=token, options=options),
        cwd=where,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = run.stdout[-6000:] + run.stderr[-2000:]
    assert report_path.exists(), output
    return run, json.loads(report_path.read_text()), output


def server_errors(metrics: str) -> dict[str, float]:
    """Requests the daemon answered with a 5xx, per method, route and status, from its
    own latency histogram (every request is counted there)."""
    pattern = re.compile(
        r'^autotune_api_request_duration_seconds_count\{(?P<labels>[^}]*status="5\d\d"[^}]*)\}'
        r" (?P<count>\S+)$"
    )
    found = {}
    for line in metrics.splitlines():
        match = pattern.match(line)
        if match and float(match["count"]) > 0:
            found[match["labels"]] = float(match["count"])
    return found


def schema_valid_bodies(openapi: dict[str, Any], path: str, count: int) -> list[Any]:
    """``count`` bodies of ``POST path`` that schemathesis draws as schema-valid (the same
    ones every run), those jsonschema finds valid too."""
    operation = schemathesis.openapi.from_dict(openapi)[path]["POST"]
    bodies: list[Any] = []

    @settings(
        max_examples=count,
        database=None,
        derandomize=True,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(operation.as_strategy())
    def draw(case: Any) -> None:
        bodies.append(case.body)

    draw()
    ref = openapi["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    validator = jsonschema_rs.Draft202012Validator(
        {**ref["schema"], "components": openapi["components"]}
    )
    return [body for body in bodies if validator.is_valid(body)]


def accepted_share(api: Api, path: str, bodies: list[dict[str, Any]]) -> float:
    """Share of ``bodies`` that ``POST path`` accepts, of those it judged (a 409 is not
    about the body); no answer may be a 5xx."""
    judged = accepted = 0
    rejected: list[str] = []
    for body in bodies:
        status, answer = api.call("POST", path, body, token=TOKEN)
        assert status < 500, (body, answer)
        if status == 409:
            continue
        judged += 1
        if status < 300:
            accepted += 1
        else:
            rejected.append(f"{status} {answer.get('message', answer)}")
    assert judged >= len(bodies) // 2, rejected
    print(f"{path}: {accepted} of {judged} schema-valid bodies accepted; rejected:", rejected)
    return accepted / judged


def test_the_manual_gives_the_configuration_and_the_command() -> None:
    readme = (REPO / "docs" / "operating" / "api.md").read_text()
    blocks = re.findall(r"\n( *)```toml\n(.*?)\n *```\n", readme, re.S)
    ours = [textwrap.dedent(block) for _, block in blocks if "checks.enabled" in block]
    assert ours == [CONFIG.rstrip("\n")]
    assert f"run http://127.0.0.1:8000/openapi.json {OPTIONS}" in " ".join(
        readme.replace("\\\n", " ").split()
    )


def test_the_schema_documents_the_module_task_syntax_the_api_takes() -> None:
    """The task's schema lists the built-in tasks; its description the module syntax."""
    schema = JobCreate.model_json_schema()["properties"]["task"]
    assert "gpt-char" in schema["enum"]
    assert "package.module:Name" in schema["description"]


def test_every_bound_in_the_schema_is_a_json_schema_keyword(tmp_path: Path) -> None:
    """Pydantic writes the bounds of a field it cannot push them into (an optional int with
    a validator before them) as ge/le, which no JSON Schema reader knows: generators then
    draw values the API rejects."""
    database = Database(f"sqlite:///{tmp_path / 'a.db'}")
    text = json.dumps(create_app(db=database, telemetry="simulator").openapi())
    database.dispose()
    assert not re.findall(r'"(?:ge|le|gt|lt)": ', text)


@pytest.mark.subprocess
def test_schemathesis_finds_no_server_error_and_no_failed_check(tmp_path: Path) -> None:
    port = free_port()
    daemon = DaemonProcess(
        tmp_path, port, "daemon", tick_s=0.5, jobs=(4, 4), env={"AUTOTUNE_TOKEN": TOKEN}
    )
    api = Api(port)
    try:
        wait_for("the daemon ready", lambda: api.call("GET", "/readyz")[0] == 200, 60)
        for job_id in ACTIVE_JOBS:
            body = {"task": "gpt-char", "job_id": job_id, "steps": 10**9, "max_gpus": 2}
            status, answer = api.call("POST", "/jobs", body, token=TOKEN)
            assert status == 201, answer
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/openapi.json") as answer:
            openapi = json.loads(answer.read())
        jobs = schema_valid_bodies(openapi, "/api/v1/jobs", 100)
        for body in jobs:  # a tenant must exist: the token's own, by default
            body.pop("tenant", None)
        assert accepted_share(api, "/jobs", jobs) >= ACCEPTED["/api/v1/jobs"]
        wait_for("st-0 running", lambda: api.get("/jobs/st-0")["state"] == "running")
        overrides = schema_valid_bodies(openapi, "/api/v1/overrides", 100)
        for body in overrides:
            body["job_id"] = "st-0"
        assert accepted_share(api, "/overrides", overrides) >= ACCEPTED["/api/v1/overrides"]
        run, report, output = run_schemathesis(port, tmp_path, "schemathesis", CONFIG)

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            metrics = answer.read().decode()
        assert server_errors(metrics) == {}
        assert daemon.process.poll() is None, daemon.stderr_path.read_text()[-3000:]
        status, ready = api.call("GET", "/readyz")
        assert status == 200, ready
        assert ready["tick"]["failures_total"] == 0, ready["tick"]
        assert report["failures"] == [], output
        assert report["errors"] == [], output
        assert run.returncode == 0, output
        phases = {name: phase["status"] for name, phase in report["phases"].items()}
        assert phases.pop("examples") in ("skip", "success"), output  # skip: no examples
        assert phases == {"coverage": "success", "fuzzing": "success", "stateful": "success"}
        assert report["operations"]["tested"] == report["operations"]["selected"] >= 30
        assert report["test_cases"]["generated"] >= 3000
        print(
            f"schemathesis: {report['test_cases']['generated']} cases in "
            f"{report['running_time']:.0f} s"
        )
        member_finds_no_way_to_change_another_tenants_jobs(api, port, tmp_path)
    finally:
        daemon.stop()


def foreign_state(api: Api) -> dict[str, Any]:
    """What another tenant's member must not change: the default tenant's active jobs
    (cancellation asked or not) and their overrides, the tenants, the tokens, the
    policies."""
    overrides = []
    for job_id in ACTIVE_JOBS:
        for o in api.get(f"/overrides?job={job_id}&limit=1000")["data"]:
            overrides.append((o["id"], o["job_id"], o["pin"], o["deleted_at"], o["expires_at"]))
    tenants = [
        {k: v for k, v in t.items() if not k.startswith("gpus_held")}
        for t in api.get("/tenants")["data"]
    ]
    status, tokens = api.call("GET", "/tokens?revoked=true", token=TOKEN)
    assert status == 200, tokens
    return {
        "jobs": {j: api.get(f"/jobs/{j}")["cancel_requested"] for j in ACTIVE_JOBS},
        "overrides": overrides,
        "tenants": tenants,
        # usable turns false at an expiry (the first run issued tokens that expire)
        "tokens": [{k: v for k, v in t.items() if k != "usable"} for t in tokens["data"]],
        "policies": api.get("/policies"),
    }


def member_finds_no_way_to_change_another_tenants_jobs(api: Api, port: int, tmp_path: Path) -> None:
    """Schemathesis over every mutating operation with the token of tenant
    ``schemathesis-b``'s member: the default tenant's jobs, their overrides, the tenants,
    tokens and policies stay as they were, and no answer is a 5xx."""
    status, answer = api.call("POST", "/tenants", {"name": "schemathesis-b"}, token=TOKEN)
    assert status == 201, answer
    body = {"tenant": "schemathesis-b", "role": "member", "name": "schemathesis"}
    status, issued = api.call("POST", "/tokens", body, token=TOKEN)
    assert status == 201, issued
    before = foreign_state(api)
    assert not all(before["jobs"].values())  # one at least the member could cancel
    _, report, output = run_schemathesis(
        port, tmp_path, "member", MEMBER_CONFIG, token=issued["token"], options=MEMBER_OPTIONS
    )
    after = foreign_state(api)
    for part in before:
        assert after[part] == before[part], part
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        assert server_errors(answer.read().decode()) == {}
    status, audit = api.call("GET", f"/audit?token_id={issued['id']}&limit=1000", token=TOKEN)
    assert status == 200, audit
    statuses = [entry["status"] for entry in audit["data"]]
    foreign = [
        entry["status"]
        for entry in audit["data"]
        if any(job in entry["path"] for job in ACTIVE_JOBS)
    ]
    assert report["operations"]["tested"] >= 14, output
    assert report["failures"] == [], output
    assert report["errors"] == [], output
    print(
        f"schemathesis as another tenant's member: {report['test_cases']['generated']} "
        f"cases, {audit['count']} audited requests (of the newest {len(statuses)}: "
        f"{statuses.count(403)} refused with 403), "
        f"{len(foreign)} aimed at the default tenant's jobs by path, all refused"
    )
    assert set(foreign) <= {403}
