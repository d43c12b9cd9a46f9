"""The decision step: from a cluster snapshot, a policy and the active overrides to the
decisions of one round, and why. A pure function, in the spirit of Pollux's
``optimize(jobs, nodes, current)``: it reads and writes no database, applies nothing and
keeps no state, so it can be tested, replayed and reused without the daemon's loop
(``autotune.daemon.loop`` stores its output and applies it).

One round:

1. jobs whose override has ended or been deleted go back to the policy, which decides for
   them as for waiting jobs;
2. the policy chooses configurations (``Policy.decide``);
3. every active override's pin is merged into its job's configuration; an override that
   no longer composes with the configuration, or whose pinned GPUs are not free, is
   skipped with the reason and the job is planned as if it had none;
4. the Planner places the jobs (pinned placements first, current placements kept where
   the configuration did not change);
5. a decision is made for every job placed anew, with its source (``policy``,
   ``override``, ``fallback``), its reason and its explanation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from autotune.core import ACTIVE_STATES, Decision, DecisionSource, JobConfig, Placement
from autotune.daemon.explain import explain_decision
from autotune.daemon.overrides import pinned_config, pinned_placement
from autotune.interfaces import ClusterSnapshot, JobStatus, Policy, PolicyChoice
from autotune.planner import plan

if TYPE_CHECKING:
    from autotune.db.repository import OverrideRecord

__all__ = ["DecisionRound", "Why", "decide", "placement_summary"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Why:
    """What a decision records beside itself."""

    override_id: int | None
    """The override the decision honours; ``None``: the policy's."""
    explanation: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class DecisionRound:
    decisions: list[Decision]
    """One per job placed anew this round, in queue order."""
    unplaced: dict[str, str]
    """Jobs the Planner left waiting, with the reason, and jobs whose override was skipped
    (with that reason, whether or not the job was then placed without it)."""
    why: dict[str, Why]
    """Per decided job."""
    skipped_overrides: dict[str, str]
    """Overrides not applied this round, by job, with the reason."""


def placement_summary(placement: Placement) -> str:
    """``node:gpu,gpu, node:gpu``, as decisions and logs show a placement."""
    by_node: dict[str, list[int]] = {}
    for slot in placement.ranks:
        by_node.setdefault(slot.node_id, []).append(slot.gpu_index)
    return ", ".join(f"{node}:{','.join(map(str, gpus))}" for node, gpus in by_node.items())


