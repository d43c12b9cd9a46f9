"""Decisions as templates: the decision step's own output, computed once per (model, GPU
count) and reused with each decision's job, placement, features and reason."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from autotune import __version__
from autotune.benchmarks.history.settings import (
    BACKEND,
    NODE_GPUS,
    PINS,
    PLACEHOLDER_OVERRIDE,
    SLOTS,
    cluster_nodes,
)
from autotune.catalog.profiles import MODEL_CATALOG
from autotune.core import (
    JobConfig,
    JobSpec,
    NodeInfo,
    Placement,
    RankSlot,
)
from autotune.decision.step import DecisionRound, decide_for
from autotune.envs.workloads import STREAM_BATCH, STREAM_MIX
from autotune.interfaces import ClusterSnapshot, JobStatus, PolicyChoice, PolicyRound
from autotune.perf.model import estimate, shape_of
from autotune.policies.rules import RulesPolicy
from autotune.rl.action import ACTION_FIELDS, GPU_OPTIONS, decode_slot

# --- templates: the decision step's own decisions, computed once ----------------------


@dataclass(frozen=True, slots=True)
class Template:
    """One decision of the decision step, to be reused for another job and placement."""

    config: JobConfig
    core: str
    """The reason without ``; placed on ...``."""
    suffix: str
    """What ``explain_decision`` appended to the reason in the explanation's ``why``."""
    explanation: dict[str, Any]
    goodput: float
    """The performance model's prediction: samples/s times statistical efficiency."""
    step_s: float
    power_watts: float


@dataclass(frozen=True, slots=True)
class _Pin:
    """An override as the decision step reads it."""

    override_id: int
    pin: Mapping[str, Any]
    reason: str


class _SampledPolicy:
    """The learned policy's choices (``decode_slot``, the features it adds) for given
    action entries, without its network."""

    name = "ppo"

    def __init__(self, entries: Mapping[str, tuple[list[int], int]]) -> None:
        self.version = f"ppo-{__version__}"
        self.entries = entries

    def decide(self, snapshot: ClusterSnapshot) -> PolicyRound:
        choices: dict[str, PolicyChoice] = {}
        for job in snapshot.by_state("pending", "running"):
            if job.spec.job_id not in self.entries:
                continue
            entries, slot = self.entries[job.spec.job_id]
            choice = decode_slot(entries, job, slot)
            if choice is not None:
                features = {**choice.features, "forecast": snapshot.gpu_utilization}
                choices[job.spec.job_id] = replace(choice, features=features)
        return PolicyRound(choices=choices)


@dataclass(slots=True)
class Templates:
    rules: dict[tuple[str, int], Template] = field(default_factory=dict)
    chosen: dict[tuple[str, int], list[Template]] = field(default_factory=dict)
    reconfigured: dict[tuple[str, int], list[Template]] = field(default_factory=dict)
    released: dict[tuple[str, int], list[Template]] = field(default_factory=dict)
    override: dict[tuple[str, int], list[tuple[int, Template]]] = field(default_factory=dict)

    def options(self, model: str, lo: int, hi: int) -> list[int]:
        """GPU counts a job of ``model`` may get: powers of two within its bounds for
        which every kind of decision has a template."""
        return [
            g
            for g in GPU_OPTIONS
            if lo <= g <= hi
            and all(
                (model, g) in table
                for table in (self.rules, self.chosen, self.reconfigured, self.released)
            )
        ]


def _action(rng: random.Random, gpus: int) -> list[int]:
    """Entries of one slot of the learned policy's action: change, ``gpus``, the rest
    drawn uniformly from the action space."""
    values = {name: rng.randrange(n) for name, n in ACTION_FIELDS}
    values["change"] = 1
    values["gpus"] = GPU_OPTIONS.index(gpus)
    return [values[name] for name, _ in ACTION_FIELDS]


def _template(
    spec: JobSpec, round_: DecisionRound, nodes: Mapping[str, NodeInfo]
) -> Template | None:
    decision = next((d for d in round_.decisions if d.job_id == spec.job_id), None)
    if decision is None or decision.placement is None or spec.model is None:
        return None
    explanation = round_.why[spec.job_id].explanation
    core = decision.reason.rsplit("; placed on ", 1)[0]
    why = str(explanation.get("why", ""))
    if not why.startswith(core):
        return None
    shape = shape_of(decision.placement, nodes)
    predicted = estimate(spec.model, decision.config, shape, decision.config.batch(spec))
    if predicted.oom or predicted.goodput <= 0:
        return None
    return Template(
        config=decision.config,
        core=core,
        suffix=why[len(core) :],
        explanation=explanation,
        goodput=predicted.goodput,
        step_s=predicted.step.step_s,
        power_watts=predicted.power_watts,
    )


