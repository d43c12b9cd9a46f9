"""The decision step: from a cluster snapshot, the policy's choices and the active
overrides to the decisions of one round, and why. A pure function, in the spirit of
Pollux's ``optimize(jobs, nodes, current)``: it reads and writes no database, applies
nothing, keeps no state and calls no policy, so it can be tested, replayed and reused
without the daemon's loop (``autotune.daemon.tick`` asks the policy, stores this
step's output and applies it).

One round:

1. jobs whose override has ended or been deleted go back to the policy, which decides for
   them as for waiting jobs (``policy_view``: the snapshot the policy is asked about);
2. the policy's choices (``Policy.decide`` on that view) say, for waiting jobs and, where
   it wants, for running ones (resize, recompress, another precision map or batch), a
   configuration; a choice without a configuration keeps its job waiting, with the
   reason; a choice the executor cannot train (PowerSGD with tensor or pipeline
   parallelism) compresses by top-k 1% instead;
   then the tenants' quotas (``autotune.decision.quotas``): a tenant within its quota
   gets GPUs others borrowed back (their jobs are preempted), a job beyond its tenant's
   quota waits unless it can borrow idle GPUs, and a job within GPUs promised to its
   tenant on a model is planned on that model;
3. a module class the policy put in a precision the performance model prices slower
   than fp32 on every GPU model the job may run on trains in the other 16-bit type
   where that one pays there, else in fp32, saying so
   (``_precision_that_pays``; a running job is judged on the GPUs it runs on too, and
   every job the Planner places on the GPUs it lands on: ``_on_placement``); the memory
   rule (``autotune.perf.memory.fit_memory``) adds gradient accumulation, then
   activation checkpointing, until a rank of each chosen configuration fits the
   smallest GPU the job may run on;
   where the backend measures what restarting a job costs, a running job's new
   configuration is taken only when it pays for its restart and the job's last change
   showed a measured gain (``autotune.decision.payoff``); otherwise the job keeps its
   configuration, with the reason;
4. every active override's pin is merged into its job's configuration; an override that
   no longer composes with the configuration, or whose pinned GPUs are not free, is
   skipped with the reason and the job is planned as if it had none;
5. the Planner places the jobs (pinned placements first, current placements kept where
   the configuration did not change or changed only its batch); a running job whose new
   configuration cannot be placed keeps its current one;
6. a decision is made for every job placed anew, with its source (``policy``,
   ``override``, ``fallback``), its reason and its explanation, and for every running
   job the policy preempts (``PolicyChoice.preempt``: it stops after a checkpoint and
   waits again; its GPUs are free for this round's placements).

The daemon's tick, the training environment (``autotune.envs.cluster_env``) and replay
all call this one function.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Final, Protocol

from autotune.core import (
    ACTIVE_STATES,
    MILLI_PER_GPU,
    MODULE_CLASSES,
    CompressionSpec,
    Decision,
    DecisionSource,
    JobConfig,
    JobSpec,
    Layout,
    ModelProfile,
    NodeInfo,
    Placement,
    Precision,
    PrecisionMap,
    node_table,
)
from autotune.decision.explain import explain_decision
from autotune.decision.overrides import pinned_config, pinned_placement
from autotune.decision.payoff import Payoff, payoff, unproven_change
from autotune.decision.quotas import enforce_quotas
from autotune.interfaces import ClusterSnapshot, JobStatus, Policy, PolicyChoice
from autotune.perf.memory import fit_layout, fit_memory, rank_memory
from autotune.perf.model import dtype_tflops
from autotune.perf.online import JobModel
from autotune.planner import largest_gang, plan


class OverrideRecord(Protocol):
    """What the decision step reads of an active override (the database's
    ``autotune.db.repository.OverrideRecord`` is one)."""

    @property
    def override_id(self) -> int: ...
    @property
    def pin(self) -> Mapping[str, Any]: ...
    @property
    def reason(self) -> str: ...


__all__ = [
    "DecisionRound",
    "OverrideRecord",
    "Why",
    "decide",
    "decide_for",
    "fit_to_cluster",
    "placement_summary",
    "policy_view",
    "released_overrides",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Why:
    """What a decision records beside itself."""

    override_id: int | None
    """The override the decision honours; ``None``: the policy's."""
    explanation: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class DecisionRound:
    decisions: list[Decision]
    """One per job preempted this round (first), then one per job placed anew, in queue
    order."""
    unplaced: dict[str, str]
    """Jobs the Planner left waiting, with the reason, and jobs whose override was skipped
    (with that reason, whether or not the job was then placed without it)."""
    why: dict[str, Why]
    """Per decided job."""
    skipped_overrides: dict[str, str]
    """Overrides not applied this round, by job, with the reason."""
    declined: dict[str, str] = field(default_factory=dict)
    """Running jobs whose new configuration could not be placed (they keep theirs)."""


