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
from autotune.cli.executor import calibrate_command, run_command
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
model_app = typer.Typer(help="Check and calibrate the performance model.", no_args_is_help=True)
app.add_typer(model_app, name="model")
# The REST API's client (autotune/client.py): jobs, decisions, overrides.
from autotune.cli.client import decisions_command, job_app, override_app  # noqa: E402

app.add_typer(job_app, name="job", no_args_is_help=True)
app.add_typer(override_app, name="override", no_args_is_help=True)
app.command("decisions")(decisions_command)


def _register_learning() -> None:
    from autotune.cli.forecast import forecast_app
    from autotune.cli.policy import train_policy, tune_policy

    app.add_typer(forecast_app, name="forecast")
    app.command("train-policy")(train_policy)
    app.command("tune-policy")(tune_policy)


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


# Training for real through the executor (autotune/job_cli.py).
job_app.command("run")(_user_errors(run_command))
app.command("calibrate")(calibrate_command)

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
    backend: Annotated[
        str | None,
        typer.Option(
            help="The cluster to drive: sim (the built-in simulated one) or ray (jobs "
            "trained for real by Ray actors; local Ray unless --ray-address)."
        ),
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address",
            help="The Ray cluster to join (ray backend) and whose state API to read (telemetry).",
        ),
    ] = None,
    sim_initial_jobs: Annotated[
        int | None,
        typer.Option("--sim-initial-jobs", help="Jobs waiting when the simulator starts (6)."),
    ] = None,
    sim_max_jobs: Annotated[
        int | None,
        typer.Option(
            "--sim-max-jobs", help="Jobs the simulator's stream makes in all (0: API jobs only)."
        ),
    ] = None,
    log_format: Annotated[
        str | None, typer.Option("--log-format", help="json (default) or text.")
    ] = None,
    log_level: Annotated[str | None, typer.Option("--log-level", help="DEBUG, INFO, ...")] = None,
    policy: Annotated[
        str, typer.Option(help="rules, or ppo (the learned policy; rules if it cannot load).")
    ] = "rules",
    policy_checkpoint: Annotated[
        Path | None, typer.Option(help="RLModule checkpoint for ppo (default: the shipped one).")
    ] = None,
) -> None:
    """Run the decision loop, the REST API and the dashboard until Ctrl-C or SIGTERM.

    With no attached cluster it drives the built-in simulated cluster (32 GPUs, a
    seeded job stream) with the rule-based policy, and stores every decision in SQLite
    before applying it. API: http://HOST:PORT/api/v1, OpenAPI docs at /docs, dashboard
    at /. Mutations need the token in $AUTOTUNE_TOKEN; without it, a token is generated
    at the first start and printed once.
    """
    from autotune.daemon.auth import ensure_token
    from autotune.daemon.backends import build_backend
    from autotune.daemon.log import configure_logging
    from autotune.daemon.loop import Daemon, serve
    from autotune.daemon.settings import load_settings
    from autotune.daemon.telemetry import host_sources
    from autotune.db import Database
    from autotune.policies.rules import RulesPolicy

    settings = load_settings(
        config,
        db_url=db,
        data_dir=data_dir,
        host=host,
        port=port,
        tick_s=tick_s,
        seed=seed,
        backend=backend,
        ray_address=ray_address,
        sim_initial_jobs=sim_initial_jobs,
        sim_max_jobs=sim_max_jobs,
        log_format=log_format,
        log_level=log_level.upper() if log_level else None,
    )
    configure_logging(settings.log_level, settings.log_format)
    if policy not in ("rules", "ppo"):
        raise InputError(f"--policy {policy!r}: rules or ppo")
    cluster = build_backend(settings)
    if settings.db_url is None:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    database = Database(settings.database_url)
    database.upgrade()
    token_check, new_token = ensure_token(
        database, settings.token.get_secret_value() if settings.token else None
    )
    if new_token is not None:  # shown once, on stdout, never through the log
        typer.echo(
            f"API token (shown once; only its hash is stored): {new_token}\n"
            "Set AUTOTUNE_TOKEN to it for `autotune job ...` and other API clients."
        )
        sys.stdout.flush()
    chosen = RulesPolicy() if policy == "rules" else _learned_policy(policy_checkpoint)
    serve(
        Daemon(db=database, backend=cluster, policy=chosen),
        host=settings.host,
        port=settings.port,
        tick_s=settings.tick_s,
        telemetry=cluster.name,
        token_check=token_check,
        task_modules=settings.task_modules,
        max_body_bytes=settings.max_body_bytes,
        host_telemetry=host_sources(settings.ray_address),
    )


def _learned_policy(checkpoint: Path | None) -> Any:
    from autotune.policies.serving import LearnedPolicy

    return LearnedPolicy(checkpoint)


