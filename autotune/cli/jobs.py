"""The command-line client of the daemon's REST API: ``autotune job``, ``autotune
decisions`` and ``autotune override``.

Every command takes ``--url`` (default ``$AUTOTUNE_URL``, else http://127.0.0.1:8000)
and, for changes, ``--token`` (default ``$AUTOTUNE_TOKEN``). Tables for people,
``--json`` for one JSON object (the API's response). Exit codes: 0 on success, 2 when
the API rejects the request (the line says why), 1 when the daemon cannot be reached.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Annotated, Any

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from autotune.cli.common import JsonOption, fail, parse_compression
from autotune.client import ApiError, Client, UnreachableError
from autotune.errors import InputError

__all__ = ["daemon", "decisions_command", "job_app", "override_app"]

job_app = typer.Typer(
    help="Submit, list, show and cancel jobs through the daemon's REST API; `job run` trains "
    "one job here, directly, through the executor."
)
override_app = typer.Typer(help="Pin a job's configuration or placement for a while.")

UrlOption = Annotated[
    str | None,
    typer.Option("--url", help="Daemon URL (default: $AUTOTUNE_URL, else http://127.0.0.1:8000)."),
]
TokenOption = Annotated[
    str | None,
    typer.Option("--token", help="API token (default: $AUTOTUNE_TOKEN).", show_default=False),
]
CursorOption = Annotated[
    str | None,
    typer.Option("--cursor", help="Show the page after the one that printed this cursor."),
]

_out = Console()


@contextmanager
def daemon(url: str | None, token: str | None = None, *, changes: bool = False) -> Iterator[Client]:
    """The daemon's API client for one command; its errors end the command with one line:
    exit 2 when the API rejects the request, 1 when it cannot be reached or fails (5xx).
    ``changes``: the command changes something, so it needs the token."""
    client = Client(url, token)
    if changes and not client.token:
        fail("this needs the API token: --token or $AUTOTUNE_TOKEN", 2)
    try:
        with client:
            yield client
    except UnreachableError as exc:
        fail(str(exc), 1)
    except ApiError as exc:
        fail(str(exc), 2 if exc.status < 500 else 1)


def to_json(model: BaseModel) -> Any:
    """A response as the JSON the API sent."""
    return model.model_dump(mode="json")


def _emit(result: Any, as_json: bool, table: Table | str | None = None) -> None:
    if as_json:
        typer.echo(json.dumps(result))
    elif table is not None:
        _out.print(table)


def _jobs_table(jobs: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=title)
    for column in ("job", "tenant", "state", "task", "GPUs", "progress", "priority", "reason"):
        table.add_column(column)
    for job in jobs:
        spec = job["spec"]
        table.add_row(
            job["job_id"],
            job.get("tenant", ""),
            job["state"] + (" (cancelling)" if job.get("cancel_requested") else ""),
            (job.get("task") or {}).get("name", ""),
            f"{spec['min_gpus']}-{spec['max_gpus']}",
            f"{job['progress']:.1%}",
            str(spec["priority"]),
            job["state_reason"][:80],
        )
    return table


# --- jobs -----------------------------------------------------------------------------


@job_app.command("submit")
def job_submit(
    task: Annotated[str, typer.Argument(help="Built-in task (gpt-char, ...) or module:Name.")],
    job_id: Annotated[str | None, typer.Option("--id", help="Job id (default: generated).")] = None,
    steps: Annotated[int, typer.Option(min=1, help="Optimizer steps.")] = 1000,
    global_batch: Annotated[int, typer.Option("--batch", min=1, help="Global batch.")] = 32,
    min_gpus: Annotated[int, typer.Option("--min-gpus", min=1)] = 1,
    max_gpus: Annotated[
        int | None, typer.Option("--max-gpus", min=1, help="Default: --min-gpus.")
    ] = None,
    priority: Annotated[int, typer.Option(help="Higher goes first.")] = 0,
    gpu_type: Annotated[
        list[str] | None, typer.Option("--gpu-type", help="Allowed GPU model (repeatable).")
    ] = None,
    max_nodes: Annotated[int | None, typer.Option("--max-nodes", min=1)] = None,
    tenant: Annotated[
        str | None,
        typer.Option(help="Whose job (default: the token's tenant; another needs an admin's)."),
    ] = None,
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Submit a job, the token's tenant's; the daemon schedules it at its next tick."""
    constraints: dict[str, Any] = {}
    if gpu_type:
        constraints["gpu_types"] = gpu_type
    if max_nodes is not None:
        constraints["max_nodes"] = max_nodes
    body: dict[str, Any] = {
        "task": task,
        "steps": steps,
        "global_batch": global_batch,
        "min_gpus": min_gpus,
        "max_gpus": max_gpus if max_gpus is not None else min_gpus,
        "priority": priority,
        "constraints": constraints,
    }
    if job_id is not None:
        body["job_id"] = job_id
    if tenant is not None:
        body["tenant"] = tenant
    with daemon(url, token, changes=True) as api:
        job = to_json(api.submit_job(body))
    _emit(job, as_json, f"submitted [bold]{job['job_id']}[/] ({job['state']})")


