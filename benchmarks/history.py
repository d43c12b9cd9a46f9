"""A month of the daemon's history in a database (`python bench/history.py`).

Builds the database ``autotune daemon`` would leave after ``--days`` of deciding for a
cluster of ``--cluster-gpus`` GPUs, so that the daemon and the API can be measured on a
month-old database rather than an empty one::

    python bench/history.py --days 30 --out /work/runs/history30.db
    python bench/history.py --db postgresql+psycopg://me@db/autotune --days 7

The database is created with ``Database(url).upgrade()`` and everything is written
through ``autotune.db.repository`` (the functions the daemon and the API call), with
the history's own times:

- **cluster**: 8-GPU A100 nodes, the ``NodeInfo`` of the built-in simulated cluster
  (``autotune.envs.presets.default_nodes``) under the names ``a100-0``, ``a100-1``, ...;
- **jobs** arrive as the daemon's built-in job stream (``job_stream``: Poisson, catalog
  models) at the rate that gives ``--decisions-per-day``; each wants a power of two of
  GPUs within its bounds (small ones more often), waits for them (first come, the first
  32 in the queue considered, smaller where its wish does not fit), runs for a
  log-normal time (its steps follow from the performance model's goodput) sized so
  that jobs at the sizes they ask for would keep 75 % of the GPUs busy (restarts,
  smaller placements and the policy's slower configurations make it about 95 %), is
  resized now and then, and ends finished (92 %), failed (3 %) or cancelled (5 %).
  Jobs still active when the history ends are cancelled then: a daemon started on the
  database afterwards resumes nothing;
- **decisions** are the decision step's own output (``autotune.decision.step.decide``:
  memory rule, Planner, ``explain_decision``), computed once at start for every
  (model, GPU count) of the stream and reused as templates with each decision's job,
  placement, live features and reason. ``policy``: the learned policy's wording
  (``ppo (slot k): chosen|reconfigured ...``) on actions sampled from its action space
  (``decode_slot``; the network is not loaded), at start, on resizes (paced so the
  total meets ``--decisions-per-day``) and when an override ends; ``override``: 3 % of
  jobs get a user's pin while running (a third are deleted early where the job still
  runs then, the others expire);
  ``fallback``: a few episodes where the rules decided after failed ticks, as the
  daemon does. Policy versions as the daemon registers them (``ppo-<version>`` active,
  ``rules-<version>`` its fallback);
- **metrics**: every ``--cluster-metrics-every`` ticks the four samples the daemon
  records each tick (``tick_duration_s``, ``jobs_running``, ``jobs_pending``,
  ``gpu_utilization``), and every ``--job-metrics-every`` ticks, in the same call, each
  running job's ``job_goodput``, ``job_nan_events``, ``job_power_watts`` and
  ``job_step_time_s`` (what the simulated backend measures);
- **transitions**: one for about every 200 policy decisions (a logged round of the
  learned policy as the daemon writes it).

A 30-day build at the defaults holds 105 k jobs, 1.05 M decisions and 3.9 M metric
samples: 3.1 GB of SQLite, written in about 6 minutes on 2 shared cores. Prints one JSON
object (rows per table, file size for SQLite, seconds taken) and writes it to
``bench/out/history.json`` (``--json-out``). ``build_history`` does the same from Python.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import numpy as np
from sqlalchemy import event, func, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from autotune import __version__
from autotune.benchmarks import OUT
from autotune.catalog.profiles import MODEL_CATALOG
from autotune.cli.common import progress_bar
from autotune.core import (
    Decision,
    DecisionSource,
    JobConfig,
    JobSpec,
    NodeInfo,
    Placement,
    PrecisionMap,
    RankSlot,
)
from autotune.daemon.tick import FALLBACK_AFTER
from autotune.db import Database, sqlite_file, sqlite_url
from autotune.db import repository as repo
from autotune.db.retention import RetentionPolicy, RetentionReport, run_retention
from autotune.db.tables import (
    DecisionRow,
    JobRow,
    MetricRow,
    NodeRow,
    OverrideRow,
    PolicyVersionRow,
    TransitionRow,
)
from autotune.decision.step import DecisionRound, decide_for, placement_summary
from autotune.envs.presets import default_nodes
from autotune.envs.simulator import SimConfig, SimulatedCluster
from autotune.envs.workloads import STREAM_BATCH, STREAM_MIX, job_stream
from autotune.interfaces import ClusterSnapshot, JobStatus, PolicyChoice, PolicyRound
from autotune.perf.model import estimate, shape_of
from autotune.policies.rules import RulesPolicy
from autotune.rl.action import ACTION_DIMS, ACTION_FIELDS, GPU_OPTIONS, decode_slot
from autotune.rl.observation import HEADER, SLOT

BACKEND: Final = SimulatedCluster.name
"""The backend the history is of: its name labels the metrics and is the jobs' origin."""
NODE_GPUS: Final = 8
GPU_WEIGHTS: Final = {1: 4.0, 2: 4.0, 4: 3.0, 8: 2.0, 16: 1.0}
"""How often a job wants each GPU count (among those within its bounds)."""
DECISIONS_PER_JOB: Final = 10.0
"""Mean decisions per job (its start, resizes, overrides): sets the arrival rate."""
OFFERED_LOAD: Final = 0.75
"""Share of the GPUs the jobs would keep busy at the sizes they ask for and the speed
of the rules' configuration: sets their durations."""
DURATION_SIGMA: Final = 1.0
"""Of the log-normal job durations."""
RESTART_S: Final = SimConfig().restart_s
SLOTS: Final = 32
"""Queued jobs considered each tick (the learned policy's slots)."""
FATES: Final = (("finished", 0.92), ("failed", 0.03), ("cancelled", 0.05))
FAIL_REASONS: Final = (
    "the training process ran out of GPU memory",
    "diverged: loss NaN after 3 rollbacks to the last checkpoint",
    "the training process exited with status 1",
)
CANCELLED: Final = "cancelled on request"
OVERRIDE_SHARE: Final = 0.03
OVERRIDE_DELETED: Final = 1 / 3
PINS: Final[tuple[tuple[dict[str, Any], str], ...]] = (
    ({"precision": PrecisionMap.uniform("fp32").as_dict()}, "fp32 while a loss spike is studied"),
    ({"compression": {"kind": "none"}}, "dense gradients for an accuracy comparison"),
    ({"layout": {"activation_checkpointing": True}}, "memory headroom for a longer context"),
)
FALLBACK_ERRORS: Final = (
    "TimeoutError: the policy did not answer within 10 s",
    "OSError: [Errno 24] Too many open files",
    "RuntimeError: policy module state does not match its checkpoint",
)
TRANSITION_SHARE: Final = 1 / 200
_PLACEHOLDER_OVERRIDE: Final = 1
DEFAULT_DAYS: Final = 30.0
DEFAULT_GPUS: Final = 512
DEFAULT_TICK_S: Final = 2.0
DEFAULT_DECISIONS_PER_DAY: Final = 35_000
DEFAULT_JOB_METRICS_EVERY: Final = 600
DEFAULT_CLUSTER_METRICS_EVERY: Final = 10
_A100: Final = next(n for n in default_nodes() if n.gpu_model == "A100")


