"""Daemon settings: defaults < TOML file < ``AUTOTUNE_*`` environment < command line.

The TOML file is the one named by ``--config`` or ``AUTOTUNE_CONFIG``; its keys are the
field names below (``tick_s = 5``).
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from platformdirs import user_data_dir
from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from autotune.core import DEFAULT_ENERGY_WEIGHT, DEFAULT_ROUND_S
from autotune.db.engine import sqlite_url
from autotune.db.retention import RetentionPolicy
from autotune.errors import InputError

__all__ = ["Settings", "load_settings"]

_toml_file: ContextVar[Path | None] = ContextVar("_toml_file", default=None)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AUTOTUNE_", extra="forbid")

    data_dir: Path = Field(default_factory=lambda: Path(user_data_dir("autotune")))
    """Where the SQLite database and other state live."""
    db_url: str | None = None
    """Any SQLAlchemy URL; default: SQLite file ``autotune.db`` in ``data_dir``."""
    host: str = "127.0.0.1"
    """Address the REST API binds to; loopback unless told otherwise."""
    port: int = Field(default=8000, ge=1, le=65535)
    tick_s: float = Field(default=2.0, gt=0, le=3600)
    """Wall seconds between decision rounds: how fast the simulated cluster plays back
    on ``--backend sim``; the round period itself on ``--backend ray`` unless ``round_s``
    is set."""
    round_s: float | None = Field(default=None, gt=0, le=86_400)
    """The decision round period the policy sees, the one setting the training
    environment and the daemon share: simulated seconds per tick on ``--backend sim``
    (default 300, the period the shipped policy was trained at), wall seconds between
    ticks on ``--backend ray`` (default ``tick_s``)."""
    energy_weight: float = Field(default=DEFAULT_ENERGY_WEIGHT, ge=0)
    """Reward given up per kWh the cluster draws, in units of normalized goodput (one job
    at its reference speed for a whole round): the environment's and replay's reward use
    it. At 0.05, a 300 s round of 32 busy 300 W GPUs (0.8 kWh) costs 0.04."""
    seed: int = Field(default=0, ge=0)
    """Seed of the simulated cluster's job stream."""
    sim_mean_interarrival_s: float = Field(default=300.0, gt=0)
    """Mean simulated seconds between job arrivals in the built-in job stream."""
    sim_initial_jobs: int = Field(default=6, ge=0)
    """Jobs waiting when the built-in simulated cluster starts."""
    sim_max_jobs: int | None = Field(default=None, ge=0)
    """Jobs the built-in job stream generates in all (``None``: no limit; 0: only the
    jobs submitted through the API)."""
    sim_workload: Path | None = None
    """A Pollux workload CSV the simulated cluster plays instead of its built-in job stream,
    on Pollux's testbed of ``sim_gpus`` T4 GPUs (4 per node)."""
    sim_workload_jobs: str | None = Field(default=None, pattern=r"^\d*:\d*$")
    """``START:STOP``: only these jobs of ``sim_workload`` (arrival order, Python slice;
    times re-based so the first arrives at 0). Default: all."""
    sim_gpus: int = Field(default=64, ge=4)
    """GPUs of the Pollux testbed ``sim_workload`` runs on (a multiple of 4)."""
    exploration_epsilon: float = Field(default=0.05, ge=0, lt=1)
    """The learned policy's exploration floor: each entry of each job's action takes the
    policy's most likely value with probability ``1 - epsilon``, a uniformly drawn one
    otherwise. Logged with every transition, it keeps the logged actions' probabilities
    away from 0 and 1, which off-policy evaluation needs. 0: deterministic."""
    forecast: Literal["lstm", "persistence", "none"] = "lstm"
    """The demand forecaster behind ``GET /api/v1/forecast``, the dashboard and the
    learned policy's observation: ``lstm`` (the shipped LSTM, with its persistence
    fallback behind it), ``persistence`` (calibrated persistence and persistence +
    buffer alone) or ``none`` (no forecast: no arrival expected, the peak is the demand
    now). The shipped policy was trained with ``lstm``."""
    provisioning: Literal["none", "buffer", "forecast"] = "none"
    """Park idle nodes beyond what the 95% quantile of the next hour's demand needs
    (``autotune.provisioning``): ``forecast`` takes that quantile from the ``forecast``
    forecaster, ``buffer`` from persistence + buffer, ``none`` keeps every node on. The
    simulated backend powers parked nodes down (``provisioning_wake_s`` to wake one);
    on Ray the plan is a recommendation (the ``provisioning`` log event and metrics)."""
    provisioning_wake_s: float = Field(default=120.0, ge=0)
    """Seconds a parked simulated node takes to become usable again."""
    log_transitions: bool = True
    """Log every round the learned policy decides (``transitions``) for offline retraining
    (``autotune replay export``)."""
    transition_episode_rounds: int = Field(default=288, ge=1)
    """Consecutive rounds per logged episode (288: a day of 5-minute rounds)."""
    backend: str = "sim"
    """The cluster the daemon drives: ``sim`` (the built-in simulated cluster) or ``ray``
    (jobs trained for real by the executor on Ray)."""
    ray_address: str | None = None
    """The Ray cluster to join (``auto``, ``HOST:PORT``); unset: the ``ray`` backend starts
    a local Ray, and telemetry reads no Ray state."""
    cluster_file: Path | None = None
    """A cluster file (``autotune cluster describe``, or written by hand;
    ``autotune.catalog.clusters``): the ``ray`` backend charges its nodes' measured
    links; the ``sim`` backend simulates its nodes instead of the built-in cluster."""
    checkpoint_every: int = Field(default=25, ge=1)
    """Steps between checkpoints of jobs the ``ray`` backend trains."""
    step_timeout_s: float = Field(default=600.0, gt=0)
    """Seconds a training step of a ``ray`` job may take before its silent ranks are
    taken for hung: the job restarts from its newest checkpoint."""
    adaptive_topk: bool = False
    """Jobs the ``ray`` backend trains with top-k compression start from the decided
    ratio and move their kept share with what they measure (``autotune job run
    --adaptive-topk``; docs/executor.md, "Adaptive top-k")."""
    balance_batch: bool = False
    """Data-parallel jobs the ``ray`` backend trains move their ranks' batch shares to
    the ranks' measured speeds, so that a slow node's rank takes fewer samples (``autotune
    job run --balance-batch``; docs/executor.md, "Uneven batch shares"); jobs whose task
    splits its batch evenly only train as before."""
    mix_gpu_models: bool = False
    """The Planner may place one data-parallel job across GPU models where no one model
    has room for it and the performance model says that runs it faster than the free
    GPUs of its best model alone; its replicas take batch shares by speed (the ``sim``
    backend prices that, the ``ray`` backend balances such a job's shares as with
    ``balance_batch``; docs/operating/heterogeneous.md)."""
    token: SecretStr | None = None
    """Bearer token for the API's mutations (``AUTOTUNE_TOKEN``, which the CLI client
    reads too). Unset: the daemon generates one at its first start, prints it once and
    stores only its SHA-256 hash."""
    reads: Literal["open", "tenant"] = "open"
    """Who reads jobs, their decisions, metrics and overrides through the API: ``open``,
    anyone, no token needed; ``tenant``, a valid token, and a member's or viewer's sees
    only its own tenant's (an admin's, every tenant's); the dashboard and ``/metrics``
    then answer an admin's token only (``docs/operating/tenants.md``)."""
    task_modules: list[str] = Field(default_factory=list)
    """Python modules (or packages) whose ``module:Name`` tasks jobs may name, besides
    the built-in tasks; nothing else is ever imported for a job."""
    max_body_bytes: int = Field(default=65_536, ge=1024, le=64 * 1024 * 1024)
    """Largest request body the API reads; larger ones get 413."""
    api_pool_size: int = Field(default=8, ge=1, le=256)
    """Database connections the API keeps for its requests (the decision loop has its
    own, so readers never hold the one a tick needs)."""
    api_pool_timeout_s: float = Field(default=2.0, gt=0, le=300)
    """How long a request waits for a free database connection before it gets 503 with
    ``Retry-After``."""
    job_metrics_every_s: float = Field(default=30.0, ge=0, le=3600)
    """Seconds between two ticks that record every running job's metric samples (goodput,
    step time, power, ...; 0: every tick). The cluster's samples are recorded every
    tick. At 2 s ticks, every tick would be 15 times the rows for the same plots."""
    leader_lease_s: float = Field(default=5.0, ge=1, le=300)
    """Several daemons may share one database: the one holding the leader lease decides,
    renewing it every fifth of this; another takes over once it has gone unrenewed this
    long (a leader that dies is replaced within about this plus a second)."""
    stop_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    """On SIGTERM or SIGINT the daemon exits within this many seconds: requests still
    running after a third of it are cut, the tick in progress finishes, running jobs
    are checkpointed (``ray``) with the rest. A second signal exits at once."""
    retention_metrics_full_days: float = Field(default=1.0, ge=0)
    """Metric samples are kept at full resolution this long, then averaged per
    ``retention_metrics_downsample_s`` (0: never downsampled)."""
    retention_metrics_downsample_s: float = Field(default=300.0, ge=1)
    """Five minutes: a month of every job's samples at one per minute is most of a busy
    database (bench/RESULTS.md, "Storage"); the newest day stays at full resolution."""
    retention_metrics_days: float = Field(default=30.0, ge=0)
    """Metric samples are deleted after this many days (0: kept forever)."""
    retention_decisions_days: float = Field(default=90.0, ge=0)
    """Decisions (and ended overrides no decision refers to) are
    deleted after this many days, never the newest decision of an active job (0: kept
    forever)."""
    retention_transitions_days: float = Field(default=30.0, ge=0)
    """Logged transitions an export covered are deleted after this many days (0: kept
    forever; see ``retention_transitions_unexported_days``). A round of
    the learned policy takes about 0.1 KB plus 0.4 KB per job it acts on (a sixth of that
    once compacted)."""
    retention_transitions_unexported_days: float = Field(default=90.0, ge=0)
    """Logged transitions no ``autotune replay export`` covered yet are kept this many
    days (at least ``retention_transitions_days``), so a replay window outlives the
    export's usual schedule (0: kept until exported)."""
    retention_transitions_compact_days: float = Field(default=1.0, ge=0)
    """Logged transitions older than this many days are compacted: their per-job JSON
    rewritten as one compressed blob, about 6 times smaller, nothing lost (0: never)."""
    retention_jobs_days: float = Field(default=90.0, ge=0)
    """Finished, failed and cancelled jobs are deleted this many days after they ended,
    once nothing refers to them (0: kept forever)."""
    retention_every_s: float = Field(default=300.0, gt=0)
    """Seconds between retention passes."""
    retention_batch_rows: int = Field(default=500, ge=1, le=100_000)
    """Rows one retention transaction deletes or folds at most: the longest a tick or a
    write waits behind retention (SQLite has one writer at a time)."""
    retention_duty: float = Field(default=0.2, gt=0, le=1)
    """Share of the time a retention pass works: it rests between its transactions, so
    the decision loop and the API keep the database and the interpreter."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["json", "text"] = "json"

    @property
    def round_period_s(self) -> float:
        """``round_s``, or its default for the backend."""
        if self.round_s is not None:
            return self.round_s
        return DEFAULT_ROUND_S if self.backend == "sim" else self.tick_s

    @property
    def tick_period_s(self) -> float:
        """Wall seconds between ticks."""
        return self.tick_s if self.backend == "sim" else self.round_period_s

    def retention(self) -> RetentionPolicy:
        """The retention settings as the policy ``autotune.db.retention`` applies (0 days:
        kept forever)."""

        def days(value: float) -> float | None:
            return value or None

        return RetentionPolicy(
            metrics_full_days=days(self.retention_metrics_full_days),
            metrics_downsample_s=self.retention_metrics_downsample_s,
            metrics_days=days(self.retention_metrics_days),
            decisions_days=days(self.retention_decisions_days),
            transitions_days=days(self.retention_transitions_days),
            transitions_unexported_days=days(self.retention_transitions_unexported_days),
            transitions_compact_days=days(self.retention_transitions_compact_days),
            jobs_days=days(self.retention_jobs_days),
            batch_rows=self.retention_batch_rows,
        )

    @property
    def database_url(self) -> str:
        return self.db_url or sqlite_url(self.data_dir / "autotune.db")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        toml_file = _toml_file.get()
        if toml_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_file))
        return tuple(sources)


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Settings from all sources; ``overrides`` set to ``None`` are ignored. Bad values
    raise ``InputError`` naming the setting and the value."""
    path = config_file or (Path(p) if (p := os.environ.get("AUTOTUNE_CONFIG")) else None)
    if path is not None and not path.is_file():
        raise InputError("config file not found", path=str(path))
    token = _toml_file.set(path)
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise InputError(
            f"setting {field}={first.get('input')!r}: {first['msg']}",
            path=str(path) if path else None,
        ) from exc
    except ValueError as exc:  # malformed TOML
        raise InputError(str(exc).splitlines()[0], path=str(path) if path else None) from exc
    finally:
        _toml_file.reset(token)