def placement_summary(placement: Placement) -> str:
    """``node:gpu,gpu, node:gpu``, as decisions and logs show a placement."""
    by_node: dict[str, list[int]] = {}
    for slot in placement.ranks:
        by_node.setdefault(slot.node_id, []).append(slot.gpu_index)
    return ", ".join(f"{node}:{','.join(map(str, gpus))}" for node, gpus in by_node.items())


def released_overrides(
    snapshot: ClusterSnapshot,
    overrides: Mapping[str, OverrideRecord],
    honoured: Mapping[str, int | None],
) -> dict[str, int]:
    """Active jobs whose newest decision honoured an override that has since ended or been
    deleted, with that override's id: the policy decides for them again, as for waiting
    jobs."""
    return {
        j.spec.job_id: ended
        for j in snapshot.by_state(*ACTIVE_STATES)
        if (ended := honoured.get(j.spec.job_id)) is not None and j.spec.job_id not in overrides
    }


def policy_view(
    snapshot: ClusterSnapshot,
    overrides: Mapping[str, OverrideRecord],
    honoured: Mapping[str, int | None],
) -> ClusterSnapshot:
    """The snapshot the policy is asked about this round: ``snapshot`` with every job
    whose override ended shown waiting without a configuration (``released_overrides``),
    so the policy decides for it as for a new job."""
    released = released_overrides(snapshot, overrides, honoured)
    if not released:
        return snapshot
    return replace(
        snapshot,
        jobs=[
            replace(j, state="pending", config=None, placement=None)
            if j.spec.job_id in released
            else j
            for j in snapshot.jobs
        ],
    )


_UNSPLIT: Final = "not split across GPU models"


def _on_models(
    active: list[JobStatus],
    decided: dict[str, PolicyChoice],
    overrides: Mapping[str, OverrideRecord],
    quota_models: Mapping[str, tuple[tuple[str, ...], str]],
) -> list[JobStatus]:
    """``active`` with each waiting job's allowed GPU models narrowed to its quota's
    (``quota_models``), and each job the policy (re)configures to those its choice names
    (``PolicyChoice.gpu_models``; not for an overridden job). A job left no model waits,
    with the reason (a running one keeps its configuration); a split across models some
    of which the job may not use is dropped, with the reason."""
    out: list[JobStatus] = []
    for j in active:
        job_id = j.spec.job_id
        allowed = j.spec.gpu_types
        if j.state == "pending" and job_id in quota_models:
            allowed = quota_models[job_id][0]
        choice = decided.get(job_id)
        wanted = choice.gpu_models if choice is not None and choice.config is not None else None
        if wanted is not None and job_id not in overrides:
            assert choice is not None
            narrowed = wanted if allowed is None else tuple(m for m in allowed if m in wanted)
            if not narrowed:
                why = (
                    f"{choice.reason}; the policy chose GPU models ({', '.join(wanted)}) it "
                    f"may not run on ({', '.join(allowed or ())})"
                )
                if j.state == "pending":
                    decided[job_id] = PolicyChoice(config=None, reason=f"{why}: waiting")
                else:
                    decided.pop(job_id)
            else:
                allowed = narrowed
                split = choice.gpu_split
                if split is not None and not {m for m, _ in split} <= set(narrowed):
                    decided[job_id] = replace(
                        choice,
                        gpu_split=None,
                        reason=f"{choice.reason}; {_UNSPLIT}: it may run on "
                        f"{', '.join(narrowed)} only",
                    )
        if allowed != j.spec.gpu_types:
            j = replace(j, spec=replace(j.spec, gpu_types=allowed))
        out.append(j)
    return out


