"""``autotune tenant``, the REST API's ``autotune token`` commands and ``autotune audit``:
the teams sharing the cluster with their GPU quotas, the tokens each holds, and the log
of what every token changed (``/api/v1/tenants``, ``/tokens``, ``/audit``).

Like ``autotune job``: ``--url`` (default ``$AUTOTUNE_URL``), ``--token`` (default
``$AUTOTUNE_TOKEN``), ``--json`` for the API's response; exit 2 when the API rejects the
request, 1 when the daemon cannot be reached. Creating and changing tenants, issuing,
listing and revoking tokens and reading the audit log need an admin's token. The token
commands are added to ``token_app`` (``autotune/cli/daemon.py``), beside the offline
``autotune token rotate``, which reaches the database without any token.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autotune.cli.common import JsonOption, fail
from autotune.cli.daemon import token_app
from autotune.cli.jobs import (
    CursorOption,
    TokenOption,
    UrlOption,
    _counted,
    _emit,
    _next_page,
    daemon,
    to_json,
)
from autotune.daemon.auth import Role

__all__ = ["audit_command", "tenant_app", "token_app"]

tenant_app = typer.Typer(
    help="Create, list, show and change tenants: the teams sharing the cluster and their "
    "GPU quotas (changes need an admin's token)."
)

_out = Console()

_GPUS = "Nominal quota: GPUs promised over all GPU models when the tenant has work."
_BY_MODEL = (
    "Quota on one GPU model, MODEL=N (repeatable), kept on that model: part of --gpus "
    "(at most --gpus in all), or, with --gpus 0, the quota is their sum."
)
_BORROW = "Whether its jobs may use GPUs beyond its quota that others leave idle."
_LEND = (
    "Whether others may use its idle nominal GPUs (taken back, by preemption, when its "
    "jobs arrive)."
)
_WEIGHT = "Its share of what is left over between borrowing tenants (fair share)."

NameArgument = Annotated[str, typer.Argument(help="Tenant name: 1-128 of [A-Za-z0-9._:-].")]
ByModelOption = Annotated[
    list[str] | None, typer.Option("--gpus-by-model", metavar="MODEL=N", help=_BY_MODEL)
]


def _by_model(values: list[str]) -> dict[str, int]:
    quota: dict[str, int] = {}
    for value in values:
        model, sep, count = value.partition("=")
        model = model.strip()
        if not sep or not model or not count.strip().isdigit():
            fail(f"--gpus-by-model {value!r}: use MODEL=N, e.g. A100=4", 2)
        if model in quota:
            fail(f"--gpus-by-model: {model!r} given twice", 2)
        quota[model] = int(count)
    return quota


def _quota(tenant: dict[str, Any]) -> str:
    by_model = " ".join(f"{m}={n}" for m, n in sorted(tenant["gpus_by_model"].items()))
    return f"{tenant['nominal_gpus']}" + (f" ({by_model})" if by_model else "")


def _held(tenant: dict[str, Any]) -> str:
    by_model = " ".join(f"{m}={n:g}" for m, n in tenant["gpus_held_by_model"].items())
    return f"{tenant['gpus_held']:g}" + (f" ({by_model})" if by_model else "")


def _tenants_table(tenants: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=title)
    for column in ("tenant", "quota", "held", "borrow", "lend", "weight"):
        table.add_column(column, overflow="fold")
    for tenant in tenants:
        table.add_row(
            tenant["name"],
            _quota(tenant),
            _held(tenant),
            "yes" if tenant["borrow"] else "no",
            "yes" if tenant["lend"] else "no",
            f"{tenant['weight']:g}",
        )
    return table


# --- tenants --------------------------------------------------------------------------


@tenant_app.command("create")
def tenant_create(
    name: NameArgument,
    gpus: Annotated[int, typer.Option(min=0, help=_GPUS)] = 0,
    gpus_by_model: ByModelOption = None,
    borrow: Annotated[bool, typer.Option("--borrow/--no-borrow", help=_BORROW)] = True,
    lend: Annotated[bool, typer.Option("--lend/--no-lend", help=_LEND)] = True,
    weight: Annotated[float, typer.Option(help=_WEIGHT)] = 1.0,
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create a tenant with its GPU quota (an admin's token); then issue its tokens with
    `autotune token create --tenant NAME`."""
    body: dict[str, Any] = {
        "name": name,
        "gpus": gpus,
        "gpus_by_model": _by_model(gpus_by_model or []),
        "borrow": borrow,
        "lend": lend,
        "weight": weight,
    }
    with daemon(url, token, changes=True) as api:
        tenant = to_json(api.create_tenant(body))
    _emit(tenant, as_json, f"created tenant [bold]{tenant['name']}[/] ({_quota(tenant)} GPUs)")


