"""``autotune policy``: the running daemon's policy versions, through its REST API
(``/api/v1/policies``): list them, register a checkpoint, activate a version, shadow one
beside the active version, roll back. Like ``autotune override``: ``--url``,
``--token`` for changes, ``--json`` for the API's response."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from autotune.cli.common import JsonOption, fail
from autotune.cli.jobs import TokenOption, UrlOption, _emit, daemon, to_json

__all__ = ["policy_app"]

policy_app = typer.Typer(
    help="The daemon's policy versions: register a checkpoint, activate, shadow, roll back."
)

_out = Console()


def _line(policy: dict[str, Any]) -> str:
    return f"[bold]{policy['version']}[/] ({policy['name']}): {policy['state']}"


@policy_app.command("list")
def policy_list(url: UrlOption = None, as_json: JsonOption = False) -> None:
    """Registered versions, newest first, with their state: active (it decides), shadow
    (it decides beside it, never applied) or registered."""
    with daemon(url) as api:
        page = to_json(api.policies())
    table = Table(title=f"{page['count']} policy version(s)")
    for column in ("version", "name", "kind", "state", "activated", "hash", "checkpoint", "error"):
        table.add_column(column, overflow="fold")
    for policy in page["data"]:
        table.add_row(
            policy["version"],
            policy["name"],
            policy["kind"],
            policy["state"],
            policy.get("activated_at") or "",
            (policy.get("content_hash") or "")[:12],
            policy.get("checkpoint_path") or "",
            policy.get("last_error") or "",
        )
    _emit(page, as_json, table)


@policy_app.command("register")
def policy_register(
    checkpoint: Annotated[
        str, typer.Argument(help="Checkpoint folder on the daemon's machine (made absolute).")
    ],
    name: Annotated[str, typer.Option("--name", help="A name for people.")],
    kind: Annotated[str, typer.Option(help="Policy family: ppo, bc, ...")] = "ppo",
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Register a checkpoint (the daemon loads it to check it serves; the same content
    registered again is the same version). It decides nothing until activated or
    shadowed."""
    path = Path(checkpoint).expanduser()
    body = {"checkpoint": str(path.absolute()), "name": name, "kind": kind}
    with daemon(url, token, changes=True) as api:
        policy = to_json(api.register_policy(body))
    _emit(policy, as_json, "registered " + _line(policy))


@policy_app.command("activate")
def policy_activate(
    version: Annotated[str, typer.Argument(help="Version (from `autotune policy list`).")],
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Make VERSION the active one: the daemon decides with it from its next tick, no
    restart. If it cannot load it, it keeps its policy (`policy list` shows why)."""
    with daemon(url, token, changes=True) as api:
        policy = to_json(api.activate_policy(version))
    _emit(policy, as_json, _line(policy) + " from the daemon's next tick")


@policy_app.command("shadow")
def policy_shadow(
    version: Annotated[
        str | None, typer.Argument(help="Version to shadow; none: show the shadow.")
    ] = None,
    stop: Annotated[bool, typer.Option("--stop", help="Stop shadowing.")] = False,
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Shadow VERSION: it decides every round beside the active version (its decisions
    stored with source shadow, never applied); --stop ends it; with neither, how the
    shadow compares with the active version."""
    if stop and version is not None:
        fail("give a VERSION to shadow or --stop, not both", 2)
    if stop:
        with daemon(url, token, changes=True) as api:
            policy = to_json(api.stop_shadow())
        _emit(policy, as_json, f"stopped shadowing [bold]{policy['version']}[/]")
        return
    if version is not None:
        with daemon(url, token, changes=True) as api:
            policy = to_json(api.shadow_policy(version))
        _emit(policy, as_json, _line(policy) + " from the daemon's next tick")
        return
    with daemon(url) as api:
        shadow = to_json(api.shadow())
    if as_json:
        _emit(shadow, True)
        return
    _out.print(
        f"[bold]{shadow['version']}[/] ({shadow['name']}) beside {shadow['active_version']} "
        f"since {shadow['since']}: {shadow['ticks']} tick(s), {shadow['decisions']} decision(s)"
    )
    table = Table()
    for column in ("", "all ticks", f"newest {shadow['recent_ticks']}"):
        table.add_column(column, justify="right")
    table.add_row("agreement", _share(shadow["agreement"]), _share(shadow["agreement_recent"]))
    for who in ("shadow", "active"):
        table.add_row(
            f"predicted goodput ({who})",
            _number(shadow["predicted_goodput"][who]),
            _number(shadow["predicted_goodput_recent"][who]),
        )
    _out.print(table)


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.1f}"


@policy_app.command("rollback")
def policy_rollback(
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Make the version active before the current one active again (again: further
    back)."""
    with daemon(url, token, changes=True) as api:
        policy = to_json(api.rollback_policy())
    _emit(policy, as_json, "rolled back to " + _line(policy))
