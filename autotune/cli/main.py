"""The ``autotune`` command tree, in one place and in the README's order.

Each command lives in the module of its group (``daemon``, ``plan``, ``jobs``,
``tenants``, ``versions``, ``evaluate``, ``forecast``, ``policy``, ``replay``,
``executor``); the helpers they share are in ``common``. Studies add command groups of
their own through the ``autotune.commands`` entry points (``autotune pollux ...``).
Commands that report figures print one JSON object with ``--json``. Exit codes: 0 on
success, 2 on bad input (one line on stderr naming the file, row or column), 1 when
something outside the input failed (an unreachable daemon, a crashed job).

Modules that import Ray, RLlib or torch do so inside the command, so ``autotune --help``
stays fast.
"""

from __future__ import annotations

import inspect
import os
import sys
from importlib.metadata import entry_points
from typing import Final

import typer
import typer.rich_utils

from autotune import __version__
from autotune.cli.cluster import cluster_app
from autotune.cli.common import user_errors
from autotune.cli.daemon import daemon, db_app, token_app
from autotune.cli.evaluate import eval_policies
from autotune.cli.executor import calibrate_command, run_command
from autotune.cli.forecast import forecast_app
from autotune.cli.jobs import decisions_command, job_app, override_app
from autotune.cli.plan import plan
from autotune.cli.policy import train_policy, tune_policy
from autotune.cli.replay import replay_app
from autotune.cli.tenants import audit_command, tenant_app
from autotune.cli.versions import policy_app

__all__ = ["app", "help_columns", "main", "reflow_help"]

app = typer.Typer(
    name="autotune",
    help="Autotuner and scheduler daemon for distributed deep-learning training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Panels of `autotune --help`, in the README's order.
_DAEMON = "Run the daemon"
_JOBS = "Jobs, decisions and overrides (the daemon's REST API)"
_ACCESS = "Tenants, tokens and the audit log (the daemon's REST API)"
_SIM = "Plan, simulate and evaluate"
_LEARN = "Learned policy and demand forecast"
_EXECUTOR = "Training for real"

app.command("daemon", rich_help_panel=_DAEMON)(daemon)
app.add_typer(db_app, name="db", rich_help_panel=_DAEMON)
app.add_typer(job_app, name="job", no_args_is_help=True, rich_help_panel=_JOBS)
app.command("decisions", rich_help_panel=_JOBS)(decisions_command)
app.add_typer(override_app, name="override", no_args_is_help=True, rich_help_panel=_JOBS)
app.add_typer(policy_app, name="policy", no_args_is_help=True, rich_help_panel=_JOBS)
app.add_typer(tenant_app, name="tenant", no_args_is_help=True, rich_help_panel=_ACCESS)
# `token rotate` works on the database, without a token (autotune.cli.daemon); the
# others, through the API, are added to the group by autotune.cli.tenants.
app.add_typer(
    token_app,
    name="token",
    help="API tokens: issue, list and revoke them (an admin's token), say who one is; "
    "`token rotate` gives one a new secret straight in the database, with no token.",
    rich_help_panel=_ACCESS,
)
app.command("audit", rich_help_panel=_ACCESS)(audit_command)
app.command("plan", rich_help_panel=_SIM)(plan)
app.command("eval", rich_help_panel=_SIM)(eval_policies)
app.add_typer(forecast_app, name="forecast", rich_help_panel=_LEARN)
app.command("train-policy", rich_help_panel=_LEARN)(train_policy)
app.command("tune-policy", rich_help_panel=_LEARN)(tune_policy)
app.add_typer(replay_app, name="replay", rich_help_panel=_LEARN)
# `job run` trains one job here, through the executor, beside the REST client's commands.
job_app.command("run")(user_errors(run_command))
app.command("calibrate", rich_help_panel=_EXECUTOR)(calibrate_command)
app.add_typer(cluster_app, name="cluster", rich_help_panel=_EXECUTOR)

_STUDIES = "Studies: other systems' worlds"
COMMANDS_GROUP = "autotune.commands"
"""The entry-point group under which studies register their command groups."""
for _entry in entry_points(group=COMMANDS_GROUP):
    # A typer app; like ours, its module imports nothing heavy (its commands do, when run).
    app.add_typer(_entry.load(), name=_entry.name, rich_help_panel=_STUDIES)


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


HELP_COLUMNS_WITHOUT_TERMINAL: Final = 120
"""Columns of help written where no terminal is (a file, a CI log): wide enough for the
option table's help column to hold sentences, not one word per line."""


def help_columns() -> int | None:
    """The columns help is drawn in when rich cannot measure them itself: None when stdout
    is a terminal or ``COLUMNS``/``TERMINAL_WIDTH`` say; else the controlling terminal's
    width (help piped into a pager), else ``HELP_COLUMNS_WITHOUT_TERMINAL`` (rich would
    take 80)."""
    if os.environ.get("COLUMNS") or os.environ.get("TERMINAL_WIDTH") or sys.stdout.isatty():
        return None
    try:
        tty = os.open("/dev/tty", os.O_RDONLY)
    except OSError:
        return HELP_COLUMNS_WITHOUT_TERMINAL
    try:
        return os.get_terminal_size(tty).columns
    except OSError:
        return HELP_COLUMNS_WITHOUT_TERMINAL
    finally:
        os.close(tty)


def _reflowed(text: str) -> str:
    head, cut, rest = inspect.cleandoc(text).partition("\f")
    paragraphs = (" ".join(line.strip() for line in p.splitlines()) for p in head.split("\n\n"))
    return "\n\n".join(paragraphs) + cut + rest


def reflow_help(tree: typer.Typer) -> None:
    """Each paragraph of the help of the commands of ``tree`` (and of its groups') as one
    line, for the terminal to wrap: typer's rich help keeps a docstring's line breaks, so
    prose wrapped at the source's width came out ragged at any other width."""
    for info in tree.registered_commands:
        text = info.help if isinstance(info.help, str) else inspect.getdoc(info.callback)
        if text:
            info.help = _reflowed(text)
    for group in tree.registered_groups:
        if group.typer_instance is not None:
            if isinstance(group.typer_instance.info.help, str):
                group.typer_instance.info.help = _reflowed(group.typer_instance.info.help)
            reflow_help(group.typer_instance)


reflow_help(app)


def main() -> None:
    columns = help_columns()
    if columns is not None:
        typer.rich_utils.MAX_WIDTH = columns
    app()


if __name__ == "__main__":
    main()
