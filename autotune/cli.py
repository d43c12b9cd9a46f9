"""The ``autotune`` command line.

Commands that report figures print one JSON object with ``--json``. Exit codes: 0 on
success, 2 on bad input (one line on stderr naming the file, row or column).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from autotune import __version__
from autotune.errors import InputError

__all__ = ["app", "main"]

app = typer.Typer(
    name="autotune",
    help="Autotuner and scheduler daemon for distributed deep-learning training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="Manage the database schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")

_err = Console(stderr=True)
P = ParamSpec("P")
R = TypeVar("R")


def _user_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Bad input ends the command with one line on stderr and exit code 2."""

    @wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except InputError as exc:
            sys.stderr.write(f"error: {exc}\n")
            raise typer.Exit(code=2) from None

    return wrapper


ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", help="TOML settings file (default: $AUTOTUNE_CONFIG, if set)."),
]
DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="SQLAlchemy database URL (default: $AUTOTUNE_DB_URL, else SQLite in the data dir).",
    ),
]
DataDirOption = Annotated[
    Path | None, typer.Option("--data-dir", help="Directory for the default SQLite database.")
]


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


@app.command()
@_user_errors
def daemon(
    config: ConfigOption = None,
    db: DbOption = None,
    data_dir: DataDirOption = None,
    host: Annotated[
        str | None, typer.Option(help="Address the API binds to (default 127.0.0.1).")
    ] = None,
    port: Annotated[int | None, typer.Option(help="API port (default 8000).")] = None,
    tick_s: Annotated[
        float | None, typer.Option("--tick-s", help="Seconds between decision rounds (default 2).")
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="Seed of the simulated cluster's job stream (default 0).")
    ] = None,
    log_format: Annotated[
        str | None, typer.Option("--log-format", help="json (default) or text.")
    ] = None,
    log_level: Annotated[str | None, typer.Option("--log-level", help="DEBUG, INFO, ...")] = None,
) -> None:
    """Run the decision loop and the REST API until Ctrl-C or SIGTERM.

    With no attached cluster it drives the built-in simulated cluster (32 GPUs, a
    seeded job stream) with the rule-based policy, and stores every decision in SQLite
    before applying it. API: http://HOST:PORT/api/v1, OpenAPI docs at /docs.
    """
    from autotune.daemon import Daemon, serve
    from autotune.db import Database
    from autotune.envs.simulated import SimulatedCluster, SimulatedClusterConfig
    from autotune.log import configure_logging
    from autotune.policies.rules import RulesPolicy
    from autotune.settings import load_settings

    settings = load_settings(
        config,
        db_url=db,
        data_dir=data_dir,
        host=host,
        port=port,
        tick_s=tick_s,
        seed=seed,
        log_format=log_format,
        log_level=log_level.upper() if log_level else None,
    )
    configure_logging(settings.log_level, settings.log_format)
    if settings.db_url is None:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    database = Database(settings.database_url)
    database.upgrade()
    backend = SimulatedCluster(
        SimulatedClusterConfig(
            seed=settings.seed,
            seconds_per_tick=settings.sim_seconds_per_tick,
            mean_interarrival_s=settings.sim_mean_interarrival_s,
        )
    )
    serve(
        Daemon(db=database, backend=backend, policy=RulesPolicy()),
        host=settings.host,
        port=settings.port,
        tick_s=settings.tick_s,
        telemetry=backend.name,
    )


@db_app.command("upgrade")
@_user_errors
def db_upgrade(
    config: ConfigOption = None,
    db: DbOption = None,
    data_dir: DataDirOption = None,
    revision: Annotated[str, typer.Option(help="Target revision.")] = "head",
) -> None:
    """Create or migrate the database schema (Alembic)."""
    from autotune.db import Database
    from autotune.settings import load_settings

    settings = load_settings(config, db_url=db, data_dir=data_dir)
    if settings.db_url is None:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    database = Database(settings.database_url)
    database.upgrade(revision)
    typer.echo(f"database at revision {database.current_revision()}: {settings.database_url}")
    database.dispose()


