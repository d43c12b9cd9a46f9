"""The policy lifecycle: which registered version decides, and which decides beside it.

Policy versions live in the database (``policy_versions``, with what happened to them in
``policy_events``): a checkpoint is registered by its content hash and a name, then
activated, shadowed, or rolled back to (``autotune.db.repository``, the API's
``/policies`` routes, ``autotune policy``). ``PolicyLifecycle`` is the decision loop's
side of it (``autotune.daemon.tick.Lifecycle``, ``DaemonParts.lifecycle``):

- before every tick it reads the active and the shadow version (a read of a table of a
  few rows). When the active version is not the one deciding, it loads that version
  and has the daemon decide with it from this tick on, carrying over what the old policy
  remembered of the cluster (the demand history behind the forecast features): no
  restart.
  A checkpoint that does not load is logged (``policy.activate_failed``), recorded with
  the reason, and the daemon keeps its policy (which the registry shows active again);
- after the active policy has decided a round, the shadow (deterministic: no
  exploration), loaded once, decides the same round through the same decision step.
  Its decisions are stored with ``source="shadow"`` and its version, never applied and
  never taken for a job's current decision; per tick, the share of the jobs in the
  active policy's slots for which both chose the same (both kept the job as it is, or
  both chose the same configuration), and the predicted goodput of each round, are
  stored as the metrics ``shadow_agreement``, ``shadow_predicted_goodput`` and
  ``active_predicted_goodput`` (labels ``shadow`` and ``active``: the versions). A
  shadow that fails never fails the tick: it is logged.

What is loaded, and how, is the ``PolicyLoader``'s business (the command line gives one
that builds learned policies from RLModule checkpoints); this module knows policies only
through ``autotune.interfaces.Policy``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from autotune.catalog.applications import catalog_coefficients
from autotune.core import Decision, JobConfig, Placement
from autotune.daemon.log import event
from autotune.daemon.parts import RoundInput
from autotune.db import Database
from autotune.db import repository as repo
from autotune.decision.step import DecisionRound, decide_for
from autotune.interfaces import ClusterSnapshot, JobStatus, Policy, PolicyRound
from autotune.perf.model import Coefficients, estimate, shape_of
from autotune.perf.online import JobModel

__all__ = [
    "SHADOW_METRICS",
    "CheckpointInfo",
    "PolicyLifecycle",
    "PolicyLoader",
    "round_agreement",
]

SHADOW_METRICS = ("shadow_agreement", "shadow_predicted_goodput", "active_predicted_goodput")
"""The metrics a shadowed tick records (labels: ``shadow``, ``active``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointInfo:
    """A checkpoint that loaded: where it is, its content hash and the version it makes."""

    path: str
    content_hash: str
    kind: str
    version: str
    """``<kind>-<content_hash[:12]>``."""


class PolicyLoader(Protocol):
    """Builds the policies that registered versions name."""

    def inspect(self, checkpoint: str, kind: str) -> CheckpointInfo:
        """Load the checkpoint at ``checkpoint`` (a path on this machine) to check that
        it serves; ``autotune.errors.InputError`` with the reason when it does not."""
        ...

    def build(
        self, kind: str, checkpoint: str | None, *, shadow: bool, follow: Policy | None
    ) -> Policy:
        """The policy of a registered version (``kind`` ``rules`` without a
        checkpoint: the rules). ``shadow``: for the shadow (no exploration). ``follow``:
        the policy it succeeds or decides beside, whose memory of the cluster it takes
        over. Raises with the reason when the checkpoint does not load."""
        ...

    def describe(self, policy: Policy) -> CheckpointInfo | None:
        """The checkpoint ``policy`` was built from (``None``: none, as for the rules)."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class _ShadowRound:
    """What the shadow decided in a tick, stored once the tick has committed."""

    shadow_version: str
    active_version: str
    round_: DecisionRound
    agreement: float | None
    jobs: int
    shadow_goodput: float
    active_goodput: float


def _error(exc: BaseException) -> str:
    message = str(exc).splitlines()[0] if str(exc) else ""
    if len(message) > 500:
        message = message[:497] + "..."
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _acted_jobs(snapshot: ClusterSnapshot, active: PolicyRound) -> list[JobStatus]:
    """The jobs the active policy acted on: those in its slots where it acts through
    slots (``PolicyRound.acted``), else every active job, in queue order (priority,
    submission, id: as the Planner takes them)."""
    ordered = snapshot.queue_order()
    if active.acted is None:
        return ordered
    acted = set(active.acted.job_ids)
    return [j for j in ordered if j.spec.job_id in acted]


def round_agreement(
    jobs: list[JobStatus], active: DecisionRound, shadow: DecisionRound
) -> float | None:
    """The share of ``jobs`` for which both rounds chose the same: neither decided
    anything for the job (it stays as it is), or both chose the same configuration (and
    both preempted it, or neither).
    ``None`` without jobs."""
    if not jobs:
        return None
    mine = {d.job_id: (d.config, d.preempt) for d in active.decisions}
    theirs = {d.job_id: (d.config, d.preempt) for d in shadow.decisions}
    same = sum(1 for j in jobs if mine.get(j.spec.job_id) == theirs.get(j.spec.job_id))
    return same / len(jobs)


class PolicyLifecycle:
    """The decision loop's hand on the policy registry (``DaemonParts.lifecycle``): built
    with the loader of policies and the daemon's database."""

    def __init__(self, loader: PolicyLoader, db: Database) -> None:
        self.loader = loader
        self.db = db
        self.shadow: Policy | None = None
        """The shadow policy while one is set (loaded once, kept while it stays)."""
        self._pending: _ShadowRound | None = None
        self._active_version = ""
        """The version of the policy deciding this tick (``before_tick``'s)."""
        # Predicted goodput of running jobs kept as they are: (config, placement) ->
        # goodput, per job; rebuilt from the jobs of each tick.
        self._kept_goodput: dict[str, tuple[JobConfig, Placement, float, Coefficients]] = {}

    def register(self, policy: Policy) -> None:
        """Record ``policy`` in the registry with its checkpoint, so it can be rolled back
        to once another is active."""
        info = self.loader.describe(policy)
        with self.db.session() as session:
            repo.register_policy_version(
                session=session,
                version=policy.version,
                kind=info.kind if info is not None else policy.name,
                checkpoint_path=info.path if info is not None else None,
                content_hash=info.content_hash if info is not None else None,
            )

    # --- before the tick ------------------------------------------------------------

    def before_tick(self, policy: Policy) -> Policy:
        """The policy to decide with: ``policy``, or the version activated since; load
        the shadow when one was set (drop it when none is). A checkpoint that fails to
        load is logged and recorded, never raised."""
        self._pending = None
        with self.db.session() as session:
            active, shadow = repo.policy_state(session=session)
        if active is not None and active.version != policy.version:
            policy = self._activate(policy, active)
        self._sync_shadow(policy, shadow)
        self._active_version = policy.version
        return policy

    def _load(
        self, record: repo.PolicyVersionRecord, *, shadow: bool, follow: Policy | None
    ) -> Policy:
        policy = self.loader.build(
            record.kind, record.checkpoint_path, shadow=shadow, follow=follow
        )
        if policy.version != record.version:
            raise ValueError(
                f"the checkpoint at {record.checkpoint_path} is now {policy.version}, not "
                f"{record.version}: its content changed since it was registered"
            )
        return policy

    def _activate(self, previous: Policy, record: repo.PolicyVersionRecord) -> Policy:
        started = time.perf_counter()
        try:
            policy = self._load(record, shadow=False, follow=previous)
        except Exception as exc:  # any failure to load: keep deciding as before
            reason = _error(exc)
            event(
                "policy.activate_failed",
                level=logging.WARNING,
                version=record.version,
                policy_name=record.name,
                reason=reason,
                kept=previous.version,
            )
            with self.db.session() as session:
                repo.record_policy_failure(
                    session=session,
                    version=record.version,
                    action="activate_failed",
                    reason=reason,
                    kept=previous.version,
                )
            return previous
        event(
            "policy.activated",
            version=policy.version,
            policy_name=record.name,
            previous=previous.version,
            load_s=round(time.perf_counter() - started, 3),
        )
        return policy

    def _sync_shadow(self, active: Policy, record: repo.PolicyVersionRecord | None) -> None:
        if record is None:
            if self.shadow is not None:
                event("policy.shadow_stopped", version=self.shadow.version)
            self.shadow = None
            return
        if self.shadow is not None and self.shadow.version == record.version:
            return
        try:
            self.shadow = self._load(record, shadow=True, follow=active)
        except Exception as exc:
            self.shadow = None
            reason = _error(exc)
            event(
                "policy.shadow_failed",
                level=logging.WARNING,
                version=record.version,
                policy_name=record.name,
                reason=reason,
            )
            with self.db.session() as session:
                repo.record_policy_failure(
                    session=session,
                    version=record.version,
                    action="shadow_failed",
                    reason=reason,
                    kept=active.version,
                )
            return
        event("policy.shadow_started", version=record.version, policy_name=record.name)

    # --- after the round is decided -------------------------------------------------

    def after_decide(self, inputs: RoundInput, active: PolicyRound, round_: DecisionRound) -> None:
        """The shadow decides the same round; kept until the tick has committed (then
        stored, never applied). A failure is logged, never raised."""
        self._pending = None
        shadow = self.shadow
        if shadow is None:
            return
        snapshot = inputs.snapshot
        try:
            shadow_round = decide_for(
                snapshot,
                shadow,
                inputs.overrides,
                honoured=inputs.honoured,
                models=inputs.models,
            )
            jobs = _acted_jobs(snapshot, active)
            kept = self._kept(snapshot, inputs.models)
            self._pending = _ShadowRound(
                shadow_version=shadow.version,
                active_version=self._active_version,
                round_=shadow_round,
                agreement=round_agreement(jobs, round_, shadow_round),
                jobs=len(jobs),
                shadow_goodput=_round_goodput(snapshot, shadow_round, kept),
                active_goodput=_round_goodput(snapshot, round_, kept),
            )
        except Exception as exc:  # the shadow never fails the tick
            event(
                "policy.shadow_error",
                level=logging.WARNING,
                version=shadow.version,
                error=_error(exc),
            )

    def _kept(self, snapshot: ClusterSnapshot, models: Mapping[str, JobModel]) -> dict[str, float]:
        """Predicted goodput of each running job as it runs now (what a round that
        leaves it alone gets from it), remembered while its configuration and placement
        stay the same."""
        nodes = {n.node_id: n for n in snapshot.nodes}
        out: dict[str, float] = {}
        known: dict[str, tuple[JobConfig, Placement, float, Coefficients]] = {}
        for job in snapshot.by_state("running"):
            job_id = job.spec.job_id
            if job.config is None or job.placement is None or job.spec.model is None:
                continue
            model = models.get(job_id)
            try:
                shape = shape_of(job.placement, nodes)
            except Exception:  # a node the snapshot no longer has
                continue
            coeffs = (
                model.coefficients
                if model
                else catalog_coefficients(job.spec.model, shape.gpu_model)
            )
            cached = self._kept_goodput.get(job_id)
            if (
                cached is not None
                and cached[0] == job.config
                and cached[1] == job.placement
                and cached[3] == coeffs
            ):
                goodput = cached[2]
            else:
                try:
                    goodput = estimate(
                        job.spec.model,
                        job.config,
                        shape,
                        job.config.batch(job.spec),
                        coeffs=coeffs,
                    ).goodput
                except Exception:  # a node or GPU model the performance model lacks
                    continue
            known[job_id] = (job.config, job.placement, goodput, coeffs)
            out[job_id] = goodput
        self._kept_goodput = known
        return out

    def after_tick(self, *, succeeded: bool) -> None:
        """After a tick: store what the shadow decided in it, unless the tick failed
        (nothing of a failed tick's round was applied). Never raises."""
        pending, self._pending = self._pending, None
        if pending is None or not succeeded:
            return
        labels = {"shadow": pending.shadow_version, "active": pending.active_version}
        values: list[tuple[str, float, str | None]] = [
            ("shadow_predicted_goodput", pending.shadow_goodput, None),
            ("active_predicted_goodput", pending.active_goodput, None),
        ]
        if pending.agreement is not None:
            values.insert(0, ("shadow_agreement", pending.agreement, None))
        why = pending.round_.why
        try:
            with self.db.session() as session:
                repo.create_decisions(
                    session=session,
                    decisions=[
                        (
                            _as_shadow(d),
                            why[d.job_id].override_id,
                            why[d.job_id].explanation,
                        )
                        for d in pending.round_.decisions
                    ],
                )
                repo.record_metrics(session=session, values=values, labels=labels)
        except Exception as exc:
            event(
                "policy.shadow_error",
                level=logging.WARNING,
                version=pending.shadow_version,
                error=_error(exc),
            )


def _as_shadow(decision: Decision) -> Decision:
    """A shadow round's decision as stored: ``source="shadow"``, saying what it would
    have been."""
    reason = decision.reason
    if decision.source != "policy":
        reason = f"(would be {decision.source}) {reason}"
    return replace(decision, source="shadow", reason=reason, decision_id=None)


def _round_goodput(
    snapshot: ClusterSnapshot, round_: DecisionRound, kept: Mapping[str, float]
) -> float:
    """The cluster's predicted goodput after ``round_``: each decided job's, from its
    explanation (``autotune.perf.model.estimate`` on the GPUs it was placed on), plus that
    of each running job the round leaves as it is."""
    decided: dict[str, float] = {}
    for decision in round_.decisions:
        chosen = round_.why[decision.job_id].explanation.get("chosen", {})
        decided[decision.job_id] = float(chosen.get("predicted_goodput", 0.0) or 0.0)
    total = sum(decided.values())
    total += sum(goodput for job_id, goodput in kept.items() if job_id not in decided)
    return total