@db_app.command("upgrade")
@_user_errors
def db_upgrade(
    config: ConfigOption = None,
    db: DbOption = None,
    data_dir: DataDirOption = None,
    revision: Annotated[str, typer.Option(help="Target revision.")] = "head",
) -> None:
    """Create or migrate the database schema (Alembic)."""
    from autotune.daemon.settings import load_settings
    from autotune.db import Database

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
    from autotune.envs.traces import load_nodes, load_pods
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


@model_app.command("validate")
@_user_errors
def model_validate(
    pollux: Annotated[
        Path,
        typer.Option(help="Pollux traces folder (<app>/placements.csv ...).", show_default=False),
    ],
    max_fit_nodes: Annotated[
        int, typer.Option(min=1, help="Fit on placements spanning at most this many nodes.")
    ] = 2,
    plot: Annotated[
        Path | None, typer.Option(help="Write the residual plot (PNG) here; needs matplotlib.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Fit the performance model per Pollux application on small placements and report
    its error on the larger placements it never saw (mean absolute percentage error)."""
    from autotune.perf.pollux import plot_residuals, validate

    report = validate(
        pollux,
        max_fit_nodes=max_fit_nodes,
        progress=None if as_json else lambda app: _err.print(f"fitting {app}"),
    )
    if plot is not None:
        plot_residuals(report, plot)
    report.pop("residuals")
    if as_json:
        typer.echo(json.dumps(report))
        return
    out = Console()
    for app_name, row in report["apps"].items():
        out.print(
            f"{app_name:12s} fit {row['n_fit']:4d}  test {row['n_test']:5d}  "
            f"step MAPE {row['mape_step_time']:6.1%}  sync MAPE {row['mape_sync_time']:6.1%}"
        )
    out.print(f"[bold]mean step-time MAPE {report['mape_step_time_mean']:.1%}[/]")


@model_app.command("calibrate")
@_user_errors
def model_calibrate(
    pollux: Annotated[
        Path,
        typer.Option(help="Pollux traces folder (<app>/placements.csv ...).", show_default=False),
    ],
    out: Annotated[Path, typer.Option(help="Where to write the calibration JSON.")],
) -> None:
    """Fit every Pollux application on all its placements and write the document the
    package ships as autotune/data/pollux_apps.json."""
    from autotune.perf.pollux import calibrate

    out.write_text(json.dumps(calibrate(pollux), indent=1) + "\n")
    _err.print(f"wrote {out}")


@app.command("eval")
@_user_errors
def eval_policies(
    nodes: Annotated[
        Path | None, typer.Option(help="Alibaba v2023 node list (with --jobs).")
    ] = None,
    jobs: Annotated[Path | None, typer.Option(help="Alibaba v2023 pod list.")] = None,
    pollux_workload: Annotated[
        Path | None, typer.Option(help="Pollux workload CSV (name,time,application,...).")
    ] = None,
    philly_jobs: Annotated[
        Path | None, typer.Option(help="Philly-style job list (timestamp,duration,num_gpus).")
    ] = None,
    gpus: Annotated[
        int, typer.Option(min=1, help="Cluster size for Pollux (4 T4 per node) or Philly (8 P100).")
    ] = 64,
    limit_jobs: Annotated[int | None, typer.Option(min=1, help="Replay the first N jobs.")] = None,
    skip_jobs: Annotated[
        int, typer.Option(min=0, help="Leave out the first N jobs (before --limit-jobs).")
    ] = 0,
    policies: Annotated[
        str,
        typer.Option(
            help="Comma-separated: static, rules, random, tiresias, oracle, ppo (the learned "
            "policy), tune (per-job trial search)."
        ),
    ] = "static,rules,tiresias,oracle",
    policy_checkpoint: Annotated[
        Path | None,
        typer.Option(help="RLModule checkpoint for ppo (default: the one shipped)."),
    ] = None,
    tune_budget_s: Annotated[
        float, typer.Option(min=0.0, help="Simulated trial time per job for tune (s).")
    ] = 1800.0,
    tune_charge: Annotated[
        bool,
        typer.Option(help="tune: the trial time delays each job (--no-tune-charge: free)."),
    ] = True,
    seeds: Annotated[int, typer.Option(min=1, help="Seeds per policy.")] = 3,
    slots: Annotated[int, typer.Option(min=1, help="Jobs a policy decides per round.")] = 32,
    interval: Annotated[float, typer.Option(min=1.0, help="Decision round (s).")] = 300.0,
    trace_seed: Annotated[int, typer.Option(help="Seed of model assignment to trace jobs.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Replay a trace in the simulator under several policies, same jobs and seeds, and
    compare job completion time, makespan, goodput and GPU utilisation."""
    from autotune.catalog.devices import node_info
    from autotune.envs import traces
    from autotune.envs.traces import load_nodes
    from autotune.envs.workloads import jobs_from_trace
    from autotune.perf.pollux import POLLUX_INTER_NODE_GBPS
    from autotune.policies.baselines import BASELINES
    from autotune.policies.evaluate import evaluate

    sources = [x is not None for x in (jobs, pollux_workload, philly_jobs)]
    if sum(sources) != 1:
        raise InputError("give one trace: --nodes/--jobs, --pollux-workload or --philly-jobs")
    from autotune.cli.policy import learned_policies

    names = [p.strip() for p in policies.split(",") if p.strip()]
    known = [*BASELINES, "ppo", "tune"]
    unknown = [p for p in names if p not in known]
    if unknown or not names:
        raise InputError(f"unknown policy {unknown}; known: {', '.join(known)}")
    if jobs is not None:
        if nodes is None:
            raise InputError("--jobs needs --nodes")
        node_list = load_nodes(nodes)
        limit = None if limit_jobs is None else skip_jobs + limit_jobs
        trace = traces.alibaba_jobs(jobs, seed=trace_seed, limit=limit)[skip_jobs:]
        info: dict[str, Any] = {"kind": "alibaba", "path": str(jobs)}
    elif pollux_workload is not None:
        if gpus % 4:
            raise InputError(f"--gpus {gpus}: Pollux nodes have 4 GPUs each")
        node_list = [
            node_info(
                f"t4-{i}",
                gpu_model="T4",
                gpu_count=4,
                cpu_milli=48_000,
                memory_mib=192 * 1024,
                inter_node_bandwidth_gbps=POLLUX_INTER_NODE_GBPS,
            )
            for i in range(gpus // 4)
        ]
        trace = _window(traces.pollux_workload(pollux_workload), skip_jobs, limit_jobs)
        info = {"kind": "pollux", "path": str(pollux_workload)}
    else:
        assert philly_jobs is not None
        if gpus % 8:
            raise InputError(f"--gpus {gpus}: Philly-style nodes have 8 GPUs each")
        node_list = [
            node_info(
                f"p100-{i}", gpu_model="P100", gpu_count=8, cpu_milli=64_000, memory_mib=512 * 1024
            )
            for i in range(gpus // 8)
        ]
        trace = _window(traces.philly_jobs(philly_jobs, seed=trace_seed), skip_jobs, limit_jobs)
        info = {"kind": "philly", "path": str(philly_jobs)}
    total = sum(n.gpu_count for n in node_list)
    too_big = [t.job_id for t in trace if t.num_gpus > total]
    if too_big:
        raise InputError(
            f"{len(too_big)} job(s) ask for more than the {total} GPUs, e.g. {too_big[0]}"
        )
    if not trace:
        raise InputError("no jobs left to replay (--skip-jobs/--limit-jobs)")
    sim_jobs = jobs_from_trace(_rebase(trace))
    extra = learned_policies(
        names,
        checkpoint=policy_checkpoint,
        slots=slots,
        budget_s=tune_budget_s,
        charge=tune_charge,
    )
    if "ppo" in names:
        info["policy_checkpoint"] = str(policy_checkpoint or "shipped")
    if "tune" in names:
        info["tune_budget_s"] = tune_budget_s
        info["tune_charge"] = tune_charge
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} runs"),
        TimeElapsedColumn(),
        console=_err,
        transient=True,
        disable=as_json or not _err.is_terminal,
    )
    with progress:
        task = progress.add_task("evaluating", total=len(names) * seeds)
        report = evaluate(
            nodes=node_list,
            jobs=sim_jobs,
            policies=names,
            seeds=seeds,
            slots=slots,
            interval_s=interval,
            trace=info,
            extra=extra,
            progress=lambda name, seed: progress.update(
                task, advance=1, description=f"{name} seed {seed}"
            ),
        )
    if as_json:
        typer.echo(json.dumps(report))
        return
    out = Console()
    out.print(
        f"{report['trace']['jobs']} jobs on {report['trace']['gpus']} GPUs, "
        f"{seeds} seed(s); means over seeds"
    )
    out.print(
        f"{'policy':10s} {'avg JCT s':>10s} {'p99 JCT s':>10s} {'makespan s':>11s} "
        f"{'goodput':>8s} {'GPU util':>8s} {'done':>6s}"
    )
    for name, row in report["policies"].items():
        out.print(
            f"{name:10s} {row['avg_jct_s']:10.0f} {row['p99_jct_s']:10.0f} "
            f"{row['makespan_s']:11.0f} {row['goodput']:8.2f} {row['gpu_util']:8.1%} "
            f"{row['n_jobs_done']:6.0f}"
        )


def _window(trace: list[Any], skip: int, limit: int | None) -> list[Any]:
    return trace[skip:] if limit is None else trace[skip : skip + limit]


def _rebase(trace: list[Any]) -> list[Any]:
    """Submission times from the first kept job (after --skip-jobs)."""
    from dataclasses import replace

    origin = min(t.submit_s for t in trace)
    return [replace(t, submit_s=t.submit_s - origin) for t in trace] if origin else trace


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


_register_learning()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
