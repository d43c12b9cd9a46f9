"""``autotune daemon`` (the decision loop, the REST API and the dashboard) and ``autotune db``
(the database schema)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from autotune.cli.common import ConfigOption, DataDirOption, DbOption, user_errors
from autotune.errors import InputError

__all__ = ["daemon", "db_app", "token_app"]

db_app = typer.Typer(help="Manage the database schema.", no_args_is_help=True)
token_app = typer.Typer(help="The API token that changes need.", no_args_is_help=True)


@user_errors
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
    round_s: Annotated[
        float | None,
        typer.Option(
            "--round-s",
            help="Decision round period the policy sees: simulated seconds per tick on "
            "sim (default 300, as the shipped policy was trained), wall seconds between "
            "ticks on ray (default --tick-s).",
        ),
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
    cluster_file: Annotated[
        Path | None,
        typer.Option(
            "--cluster-file",
            help="A cluster file (autotune cluster describe): the ray backend charges its "
            "measured links; the sim backend simulates its nodes.",
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
    sim_workload: Annotated[
        Path | None,
        typer.Option(
            "--sim-workload",
            help="A Pollux workload CSV for the simulator to play instead of its job stream "
            "(on Pollux's testbed of --sim-gpus T4 GPUs).",
        ),
    ] = None,
    sim_workload_jobs: Annotated[
        str | None,
        typer.Option(
            "--sim-workload-jobs",
            help="START:STOP: only these jobs of --sim-workload, in arrival order (e.g. 0:80).",
        ),
    ] = None,
    sim_gpus: Annotated[
        int | None, typer.Option("--sim-gpus", help="GPUs of the Pollux testbed (64).")
    ] = None,
    exploration_epsilon: Annotated[
        float | None,
        typer.Option(
            "--exploration-epsilon",
            help="The learned policy's exploration floor per action entry (0.05; 0: "
            "deterministic). Logged with every transition for off-policy evaluation.",
        ),
    ] = None,
    forecast: Annotated[
        str | None,
        typer.Option(
            "--forecast",
            metavar="[lstm|persistence|none]",
            help="The demand forecaster behind /api/v1/forecast, the dashboard and the "
            "learned policy's observation: lstm (default; the shipped LSTM, its "
            "persistence fallback behind it), persistence (calibrated persistence and "
            "persistence + buffer) or none (no forecast; the policy was trained with lstm).",
        ),
    ] = None,
    provisioning: Annotated[
        str | None,
        typer.Option(
            "--provisioning",
            metavar="[none|buffer|forecast]",
            help="Park idle nodes beyond what the 95% quantile of the next hour's demand "
            "needs: forecast (from --forecast's forecaster), buffer (persistence + buffer) "
            "or none (default: every node on). The simulated cluster powers them down; on "
            "Ray the plan is a recommendation (log event 'provisioning', metrics).",
        ),
    ] = None,
    log_format: Annotated[
        str | None, typer.Option("--log-format", help="json (default) or text.")
    ] = None,
    log_level: Annotated[str | None, typer.Option("--log-level", help="DEBUG, INFO, ...")] = None,
    policy: Annotated[
        str,
        typer.Option(help="ppo (the learned policy, default; rules if it cannot load) or rules."),
    ] = "ppo",
    policy_checkpoint: Annotated[
        Path | None, typer.Option(help="RLModule checkpoint for ppo (default: the shipped one).")
    ] = None,
) -> None:
    """Run the decision loop, the REST API and the dashboard until Ctrl-C or SIGTERM.

    With no attached cluster it drives the built-in simulated cluster (32 GPUs, a
    seeded job stream) with the learned policy, and stores every decision in SQLite
    before applying it. API: http://HOST:PORT/api/v1, OpenAPI docs at /docs, dashboard
    at /. Mutations need the token in $AUTOTUNE_TOKEN; without it, a token is generated
    at the first start and printed once.

    Several daemons may share one database (--db, PostgreSQL): all serve the API, the
    one holding the leader lease decides, and another takes over within
    AUTOTUNE_LEADER_LEASE_S (5 s) plus a second when it dies.
    """
    from autotune.daemon.auth import ensure_token
    from autotune.daemon.backends import build_backend
    from autotune.daemon.hosting import serve
    from autotune.daemon.leader import Leadership
    from autotune.daemon.log import configure_logging
    from autotune.daemon.settings import load_settings
    from autotune.daemon.telemetry import host_sources
    from autotune.daemon.tick import Daemon, DaemonParts
    from autotune.db import Database
    from autotune.policies.rules import RulesPolicy
    from autotune.replay.log import TransitionLog

    settings = load_settings(
        config,
        db_url=db,
        data_dir=data_dir,
        host=host,
        port=port,
        tick_s=tick_s,
        round_s=round_s,
        seed=seed,
        backend=backend,
        ray_address=ray_address,
        cluster_file=cluster_file,
        sim_initial_jobs=sim_initial_jobs,
        sim_max_jobs=sim_max_jobs,
        sim_workload=sim_workload,
        sim_workload_jobs=sim_workload_jobs,
        sim_gpus=sim_gpus,
        exploration_epsilon=exploration_epsilon,
        forecast=forecast,
        provisioning=provisioning,
        log_format=log_format,
        log_level=log_level.upper() if log_level else None,
    )
    configure_logging(settings.log_level, settings.log_format)
    retention = settings.retention()  # bad retention settings exit 2 before anything runs
    if policy not in ("rules", "ppo"):
        raise InputError(f"--policy {policy!r}: rules or ppo")
    cluster = build_backend(settings)
    if settings.db_url is None:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    database = Database(settings.database_url)
    database.prepare()  # migrated, reachable and writable, or exit 2 saying why
    api_db = Database(
        settings.database_url,
        pool_size=settings.api_pool_size,
        pool_timeout_s=settings.api_pool_timeout_s,
    )
    token_check, new_token = ensure_token(
        api_db, settings.token.get_secret_value() if settings.token else None
    )
    if new_token is not None:  # shown once, on stdout, never through the log
        typer.echo(
            f"API token (shown once; only its hash is stored): {new_token}\n"
            "Set AUTOTUNE_TOKEN to it for `autotune job ...` and other API clients."
        )
        sys.stdout.flush()
    chosen = RulesPolicy() if policy == "rules" else None
    if policy == "ppo" and policy_checkpoint is None:
        # The version activated through the API before a restart decides again.
        chosen = _resumed_policy(database, settings)
    if chosen is None:
        chosen = _learned_policy(policy_checkpoint, settings)
    # The rules decide whenever the chosen policy fails after ticks failed in a row.
    # Other daemons may share the database: the lease holder decides, the others serve
    # the API and take over when it stops renewing.
    lifecycle = None
    if policy == "ppo":  # it follows the policy registry: activate, shadow, roll back
        from autotune.daemon.lifecycle import PolicyLifecycle

        lifecycle = PolicyLifecycle(_policy_loader(settings), database)
    transitions = None
    if settings.log_transitions and policy == "ppo":
        transitions = TransitionLog(
            round_s=settings.round_period_s,
            energy_weight=settings.energy_weight,
            episode_rounds=settings.transition_episode_rounds,
        )
    the_daemon = Daemon(
        DaemonParts(
            db=database,
            backend=cluster,
            policy=chosen,
            fallback=RulesPolicy(),
            leadership=Leadership(
                Database(settings.database_url, pool_size=1), lease_s=settings.leader_lease_s
            ),
            backend_factory=lambda: build_backend(settings),
            lifecycle=lifecycle,
            transitions=transitions,
            provisioner=_provisioner(settings),
            job_metrics_every_s=settings.job_metrics_every_s,
        )
    )
    serve(
        the_daemon,
        host=settings.host,
        port=settings.port,
        tick_s=settings.tick_period_s,
        telemetry=cluster.name,
        api_db=api_db,
        stop_timeout_s=settings.stop_timeout_s,
        retention=retention,
        retention_every_s=settings.retention_every_s,
        retention_duty=settings.retention_duty,
        token_check=token_check,
        reads=settings.reads,
        task_modules=settings.task_modules,
        trains=settings.backend != "sim",  # every backend but the simulator trains for real
        max_body_bytes=settings.max_body_bytes,
        host_telemetry=host_sources(settings.ray_address),
        forecasters=_forecasters(settings.forecast),
    )


def _forecasters(kind: str) -> list[Any]:
    """The demand forecaster chain of ``--forecast``, first choice first: the LSTM and its
    named persistence fallback (``lstm``), the fallback alone (``persistence``), or none
    (``none``: the API answers with ``NoForecast``). When the checkpoint does not load the
    chain is empty, and the log says why."""
    from autotune.daemon.log import event
    from autotune.policies.forecast import demand_forecaster

    kinds = {"lstm": ["lstm", "persistence"], "persistence": ["persistence"]}.get(kind, [])
    try:
        return [demand_forecaster(k) for k in kinds]
    except InputError as exc:
        event("forecast.unavailable", level=30, forecast=kind, fallback="none", reason=str(exc))
        return []


def _provisioner(settings: Any) -> Any:
    """The provisioner of ``--provisioning`` (``None`` for ``none``): its target comes from
    the ``--forecast`` forecaster (``forecast``) or persistence + buffer (``buffer``)."""
    from autotune.provisioning import Provisioner

    if settings.provisioning == "none":
        return None
    kind = "persistence" if settings.provisioning == "buffer" else settings.forecast
    chain = _forecasters(kind)
    return Provisioner(chain[0] if chain else None)


def _policy_loader(settings: Any) -> Any:
    """What builds the learned policy of a registered version, as the daemon's own."""
    from autotune.policies.versions import CheckpointPolicies

    # The forecast kind ("lstm", "persistence", "none") goes on to ``LearnedPolicy``.
    forecast: Any = getattr(settings, "forecast", "lstm")
    return CheckpointPolicies(
        round_s=settings.round_period_s,
        epsilon=getattr(settings, "exploration_epsilon", 0.0),
        seed=settings.seed,
        forecast=forecast,
    )