def cluster_nodes(gpus: int) -> list[NodeInfo]:
    """``gpus / 8`` nodes: the simulated cluster's 8-GPU A100 node, renamed."""
    if gpus < NODE_GPUS or gpus % NODE_GPUS or _A100.gpu_count != NODE_GPUS:
        raise ValueError(f"--cluster-gpus {gpus}: a multiple of {NODE_GPUS} (8-GPU nodes)")
    return [replace(_A100, node_id=f"a100-{i}") for i in range(gpus // NODE_GPUS)]


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
                (out.released, busy, {job_id: _PLACEHOLDER_OVERRIDE}),
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
                record = _Pin(override_id=_PLACEHOLDER_OVERRIDE, pin=pin, reason=reason)
                round_ = decide_for(busy, _SampledPolicy({}), {job_id: record}, honoured={})
                made = _template(spec, round_, by_id)
                if made is not None and not round_.skipped_overrides:
                    out.override.setdefault(key, []).append((index, made))
    return out


def _with_override(core: str, override_id: int) -> str:
    """A template's reason naming override ``override_id`` instead of the placeholder."""
    placeholder = f"override {_PLACEHOLDER_OVERRIDE}"
    if core.startswith(placeholder):
        return f"override {override_id}{core[len(placeholder) :]}"
    return core


# --- the cluster ----------------------------------------------------------------------


class Cluster:
    """Free GPUs per node; a job gets whole GPUs on one node (8 or fewer) or whole
    nodes (more)."""

    def __init__(self, nodes: list[NodeInfo]) -> None:
        self.names = [n.node_id for n in nodes]
        self.free: list[list[int]] = [list(range(NODE_GPUS)) for _ in nodes]
        self.by_free: list[set[int]] = [set() for _ in range(NODE_GPUS + 1)]
        self.by_free[NODE_GPUS] = set(range(len(nodes)))
        self.total = NODE_GPUS * len(nodes)
        self.held = 0

    def _set(self, node: int, free: list[int]) -> None:
        self.by_free[len(self.free[node])].discard(node)
        self.free[node] = free
        self.by_free[len(free)].add(node)

    def take(self, gpus: int) -> list[tuple[int, int]] | None:
        """``gpus`` free GPUs (best fit), or ``None``."""
        if gpus > NODE_GPUS:
            if len(self.by_free[NODE_GPUS]) < gpus // NODE_GPUS:
                return None
            chosen = sorted(self.by_free[NODE_GPUS])[: gpus // NODE_GPUS]
            for node in chosen:
                self._set(node, [])
            self.held += gpus
            return [(node, g) for node in chosen for g in range(NODE_GPUS)]
        for count in range(gpus, NODE_GPUS + 1):
            if self.by_free[count]:
                node = min(self.by_free[count])
                free = self.free[node]
                self._set(node, free[gpus:])
                self.held += gpus
                return [(node, g) for g in free[:gpus]]
        return None

    def grow(self, held: list[tuple[int, int]], gpus: int) -> list[tuple[int, int]] | None:
        """``held`` and more GPUs of the same node, up to ``gpus``, where that node has them."""
        node = held[0][0]
        more = gpus - len(held)
        if gpus > NODE_GPUS or any(n != node for n, _ in held) or len(self.free[node]) < more:
            return None
        free = self.free[node]
        self._set(node, free[more:])
        self.held += more
        return sorted(held + [(node, g) for g in free[:more]])

    def give(self, gpus: list[tuple[int, int]]) -> None:
        for node, gpu in gpus:
            self._set(node, sorted([*self.free[node], gpu]))
        self.held -= len(gpus)


# --- jobs -----------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class Job:
    spec: JobSpec
    model: str
    task: dict[str, Any]
    fate: str
    wish: int
    """GPUs it asks for."""
    options: list[int]
    work: float
    """Samples at statistical efficiency 1 left to do."""
    total_work: float
    state: str = "pending"
    gpus: list[tuple[int, int]] = field(default_factory=list)
    template: Template | None = None
    since_s: float = 0.0
    """When its current configuration started to make progress (after a restart)."""
    generation: int = 0
    """Counts its decisions: a finish event of an earlier configuration is stale."""
    override_id: int | None = None
    nan_events: int = 0
    row: JobRow | None = None
    """Kept so the repository finds the job's row in the session instead of reading it."""

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    def progress_at(self, now_s: float) -> float:
        done = self.total_work - self.work
        if self.template is not None and self.state == "running":
            done += self.template.goodput * max(0.0, now_s - self.since_s)
        return min(1.0, max(0.0, done / self.total_work)) if self.total_work > 0 else 0.0


@dataclass(slots=True)
class Counters:
    decisions: int = 0
    resizes: int = 0
    others_before: int = 0
    """Decisions other than resizes before the current span (to pace the resizes)."""
    in_tick: int = 0
    utilization_sum: float = 0.0
    utilization_n: int = 0


class History:
    """The daemon's history, tick by tick, written as it goes."""

    def __init__(
        self,
        session: Session,
        *,
        nodes: list[NodeInfo],
        templates: Templates,
        start: datetime,
        days: float,
        tick_s: float,
        decisions_per_day: int,
        seed: int,
        job_metrics_every: int,
        cluster_metrics_every: int,
    ) -> None:
        self.session = session
        self.templates = templates
        self.start = start
        self.tick_s = tick_s
        self.ticks = max(1, math.floor(days * 86_400 / tick_s))
        self.horizon_s = (self.ticks - 1) * tick_s
        """The last tick, before the history's end."""
        self.decisions_per_day = decisions_per_day
        self.job_metrics_every = job_metrics_every
        self.cluster_metrics_every = cluster_metrics_every
        self.rng = random.Random(seed)
        self.cluster = Cluster(nodes)
        self.ppo = f"ppo-{__version__}"
        self.transition_step = 0
        self.rules = f"rules-{__version__}"
        self.slots: dict[tuple[int, int, int], RankSlot] = {}
        self.jobs: dict[str, Job] = {}
        self.queue: dict[str, Job] = {}
        self.running: dict[str, Job] = {}
        self.events: list[tuple[float, int, str, str, int]] = []
        self.sequence = 0
        self.buffer: list[tuple[Decision, int | None, dict[str, Any] | None]] = []
        self.counters = Counters()
        self.dirty = False
        jobs_per_day = decisions_per_day / DECISIONS_PER_JOB
        self.arrivals = self._arrivals(np.random.default_rng(seed), jobs_per_day)
        self.next_arrival = next(self.arrivals, None)
        # Durations for OFFERED_LOAD: arrivals/s x mean GPUs x mean duration = busy GPUs.
        mean_gpus = sum(
            share * self._mean_wish(name, lo, hi) for name, share, lo, hi in STREAM_MIX
        ) / sum(share for _, share, _, _ in STREAM_MIX)
        mean_s = OFFERED_LOAD * self.cluster.total / (jobs_per_day / 86_400 * mean_gpus)
        self.median_s = mean_s / math.exp(DURATION_SIGMA**2 / 2)
        self.resize_rate = 0.0
        self.next_resize_s = math.inf
        self.episodes = self._episodes(days)

    # -- set-up -----------------------------------------------------------------------

    def _mean_wish(self, model: str, lo: int, hi: int) -> float:
        options = self.templates.options(model, lo, hi) or [lo]
        weights = [GPU_WEIGHTS.get(g, 1.0) for g in options]
        return sum(g * w for g, w in zip(options, weights, strict=True)) / sum(weights)

    def _arrivals(self, rng: np.random.Generator, jobs_per_day: float) -> Iterator[Any]:
        for arrival in job_stream(
            rng, mean_interarrival_s=86_400 / jobs_per_day, initial_jobs=0, max_jobs=None
        ):
            if arrival.spec.submitted_at > self.horizon_s:
                return
            yield arrival

    def _episodes(self, days: float) -> list[tuple[float, float, str]]:
        """Fallback episodes: (start, end, error), about one in four days."""
        count = max(1, round(days / 4))
        episodes = []
        for _ in range(count):
            begin = self.rng.uniform(0.05, 0.95) * self.horizon_s
            length = self.rng.uniform(60, 900)
            episodes.append((begin, begin + length, self.rng.choice(FALLBACK_ERRORS)))
        return sorted(episodes)

    def _fallback(self, now_s: float) -> tuple[str, float] | None:
        """The episode under way at ``now_s``: its error and start, or ``None``."""
        for begin, end, error in self.episodes:
            if begin <= now_s < end:
                return error, begin
        return None

    def _push(self, at_s: float, kind: str, job: Job) -> None:
        self.sequence += 1
        heapq.heappush(self.events, (at_s, self.sequence, kind, job.job_id, job.generation))

    def at(self, seconds: float, after_s: float = 0.0) -> datetime:
        """The time ``seconds`` into the history, plus ``after_s`` within that tick."""
        return self.start + timedelta(seconds=seconds + min(after_s, 0.9 * self.tick_s))

    # -- decisions --------------------------------------------------------------------

    def _placement(self, job: Job) -> Placement:
        slots = []
        for rank, (node, gpu) in enumerate(job.gpus):
            slot = self.slots.get((rank, node, gpu))
            if slot is None:
                slot = self.slots[rank, node, gpu] = RankSlot(
                    rank=rank, node_id=self.cluster.names[node], gpu_index=gpu
                )
            slots.append(slot)
        return Placement(job_id=job.job_id, ranks=tuple(slots))

    def _decide(
        self,
        job: Job,
        template: Template,
        now_s: float,
        *,
        source: DecisionSource = "policy",
        version: str | None = None,
        core: str | None = None,
        override_id: int | None = None,
    ) -> None:
        """Record a decision for ``job`` on its GPUs from ``template``."""
        placement = self._placement(job)
        core = template.core if core is None else core
        features = dict(template.explanation.get("features", {}))
        live = {
            "gpu_utilization": self.cluster.held / self.cluster.total,
            "jobs_pending": float(len(self.queue)),
            "jobs_running": float(len(self.running)),
            "free_gpus": float(self.cluster.total - self.cluster.held),
            "waiting_jobs": float(len(self.queue)),
            "forecast": self.cluster.held / self.cluster.total,
        }
        features.update({k: round(v, 6) for k, v in live.items() if k in features})
        explanation = {**template.explanation, "features": features, "why": core + template.suffix}
        self.counters.in_tick += 1
        decided = self.at(now_s, 0.003 + 0.000_05 * self.counters.in_tick)
        decision = Decision(
            job_id=job.job_id,
            config=template.config,
            placement=placement,
            source=source,
            policy_version=version or self.ppo,
            reason=f"{core}; placed on {placement_summary(placement)}",
            decided_at=decided,
        )
        self.buffer.append((decision, override_id, explanation))
        self.counters.decisions += 1
        # Work done so far at the old speed; then the restart, then the new speed.
        if job.template is not None and job.state == "running":
            job.work -= job.template.goodput * max(0.0, now_s - job.since_s)
            restart = RESTART_S
        else:
            restart = 0.0
        job.template = template
        job.since_s = now_s + restart
        job.generation += 1
        finish = job.since_s + max(0.0, job.work) / template.goodput
        self._push(finish, "finish", job)
        if source == "policy" and self.rng.random() < TRANSITION_SHARE:
            self._transition(job, template, decided)

    def _transition(self, job: Job, template: Template, at: datetime) -> None:
        # A logged round as the daemon's transition log writes it: the observation's
        # header and occupied slots, compressed, and each acted slot's entries.
        slots = min(32, max(1, len(self.queue) + len(self.running)))
        used = HEADER + len(SLOT) * slots
        observation = np.zeros(used, dtype=np.float32)
        observation[:HEADER] = round(self.cluster.held / self.cluster.total, 4)
        observation[HEADER:] = np.round(
            np.array([self.rng.random() for _ in range(used - HEADER)]), 3
        )
        entries = [[self.rng.randrange(n) for n in ACTION_DIMS] for _ in range(slots)]
        self.transition_step += 1
        repo.create_transition(
            session=self.session,
            episode="history-0000",
            step=self.transition_step,
            policy_version=self.ppo,
            epsilon=0.05,
            observation=repo.pack_observation(observation, used),
            slots={
                "jobs": [job.job_id] * slots,
                "running": [True] * slots,
                "entries": entries,
                "mask": [[1] * len(ACTION_DIMS)] * slots,
                "logp": [[-0.05] * len(ACTION_DIMS)] * slots,
                "applied": [True] * slots,
            },
            at=at,
        )

    def _fallback_core(self, template: Template, error: str, began_s: float, now_s: float) -> str:
        # The daemon's wording (autotune.daemon.loop's fallback): failed ticks, the error.
        failed = FALLBACK_AFTER + int((now_s - began_s) / self.tick_s)
        why = f"{failed} consecutive failed ticks ({error}); deciding with rules"
        return f"{why}: {template.core}"

    def _start_queued(self, now_s: float, new: set[str]) -> None:
        """Place the first ``SLOTS`` queued jobs that fit, each on its wish or less."""
        fallback = self._fallback(now_s)
        started: list[Job] = []
        for position, job in enumerate(self.queue.values()):
            if position >= SLOTS or self.cluster.held >= self.cluster.total:
                break
            for gpus in sorted((g for g in job.options if g <= job.wish), reverse=True):
                taken = self.cluster.take(gpus)
                if taken is not None:
                    job.gpus = taken
                    break
            else:
                continue
            key = (job.model, len(job.gpus))
            if fallback is None:
                self._decide(job, self.rng.choice(self.templates.chosen[key]), now_s)
            else:
                template = self.templates.rules[key]
                core = self._fallback_core(template, fallback[0], fallback[1], now_s)
                self._decide(job, template, now_s, source="fallback", version=self.rules, core=core)
            started.append(job)
        for job in started:
            del self.queue[job.job_id]
            self.running[job.job_id] = job
            job.state = "running"
            if job.job_id not in new:  # else its row is written as running (in tick)
                when = self.at(now_s, 0.02)
                self._hold(job)
                repo.set_job_state(
                    session=self.session, job_id=job.job_id, state="running", at=when
                )
                repo.upsert_job(
                    session=self.session,
                    spec=job.spec,
                    state="running",
                    task=job.task,
                    sim_started_s=now_s,
                    at=when,
                )
            if job.fate == "failed":
                self._push(now_s + self.rng.uniform(0.05, 0.95) * self._expected(job), "fail", job)
            if self.rng.random() < OVERRIDE_SHARE and (job.model, len(job.gpus)) in (
                self.templates.override
            ):
                self._push(now_s + self.rng.uniform(0.1, 0.6) * self._expected(job), "pin", job)

    def _expected(self, job: Job) -> float:
        assert job.template is not None
        return job.work / job.template.goodput

    def _hold(self, job: Job) -> None:
        if job.row is None:
            job.row = self.session.get(JobRow, job.job_id)

    def _resize(self, now_s: float) -> None:
        """The learned policy reconfigures a running job: other GPUs, or the same ones."""
        candidates = [j for j in self.running.values() if j.override_id is None]
        if not candidates:
            return
        job = self.rng.choice(candidates)
        gpus = len(job.gpus)
        index = job.options.index(gpus)
        choices = job.options[max(0, index - 1) : index + 2]
        target = self.rng.choice(choices)
        if target < gpus:
            keep, give = job.gpus[:target], job.gpus[target:]
            self.cluster.give(give)
            job.gpus = keep
            self.dirty = True
        elif target > gpus:
            grown = self.cluster.grow(job.gpus, target)
            if grown is None:
                moved = self.cluster.take(target)
                if moved is None:
                    target = gpus  # no room: the same GPUs, another configuration
                else:
                    self.cluster.give(job.gpus)
                    grown = moved
            if grown is not None:
                job.gpus = grown
        template = self.rng.choice(self.templates.reconfigured[job.model, target])
        self.counters.resizes += 1
        self._decide(job, template, now_s)

    # -- events -----------------------------------------------------------------------

    def _arrive(self, arrival: Any, now_s: float, new: set[str]) -> None:
        spec: JobSpec = arrival.spec
        model = str(arrival.task)
        options = self.templates.options(model, spec.min_gpus, spec.max_gpus)
        if not options:
            return
        weights = [GPU_WEIGHTS.get(g, 1.0) for g in options]
        wish = self.rng.choices(options, weights)[0]
        duration = max(10 * self.tick_s, self.median_s * self.rng.lognormvariate(0, DURATION_SIGMA))
        reference = self.templates.rules[model, wish].goodput
        steps = max(1, round(duration * reference / spec.global_batch))
        fate = self.rng.choices([f for f, _ in FATES], [w for _, w in FATES])[0]
        job = Job(
            spec=spec,
            model=model,
            task={"name": model, "steps": steps, "origin": BACKEND},
            fate=fate,
            wish=wish,
            options=options,
            work=float(steps * spec.global_batch),
            total_work=float(steps * spec.global_batch),
        )
        self.jobs[job.job_id] = job
        self.queue[job.job_id] = job
        new.add(job.job_id)
        self.dirty = True
        if fate == "cancelled":
            self._push(spec.submitted_at + self.rng.expovariate(1 / duration), "cancel", job)

    def _end(self, job: Job, state: str, reason: str, now_s: float) -> None:
        """The job reaches a final state."""
        progress = 1.0 if state == "finished" else round(job.progress_at(now_s), 4)
        if job.state == "running":
            self.cluster.give(job.gpus)
            del self.running[job.job_id]
        else:
            del self.queue[job.job_id]
        self.dirty = True
        job.state = state
        job.gpus = []
        repo.upsert_job(
            session=self.session,
            spec=job.spec,
            state=state,  # type: ignore[arg-type]
            reason=reason,
            progress=progress,
            task=job.task,
            sim_submitted_s=job.spec.submitted_at,
            sim_finished_s=now_s,
            at=self.at(now_s, 0.01),
        )
        job.row = None
        del self.jobs[job.job_id]

    def _pin(self, job: Job, now_s: float) -> None:
        """A user pins part of the running job's configuration; the daemon applies it."""
        index, template = self.rng.choice(self.templates.override[job.model, len(job.gpus)])
        pin, reason = PINS[index]
        created = self.at(now_s - self.rng.uniform(0, self.tick_s))
        lasts = self.rng.uniform(1_800, 12 * 3_600)
        record = repo.create_override(
            session=self.session,
            job_id=job.job_id,
            pin=pin,
            reason=reason,
            expires_at=created + timedelta(seconds=lasts),
            at=created,
        )
        ends = now_s + lasts
        if self.rng.random() < OVERRIDE_DELETED:
            ends = now_s + self.rng.uniform(0.1, 0.7) * lasts
            self._push(ends, "unpin", job)
        job.override_id = record.override_id
        self._push(ends + self.tick_s, "released", job)
        fallback = self._fallback(now_s)
        core = _with_override(template.core, record.override_id)
        version = self.rules if fallback is not None else self.ppo
        self._decide(
            job,
            template,
            now_s,
            source="override",
            version=version,
            core=core,
            override_id=record.override_id,
        )

    def _unpin(self, job: Job, now_s: float) -> None:
        if job.override_id is not None:
            repo.delete_override(
                session=self.session,
                override_id=job.override_id,
                at=self.at(now_s - self.rng.uniform(0, self.tick_s)),
            )

    def _released(self, job: Job, now_s: float) -> None:
        """The job's override ended: the policy decides for it again."""
        if job.override_id is None:
            return
        ended, job.override_id = job.override_id, None
        fallback = self._fallback(now_s)
        key = (job.model, len(job.gpus))
        if fallback is None:
            template = self.rng.choice(self.templates.released[key])
            core = _with_override(template.core, ended)
            self._decide(job, template, now_s, core=core)
        else:
            template = self.templates.rules[key]
            # decide()'s wording for a released job, with the fallback's reason.
            choice = self._fallback_core(template, fallback[0], fallback[1], now_s)
            core = f"override {ended} ended; the policy decides again: {choice}"
            self._decide(job, template, now_s, source="fallback", version=self.rules, core=core)

    def _event(self, kind: str, job: Job, generation: int, now_s: float) -> None:
        if job.state not in ("pending", "running"):
            return
        if kind == "finish" and job.state == "running" and generation == job.generation:
            self._end(job, "finished", "", now_s)  # done before it failed or was cancelled
        elif kind == "fail" and job.state == "running":
            self._end(job, "failed", self.rng.choice(FAIL_REASONS), now_s)
        elif kind == "cancel":
            self._end(job, "cancelled", CANCELLED, now_s)
        elif kind == "pin" and job.state == "running" and job.override_id is None:
            self._pin(job, now_s)
        elif kind == "unpin":
            self._unpin(job, now_s)
        elif kind == "released" and job.state == "running":
            self._released(job, now_s)

    # -- the ticks --------------------------------------------------------------------

    def tick(self, k: int) -> None:
        now_s = k * self.tick_s
        self.counters.in_tick = 0
        new: set[str] = set()
        while self.next_arrival is not None and self.next_arrival.spec.submitted_at <= now_s:
            self._arrive(self.next_arrival, now_s, new)
            self.next_arrival = next(self.arrivals, None)
        while self.events and self.events[0][0] <= now_s:
            _, _, kind, job_id, generation = heapq.heappop(self.events)
            job = self.jobs.get(job_id)
            if job is not None:
                self._event(kind, job, generation, now_s)
        if self.dirty and self.queue:
            self._start_queued(now_s, new)
        self.dirty = False
        while self.next_resize_s <= now_s:
            # In a fallback episode the rules decide: they keep running jobs' configurations.
            if self._fallback(now_s) is None:
                self._resize(now_s)
            self.next_resize_s += self.rng.expovariate(self.resize_rate)
        # The new jobs' rows, as pending or (placed in this tick) running; not flushed
        # one by one when upsert_job looks each up: together, with the next statement.
        with self.session.no_autoflush if new else nullcontext():
            for job_id in new:
                job = self.jobs.get(job_id)
                if job is None:
                    continue  # cancelled on arrival: its row is written
                running = job.state == "running"
                repo.upsert_job(
                    session=self.session,
                    spec=job.spec,
                    state="running" if running else "pending",
                    task=job.task,
                    sim_submitted_s=job.spec.submitted_at,
                    sim_started_s=now_s if running else None,
                    at=self.at(now_s),
                )
        if k == self.ticks - 1:  # the last tick: what is still active is cancelled
            for job in [*self.running.values(), *self.queue.values()]:
                self._end(job, "cancelled", CANCELLED, now_s)
        self._metrics(k, now_s)

    def pace(self, now_s: float, span_s: float) -> None:
        """Set the resize rate for the next ``span_s`` so that the decisions meet
        ``decisions_per_day`` at its end, with as many other decisions (starts,
        overrides) as in the span before."""
        counters = self.counters
        others = counters.decisions - counters.resizes
        expected, counters.others_before = others - counters.others_before, others
        target = self.decisions_per_day * (now_s + span_s) / 86_400
        missing = target - counters.decisions - expected
        self.resize_rate = max(missing, 0.0) / span_s
        self.next_resize_s = (
            now_s + self.rng.expovariate(self.resize_rate) if self.resize_rate > 0 else math.inf
        )

    def _metrics(self, k: int, now_s: float) -> None:
        cluster = k % self.cluster_metrics_every == 0
        jobs = k % self.job_metrics_every == 0
        if not (cluster or jobs):
            return
        utilization = self.cluster.held / self.cluster.total
        self.counters.utilization_sum += utilization
        self.counters.utilization_n += 1
        active = len(self.running) + len(self.queue)
        duration = (0.004 + 0.0002 * active) * self.rng.lognormvariate(0, 0.3)
        values: list[tuple[str, float, str | None]] = [
            ("tick_duration_s", round(duration, 6), None),
            ("jobs_running", float(len(self.running)), None),
            ("jobs_pending", float(len(self.queue)), None),
            ("gpu_utilization", utilization, None),
        ]
        if jobs:
            for job in self.running.values():
                template = job.template
                assert template is not None
                up = now_s >= job.since_s
                noise = self.rng.uniform(0.95, 1.05)
                if self.rng.random() < 0.002:
                    job.nan_events += 1
                values += [
                    ("job_goodput", template.goodput * noise if up else 0.0, job.job_id),
                    ("job_nan_events", float(job.nan_events), job.job_id),
                    ("job_power_watts", template.power_watts * noise, job.job_id),
                    ("job_step_time_s", template.step_s / noise, job.job_id),
                ]
        repo.record_metrics(
            session=self.session,
            values=values,
            labels={"backend": BACKEND},
            at=self.at(now_s, duration),
        )

    def flush(self) -> None:
        """Store the buffered decisions (one statement), mark them applied, commit."""
        self.session.flush()  # job and override rows before the decisions that name them
        stored = repo.create_decisions(session=self.session, decisions=self.buffer)
        ids = [d.decision_id for d in stored if d.decision_id is not None]
        if ids:
            # A fix-up, not a repository call: the daemon marks each decision applied
            # right after applying it (repo.mark_decision_applied loads each row: a
            # million reads here); one UPDATE gives them their decision's time.
            self.session.execute(
                update(DecisionRow)
                .where(DecisionRow.id.between(min(ids), max(ids)))
                .values(applied_at=DecisionRow.decided_at)
            )
        self.buffer = []
        self.session.commit()


# --- the build ------------------------------------------------------------------------


def _count(session: Session, table: Any) -> int:
    return int(session.scalar(select(func.count()).select_from(table)) or 0)


def build_history(
    url: str,
    *,
    days: float,
    cluster_gpus: int,
    tick_s: float,
    decisions_per_day: int,
    seed: int,
    end: datetime | None,
    progress: bool,
    job_metrics_every: int = DEFAULT_JOB_METRICS_EVERY,
    cluster_metrics_every: int = DEFAULT_CLUSTER_METRICS_EVERY,
    retention: RetentionPolicy | None = None,
    retention_every_s: float = 6 * 3600.0,
) -> dict[str, Any]:
    """Fill the database at ``url`` (migrated first; it must hold no job yet) with the
    history of ``days`` ending at ``end`` (default now); returns the summary.

    ``retention``: applied as the daemon's leader does, every ``retention_every_s`` of
    the history's time (at that time), so the database ends as a daemon that ran those
    days leaves it; the summary then has the database's size at the end of every day."""
    if days <= 0 or tick_s <= 0 or decisions_per_day <= 0:
        raise ValueError("days, tick_s and decisions_per_day must be > 0")
    if job_metrics_every < 1 or cluster_metrics_every < 1:
        raise ValueError("--job-metrics-every and --cluster-metrics-every: at least 1")
    began = time.perf_counter()
    if end is None:
        end = datetime.now(UTC).replace(microsecond=0)
    elif end.tzinfo is None:
        end = end.replace(tzinfo=UTC)
    end = end.astimezone(UTC)
    start = end - timedelta(days=days)
    nodes = cluster_nodes(cluster_gpus)
    templates = build_templates(random.Random(seed))
    db = Database(url)
    db.upgrade()
    try:
        with Session(db.engine, expire_on_commit=False) as session:
            if _count(session, JobRow):
                raise ValueError(f"{url}: the database already holds jobs; give a new one")
            history = History(
                session,
                nodes=nodes,
                templates=templates,
                start=start,
                days=days,
                tick_s=tick_s,
                decisions_per_day=decisions_per_day,
                seed=seed,
                job_metrics_every=job_metrics_every,
                cluster_metrics_every=cluster_metrics_every,
            )

            # Keep job rows alive while the job is: the repository's session.get then
            # finds them in the session instead of reading them back.
            @event.listens_for(session, "pending_to_persistent")
            def _keep(_session: Session, instance: object) -> None:
                if isinstance(instance, JobRow):
                    job = history.jobs.get(instance.job_id)
                    if job is not None:
                        job.row = instance

            # As the daemon's start: its fallback's version, then its own, active.
            repo.upsert_nodes(session=session, nodes=nodes, at=start)
            repo.register_policy_version(
                session=session, version=history.rules, kind="rules", at=start
            )
            repo.register_policy_version(
                session=session, version=history.ppo, kind="ppo", activate=True, at=start
            )
            session.commit()
            span = max(1, round(3_600 / tick_s))  # ticks of one transaction, about an hour
            retained = _Retained(db, retention, start, retention_every_s)
            with progress_bar("[bold]history[/] ticks", enabled=progress) as bar:
                task = bar.add_task("ticks", total=history.ticks)
                for k in range(history.ticks):
                    if k % span == 0:
                        history.pace(k * tick_s, span * tick_s)
                    history.tick(k)
                    if k % span == span - 1 or len(history.buffer) >= 5_000:
                        history.flush()
                        bar.update(task, completed=k + 1)
                        if k % span == span - 1:
                            retained.at(start + timedelta(seconds=(k + 1) * tick_s))
                history.flush()
                retained.at(end, last=True)
                bar.update(task, completed=history.ticks)
            summary = _summary(session, history)
            if retention is not None:
                summary["retention"] = retained.summary()
    finally:
        db.dispose()  # SQLite: the last connection folds the WAL into the file
    path = sqlite_file(url)
    size = None
    if path is not None:
        size = sum(
            p.stat().st_size for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")) if p.exists()
        )
    seconds = time.perf_counter() - began
    rows = summary["rows"]
    return {
        "url": make_url(url).render_as_string(hide_password=True),
        "days": days,
        "cluster_gpus": cluster_gpus,
        "nodes": len(nodes),
        "tick_s": tick_s,
        "ticks": history.ticks,
        "decisions_per_day": decisions_per_day,
        "job_metrics_every": job_metrics_every,
        "cluster_metrics_every": cluster_metrics_every,
        "seed": seed,
        "start": start.isoformat(),
        "end": end.isoformat(),
        **summary,
        "file_bytes": size,
        "seconds": round(seconds, 1),
        "rows_per_s": round(sum(rows.values()) / seconds),
    }


class _Retained:
    """Retention applied during a build (``build_history(retention=...)``), and the
    database's size at the end of each day."""

    def __init__(
        self, db: Database, policy: RetentionPolicy | None, start: datetime, every_s: float
    ) -> None:
        self.db, self.policy, self.start, self.every_s = db, policy, start, every_s
        self.next_at = start + timedelta(seconds=every_s)
        self.next_day = 1
        self.sizes: list[int] = []
        self.report = RetentionReport()
        self.seconds = 0.0

    def at(self, now: datetime, *, last: bool = False) -> None:
        if self.policy is None:
            return
        if now >= self.next_at or last:
            began = time.perf_counter()
            self.report = self.report + run_retention(self.db, self.policy, now)
            self.seconds += time.perf_counter() - began
            self.next_at = now + timedelta(seconds=self.every_s)
        if now >= self.start + timedelta(days=self.next_day) or last:
            self.sizes.append(database_bytes(self.db))
            self.next_day += 1

    def summary(self) -> dict[str, Any]:
        return {
            "every_s": self.every_s,
            "policy": asdict(self.policy) if self.policy else None,
            "deleted": self.report.deleted,
            "metrics_downsampled": self.report.metrics_downsampled,
            "seconds": round(self.seconds, 1),
            "bytes_by_day": self.sizes,
        }


def database_bytes(db: Database) -> int:
    """The database's size on disk: SQLite's file with its WAL, or PostgreSQL's
    ``pg_database_size``."""
    path = sqlite_file(db.url)
    if path is None:
        with db.engine.connect() as connection:
            return int(
                connection.exec_driver_sql(
                    "SELECT pg_database_size(current_database())"
                ).scalar_one()
            )
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


def _summary(session: Session, history: History) -> dict[str, Any]:
    tables = {
        "jobs": JobRow,
        "decisions": DecisionRow,
        "metrics": MetricRow,
        "overrides": OverrideRow,
        "transitions": TransitionRow,
        "nodes": NodeRow,
        "policy_versions": PolicyVersionRow,
    }
    rows = {name: _count(session, table) for name, table in tables.items()}
    by_source = dict(
        session.execute(select(DecisionRow.source, func.count()).group_by(DecisionRow.source)).all()
    )
    counters = history.counters
    return {
        "rows": rows,
        "decisions_by_source": {str(k): int(v) for k, v in sorted(by_source.items())},
        "jobs_by_state": repo.job_counts(session=session),
        "mean_gpu_utilization": round(counters.utilization_sum / max(1, counters.utilization_n), 3),
    }


def _default_retention() -> RetentionPolicy:
    """The retention the daemon applies at its default settings."""
    from autotune.daemon.settings import Settings

    return Settings.model_construct().retention()


def _when(text: str) -> datetime:
    when = datetime.fromisoformat(text)
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Builds a new database: an existing --out file is refused unless --overwrite.",
    )
    parser.add_argument(
        "--db", help="SQLAlchemy URL of the database (default: the SQLite file --out)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=OUT / "history.db",
        help="SQLite file to build when --db is not given (default: %(default)s)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    parser.add_argument(
        "--days", type=float, default=DEFAULT_DAYS, help="history length (default: %(default)s)"
    )
    parser.add_argument(
        "--cluster-gpus",
        type=int,
        default=DEFAULT_GPUS,
        help="GPUs of the cluster, in 8-GPU A100 nodes (default: %(default)s)",
    )
    parser.add_argument(
        "--tick-s",
        type=float,
        default=DEFAULT_TICK_S,
        help="the daemon's tick period, seconds (default: %(default)s)",
    )
    parser.add_argument(
        "--decisions-per-day",
        type=int,
        default=DEFAULT_DECISIONS_PER_DAY,
        help="decisions the daemon takes per day (default: %(default)s)",
    )
    parser.add_argument(
        "--job-metrics-every",
        type=int,
        default=DEFAULT_JOB_METRICS_EVERY,
        help="ticks between two samples of every running job's metrics (default: "
        "%(default)s; the daemon records them every tick)",
    )
    parser.add_argument(
        "--cluster-metrics-every",
        type=int,
        default=DEFAULT_CLUSTER_METRICS_EVERY,
        help="ticks between two samples of the cluster's four metrics (default: "
        "%(default)s; 1: every tick, as the daemon)",
    )
    parser.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    parser.add_argument(
        "--end",
        type=_when,
        default=None,
        help="ISO time the history ends (default: now, UTC; a time without zone is UTC)",
    )
    parser.add_argument(
        "--json-out",
        type=Path,
        default=OUT / "history.json",
        help="where the summary is written (default: %(default)s)",
    )
    parser.add_argument(
        "--retention",
        action="store_true",
        help="apply the daemon's default retention settings as the history is built (every "
        "6 hours of its time), as the daemon's leader would: the summary then gives the "
        "database's size at the end of each day",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    url = args.db
    if url is None:
        out: Path = args.out
        if out.exists():
            if not args.overwrite:
                parser.error(f"{out} exists: remove it, give another --out, or --overwrite")
            for suffix in ("", "-wal", "-shm"):
                Path(f"{out}{suffix}").unlink(missing_ok=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        url = sqlite_url(out)
    summary = build_history(
        url,
        days=args.days,
        cluster_gpus=args.cluster_gpus,
        tick_s=args.tick_s,
        decisions_per_day=args.decisions_per_day,
        seed=args.seed,
        end=args.end,
        progress=not args.no_progress and sys.stderr.isatty(),
        job_metrics_every=args.job_metrics_every,
        cluster_metrics_every=args.cluster_metrics_every,
        retention=_default_retention() if args.retention else None,
    )
    text = json.dumps(summary, indent=2)
    print(text)
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(text + "\n")


if __name__ == "__main__":
    main()
