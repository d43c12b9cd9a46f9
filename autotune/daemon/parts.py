"""What a daemon is built from (``DaemonParts``) and what its decision loop asks of its
collaborators: the transition log (``Recorder``) and the policy registry (``Lifecycle``,
told what each round was decided from: ``RoundInput``). The command line assembles the
parts (``autotune.cli.daemon``); tests assemble their own."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy.orm import Session

from autotune.daemon.leader import Leadership
from autotune.db import Database
from autotune.db import repository as repo
from autotune.decision.step import DecisionRound
from autotune.interfaces import Backend, ClusterSnapshot, Policy, PolicyRound
from autotune.perf.online import JobModel
from autotune.provisioning import Provisioner
from autotune.rl.acting import ActedStep
from autotune.rl.reward import RoundOutcome

__all__ = ["DaemonParts", "Lifecycle", "Recorder", "RoundInput"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundInput:
    """What a round was decided from: what a shadow policy needs to decide the same
    round through the same decision step."""

    snapshot: ClusterSnapshot
    overrides: Mapping[str, repo.OverrideRecord]
    honoured: Mapping[str, int | None]
    """Per active job, the override its newest decision honoured (``None``: the
    policy's)."""
    models: Mapping[str, JobModel]
    """Per job, its online throughput model."""


class Recorder(Protocol):
    """What the decision loop asks of the transition log each tick (in the transaction
    that commits the round's decisions) and when it stops."""

    def record(
        self,
        session: Session,
        *,
        acted: ActedStep | None,
        outcome: RoundOutcome | None,
        snapshot: ClusterSnapshot,
        round_: DecisionRound,
        overrides: Mapping[str, repo.OverrideRecord],
        stored: list[Any],
    ) -> None:
        """Measure the previous round with ``outcome`` (what the backend reported of it,
        ``None`` where it reports none), then log this one if the daemon's own policy
        acted on it (``acted``; ``None``: the fallback decided, or the policy did not act
        through the reinforcement-learning contract)."""

    def close(self, session: Session) -> None:
        """The loop stopped: the round logged last will never be measured."""


class Lifecycle(Protocol):
    """What the decision loop asks of the policy registry (``autotune.daemon.lifecycle``)."""

    def register(self, policy: Policy) -> None:
        """At start: record ``policy`` in the registry with its checkpoint, so it can be
        rolled back to once another is active."""

    def before_tick(self, policy: Policy) -> Policy:
        """The policy to decide this tick with: ``policy``, or the version activated
        since (never raises for a checkpoint that cannot load: it logs and keeps
        ``policy``)."""

    def after_decide(self, inputs: RoundInput, active: PolicyRound, round_: DecisionRound) -> None:
        """Let the shadow policy, if any, decide the same round (never applied)."""

    def after_tick(self, *, succeeded: bool) -> None:
        """The tick ended, its work committed if it ``succeeded``: store what the shadow
        decided in it (not for a failed tick, nothing of whose round was applied)."""


@dataclass(kw_only=True, slots=True)
class DaemonParts:
    """What a daemon is built from: the command line assembles one (and tests do)."""

    db: Database
    """The decision loop's connections (the API has its own)."""
    backend: Backend
    policy: Policy
    fallback: Policy | None = None
    """Decides when ``policy`` fails after ``FALLBACK_AFTER`` failed ticks in a row
    (``None``: failed ticks are only counted)."""
    leadership: Leadership | None = None
    """The leader lease, when several daemons may share the database (``run`` ticks only
    while it leads, and fences its writes); ``None``: this daemon decides alone."""
    backend_factory: Callable[[], Backend] | None = None
    """Builds a fresh backend after the lease was lost to another daemon (the old one is
    closed: its jobs are checkpointed and handed back)."""
    lifecycle: Lifecycle | None = None
    """The policy registry's hand on the loop: it may swap the policy before a tick
    decides, and lets a shadow policy decide beside it."""
    transitions: Recorder | None = None
    """Where the learned policy's rounds are logged for offline learning
    (``autotune.replay.log.TransitionLog``); ``None``: not logged."""
    provisioner: Provisioner | None = None
    """Parks idle nodes the demand forecast does not need (``autotune.provisioning``): on
    a backend that can (``Provisionable``) before the tick decides; elsewhere its plan is
    a recommendation, in the log and the metrics."""
    job_metrics_every_s: float = 0.0
    """Seconds between two ticks that record every running job's samples (goodput and
    what the backend measured), the bulk of the metrics; 0: every tick. A job's first
    measured tick and the tick it ends are recorded too; the cluster's own samples every
    tick."""