def _resumed_policy(database: Any, settings: Any) -> Any:
    """The registry's active version when it has a checkpoint (one registered through
    the API, or named by ``--policy-checkpoint`` at an earlier start) or is the rules;
    ``None`` without one, or when it no longer loads (then the shipped policy decides,
    and the log says why)."""
    from autotune.daemon.log import event
    from autotune.db import repository as repo

    with database.session() as session:
        active, _shadow = repo.policy_state(session=session)
    if active is None or (active.checkpoint_path is None and active.kind != "rules"):
        return None
    try:
        chosen = _policy_loader(settings).build(
            active.kind, active.checkpoint_path, shadow=False, follow=None
        )
    except Exception as exc:  # whatever the checkpoint does: start on the shipped policy
        event(
            "policy.resume_failed",
            level=30,
            version=active.version,
            checkpoint=active.checkpoint_path,
            reason=f"{type(exc).__name__}: {exc}",
        )
        return None
    event(
        "policy.resumed",
        version=chosen.version,
        policy_name=active.name,
        checkpoint=active.checkpoint_path,
    )
    return chosen


def _learned_policy(checkpoint: Path | None, settings: Any) -> Any:
    from autotune.policies.serving import LearnedPolicy

    return LearnedPolicy(
        checkpoint,
        round_s=settings.round_period_s,
        epsilon=settings.exploration_epsilon,
        seed=settings.seed,
        forecast=settings.forecast,
    )