@app.command()
@_user_errors
def plan(
    nodes: Annotated[
        Path, typer.Option(help="Alibaba v2023 node list (.csv or .csv.gz).", show_default=False)
    ],
    jobs: Annotated[
        Path, typer.Option(help="Alibaba v2023 pod list (.csv or .csv.gz).", show_default=False)
    ],
    limit: Annotated[
        int | None, typer.Option(min=1, help="Take only the first N GPU pods by creation time.")
    ] = None,
    strategy: Annotated[
        str,
        typer.Option(help="hungarian (decision rounds of linear assignment) or first-fit."),
    ] = "hungarian",
    round_size: Annotated[
        int, typer.Option("--round-size", min=1, help="Placement units per decision round.")
    ] = 256,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Place the GPU pods of a trace, as one queue of pending work, on its nodes.

    Pods go in creation order; each must fit on one node, whole. Prints the assignment
    of every rank to a node and GPU, the pods left unplaced with the reason, and the
    solve time.
    """
    from autotune.envs.alibaba import load_nodes, load_pods
    from autotune.planner import first_fit, verify_placements
    from autotune.planner import plan as run_plan

    if strategy not in ("hungarian", "first-fit"):
        raise InputError(f"--strategy {strategy!r}: use hungarian or first-fit")
    node_list = load_nodes(nodes)
    trace = load_pods(jobs, limit=limit)
    with _progress(enabled=not as_json, total=len(trace.jobs)) as update:
        if strategy == "first-fit":
            result = first_fit(trace.jobs, node_list, {})
        else:
            result = run_plan(trace.jobs, node_list, {}, round_size=round_size, progress=update)
    problems = verify_placements(trace.jobs, node_list, result.placements)
    if problems:  # a Planner bug, not bad input: say so loudly
        sys.stderr.write(f"internal error: invalid assignment: {problems[0]}\n")
        raise typer.Exit(code=1)
    report: dict[str, Any] = {
        "assignments": [
            {
                "job": job.job_id,
                "rank": slot.rank,
                "node": slot.node_id,
                "gpu": slot.gpu_index,
                "gpu_milli": slot.gpu_milli,
            }
            for job in trace.jobs
            if (placement := result.placements.get(job.job_id)) is not None
            for slot in placement.ranks
        ],
        "unplaced": [
            {"job": job.job_id, "reason": result.unplaced[job.job_id]}
            for job in trace.jobs
            if job.job_id in result.unplaced
        ],
        "skipped_cpu_only": trace.skipped_cpu_only,
        "solve_s": round(result.solve_s, 3),
        "strategy": strategy,
        "placed": len(result.placements),
        "rounds": result.rounds,
    }
    if as_json:
        typer.echo(json.dumps(report))
        return
    _print_plan_summary(report, total=len(trace.jobs))


@contextmanager
def _progress(*, enabled: bool, total: int) -> Iterator[Callable[[int, int], None]]:
    """A progress bar on stderr, when it is a terminal, fed by ``update(done, total)``."""
    progress = Progress(
        TextColumn("placing"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} pods"),
        TimeElapsedColumn(),
        console=_err,
        transient=True,
        disable=not (enabled and _err.is_terminal),
    )
    with progress:
        task = progress.add_task("plan", total=total)

        def update(done: int, _total: int) -> None:
            progress.update(task, completed=done)

        yield update


def _print_plan_summary(report: dict[str, Any], *, total: int) -> None:
    out = Console()
    out.print(
        f"[bold]{report['placed']}[/] of {total} GPU pods placed with {report['strategy']} "
        f"in {report['solve_s']:.1f} s ({report['rounds']} rounds); "
        f"{len(report['unplaced'])} unplaced; {report['skipped_cpu_only']} CPU-only pods skipped."
    )
    reasons = Counter(u["reason"].split(";")[0] for u in report["unplaced"])
    for reason, count in reasons.most_common():
        out.print(f"  {count:5d}  {reason}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