@tenant_app.command("list")
def tenant_list(url: UrlOption = None, as_json: JsonOption = False) -> None:
    """Every tenant with its quota and the GPUs its running jobs hold now."""
    with daemon(url) as api:
        page = to_json(api.tenants())
    _emit(page, as_json, _tenants_table(page["data"], f"{len(page['data'])} tenant(s)"))


@tenant_app.command("show")
def tenant_show(name: NameArgument, url: UrlOption = None, as_json: JsonOption = False) -> None:
    """One tenant: its quota, borrowing, lending, weight and the GPUs it holds now."""
    with daemon(url) as api:
        tenant = to_json(api.tenant(name))
    _emit(tenant, as_json, _tenants_table([tenant], f"tenant {tenant['name']}"))


@tenant_app.command("update")
def tenant_update(
    name: NameArgument,
    gpus: Annotated[int | None, typer.Option(min=0, help=_GPUS)] = None,
    gpus_by_model: Annotated[
        list[str] | None,
        typer.Option(
            "--gpus-by-model",
            metavar="MODEL=N",
            help=_BY_MODEL + " Replaces the whole per-model quota.",
        ),
    ] = None,
    borrow: Annotated[
        bool | None, typer.Option("--borrow/--no-borrow", show_default=False, help=_BORROW)
    ] = None,
    lend: Annotated[
        bool | None, typer.Option("--lend/--no-lend", show_default=False, help=_LEND)
    ] = None,
    weight: Annotated[float | None, typer.Option(help=_WEIGHT)] = None,
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Change a tenant's quota, borrowing, lending or weight (an admin's token); what is
    not given keeps its value. The daemon decides with the new values from its next
    tick."""
    changes: dict[str, Any] = {
        key: value
        for key, value in {"gpus": gpus, "borrow": borrow, "lend": lend, "weight": weight}.items()
        if value is not None
    }
    if gpus_by_model is not None:
        changes["gpus_by_model"] = _by_model(gpus_by_model)
    if not changes:
        fail(
            "nothing to change: give --gpus, --gpus-by-model, --borrow/--no-borrow, "
            "--lend/--no-lend or --weight",
            2,
        )
    with daemon(url, token, changes=True) as api:
        tenant = to_json(api.update_tenant(name, changes))
    _emit(tenant, as_json, f"updated tenant [bold]{tenant['name']}[/] ({_quota(tenant)} GPUs)")


# --- tokens (through the API; `token rotate` is in autotune.cli.daemon) ----------------


def _token_state(token: dict[str, Any]) -> str:
    if token.get("revoked_at"):
        return "revoked"
    return "usable" if token["usable"] else "expired"


@token_app.command("create")
def token_create(
    tenant: Annotated[str, typer.Option("--tenant", help="Whose token it is (must exist).")],
    role: Annotated[
        Role,
        typer.Option(
            "--role",
            help="admin: everything, tenants, tokens and policies included; member: submits, "
            "cancels and overrides its tenant's jobs; viewer: reads only.",
        ),
    ],
    name: Annotated[
        str, typer.Option("--name", help="What the token is for, for people and the audit log.")
    ] = "",
    expires_in_s: Annotated[
        int | None,
        typer.Option(
            "--expires-in-s", min=60, help="Seconds until it stops working (default: never)."
        ),
    ] = None,
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Issue a token to a tenant with a role (an admin's token). The new token is printed
    once, on stdout: only its hash is stored."""
    body: dict[str, Any] = {"tenant": tenant, "role": role, "name": name}
    if expires_in_s is not None:
        body["expires_in_s"] = expires_in_s
    with daemon(url, token, changes=True) as api:
        issued = to_json(api.create_token(body))
    if as_json:
        _emit(issued, True)
        return
    expiry = f", expires {issued['expires_at']}" if issued.get("expires_at") else ""
    typer.echo(
        f"token {issued['id']} ({issued['role']} of {issued['tenant']}{expiry}; shown once, "
        f"only its hash is stored): {issued['token']}"
    )
    typer.echo(
        f"Give it to its holder as AUTOTUNE_TOKEN; `autotune token revoke {issued['id']}` ends it.",
        err=True,
    )