@job_app.command("list")
def job_list(
    state: Annotated[str | None, typer.Option(help="pending, running, finished, ...")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    cursor: CursorOption = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Jobs, newest first; the next page with --cursor (printed under the table)."""
    with daemon(url) as api:
        page = to_json(api.jobs_page(state=state, limit=limit, cursor=cursor))
    table = _jobs_table(page["data"], f"{_counted(page)} job(s)")
    table.caption = _next_page(page)
    _emit(page, as_json, table)


def _counted(page: dict[str, Any]) -> str:
    """A listing's count: "more than N" when the API stopped counting."""
    return f"{page['count']:,}" if page.get("count_exact", True) else f"more than {page['count']:,}"


def _next_page(page: dict[str, Any]) -> str | None:
    return f"next page: --cursor {page['next']}" if page.get("next") else None


@job_app.command("show")
def job_show(
    job_id: Annotated[str, typer.Argument(help="Job id.")],
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """One job, with its newest decision."""
    with daemon(url) as api:
        job = to_json(api.job(job_id))
        latest = to_json(api.decisions_page(job=job_id, limit=1))["data"]
    job_out = {**job, "latest_decision": latest[0] if latest else None}
    table = _jobs_table([job], f"job {job_id}")
    if as_json:
        _emit(job_out, True)
        return
    _out.print(table)
    if latest:
        _out.print(f"newest decision #{latest[0]['id']} ({latest[0]['source']}): ")
        _out.print(latest[0]["reason"], markup=False)


@job_app.command("events")
def job_events(
    job_id: Annotated[str, typer.Argument(help="Job id.")],
    kind: Annotated[
        str | None,
        typer.Option(help="Only this kind: node_lost, resumed, grad_norm_growth, ..."),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 100,
    cursor: CursorOption = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """What happened to a job on the backend while it trained, oldest first: nodes lost,
    resumes from a checkpoint, precision raised by the gradient-norm guard, batch shares
    moved, reconfigurations. The next page with --cursor."""
    with daemon(url) as api:
        page = to_json(api.job_events_page(job_id, kind=kind, limit=limit, cursor=cursor))
    table = Table(title=f"{_counted(page)} event(s) of job {job_id}", caption=_next_page(page))
    for column in ("at", "kind", "detail"):
        table.add_column(column, overflow="fold")
    for item in page["data"]:
        detail = " ".join(f"{k}={v}" for k, v in item["detail"].items())
        table.add_row(str(item["at"]), item["kind"], detail)
    _emit(page, as_json, table)


@job_app.command("cancel")
def job_cancel(
    job_id: Annotated[str, typer.Argument(help="Job id.")],
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Cancel a job; the daemon stops it at its next tick."""
    with daemon(url, token, changes=True) as api:
        job = to_json(api.cancel_job(job_id))
    _emit(job, as_json, f"cancelling [bold]{job['job_id']}[/]")


# --- decisions ------------------------------------------------------------------------


def decisions_command(
    job: Annotated[str | None, typer.Option("--job", help="Only this job's decisions.")] = None,
    source: Annotated[
        str | None,
        typer.Option(
            help="policy, override, fallback, static, or shadow (a shadow policy's, never "
            "applied; listed only when asked for)."
        ),
    ] = None,
    policy_version: Annotated[
        str | None, typer.Option("--policy-version", help="Only this policy version's.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 20,
    cursor: CursorOption = None,
    explain: Annotated[
        int | None, typer.Option("--explain", help="Explain this decision instead.")
    ] = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Decisions, newest first; or why one decision was made (--explain ID)."""
    if explain is not None:
        with daemon(url) as api:
            explained = to_json(api.explain(explain))
        if as_json:
            _emit(explained, True)
            return
        _print_explanation(explained)
        return
    with daemon(url) as api:
        page = to_json(
            api.decisions_page(
                job=job, source=source, policy_version=policy_version, limit=limit, cursor=cursor
            )
        )
    table = Table(title=f"{_counted(page)} decision(s)", caption=_next_page(page))
    for column in ("id", "job", "source", "config", "placement", "reason"):
        table.add_column(column, overflow="fold")
    for decision in page["data"]:
        layout = decision["config"]["layout"]
        compression = decision["config"]["compression"]["kind"]
        nodes = sorted({r["node_id"] for r in (decision["placement"] or {}).get("ranks", [])})
        source_cell = decision["source"]
        if decision.get("override_id") is not None:
            source_cell += f" #{decision['override_id']}"
        table.add_row(
            str(decision["id"]),
            decision["job_id"],
            source_cell,
            f"dp{layout['dp']} tp{layout['tp']} pp{layout['pp']} {compression}",
            ",".join(nodes),
            decision["reason"][:100],
        )
    _emit(page, as_json, table)


def _print_explanation(explained: dict[str, Any]) -> None:
    override = explained["override_id"]
    _out.print(
        f"[bold]decision {explained['decision_id']}[/] for {explained['job_id']}: "
        f"{explained['source']}" + (f" (override {override})" if override else "")
    )
    _out.print(explained["why"], markup=False)
    chosen = explained["chosen"]
    if chosen:
        _out.print(
            f"chosen: {chosen.get('config')}  predicted goodput "
            f"{chosen.get('predicted_goodput', 'n/a')}"
        )
    features = Table(title="features")
    features.add_column("feature")
    features.add_column("value", justify="right")
    for name, value in explained["features"].items():
        features.add_row(name, f"{value:g}")
    _out.print(features)
    alternatives = Table(title="alternatives on the same GPUs")
    for column in ("change", "config", "predicted goodput", "fits memory"):
        alternatives.add_column(column)
    for alt in explained["alternatives"]:
        alternatives.add_row(
            alt["change"], alt["config"], f"{alt['predicted_goodput']:.1f}", str(alt["fits_memory"])
        )
    _out.print(alternatives)


# --- overrides ------------------------------------------------------------------------


def _compression(value: str) -> dict[str, Any]:
    try:
        spec = parse_compression(value)
    except InputError as exc:
        fail(str(exc))
    return {k: v for k, v in asdict(spec).items() if v is not None}


def _precision(values: list[str]) -> dict[str, str]:
    pinned: dict[str, str] = {}
    for value in values:
        module_class, sep, precision = value.partition("=")
        if not sep:
            fail(f"--precision {value!r}: use CLASS=PRECISION, e.g. ffn=fp32", 2)
        pinned[module_class] = precision
    return pinned


def _placement(value: str) -> list[dict[str, Any]]:
    slots = []
    for item in value.split(","):
        node, sep, gpu = item.strip().rpartition(":")
        if not sep or not gpu.isdigit():
            fail(f"--place {value!r}: use NODE:GPU,NODE:GPU,... (rank order)", 2)
        slots.append({"node_id": node, "gpu_index": int(gpu)})
    return slots


@override_app.command("set")
def override_set(
    job_id: Annotated[str, typer.Argument(help="Job id.")],
    ttl: Annotated[float, typer.Option("--ttl", help="Seconds until it expires.")],
    reason: Annotated[str, typer.Option(help="Why (shown in the decision log).")],
    world_size: Annotated[int | None, typer.Option("--world-size", min=1)] = None,
    dp: Annotated[int | None, typer.Option(min=1)] = None,
    tp: Annotated[int | None, typer.Option(min=1)] = None,
    pp: Annotated[int | None, typer.Option(min=1)] = None,
    micro_batches: Annotated[int | None, typer.Option("--micro-batches", min=1)] = None,
    checkpointing: Annotated[
        bool | None, typer.Option("--checkpointing/--no-checkpointing", show_default=False)
    ] = None,
    precision: Annotated[
        list[str] | None,
        typer.Option("--precision", help="CLASS=PRECISION, e.g. ffn=fp32 (repeatable)."),
    ] = None,
    compression: Annotated[
        str | None, typer.Option(help="none, int8, fp8, topk:RATIO or powersgd:RANK.")
    ] = None,
    place: Annotated[
        str | None, typer.Option("--place", help="NODE:GPU,... for ranks 0, 1, ...")
    ] = None,
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Pin part of a job's configuration or its placement until --ttl seconds pass.
    The daemon applies it at its next tick, or says why it cannot (422)."""
    layout = {
        key: value
        for key, value in {
            "world_size": world_size,
            "dp": dp,
            "tp": tp,
            "pp": pp,
            "micro_batches": micro_batches,
            "activation_checkpointing": checkpointing,
        }.items()
        if value is not None
    }
    body: dict[str, Any] = {"job_id": job_id, "ttl_s": ttl, "reason": reason}
    if layout:
        body["layout"] = layout
    if precision:
        body["precision"] = _precision(precision)
    if compression is not None:
        body["compression"] = _compression(compression)
    if place is not None:
        body["placement"] = _placement(place)
    with daemon(url, token, changes=True) as api:
        override = to_json(api.create_override(body))
    _emit(
        override,
        as_json,
        f"override [bold]{override['id']}[/] on {override['job_id']} until "
        f"{override['expires_at']}",
    )


@override_app.command("list")
def override_list(
    job: Annotated[str | None, typer.Option("--job", help="Only this job's overrides.")] = None,
    active: Annotated[
        bool | None, typer.Option("--active/--ended", show_default=False, help="Filter.")
    ] = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Overrides, newest first."""
    with daemon(url) as api:
        page = to_json(api.overrides_page(job=job, active=active))
    table = Table(title=f"{page['count']} override(s)")
    for column in ("id", "job", "active", "pin", "expires", "reason"):
        table.add_column(column, overflow="fold")
    for override in page["data"]:
        table.add_row(
            str(override["id"]),
            override["job_id"],
            "yes" if override["active"] else "no",
            json.dumps(override["pin"], separators=(",", ":")),
            override["expires_at"],
            override["reason"],
        )
    _emit(page, as_json, table)


@override_app.command("clear")
def override_clear(
    override_id: Annotated[int, typer.Argument(help="Override id.")],
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """End an override now; the policy takes the job back at the next tick."""
    with daemon(url, token, changes=True) as api:
        override = to_json(api.delete_override(override_id))
    _emit(override, as_json, f"override [bold]{override['id']}[/] ended")