def _placement(job_id: str, gpus: int, node_ids: list[str]) -> Placement:
    """``gpus`` ranks packed on the nodes in order."""
    return Placement(
        job_id=job_id,
        ranks=tuple(
            RankSlot(rank=r, node_id=node_ids[r // NODE_GPUS], gpu_index=r % NODE_GPUS)
            for r in range(gpus)
        ),
    )


def build_templates(rng: random.Random, *, variants: int = 3) -> Templates:
    """For every model of the built-in stream and GPU count within its bounds: the
    decisions the daemon takes for it (rules, the learned policy's start, resize and
    return from an override, each override pin), on an otherwise idle two-node cluster
    where exactly those GPUs are free."""
    nodes = cluster_nodes(2 * NODE_GPUS)
    by_id = {n.node_id: n for n in nodes}
    node_ids = [n.node_id for n in nodes]
    job_id = "job-00000"
    out = Templates()
    rules = RulesPolicy()
    for model_name, _, lo, hi in STREAM_MIX:
        spec = JobSpec(
            job_id=job_id,
            model=MODEL_CATALOG[model_name],
            global_batch=STREAM_BATCH,
            min_gpus=lo,
            max_gpus=hi,
        )
        for gpus in (g for g in GPU_OPTIONS if lo <= g <= hi):
            key = (model_name, gpus)
            jobs = [JobStatus(spec=spec, state="pending")]
            blocked = 2 * NODE_GPUS - gpus
            if blocked:  # everything but the job's GPUs is held: the rules take exactly them
                blocker = JobSpec(job_id="blocker", min_gpus=blocked, max_gpus=blocked)
                taken = Placement(
                    job_id="blocker",
                    ranks=tuple(
                        RankSlot(
                            rank=r,
                            node_id=node_ids[(r + gpus) // NODE_GPUS],
                            gpu_index=(r + gpus) % NODE_GPUS,
                        )
                        for r in range(blocked)
                    ),
                )
                jobs.append(
                    JobStatus(
                        spec=blocker,
                        state="running",
                        config=JobConfig.data_parallel(blocked),
                        placement=taken,
                    )
                )
            snapshot = ClusterSnapshot(
                time_s=0.0,
                nodes=nodes,
                jobs=jobs,
                telemetry=BACKEND,
                gpu_utilization=blocked / (2 * NODE_GPUS),
            )
            base = _template(spec, decide_for(snapshot, rules, {}, honoured={}), by_id)
            if base is None:
                continue
            out.rules[key] = base
            idle = replace(snapshot, jobs=[JobStatus(spec=spec, state="pending")])
            running = JobStatus(
                spec=spec,
                state="running",
                config=base.config,
                placement=_placement(job_id, gpus, node_ids),
                progress=0.3,
            )
            busy = replace(idle, jobs=[running], gpu_utilization=gpus / (2 * NODE_GPUS))
            for table, view, honoured in (
                (out.chosen, idle, {}),
                (out.reconfigured, busy, {}),
                (out.released, busy, {job_id: PLACEHOLDER_OVERRIDE}),
            ):
                found: list[Template] = []
                for _ in range(10 * variants):
                    if len(found) == variants:
                        break
                    policy = _SampledPolicy({job_id: (_action(rng, gpus), rng.randrange(SLOTS))})
                    made = _template(spec, decide_for(view, policy, {}, honoured=honoured), by_id)
                    # A learned policy keeps no configuration far slower than the rules'.
                    if made is not None and made.goodput >= 0.3 * base.goodput:
                        found.append(made)
                if found:
                    table[key] = found
            for index, (pin, reason) in enumerate(PINS):
                record = _Pin(override_id=PLACEHOLDER_OVERRIDE, pin=pin, reason=reason)
                round_ = decide_for(busy, _SampledPolicy({}), {job_id: record}, honoured={})
                made = _template(spec, round_, by_id)
                if made is not None and not round_.skipped_overrides:
                    out.override.setdefault(key, []).append((index, made))
    return out


def with_override(core: str, override_id: int) -> str:
    """A template's reason naming override ``override_id`` instead of the placeholder."""
    placeholder = f"override {PLACEHOLDER_OVERRIDE}"
    if core.startswith(placeholder):
        return f"override {override_id}{core[len(placeholder) :]}"
    return core