@token_app.command("list")
def token_list(
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant's.")] = None,
    revoked: Annotated[bool, typer.Option("--revoked", help="Include revoked tokens.")] = False,
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Tokens by id, without their secrets (an admin's token)."""
    with daemon(url, token, changes=True) as api:
        page = to_json(api.tokens(tenant=tenant, revoked=revoked))
    table = Table(title=f"{len(page['data'])} token(s)")
    for column in ("id", "tenant", "role", "name", "state", "created", "expires", "by"):
        table.add_column(column, overflow="fold")
    for row in page["data"]:
        table.add_row(
            str(row["id"]),
            row["tenant"],
            row["role"],
            escape(row["name"]),
            _token_state(row),
            row["created_at"],
            row.get("expires_at") or "never",
            "" if row.get("created_by") is None else str(row["created_by"]),
        )
    _emit(page, as_json, table)


@token_app.command("revoke")
def token_revoke(
    token_id: Annotated[int, typer.Argument(min=1, help="Token id (autotune token list).")],
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Revoke a token (an admin's token): it stops working at once. Its row stays, so the
    audit log still says whose it was."""
    with daemon(url, token, changes=True) as api:
        revoked = to_json(api.revoke_token(token_id))
    _emit(
        revoked,
        as_json,
        f"revoked token [bold]{revoked['id']}[/] ({revoked['role']} of {revoked['tenant']})",
    )


@token_app.command("whoami")
def token_whoami(
    url: UrlOption = None, token: TokenOption = None, as_json: JsonOption = False
) -> None:
    """Who the token is: its tenant, role, id and name."""
    with daemon(url, token, changes=True) as api:
        principal = to_json(api.whoami())
    if principal.get("token_id") is None:
        which = escape(principal["token_name"]) or "the daemon's AUTOTUNE_TOKEN"
    else:
        which = f"token {principal['token_id']}" + (
            f" ({escape(principal['token_name'])})" if principal["token_name"] else ""
        )
    _emit(
        principal,
        as_json,
        f"{which}: [bold]{principal['role']}[/] of tenant [bold]{principal['tenant']}[/]",
    )


# --- the audit log --------------------------------------------------------------------


def audit_command(
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="Only requests of this tenant's tokens.")
    ] = None,
    token_id: Annotated[
        int | None, typer.Option("--token-id", min=1, help="Only this token's requests.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    cursor: CursorOption = None,
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """The audit log, newest first: who changed what (an admin's token).

    Every request that changes something, the token that made it (its tenant and role)
    and the status it got, refusals (401, 403) included. The next page with --cursor
    (printed under the table)."""
    with daemon(url, token, changes=True) as api:
        page = to_json(api.audit_page(tenant=tenant, token_id=token_id, limit=limit, cursor=cursor))
    table = Table(title=f"{_counted(page)} request(s)", caption=_next_page(page))
    for column in ("id", "at", "tenant", "role", "token", "request", "status"):
        table.add_column(column, overflow="fold")
    for entry in page["data"]:
        who = "" if entry.get("token_id") is None else str(entry["token_id"])
        if entry.get("token_name"):
            name = escape(entry["token_name"])
            who = f"{who} ({name})" if who else name
        table.add_row(
            str(entry["id"]),
            entry["at"],
            entry.get("tenant") or "",
            entry.get("role") or "",
            who,
            escape(f"{entry['method']} {entry['path']}"),
            str(entry["status"]),
        )
    _emit(page, as_json, table)