def decide(
    snapshot: ClusterSnapshot,
    choices: Mapping[str, PolicyChoice],
    overrides: Mapping[str, OverrideRecord],
    *,
    honoured: Mapping[str, int | None],
    policy_version: str,
    explain: bool = True,
    models: Mapping[str, JobModel] | None = None,
) -> DecisionRound:
    """The decisions of one round. ``choices``: what the policy chose, asked about
    ``policy_view(snapshot, overrides, honoured)``; ``overrides``: the active override
    of each job that has one; ``honoured``: per active job, the override its newest
    decision honoured (``None``: the policy's); ``policy_version``: the version of the
    policy that chose, recorded on every decision; ``explain=False`` skips the
    explanations (the training environment does not store them); ``models``: per job,
    the throughput model its explanation predicts with (its online fit; the catalog's
    where absent)."""
    active = snapshot.by_state(*ACTIVE_STATES)
    overrides = dict(overrides)
    # 1. A job whose newest decision honoured an override that has since ended goes back
    #    to the policy, which decides for it as for a waiting job.
    released = released_overrides(snapshot, overrides, honoured)
    view = policy_view(snapshot, overrides, honoured)
    # 2. The policy's choices; 3. the memory rule. A running job the policy preempts
    #    (and no override holds) leaves the round: its GPUs are free for the others.
    decided = dict(choices)
    if not snapshot.mixes_models:
        for job_id, split in list(decided.items()):
            if split.gpu_split is not None:
                decided[job_id] = replace(
                    split,
                    gpu_split=None,
                    reason=f"{split.reason}; {_UNSPLIT}: this backend runs a job on one model",
                )
    preempted = {
        j.spec.job_id: decided.pop(j.spec.job_id)
        for j in view.by_state("running")
        if (c := decided.get(j.spec.job_id)) is not None
        and c.preempt
        and j.spec.job_id not in overrides
        and j.config is not None
    }
    for j in view.by_state("pending"):
        # A pending job the policy left out is planned as the ``Policy`` contract says.
        if j.spec.job_id not in decided:
            decided[j.spec.job_id] = PolicyChoice(
                config=JobConfig.data_parallel(j.spec.min_gpus),
                reason=f"not chosen by the policy: data parallel over its {j.spec.min_gpus} "
                "minimum GPU(s)",
            )
    # 2a. A waiting job sized beyond what any plan could give it (more ranks than one GPU
    #     model it allows has, on at most its max_nodes nodes) would wait for ever:
    #     the most that could; one whose layout fits no GPU, one that does. Before the
    #     quotas, which then weigh the sizes the jobs will have.
    for job_id, (size, note) in _beyond_reach(view, decided, overrides).items():
        c = decided[job_id]
        assert c.config is not None
        layout = c.config.layout
        inner = layout.tp * layout.pp
        layout = (
            replace(layout, world_size=size, dp=-1)
            if layout.tp > 0 and layout.pp > 0 and size % inner == 0
            else Layout(world_size=size)
        )
        decided[job_id] = replace(
            c, config=replace(c.config, layout=layout), reason=f"{c.reason}; {note}"
        )
    _layouts_that_fit(decided, view, overrides)
    _compression_that_runs(decided)
    # 2b. The tenants' quotas, whatever the policy: borrowed GPUs given back to a tenant
    #     within its quota, jobs beyond a quota waiting unless they can borrow idle GPUs.
    quota = enforce_quotas(view, decided, overrides, preempted)
    skipped: dict[str, str] = {}
    for job_id, reason in quota.preempt.items():
        decided.pop(job_id, None)
        preempted[job_id] = PolicyChoice(config=None, reason=reason, preempt=True)
    for job_id, reason in quota.wait.items():
        decided[job_id] = PolicyChoice(config=None, reason=reason)
        if job_id in overrides:
            skipped[job_id] = f"override {overrides.pop(job_id).override_id} not applied: {reason}"
    for job_id, (size, note) in quota.shrink.items():
        c = decided[job_id]
        assert c.config is not None
        layout = replace(c.config.layout, world_size=size, dp=-1)
        decided[job_id] = replace(
            c,
            config=replace(c.config, layout=layout),
            reason=f"{c.reason}; {note}" + (f"; {_UNSPLIT}" if c.gpu_split else ""),
            gpu_split=None,
        )
    for job_id, note in quota.borrowing.items():
        if (c := decided.get(job_id)) is not None:
            decided[job_id] = replace(c, reason=f"{c.reason}; {note}")
    for job_id, (_, note) in quota.models.items():
        if (c := decided.get(job_id)) is not None and c.config is not None:
            decided[job_id] = replace(c, reason=f"{c.reason}; {note}")
    # A waiting job kept on given GPU models for a quota, or sent to given models by the
    # policy, is planned as one that allows only those (a running job whose override
    # ended is waiting in the policy's view: it is not moved for this).
    active = _on_models(
        [j for j in active if j.spec.job_id not in preempted], decided, overrides, quota.models
    )
    _precision_that_pays(decided, active, snapshot.nodes)
    choices = _fit_memory(decided, active, snapshot.nodes)
    waiting = {
        job_id: c.reason
        for job_id, c in choices.items()
        if c.config is None and job_id not in overrides
    }
    # GPUs this round's preemptions free count as free.
    planning = (
        replace(snapshot, jobs=[j for j in snapshot.jobs if j.spec.job_id not in preempted])
        if preempted
        else snapshot
    )
    declined: dict[str, str] = _hopeless_resizes(planning, active, choices, overrides)
    for job_id in declined:
        choices.pop(job_id)
    for job_id, reason in quota.keep.items():
        if job_id in choices and job_id not in overrides:
            choices.pop(job_id)
            declined[job_id] = reason
    payoffs: dict[str, Payoff] = {}
    if snapshot.restart_s is not None:
        unpaid, payoffs = _unpaid_changes(
            snapshot, active, choices, overrides, released, models or {}
        )
        for job_id, why_not in unpaid.items():
            choices.pop(job_id)
            declined[job_id] = why_not
    # 4-5. Pins merged, then the Planner; an override that cannot be applied this round is
    #      skipped with the reason and the round planned again without it, and so is a
    #      running job's new configuration that finds no room (it keeps its current one).
    reserved: dict[str, Placement] = {}
    while True:
        configs, current, pinned = _pinned_configs(active, choices, overrides, released, skipped)
        # Pinned placements take their GPUs first: the Planner keeps current placements in
        # queue order, so those jobs go to the front.
        specs = [
            replace(j.spec, priority=2**31 - 1) if j.spec.job_id in pinned else j.spec
            for j in active
            if j.spec.job_id in configs or j.spec.job_id not in waiting
        ]
        result = plan(
            specs,
            snapshot.nodes,
            configs,
            current,
            reserved=reserved,
            mix_models=snapshot.mixes_models,
            pack=snapshot.packs_jobs,
            splits={
                job_id: dict(c.gpu_split)
                for job_id, c in choices.items()
                if c.gpu_split is not None and job_id not in overrides and job_id in configs
            },
        )
        lost = [job_id for job_id, p in pinned.items() if result.placements.get(job_id) != p]
        for job_id in lost:
            skipped[job_id] = (
                f"override {overrides[job_id].override_id} not applied: its pinned GPUs "
                "are not free for it (held by another pinned job, or CPU or host memory)"
            )
            overrides.pop(job_id)
        # A running job is never displaced without somewhere to go: a pin that takes the
        # GPUs of a running job the Planner cannot re-place is not applied this round.
        for job_id, cause in _displacing_pins(active, result.placements, pinned, choices).items():
            if job_id in overrides:
                skipped[job_id] = f"override {overrides[job_id].override_id} not applied: {cause}"
                overrides.pop(job_id)
                lost.append(job_id)
        # A running job the round does not place gets no decision, so it goes on running
        # as it is: an override's pinned configuration waits for a later round (a pinned
        # placement is handled above), the policy's new configuration is declined, and
        # nothing else takes its GPUs (they went to a pin, the backend changed its
        # configuration to one the memory check refuses, its override ended and the
        # policy lets it wait, ...).
        stuck: list[str] = []
        displaced: dict[str, Placement] = {}
        for j in active:
            job_id = j.spec.job_id
            if j.state != "running" or j.placement is None or job_id in result.placements:
                continue
            cause = result.unplaced.get(job_id, "no room")
            if job_id in overrides and job_id not in pinned:
                skipped[job_id] = (
                    f"override {overrides[job_id].override_id} not applied: its "
                    f"configuration was not placed ({cause}); the job keeps its current one"
                )
                overrides.pop(job_id)
                lost.append(job_id)
            if (c := choices.get(job_id)) is not None and c.config is not None:
                refused = choices.pop(job_id)
                declined[job_id] = (
                    f"kept its configuration: the new one ({_describe(refused)}) was not "
                    f"placed ({cause})"
                )
                stuck.append(job_id)
            if job_id not in pinned:
                displaced[job_id] = j.placement
        reserved.update(displaced)
        if not lost and not stuck and not displaced:
            break
    _on_placement(configs, choices, overrides, result.placements, snapshot.nodes)
    # 5. A decision for every job placed anew, and for every job preempted.
    nodes = node_table(snapshot.nodes).by_id
    decisions: list[Decision] = []
    why: dict[str, Why] = {}
    for job in view.by_state("running"):
        job_id = job.spec.job_id
        if (stopped := preempted.get(job_id)) is None:
            continue
        assert job.config is not None
        decisions.append(
            Decision(
                job_id=job_id,
                config=job.config,
                placement=None,
                source=stopped.source,
                policy_version=policy_version,
                reason=f"preempted: {stopped.reason}",
                preempt=True,
            )
        )
        why[job_id] = Why(
            override_id=None,
            explanation={
                "preempted": True,
                "why": stopped.reason,
                "features": dict(stopped.features),
            }
            if explain
            else {},
        )
    for job in active:
        job_id = job.spec.job_id
        placement = result.placements.get(job_id)
        if placement is None:
            continue
        override = overrides.get(job_id)
        fresh_override = override is not None and honoured.get(job_id) != override.override_id
        if (
            job_id in result.kept
            and configs[job_id] == job.config
            and not fresh_override
            and job_id not in released
        ):
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
            if (paid := payoffs.get(job_id)) is not None:
                reason += f"; it pays for its restart: {paid.describe()}"
        if job.interrupted:
            reason = f"{job.interrupted}: {reason}"
        if job_id in result.mixed:
            reason += f"; {result.mixed[job_id]}"
        decisions.append(
            Decision(
                job_id=job_id,
                config=configs[job_id],
                placement=placement,
                source=source,
                policy_version=policy_version,
                reason=f"{reason}; placed on {placement_summary(placement)}",
            )
        )
        explanation = (
            explain_decision(
                spec=job.spec,
                config=configs[job_id],
                placement=placement,
                nodes=nodes,
                features=_features(snapshot, choice),
                why=reason,
                model=(models or {}).get(job_id),
                metrics=job.metrics,
                balanced=snapshot.mixes_models,
            )
            if explain
            else {}
        )
        if explain and job_id in payoffs and override is None:
            explanation["reconfiguration"] = payoffs[job_id].as_dict()
        why[job_id] = Why(
            override_id=override.override_id if override is not None else None,
            explanation=explanation,
        )
    return DecisionRound(
        decisions=decisions,
        unplaced={
            **{job_id: f"preempted: {c.reason}" for job_id, c in preempted.items()},
            **waiting,
            **skipped,
            **result.unplaced,
        },
        why=why,
        skipped_overrides=skipped,
        declined=declined,
    )