def decide(
    snapshot: ClusterSnapshot,
    policy: Policy,
    overrides: Mapping[str, OverrideRecord],
    *,
    honoured: Mapping[str, int | None],
) -> DecisionRound:
    """The decisions of one round. ``overrides``: the active override of each job that has
    one; ``honoured``: per active job, the override its newest decision honoured (``None``:
    the policy's)."""
    active = snapshot.by_state(*ACTIVE_STATES)
    overrides = dict(overrides)
    # 1. A job whose newest decision honoured an override that has since ended goes back
    #    to the policy, which decides for it as for a waiting job.
    released = {
        j.spec.job_id: ended
        for j in active
        if (ended := honoured.get(j.spec.job_id)) is not None and j.spec.job_id not in overrides
    }
    view = snapshot
    if released:
        view = replace(
            snapshot,
            jobs=[
                replace(j, state="pending", config=None, placement=None)
                if j.spec.job_id in released
                else j
                for j in snapshot.jobs
            ],
        )
    # 2. The policy's choices.
    choices = policy.decide(view)
    # 3-4. Pins merged, then the Planner; an override that cannot be applied this round is
    #      skipped with the reason and the round planned again without it.
    skipped: dict[str, str] = {}
    while True:
        configs, current, pinned = _pinned_configs(active, choices, overrides, released, skipped)
        # Pinned placements take their GPUs first: the Planner keeps current placements in
        # queue order, so those jobs go to the front.
        specs = [
            replace(j.spec, priority=2**31 - 1) if j.spec.job_id in pinned else j.spec
            for j in active
        ]
        result = plan(specs, snapshot.nodes, configs, current)
        lost = [job_id for job_id, p in pinned.items() if result.placements.get(job_id) != p]
        for job_id in lost:
            skipped[job_id] = (
                f"override {overrides[job_id].override_id} not applied: its pinned GPUs "
                "are not free for it (held by another pinned job, or CPU or host memory)"
            )
            overrides.pop(job_id)
        if not lost:
            break
    # 5. A decision for every job placed anew.
    nodes = {n.node_id: n for n in snapshot.nodes}
    decisions: list[Decision] = []
    why: dict[str, Why] = {}
    for job in active:
        job_id = job.spec.job_id
        placement = result.placements.get(job_id)
        if placement is None:
            continue
        override = overrides.get(job_id)
        fresh_override = override is not None and honoured.get(job_id) != override.override_id
        if job_id in result.kept and not fresh_override and job_id not in released:
            continue
        choice = choices.get(job_id)
        source: DecisionSource
        if override is not None:
            source = "override"
            reason = f"override {override.override_id}: {override.reason}"
            if not fresh_override:
                reason += " (re-placed: its GPUs are no longer available)"
        elif job_id in released:
            source = choice.source if choice else "policy"
            reason = f"override {released[job_id]} ended; the policy decides again: " + (
                choice.reason if choice else "it keeps the current configuration"
            )
        else:
            source = choice.source if choice else "policy"
            reason = choice.reason if choice else "re-placed: its GPUs are no longer available"
        decisions.append(
            Decision(
                job_id=job_id,
                config=configs[job_id],
                placement=placement,
                source=source,
                policy_version=policy.version,
                reason=f"{reason}; placed on {placement_summary(placement)}",
            )
        )
        why[job_id] = Why(
            override_id=override.override_id if override is not None else None,
            explanation=explain_decision(
                spec=job.spec,
                config=configs[job_id],
                placement=placement,
                nodes=nodes,
                features=_features(snapshot, choice),
                why=reason,
            ),
        )
    return DecisionRound(
        decisions=decisions,
        unplaced={**skipped, **result.unplaced},
        why=why,
        skipped_overrides=skipped,
    )


def _pinned_configs(
    active: list[JobStatus],
    choices: Mapping[str, PolicyChoice],
    overrides: dict[str, OverrideRecord],
    released: Mapping[str, int],
    skipped: dict[str, str],
) -> tuple[dict[str, JobConfig], dict[str, Placement], dict[str, Placement]]:
    """Each active job's configuration (the policy's choice or its current one, with its
    override's pin), the placements to keep, and the pinned placements. An override whose
    pin no longer composes is dropped from ``overrides`` and its reason put in
    ``skipped``."""
    configs: dict[str, JobConfig] = {}
    current: dict[str, Placement] = {}
    pinned: dict[str, Placement] = {}
    for job in active:
        job_id = job.spec.job_id
        choice = choices.get(job_id)
        if choice is not None:
            configs[job_id] = choice.config
        elif job.config is not None:
            configs[job_id] = job.config
        override = overrides.get(job_id)
        if override is not None:
            base = configs.get(job_id) or JobConfig.data_parallel(job.spec.min_gpus)
            try:
                config = pinned_config(base, override.pin)
                placement = pinned_placement(job.spec, override.pin)
            except ValueError as exc:  # valid when stored, not with this configuration
                skipped[job_id] = f"override {override.override_id} not applied: {exc}"
                overrides.pop(job_id)
            else:
                configs[job_id] = config
                if placement is not None:
                    pinned[job_id] = current[job_id] = placement
                    continue
        if (
            job.placement is not None
            and configs.get(job_id) == job.config
            and (job_id not in released or choice is None)
        ):
            current[job_id] = job.placement
    return configs, current, pinned


def _features(snapshot: ClusterSnapshot, choice: PolicyChoice | None) -> dict[str, float]:
    """The observation features behind a decision: the policy's own, and the cluster's."""
    features = {
        "gpu_utilization": snapshot.gpu_utilization,
        "jobs_pending": float(len(snapshot.by_state("pending"))),
        "jobs_running": float(len(snapshot.by_state("running"))),
    }
    if choice is not None:
        features.update(choice.features)
    return features
