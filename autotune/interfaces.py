"""The small interfaces the daemon is assembled from at start-up.

A ``Backend`` is the cluster: it reports state and applies decisions (the simulated
cluster in ``autotune.envs``; Ray actors in ``autotune.executor``). What a backend offers
beyond that, it says by the protocols it implements, each checked with ``isinstance``:

- ``JobControl``: it takes jobs users submit, cancels them and resumes them after a
  restart;
- ``SimulatedTime``: its time passes only when told, one decision round at a time, and
  it reports each round's outcome (the simulated cluster);
- ``Provisionable``: it can park idle nodes and wake them (the simulated cluster);
- ``Replayable``: it can say what a job is beyond its spec, so that replay can simulate
  the job again (the simulated cluster).

A ``Policy`` chooses each job's configuration (``autotune.policies``) and answers with a
``PolicyRound``. The daemon knows only these (and the demand forecast's
``autotune.demand.DemandForecaster``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from autotune.core import (
    ACTIVE_STATES,
    MILLI_PER_GPU,
    Decision,
    DecisionSource,
    JobConfig,
    JobSpec,
    JobState,
    ModelProfile,
    NodeInfo,
    Placement,
    TenantSpec,
    node_table,
)

if TYPE_CHECKING:
    from autotune.rl.acting import ActedStep
    from autotune.rl.reward import RoundOutcome

__all__ = [
    "EVENTS_KEPT",
    "Backend",
    "ClusterSnapshot",
    "ConfigChange",
    "Fenceable",
    "JobControl",
    "JobEvents",
    "JobMetrics",
    "JobState",
    "JobStatus",
    "JobSubmission",
    "Policy",
    "PolicyChoice",
    "PolicyRound",
    "Provisionable",
    "ReplayInfo",
    "Replayable",
    "SimulatedTime",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class JobMetrics:
    """What a backend measured of a job, as of its last step; ``None`` where it did not
    measure it. The Ray backend trains the job for real and measures the step; the
    simulated cluster reports what its model predicts (``step_time_s`` with measurement
    noise, ``power_watts``, ``nan_events``) and the ``goodput`` it charges. The daemon
    stores each figure that is set as the metric sample ``job_<name>`` (``measured``)."""

    loss: float | None = None
    """Training loss of the last step (the mean of the data-parallel replicas')."""
    step_time_s: float | None = None
    """Seconds of the last step: the slowest rank's, as the ranks timed it."""
    samples_per_s: float | None = None
    """Samples per second of the last step, over its wall time as the job sees it (the
    slowest rank plus the round trip to the ranks)."""
    tokens_per_s: float | None = None
    """``samples_per_s`` times the task's tokens per sample, where the task has a
    sequence length."""
    bytes_sent: int | None = None
    """Bytes of gradients the ranks sent in the last step, as compressed, all ranks
    together."""
    bytes_dense: int | None = None
    """Bytes the same reductions send uncompressed (fp32): ``bytes_sent / bytes_dense``
    is the compression ratio achieved."""
    nan_events: int | None = None
    """Non-finite values that made the job fall back to a safer precision: on the Ray
    backend those of the last step; in the simulated cluster the job's count so far."""
    peak_memory_bytes: int | None = None
    """The largest peak memory of any rank so far, in bytes (allocated GPU memory on
    GPUs, resident set size on CPUs)."""
    power_watts: float | None = None
    """Power drawn by the job's GPUs, in watts: the sum over its ranks of NVML's reading
    after the last step (Ray), or the modelled draw (simulated cluster)."""
    steps_redone: int | None = None
    """Steps trained again after the job's ranks restarted from a checkpoint (a rank
    died, hung, or its node was lost), since the job was submitted."""
    goodput: float | None = None
    """The simulated cluster's own goodput of the job, in samples per second times
    statistical efficiency; the daemon stores its own computation instead."""
    oom: bool | None = None
    """``True``: the job's ranks did not fit their GPUs' memory and it failed at start
    (the simulated cluster's verdict)."""
    sync_time_s: float | None = None
    """Seconds of the last step spent synchronising gradients that computation did not
    hide (``autotune.executor.reports.RankStep.sync_time_s``, the least of the ranks'),
    where a backend measures them apart (the Ray backend for data-parallel jobs; the daemon's
    online fit otherwise uses the step time alone)."""
    noise_scale: float | None = None
    """The job's gradient noise scale in samples (McCandlish et al.; Pollux's online
    estimate from the replicas' and the averaged gradients' norms, smoothed over its
    steps; ``autotune.executor.quality``): the batch beyond which a larger batch stops
    paying off. Data-parallel jobs only."""
    grad_norm: float | None = None
    """Norm of the gradient the optimizer applied in the last step (after reduction)."""
    compression_cosine: float | None = None
    """Cosine between the compressed and the dense averaged gradient on the latest step
    that compared them (a compressed data-parallel job)."""
    compression_error: float | None = None
    """|compressed - dense| / |dense| of the averaged gradients, on the same step."""
    residual_norm: float | None = None
    """Norm of the error-feedback residual (top-k, PowerSGD) on the same step, RMS over
    the replicas."""
    loss_scale: float | None = None
    """fp16's dynamic loss scale after the last step; ``None`` without fp16."""

    def measured(self) -> Iterator[tuple[str, float]]:
        """``(name, value)`` of every figure that is set, by name, as floats."""
        for name in sorted(f.name for f in fields(self)):
            value = getattr(self, name)
            if value is not None:
                yield name, float(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigChange:
    """A running job's last reconfiguration and what it measured before and after, as
    the backend saw it: the decision step changes the job again only after this one
    showed a gain (``autotune.decision.step``)."""

    previous: JobConfig
    """The configuration the job ran before the change."""
    at_s: float
    """When the change was applied, on the backend's clock."""
    samples_per_s_before: float | None
    """The job's throughput before the change (the median of its last steps), where
    measured."""
    samples_per_s_after: float | None = None
    """Its throughput since (the median of its steps after the first under the new
    configuration), once enough steps ran to tell (``None`` until then)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobStatus:
    spec: JobSpec
    state: JobState
    config: JobConfig | None = None
    placement: Placement | None = None
    progress: float = 0.0
    """Fraction of the job's work done, 0 to 1."""
    samples_per_s: float = 0.0
    task: str | None = None
    """What the job trains (a built-in task name, ``module:Name``), when known."""
    steps: int | None = None
    """Optimizer steps the job trains for, when known."""
    started_s: float | None = None
    """When the job first ran, on the backend's clock (``time_s``); ``None``: not yet."""
    finished_s: float | None = None
    """When the job reached a final state, on the backend's clock; ``None``: not yet."""
    metrics: JobMetrics = field(default_factory=JobMetrics)
    """What the backend measured of the job, as of its last step (``JobMetrics``)."""
    interrupted: str | None = None
    """Why a job that ran waits to be placed again (``node gpu-3 lost``), until it is;
    the decision that places it starts its reason with this."""
    last_change: ConfigChange | None = None
    """The job's last reconfiguration while it ran, where the backend tracks them."""

    @property
    def profile(self) -> ModelProfile | None:
        """The job's model profile as measured on the job: the catalog's, with the
        gradient noise scale the backend measured (``JobMetrics.noise_scale``) in its
        place once there is one, so that its statistical efficiency at each batch size is
        its own (``autotune.perf.model.batch_efficiency``). ``None`` without a profile."""
        model = self.spec.model
        return None if model is None else model.with_noise_scale(self.metrics.noise_scale)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSubmission:
    """A job as a user submits it: the spec, what it trains and for how long."""

    spec: JobSpec
    task: str
    """A built-in task name or an allow-listed ``package.module:Name``."""
    steps: int
    """Optimizer steps to train."""

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"JobSubmission.steps={self.steps!r}: must be an integer >= 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSnapshot:
    time_s: float
    """The backend's clock, in seconds."""
    nodes: Sequence[NodeInfo]
    jobs: Sequence[JobStatus]
    telemetry: str
    """Where the figures come from: ``simulator``, ``nvml``, ``psutil``, ``ray``."""
    gpu_utilization: float = 0.0
    """Allocated share of the cluster's GPU capacity, 0 to 1."""
    lost_nodes: Sequence[NodeInfo] = ()
    """Nodes that were part of the cluster and are gone (as last seen); ``nodes`` holds
    the ones jobs can use."""
    parked_nodes: Sequence[NodeInfo] = ()
    """Idle nodes powered down by provisioning (``autotune.provisioning``); jobs cannot
    use them until they are woken."""
    waking_nodes: Sequence[NodeInfo] = ()
    """Parked nodes woken and not usable yet."""
    restart_s: float | None = None
    """Seconds a reconfiguration of a running job costs on this backend (state saved,
    ranks torn down, started and restored), as measured: the median of its recent
    reconfigurations, or of its jobs' first starts until one is measured. ``None``: the
    backend does not measure it (the simulated cluster charges its own ``restart_s``),
    and the decision step does not weigh a change against it."""
    tenants: Mapping[str, TenantSpec] = field(default_factory=dict)
    """The tenants sharing the cluster, by name, with their quotas (the decision step
    enforces them: ``autotune.decision.quotas``); empty: no quotas."""
    mixes_models: bool = False
    """Whether the backend runs one data-parallel job across GPU models with batch
    shares by speed, so that the Planner may place one there where that pays
    (``autotune.planner.plan``'s ``mix_models``)."""
    packs_jobs: bool = False
    """Whether the Planner places every job that may span nodes on the nodes with the
    most free GPUs first (``autotune.planner.plan``'s ``pack``), as Pollux's and Sia's
    simulators do; ``False``: in equal blocks, where its cost model says."""

    def by_state(self, *states: JobState) -> list[JobStatus]:
        return [j for j in self.jobs if j.state in states]

    def queue_order(self) -> list[JobStatus]:
        """Active jobs as the Planner takes them, and as a learned policy's slots are
        filled: higher priority first, then earlier submission, then id."""
        return sorted(
            self.by_state(*ACTIVE_STATES),
            key=lambda j: (-j.spec.priority, j.spec.submitted_at, j.spec.job_id),
        )

    def capacity_gpus(self) -> float:
        """GPUs of the cluster, parked and waking nodes included."""
        out = (*self.parked_nodes, *self.waking_nodes)
        return float(node_table(self.nodes).total_gpus + sum(n.gpu_count for n in out))

    def demand_gpus(self) -> float:
        """GPU demand: the GPUs running jobs hold plus the GPUs pending jobs ask for
        (``JobSpec.gpu_request``)."""
        held = sum(self.held_gpus().values())
        pending = sum(j.spec.gpu_request() for j in self.by_state("pending"))
        return float(held + pending)

    def tenant_gpus(self) -> dict[str, float]:
        """GPUs the running jobs hold per tenant, in whole-GPU equivalents."""
        held: dict[str, float] = {}
        for job in self.by_state("running"):
            if job.placement is not None:
                held[job.spec.tenant] = held.get(job.spec.tenant, 0.0) + job.placement.gpus
        return held

    def held_gpus(self) -> dict[str, float]:
        """GPUs the running jobs hold per node, in whole-GPU equivalents."""
        held: dict[str, float] = {}
        for job in self.by_state("running"):
            if job.placement is not None:
                for slot in job.placement.ranks:
                    held[slot.node_id] = (
                        held.get(slot.node_id, 0.0) + slot.gpu_milli / MILLI_PER_GPU
                    )
        return held


@runtime_checkable
class Backend(Protocol):
    name: str

    def observe(self) -> ClusterSnapshot:
        """The cluster now. Observing changes nothing: on a backend with
        ``SimulatedTime``, time passes only in ``run_round``."""
        ...

    def apply(self, decisions: Sequence[Decision]) -> None:
        """Start, reconfigure or preempt jobs as decided. A preemption (``preempt``)
        stops a running job after a checkpoint and leaves it pending with its progress;
        other decisions without a placement are ignored."""
        ...

    def close(self, timeout_s: float | None = None) -> None:
        """Release the backend. One that trains jobs checkpoints the running ones first,
        within ``timeout_s`` seconds where given (what is not saved by then is not)."""
        ...


@runtime_checkable
class JobControl(Protocol):
    """What a backend offers beyond ``Backend`` to run jobs that users submit through
    the API: take a job, cancel one, and resume the jobs of the database after the
    daemon restarts."""

    def submit(self, job: JobSubmission) -> None:
        """Queue a new job; it shows as pending in the next ``observe()``."""
        ...

    def cancel(self, job_id: str) -> None:
        """Stop the job and free its GPUs; it shows as cancelled from then on."""
        ...

    def restore(
        self, jobs: Sequence[tuple[JobSubmission, JobStatus]], *, taken_ids: Collection[str]
    ) -> None:
        """Before the first ``observe()``: resume ``jobs`` as they were (state,
        progress, config and placement), and never create a job whose id is in
        ``taken_ids`` (the database already holds it)."""
        ...


EVENTS_KEPT = 10_000
"""Job events a backend keeps until they are taken, and the daemon until they are
stored; the oldest are dropped beyond it."""


@runtime_checkable
class JobEvents(Protocol):
    """A backend that reports what happens to its jobs while they train (a node lost, a
    resume from a checkpoint, precision raised by the gradient-norm guard, batch shares
    moved): the daemon's tick takes them and stores them (``GET /jobs/{id}/events``)."""

    def take_events(self) -> list[tuple[str, dict[str, Any]]]:
        """The ``(job_id, event)`` pairs reported since the previous call, oldest first,
        each event a dict with ``kind``, ``at`` (Unix time) and its own fields; a pair is
        given once."""
        ...


@runtime_checkable
class Fenceable(Protocol):
    """A backend whose jobs outlive the daemon's leadership (Ray actors keep training
    when their daemon loses the database): it fences the jobs it starts by the leader
    term it is told, so that a newer leader's start of a job stops this one's ranks
    first (``autotune.executor.fencing``)."""

    def lead(self, term: int | None) -> None:
        """Start jobs as the leader of ``term`` from now on (``None``: unfenced)."""
        ...


@runtime_checkable
class SimulatedTime(Protocol):
    """A backend whose time passes only when told: the daemon runs one round of it at the
    start of every tick, before it observes."""

    def run_round(self) -> RoundOutcome | None:
        """Let one decision round of simulated time pass, and say what the cluster did in
        it (``None`` for the first call, which starts the cluster: the jobs present at
        the start arrive)."""
        ...


@runtime_checkable
class Provisionable(Protocol):
    """A backend that can power idle nodes down and up (``autotune.provisioning``)."""

    def park(self, node_ids: Iterable[str]) -> None:
        """Power down idle nodes; ``ValueError`` if a job holds a GPU on one."""
        ...

    def wake(self, node_ids: Iterable[str]) -> None:
        """Power parked nodes up; each becomes usable after its boot time."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayInfo:
    """What replaying a job in another simulation needs beyond its spec."""

    work: float
    """Samples at statistical efficiency 1 to finish."""
    reference_gpus: int
    """GPUs of its reference configuration (data parallel, fp32, its batch)."""
    coeffs_app: str | None
    """The application whose calibrated coefficients it runs with
    (``autotune.catalog.applications``); ``None``: the literature defaults."""


@runtime_checkable
class Replayable(Protocol):
    """A backend that can say what each of its jobs is, so that replay can simulate it
    again (stored once with the job)."""

    def replay_info(self, job_id: str) -> ReplayInfo: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyChoice:
    config: JobConfig | None
    """``None``: the job waits this round (a pending job is not placed; a running one
    keeps its configuration); ``reason`` says why."""
    reason: str
    """Why, in words a user reads in the decision log."""
    features: Mapping[str, float] = field(default_factory=dict)
    """The inputs that mattered, by name."""
    source: DecisionSource = "policy"
    """``fallback`` when a policy could not decide and another one did (see the reason)."""
    preempt: bool = False
    """With ``config=None``, for a running job: stop it (after a checkpoint) so that its
    GPUs go to others this round; it waits again with its progress. Ignored for a job
    that is not running or has an active override."""
    gpu_models: tuple[str, ...] | None = None
    """With a configuration: the GPU models the job may be placed on this round, a
    waiting job the round starts or a running one it reconfigures (within those its
    spec allows; a running job on one of them stays where it is); ``None``: any it
    allows. A policy that picks the device type itself (a heterogeneity-aware one) says
    so here; the Planner still chooses the nodes."""
    gpu_split: tuple[tuple[str, int], ...] | None = None
    """With a data-parallel configuration, on a backend that runs one job across GPU
    models (``ClusterSnapshot.mixes_models``): ``(GPU model, ranks)`` per model, the
    job's ranks split across them as given (two models or more; the ranks add up to the
    configuration's; ``gpu_models`` names the same models, and is set to them where not
    given). The Planner takes that many
    free GPUs of each, the nodes with the most free first; a running job keeps its
    placement only where it holds that split. ``None``: the Planner's choice."""

    def __post_init__(self) -> None:
        if self.preempt and self.config is not None:
            raise ValueError("PolicyChoice: a preemption has no configuration")
        if self.gpu_models is not None and not self.gpu_models:
            raise ValueError("PolicyChoice: gpu_models=() allows no GPU model (None: any)")
        if self.gpu_split is not None:
            models = [m for m, _ in self.gpu_split]
            if self.config is None:
                raise ValueError("PolicyChoice: a gpu_split needs a configuration")
            layout = self.config.layout
            if layout.dp != layout.world_size:
                raise ValueError("PolicyChoice: a gpu_split is for a data-parallel layout")
            if len(set(models)) != len(models) or len(models) < 2:
                raise ValueError(
                    f"PolicyChoice: gpu_split {self.gpu_split}: two GPU models or more, each once"
                )
            if min(n for _, n in self.gpu_split) < 1:
                raise ValueError(f"PolicyChoice: gpu_split {self.gpu_split}: ranks must be >= 1")
            if sum(n for _, n in self.gpu_split) != layout.world_size:
                raise ValueError(
                    f"PolicyChoice: gpu_split {self.gpu_split} does not add up to the "
                    f"configuration's {layout.world_size} ranks"
                )
            if self.gpu_models is None:
                object.__setattr__(self, "gpu_models", tuple(models))
            elif set(self.gpu_models) != set(models):
                raise ValueError(
                    f"PolicyChoice: gpu_models {self.gpu_models} are not the gpu_split's"
                )


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyRound:
    """A policy's answer for one round: what it chose, and what it observed and did."""

    choices: Mapping[str, PolicyChoice]
    """A choice for every job to (re)configure; running jobs left out keep their
    configuration, pending jobs left out are planned as plain data parallelism over their
    ``min_gpus`` (a ``PolicyChoice`` with ``config=None`` keeps a job waiting)."""
    acted: ActedStep | None = None
    """What a learned policy saw (its encoded observation) and did (the action entries of
    each slot, with their log-probabilities), for the transition log; ``None`` for a
    policy that does not act through the reinforcement-learning contract, or a round in
    which it fell back for every job."""


@runtime_checkable
class Policy(Protocol):
    name: str
    version: str

    def decide(self, snapshot: ClusterSnapshot) -> PolicyRound:
        """This round's choices (``PolicyRound.choices``)."""
        ...