@db_app.command("upgrade")
@user_errors
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


@token_app.command("rotate")
@user_errors
def token_rotate(
    token_id: Annotated[
        int | None,
        typer.Option(
            "--id",
            min=1,
            help="The token to rotate (autotune token list); default: the oldest admin "
            "token, or a new admin token of tenant default when every admin's is revoked",
        ),
    ] = None,
    config: ConfigOption = None,
    db: DbOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Give a stored API token a new secret, shown once, straight in the database (no
    token needed: for an admin who lost theirs).

    The old secret stops working within 2 s, also in a running daemon (no restart). The
    token keeps its id, tenant, role and expiry. AUTOTUNE_TOKEN, when a daemon runs with
    it, is not stored: change the setting and restart it then."""
    from autotune.daemon.auth import rotate_token
    from autotune.daemon.settings import load_settings
    from autotune.db import Database

    settings = load_settings(config, db_url=db, data_dir=data_dir)
    if settings.db_url is None and not (settings.data_dir / "autotune.db").is_file():
        raise InputError(f"no daemon database in {settings.data_dir}: start the daemon first")
    database = Database(settings.database_url)
    database.upgrade()
    try:
        record, token = rotate_token(database, token_id)
    except LookupError as exc:
        raise InputError(f"--id {token_id}: {exc}") from None
    finally:
        database.dispose()
    typer.echo(
        f"new secret of token {record.token_id} ({record.role} of {record.tenant}; shown "
        f"once, only its hash is stored): {token}"
    )
    typer.echo(
        "The old secret stops working within 2 s. Daemons started with AUTOTUNE_TOKEN "
        "keep using that one too.",
        err=True,
    )