def decide_for(
    snapshot: ClusterSnapshot,
    policy: Policy,
    overrides: Mapping[str, OverrideRecord],
    *,
    honoured: Mapping[str, int | None],
    explain: bool = True,
    models: Mapping[str, JobModel] | None = None,
) -> DecisionRound:
    """``decide`` with ``policy``'s choices, asked about the round's view
    (``policy_view``): how a shadow policy decides beside the active one. The daemon asks
    its own policy itself, to fall back when it fails."""
    choices = policy.decide(policy_view(snapshot, overrides, honoured)).choices
    return decide(
        snapshot,
        choices,
        overrides,
        honoured=honoured,
        policy_version=policy.version,
        explain=explain,
        models=models,
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
        if choice is not None and choice.config is not None:
            configs[job_id] = choice.config
        elif job.config is not None:
            # A running job keeps its configuration, and so does a waiting one that
            # still has one (stopped by a lost node, or restored after a restart): it
            # resumes as it ran. A preempted job waits without one.
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
        chosen = configs.get(job_id)
        if (
            job.placement is not None
            and chosen is not None
            and chosen.rebatches(job.config)
            and (job_id not in released or choice is None or choice.config is None)
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


def _describe(choice: PolicyChoice) -> str:
    return choice.config.describe() if choice.config is not None else "none"


def fit_to_cluster(spec: JobSpec, config: JobConfig, nodes: Sequence[NodeInfo]) -> JobConfig:
    """``config`` after the memory rule, for the smallest GPU ``spec`` may run on in
    ``nodes`` (unchanged for a job without a model profile or with no such GPU)."""
    if spec.model is None:
        return config
    share = _gpu_share(spec, nodes)
    if share is None:
        return config
    return _fitted(spec.model, config, config.batch(spec), share)


def _gpu_share(spec: JobSpec, nodes: Sequence[NodeInfo]) -> float | None:
    """The memory one rank of ``spec`` has on the smallest GPU it may run on in
    ``nodes`` (its milli's share), ``None`` with no such GPU."""
    memory = [m for model, m in node_table(nodes).memory_by_model.items() if spec.allows(model)]
    return min(memory) * spec.gpu_milli / MILLI_PER_GPU if memory else None


def _layouts_that_fit(
    choices: dict[str, PolicyChoice],
    view: ClusterSnapshot,
    overrides: Mapping[str, OverrideRecord],
) -> None:
    """2a. A waiting job whose chosen layout fits no GPU it may use, even under the
    memory rule, takes the first layout of its size that fits the largest (tensor, then
    pipeline parallel: ``fit_layout``), else of twice its size, and so on up to its
    ``max_gpus`` and ``largest_gang``: a policy's data parallel 7B model on 16 GiB GPUs
    would otherwise wait for ever. Precision and compression stay the policy's."""
    table = node_table(view.nodes)
    for job in view.by_state("pending"):
        spec, job_id = job.spec, job.spec.job_id
        c = choices.get(job_id)
        if spec.model is None or c is None or c.config is None or job_id in overrides:
            continue
        allowed = [m for m in table.memory_by_model if spec.allows(m)]
        if not allowed:
            continue
        largest = max(allowed, key=lambda m: (table.memory_by_model[m], m))
        share = table.memory_by_model[largest] * spec.gpu_milli / MILLI_PER_GPU
        batch = c.config.batch(spec)
        ruled = _fitted(spec.model, c.config, batch, share)  # the memory rule on that GPU
        if rank_memory(spec.model, ruled, batch).fits(int(share)):
            continue
        max_tp = table.node_gpus_by_model[largest][0]  # tensor parallel within a node
        size, ceiling = c.config.world_size, min(spec.max_gpus, largest_gang(spec, view.nodes))
        while size <= ceiling:
            start = replace(c.config, layout=Layout(world_size=size))
            fitted, estimate, _ = fit_layout(spec.model, start, batch, share, max_tp=max_tp)
            if estimate.fits(int(share)):
                layout = fitted.layout
                unsplit = f"; {_UNSPLIT}" if c.gpu_split else ""
                choices[job_id] = replace(
                    c,
                    config=fitted,
                    gpu_split=None,
                    reason=f"{c.reason}{unsplit}; fitting no GPU so, {size} GPU(s) as "
                    f"dp={layout.dp} tp={layout.tp} pp={layout.pp} "
                    f"({estimate.total_bytes / (1 << 30):.1f} GiB per rank of "
                    f"{share / (1 << 30):.0f})",
                )
                break
            size *= 2


RUNNABLE_COMPRESSION: Final = CompressionSpec(kind="topk", ratio=0.01)
"""What a choice of PowerSGD with tensor or pipeline parallelism compresses by instead:
the strongest compression of the policy's choices that the executor runs on any layout."""


def _compression_that_runs(choices: dict[str, PolicyChoice]) -> None:
    """2a. A choice the executor cannot train (``JobConfig.executor_refusal``: PowerSGD
    with tensor or pipeline parallelism) keeps its layout and compresses by
    ``RUNNABLE_COMPRESSION`` instead, saying so; the same in the simulated cluster, so
    that a policy learns what the executor runs."""
    for job_id, c in choices.items():
        if c.config is None or c.config.executor_refusal() is None:
            continue
        layout = c.config.layout
        choices[job_id] = replace(
            c,
            config=replace(c.config, compression=RUNNABLE_COMPRESSION),
            reason=f"{c.reason}; {RUNNABLE_COMPRESSION} instead of {c.config.compression}: "
            f"PowerSGD runs on data-parallel layouts only, not tp={layout.tp} pp={layout.pp}",
        )


def _precision_that_pays(
    choices: dict[str, PolicyChoice], active: Sequence[JobStatus], nodes: Sequence[NodeInfo]
) -> None:
    """3. A module class chosen in a precision whose matmuls the performance model
    prices slower than fp32's on every GPU model the job may run on
    (``autotune.perf.model.dtype_tflops``: a 16-bit type with no units there, emulated at
    half fp32; a CPU that measured its bf16 slower than its fp32) trains in the other
    16-bit type where that one is faster than fp32 on every such model (bf16 chosen for
    a job held to V100s or T4s trains in fp16, as ``rules`` would run it there), else in
    fp32, slower and less exact being no trade; the same in the simulated cluster, so
    that a policy learns what it gets. Judged by the model's speed, not by
    ``core.fast_precisions``: fp8 on a T4 runs through its fp16 units, faster than fp32,
    and stays. A job on no known GPU model keeps its choice.

    A running job is judged on the GPUs it runs on as well: bf16 chosen for a job that
    runs in fp16 on T4s is no change (it would restart the job to run slower), while the
    Planner re-places only jobs whose configuration changes (``_on_placement`` judges
    those where they land)."""
    peaks = _peaks(nodes)
    for job in active:
        c = choices.get(job.spec.job_id)
        if c is None or c.config is None:
            continue
        models = sorted(m for m in peaks if job.spec.allows(m))
        raised = _paying_precision(c.config.precision, models, peaks)
        if raised is None and job.state == "running" and job.placement is not None:
            models = _placed_models(job.placement, nodes, peaks)
            raised = _paying_precision(c.config.precision, models, peaks, same_width=True)
        if raised is not None:
            precision, said = raised
            choices[job.spec.job_id] = replace(
                c,
                config=replace(c.config, precision=precision),
                reason=f"{c.reason}; {said}: slower than fp32 on {', '.join(models)}",
            )


def _on_placement(
    configs: dict[str, JobConfig],
    choices: dict[str, PolicyChoice],
    overrides: Mapping[str, OverrideRecord],
    placements: Mapping[str, Placement],
    nodes: Sequence[NodeInfo],
) -> None:
    """5a. A 16-bit type the policy chose for a job the Planner placed on GPUs that run it
    slower than fp32 (bf16 on T4s or V100s, for a job that may also run on A100s) trains
    in the other 16-bit type where that one pays there: the same bytes, so the placement
    holds. Overrides are the user's word and keep theirs."""
    peaks = _peaks(nodes)
    for job_id, placement in placements.items():
        c = choices.get(job_id)
        if c is None or c.config is None or job_id in overrides or job_id not in configs:
            continue
        models = _placed_models(placement, nodes, peaks)
        raised = _paying_precision(configs[job_id].precision, models, peaks, same_width=True)
        if raised is not None:
            precision, said = raised
            configs[job_id] = replace(configs[job_id], precision=precision)
            choices[job_id] = replace(
                c,
                config=configs[job_id],
                reason=f"{c.reason}; {said}: slower than fp32 on the {', '.join(models)} "
                "it was placed on",
            )


def _peaks(nodes: Sequence[NodeInfo]) -> dict[str, Mapping[str, float]]:
    """Each GPU model's peak TFLOPS by data type, for the models whose fp32 is known."""
    return {n.gpu_model: n.peak_tflops for n in nodes if n.peak_tflops.get("fp32")}


def _placed_models(
    placement: Placement, nodes: Sequence[NodeInfo], peaks: Mapping[str, Mapping[str, float]]
) -> list[str]:
    """The GPU models ``placement``'s ranks run on, of those in ``peaks``, sorted."""
    by_id = node_table(nodes).by_id
    return sorted(
        {by_id[r.node_id].gpu_model for r in placement.ranks if r.node_id in by_id} & {*peaks}
    )


def _paying_precision(
    precision: PrecisionMap,
    models: Sequence[str],
    peaks: Mapping[str, Mapping[str, float]],
    *,
    same_width: bool = False,
) -> tuple[PrecisionMap, str] | None:
    """``precision`` with each class that runs slower than fp32 on every one of
    ``models`` in what pays there (``_paying_substitute``), and what changed; ``None``
    where nothing does (or ``models`` is empty). ``same_width``: only a 16-bit class that
    the other 16-bit type pays for is changed (the memory it needs stays)."""
    if not models or precision.lowest() == "fp32":
        return None
    slower = {
        cls: p
        for cls in MODULE_CLASSES
        if cls != "optimizer_state"
        and (p := getattr(precision, cls)) != "fp32"
        and all(dtype_tflops(peaks[m], p) < peaks[m]["fp32"] for m in models)
    }
    instead = {cls: _paying_substitute(p, models, peaks) for cls, p in slower.items()}
    if same_width:
        instead = {cls: to for cls, to in instead.items() if to != "fp32" and slower[cls] != "fp8"}
    if not instead:
        return None
    by_target: dict[Precision, list[str]] = {}
    for cls in sorted(instead):
        by_target.setdefault(instead[cls], []).append(cls)
    said = [
        f"{to} instead of {'/'.join(sorted({slower[c] for c in classes}))} for {', '.join(classes)}"
        for to, classes in sorted(by_target.items())
    ]
    return replace(precision, **instead), "; ".join(said)


def _paying_substitute(
    chosen: Precision, models: Sequence[str], peaks: Mapping[str, Mapping[str, float]]
) -> Precision:
    """What a class chosen in ``chosen`` (slower than fp32 on every one of ``models``)
    trains in: a 16-bit type that is faster than fp32 on every one of them (none of fewer
    bits than the choice: an fp8 choice may get fp16 or bf16, a 16-bit one the other),
    else fp32."""
    for other in ("fp16", "bf16"):
        if other != chosen and all(
            dtype_tflops(peaks[m], other) > peaks[m]["fp32"] for m in models
        ):
            return other
    return "fp32"


@lru_cache(maxsize=65_536)
def _fitted(model: ModelProfile, config: JobConfig, batch: int, memory: float) -> JobConfig:
    return fit_memory(model, config, batch, memory)[0]


def _fit_memory(
    choices: Mapping[str, PolicyChoice], active: Sequence[JobStatus], nodes: Sequence[NodeInfo]
) -> dict[str, PolicyChoice]:
    specs = {j.spec.job_id: j.spec for j in active}
    fitted: dict[str, PolicyChoice] = {}
    for job_id, choice in choices.items():
        spec = specs.get(job_id)
        if spec is None or choice.config is None:
            fitted[job_id] = choice
            continue
        config = fit_to_cluster(spec, choice.config, nodes)
        if config != choice.config:
            layout = config.layout
            what = []
            if layout.micro_batches != choice.config.layout.micro_batches:
                what.append(f"{layout.micro_batches} micro-batches")
            if layout.activation_checkpointing != choice.config.layout.activation_checkpointing:
                what.append("activation checkpointing")
            choice = replace(
                choice, config=config, reason=f"{choice.reason}; to fit memory: {', '.join(what)}"
            )
        fitted[job_id] = choice
    return fitted


def _displacing_pins(
    active: Sequence[JobStatus],
    placements: Mapping[str, Placement],
    pinned: Mapping[str, Placement],
    choices: Mapping[str, PolicyChoice],
) -> dict[str, str]:
    """Pinned jobs whose GPUs belong to a running job left without a placement."""
    gpu_owner = {
        (slot.node_id, slot.gpu_index): job_id
        for job_id, placement in pinned.items()
        for slot in placement.ranks
    }
    found: dict[str, str] = {}
    for job in active:
        job_id = job.spec.job_id
        if job.state != "running" or job.placement is None or job_id in placements:
            continue
        choice = choices.get(job_id)
        if job_id in pinned or (choice is not None and choice.config is not None):
            continue
        for slot in job.placement.ranks:
            owner = gpu_owner.get((slot.node_id, slot.gpu_index))
            if owner is not None and owner != job_id:
                found.setdefault(
                    owner,
                    f"its pinned GPUs are held by running job {job_id}, which has nowhere "
                    "else to go this round",
                )
    return found


def _policy_changes(
    active: Sequence[JobStatus],
    choices: Mapping[str, PolicyChoice],
    overrides: Mapping[str, OverrideRecord],
) -> Iterator[tuple[JobStatus, PolicyChoice]]:
    """Each running, placed job the policy gives a configuration (no override holds it),
    with that choice."""
    for job in active:
        choice = choices.get(job.spec.job_id)
        if (
            job.state == "running"
            and job.placement is not None
            and choice is not None
            and choice.config is not None
            and job.spec.job_id not in overrides
        ):
            yield job, choice


def _unpaid_changes(
    snapshot: ClusterSnapshot,
    active: Sequence[JobStatus],
    choices: Mapping[str, PolicyChoice],
    overrides: Mapping[str, OverrideRecord],
    released: Mapping[str, int],
    models: Mapping[str, JobModel],
) -> tuple[dict[str, str], dict[str, Payoff]]:
    """Running jobs whose new configuration does not pay for its restart, or whose last
    change showed no gain yet (``autotune.decision.payoff``), with the reason; and the
    arithmetic of the changes that pass."""
    assert snapshot.restart_s is not None
    nodes = {n.node_id: n for n in snapshot.nodes}
    declined: dict[str, str] = {}
    paid: dict[str, Payoff] = {}
    for job, choice in _policy_changes(active, choices, overrides):
        job_id = job.spec.job_id
        if job.config is None or choice.config == job.config or job_id in released:
            continue
        assert choice.config is not None
        keep = f"kept its configuration rather than {_describe(choice)}: "
        if (unproven := unproven_change(job, choice.config)) is not None:
            declined[job_id] = keep + unproven
            continue
        arithmetic = payoff(
            job,
            choice.config,
            nodes,
            snapshot.restart_s,
            models.get(job_id),
            balanced=snapshot.mixes_models,
        )
        if isinstance(arithmetic, str):
            declined[job_id] = keep + arithmetic
        elif not arithmetic.pays:
            declined[job_id] = (
                keep + "the change does not pay for its restart: " + (arithmetic.describe())
            )
        else:
            paid[job_id] = arithmetic
    return declined, paid


def _beyond_reach(
    view: ClusterSnapshot,
    decided: Mapping[str, PolicyChoice],
    overrides: Mapping[str, OverrideRecord],
) -> dict[str, tuple[int, str]]:
    """Waiting jobs (no override) whose chosen GPUs exceed ``largest_gang`` on the
    cluster while it could hold their minimum: the size they get instead (the largest
    power of two it can hold, at least their minimum) and why."""
    out: dict[str, tuple[int, str]] = {}
    for job in view.by_state("pending"):
        job_id, spec = job.spec.job_id, job.spec
        c = decided.get(job_id)
        if c is None or c.config is None or job_id in overrides or spec.gpu_milli < MILLI_PER_GPU:
            continue
        if c.gpu_split is not None:
            continue  # across models: the Planner says whether its split has room
        gang = largest_gang(spec, view.nodes)
        if c.config.world_size <= gang or gang < spec.min_gpus:
            continue
        size = max(spec.min_gpus, 1 << (gang.bit_length() - 1))
        out[job_id] = (
            size,
            f"{size} GPU(s) instead of {c.config.world_size}: one GPU model it may use holds at "
            f"most {gang} of its ranks"
            + (f" on {spec.max_nodes} node(s)" if spec.max_nodes else ""),
        )
    return out


def _hopeless_resizes(
    snapshot: ClusterSnapshot,
    active: Sequence[JobStatus],
    choices: Mapping[str, PolicyChoice],
    overrides: Mapping[str, OverrideRecord],
) -> dict[str, str]:
    """Running jobs whose new configuration asks for more GPUs than any one GPU model has
    free, counting the job's own: declined before planning (the Planner would refuse them
    too, at the cost of planning the round twice)."""
    changes = list(_policy_changes(active, choices, overrides))
    if not changes:
        return {}
    table = node_table(snapshot.nodes)
    nodes = table.by_id
    free = {model: float(count) for model, count in table.gpus_by_model.items()}
    for node_id, count in snapshot.held_gpus().items():
        host = nodes.get(node_id)
        if host is not None and host.gpu_count > 0:
            free[host.gpu_model] -= count
    held: dict[str, dict[str, float]] = {}
    for job in snapshot.by_state("running"):
        if job.placement is None:
            continue
        for slot in job.placement.ranks:
            host = nodes.get(slot.node_id)
            if host is not None:
                mine = held.setdefault(job.spec.job_id, {})
                mine[host.gpu_model] = (
                    mine.get(host.gpu_model, 0.0) + slot.gpu_milli / MILLI_PER_GPU
                )
    declined: dict[str, str] = {}
    for job, choice in changes:
        job_id = job.spec.job_id
        assert choice.config is not None
        if choice.config == job.config and choice.gpu_split is None:
            continue  # it keeps its GPUs (a job across models holds them on several)
        own = held.get(job_id, {})
        if choice.gpu_split is not None:
            short = [
                f"{n} {m} ({free.get(m, 0.0) + own.get(m, 0.0):g} free for it)"
                for m, n in choice.gpu_split
                if n > free.get(m, 0.0) + own.get(m, 0.0) + 1e-9
            ]
            if short:
                declined[job_id] = (
                    f"kept its configuration: the new one ({_describe(choice)}) needs "
                    + ", ".join(short)
                )
            continue
        room = max(
            (free.get(m, 0.0) + own.get(m, 0.0) for m in free if job.spec.allows(m)),
            default=0.0,
        )
        if choice.config.world_size > room + 1e-9:
            declined[job_id] = (
                f"kept its configuration: the new one ({_describe(choice)}) needs "
                f"{choice.config.world_size} GPUs of one model; {room:g} are free for it"
            )
    return declined
