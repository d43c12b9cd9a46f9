"""The simulated cluster: the one cluster model that ``autotune daemon --backend sim``
runs and that the Gymnasium environment wraps.

It is a ``Backend`` with ``JobControl``, ``SimulatedTime``, ``Provisionable`` and
``Replayable`` (``autotune.interfaces``): ``run_round()`` lets one round (``round_s``
simulated seconds) pass and reports its ``RoundOutcome``; ``observe()`` reports the
cluster as a ``ClusterSnapshot`` and changes nothing; ``apply()`` starts or reconfigures
jobs exactly as the decision step placed them. Jobs arrive from a list (a
trace) or from the built-in job stream (``autotune.envs.workloads.job_stream``), and
users' jobs can be submitted through the API. Its tenants (``SimConfig.tenants``) ride in
its snapshots, so the decision step enforces their quotas as in the daemon; each job
keeps its ``JobSpec.tenant``.

Physics (``autotune.perf.model.estimate``, the same everywhere): a running job advances
at its goodput (samples/s x statistical efficiency) for its configuration and placement
(``shape_of``: slowest GPU model, ranks per node, network) and finishes when it has done
its work, counted in samples at statistical efficiency 1. Communication, compression,
pipeline bubbles, stragglers (a coefficient of variation per job, drawn from the measured
Alibaba distribution), memory and power all come from that model. With
``SimConfig.sensitivity``, what compression costs a job's convergence is drawn per job
from the spread measured over real tasks (``autotune.perf.sensitivity``): the job trains
at its draw (``SimJob.truth``) while its snapshots keep the profile the daemon knows.

Randomness comes from the generator given, in streams of its own for what the policy
can change: the job stream and each job's straggler spread from the generator itself,
divergence events, measurement noise and drawn sensitivities each from a stream spawned
from its seed. So whatever a policy runs, the same seed brings the same jobs at the same
times.

Events:

- **reconfiguration**: a running job whose configuration or placement changes pays
  ``restart_s`` of downtime (checkpoint, tear down, restore and the steps lost since the
  last checkpoint) before it makes progress again, unless its physics takes the change
  in place (``JobPhysics.in_place``);
- **divergence**: low-precision maps diverge (NaN/Inf) as a Poisson process at
  ``divergence_rate_per_hour``; the job rolls back to its last checkpoint (half a round
  lost on average) and moves to a safer map (bf16 where the GPU has it, else fp32, with
  the micro-batches the memory rule then needs), as the executor does;
- **out of memory**: a configuration whose rank does not fit its GPU crashes at start
  and the job fails (the decision step's memory rule and the Planner prevent this unless
  an override forces it).

Energy: each running job's power from the model, idle GPUs at their idle share of TDP.
Provisioning may **park** idle nodes (``park``): a parked node draws
``parked_power_fraction`` of its GPUs' TDP (0: powered off) and jobs cannot use it; one
woken (``wake``) draws idle power and becomes usable ``wake_s`` later.

A job may bring physics of its own (``Arrival.physics``, a ``JobPhysics``): then it
advances as its measurements say, not as the performance model does; a study's world
plugs in this way (``autotune.studies.pollux``: Pollux's measured step times and
gradient statistics). Energy still comes from the model.

Measurements: each running job reports its step time (``metrics.step_time_s``) with
``MEASUREMENT_NOISE`` (when ``noise``), as a backend that trains it would; the daemon
fits each job's throughput model online from these reports.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from autotune.catalog.devices import device
from autotune.core import (
    ACTIVE_STATES,
    DEFAULT_RESTART_S,
    MILLI_PER_GPU,
    MODULE_CLASSES,
    Decision,
    JobConfig,
    JobSpec,
    Layout,
    ModelProfile,
    NodeInfo,
    PrecisionMap,
    TenantSpec,
    fast_precisions,
)
from autotune.envs.presets import default_nodes
from autotune.interfaces import (
    EVENTS_KEPT,
    ClusterSnapshot,
    JobMetrics,
    JobStatus,
    JobSubmission,
    ReplayInfo,
)
from autotune.perf.memory import fit_memory
from autotune.perf.model import (
    DEFAULT_COEFFICIENTS,
    IDLE_POWER_FRACTION,
    Coefficients,
    Estimate,
    Shape,
    estimate,
    shape_of,
)
from autotune.perf.sensitivity import SensitivitySpread
from autotune.perf.stragglers import median_cv, sample_cv
from autotune.rl.reward import JobRound, RoundOutcome

__all__ = [
    "MEASUREMENT_NOISE",
    "Arrival",
    "JobPhysics",
    "PhysicsRound",
    "SimConfig",
    "SimJob",
    "SimulatedCluster",
]


MEASUREMENT_NOISE = 0.05
"""Log-normal spread of a reported step time around the model's (assumed: 5%, within
the 3-8% step-to-step spread the executor measures on CPU). The daemon's online fits
learn from these reports as they would from a real backend's."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PhysicsRound:
    """What a job with physics of its own did in a round."""

    goodput: float
    """Progress units per second, averaged over the round's run time."""
    step_s: float
    """Its step time (what a backend would measure)."""
    samples_per_s: float
    reached: float
    """Its progress at the end of the round, in its physics' units."""
    finished_after_s: float | None
    """Seconds of run time it took to finish; ``None``: it did not."""


class JobPhysics(Protocol):
    """How a job advances when its progress is measured rather than modelled: the
    simulated cluster asks these instead of the performance model (a study's world plugs
    its measurements in this way)."""

    @property
    def work(self) -> float:
        """Progress units to finish."""
        ...

    @property
    def restart_s(self) -> float | None:
        """Seconds without progress at every start and restart of the job (its world's
        checkpoint-restore cost); ``None``: the cluster's ``start_s`` and ``restart_s``."""
        ...

    def reference_rate(
        self, reference_gpus: int, gpus_per_node: int, batch: int, *, gpu_model: str
    ) -> float:
        """Progress units per second of the job's reference configuration (its reference
        GPUs of ``gpu_model`` packed on nodes of ``gpus_per_node``, data parallel,
        ``batch``): the unit of its normalized goodput."""
        ...

    def advance(
        self,
        job_id: str,
        done: float,
        config: JobConfig,
        ranks_per_node: tuple[int, ...],
        batch: int,
        run_s: float,
        *,
        gpu_model: str,
        gpu_models: tuple[tuple[str, int], ...] = (),
    ) -> PhysicsRound:
        """``run_s`` seconds of training from progress ``done`` on ``gpu_model`` GPUs
        (``run_s`` 0: the rate alone); ``gpu_models``: ``(GPU model, ranks)`` of a job
        whose ranks run on several models with batch shares by speed (``Shape.gpu_models``
        of a balanced shape; empty otherwise, and then ``gpu_model`` is the slowest).
        ``ValueError`` for a configuration it has no measurements of (on that model)."""
        ...

    def in_place(self, old: JobConfig | None, new: JobConfig) -> bool:
        """Whether a running job takes ``new`` on the same GPUs without a restart."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Arrival:
    """A job as it enters the simulated cluster; ``spec.submitted_at`` is when."""

    spec: JobSpec
    task: str | None = None
    steps: int | None = None
    work: float = 0.0
    """Samples at statistical efficiency 1 to finish; 0: ``duration_s`` at the reference
    configuration (a trace job's measured runtime) sets it."""
    duration_s: float | None = None
    reference_gpus: int = 1
    """GPUs of the reference configuration (data parallel, fp32, the job's batch): the
    unit of normalized goodput, and the run a trace job's duration was measured on."""
    coeffs: Coefficients = DEFAULT_COEFFICIENTS
    """The performance model's coefficients for this job (calibrated per application
    for the Pollux workloads)."""
    physics: JobPhysics | None = None
    """Physics of the job's own (measured): it advances as they say, ``work`` in their
    progress units, and never runs out of memory (it was measured at the sizes it runs);
    ``None``: the performance model."""

    @property
    def coeffs_app(self) -> str | None:
        """The application whose calibrated coefficients the job runs with (its model's
        name), ``None`` for the defaults."""
        if self.coeffs == DEFAULT_COEFFICIENTS or self.spec.model is None:
            return None
        return self.spec.model.name

    def __post_init__(self) -> None:
        if self.spec.model is None:
            raise ValueError(f"job {self.spec.job_id}: the simulator needs a model profile")
        if self.work <= 0 and not self.duration_s:
            raise ValueError(f"job {self.spec.job_id}: neither work nor duration")


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    seed: int = 0
    round_s: float = 300.0
    """Simulated seconds between two decisions (one ``observe()``)."""
    restart_s: float = DEFAULT_RESTART_S
    """Downtime of a job whose configuration or placement changes."""
    start_s: float = 0.0
    """Downtime of a job that starts: the first time, or again after a preemption
    (Pollux's simulator charges ``restart_s`` for every start)."""
    noise: bool = True
    """Draw stragglers and divergence; ``False``: their expected values."""
    nodes: tuple[NodeInfo, ...] = field(default_factory=lambda: tuple(default_nodes()))
    mean_interarrival_s: float = 300.0
    """Of the built-in job stream (when no arrivals are given)."""
    initial_jobs: int = 6
    """Jobs of the built-in stream waiting at time 0 (not when jobs were restored)."""
    max_jobs: int | None = None
    """Jobs the built-in stream generates in all (``None``: no limit)."""
    wake_s: float = 120.0
    """Seconds a parked node takes from ``wake`` to usable (boot and join)."""
    parked_power_fraction: float = 0.0
    """Share of its GPUs' TDP a parked node draws (0: powered off)."""
    coeffs: Coefficients | None = None
    """The performance model's coefficients of the jobs of the built-in stream and of
    those submitted: a calibrated cluster's (``autotune calibrate --cluster-file``);
    ``None``: the defaults."""
    task_coeffs: tuple[tuple[str, Coefficients], ...] = ()
    """A task's own coefficients on that cluster, by task name, where its calibration
    fitted the task's compute (``ClusterDescription.task_coefficients``); the other tasks
    run on ``coeffs``."""
    tenants: tuple[TenantSpec, ...] = ()
    """The tenants sharing the cluster, with their quotas: its snapshots carry them, so the
    decision step enforces them as in the daemon (``autotune.decision.quotas``)."""
    mix_models: bool = False
    """Whether one data-parallel job may run across GPU models, its replicas' batch
    shares by speed (``ClusterSnapshot.mixes_models``); the performance model prices it
    (``autotune.perf.model.balance_gain``). Jobs of measured physics (the Pollux and Sia
    modes) advance by measurements of one GPU model per placement, which a mixed
    placement has not: leave this off there."""
    sensitivity: SensitivitySpread | None = None
    """Where set, each job the performance model advances trains at a compression
    sensitivity drawn from it (``autotune.perf.sensitivity``; the measured one is
    ``measured_spread()``), unless its task's efficiencies were measured; the snapshots
    keep the profile the daemon knows, so a policy prices compression as it would on a
    real cluster, by the catalog or the calibration. ``None``: every job trains at what
    its profile says."""
    pack_jobs: bool = False
    """Whether the Planner places every job that may span nodes on the nodes with the
    most free GPUs first, as many ranks on each as it has room for
    (``ClusterSnapshot.packs_jobs``): how Pollux's and Sia's simulators place jobs, for a
    study's world that must match one of them; ``False``: the Planner's equal blocks."""

    def __post_init__(self) -> None:
        if len({t.name for t in self.tenants}) != len(self.tenants):
            raise ValueError(f"tenants {[t.name for t in self.tenants]}: a name twice")
        if not self.round_s > 0:
            raise ValueError(f"round_s={self.round_s!r}: must be > 0")
        if self.restart_s < 0:
            raise ValueError(f"restart_s={self.restart_s!r}: must be >= 0")
        if self.start_s < 0:
            raise ValueError(f"start_s={self.start_s!r}: must be >= 0")
        if not self.mean_interarrival_s > 0:
            raise ValueError(f"mean_interarrival_s={self.mean_interarrival_s!r}: must be > 0")
        if self.initial_jobs < 0:
            raise ValueError(f"initial_jobs={self.initial_jobs!r}: must be >= 0")
        if self.wake_s < 0:
            raise ValueError(f"wake_s={self.wake_s!r}: must be >= 0")
        if not 0 <= self.parked_power_fraction <= 1:
            raise ValueError(
                f"parked_power_fraction={self.parked_power_fraction!r}: must be in [0, 1]"
            )
        if not any(n.gpu_count > 0 for n in self.nodes):
            raise ValueError("the cluster has no GPU node")


@dataclass(slots=True, kw_only=True)
class SimJob:
    """One job: what arrived, its status as the daemon sees it, and its run state."""

    arrival: Arrival
    status: JobStatus
    work: float
    done: float = 0.0
    straggler_cv: float = 0.0
    reference_goodput: float = 1.0
    downtime_s: float = 0.0
    attained_gpu_s: float = 0.0
    goodput: float = 0.0
    nan_events: int = 0
    restarts: int = 0
    preemptions: int = 0
    truth: ModelProfile | None = None
    """The profile it trains at where that is not the one the daemon sees (a drawn
    compression sensitivity, ``SimConfig.sensitivity``)."""

    @property
    def job_id(self) -> str:
        return self.status.spec.job_id


class SimulatedCluster:
    """The simulated cluster; see the module docstring."""

    name = "simulator"

    def __init__(
        self,
        config: SimConfig | None = None,
        *,
        arrivals: Iterable[Arrival] | None = None,
        rng: np.random.Generator | None = None,
    ) -> None:
        self.config = config or SimConfig()
        self.rng = rng if rng is not None else np.random.default_rng(self.config.seed)
        # Measurement noise draws from a stream of its own, spawned from the generator's
        # seed (different per seed), so the jobs' events stay what they were.
        seeds = getattr(self.rng.bit_generator, "seed_seq", None)
        self._measure = np.random.default_rng(
            seeds.spawn(1)[0] if seeds is not None else [self.config.seed, 1]
        )
        # The jobs' drawn sensitivities from a third, spawned only where they are drawn
        # (a spawn moves the seed's later children: the other worlds stay as they were).
        self._sensitivity = (
            np.random.default_rng(seeds.spawn(1)[0] if seeds is not None else [self.config.seed, 2])
            if self.config.sensitivity is not None
            else None
        )
        # The jobs' divergence events from a stream of their own: how many draws they take
        # depends on what the policy runs, and from the shared generator they moved every
        # later arrival of the built-in stream, so that two policies given the same seed
        # were scheduling different jobs.
        self._divergence = np.random.default_rng(
            seeds.spawn(1)[0] if seeds is not None else [self.config.seed, 3]
        )
        self.nodes = [n for n in self.config.nodes if n.gpu_count > 0]
        self._nodes = {n.node_id: n for n in self.config.nodes}
        self.total_gpus = sum(n.gpu_count for n in self.nodes)
        self.reference_gpu = max(
            sorted({n.gpu_model for n in self.nodes}),
            key=lambda m: sum(n.gpu_count for n in self.nodes if n.gpu_model == m),
        )
        self._gpus_per_node = max(
            n.gpu_count for n in self.nodes if n.gpu_model == self.reference_gpu
        )
        self.jobs: dict[str, SimJob] = {}
        self.now = 0.0
        self._arrivals = arrivals
        self._stream: Iterator[Any] | None = None
        self._next: Arrival | None = None
        self._observed = False
        self._taken: set[str] = set()
        self._restored = False
        self._cache: dict[tuple[object, ...], Estimate] = {}
        self._restarts = 0
        """Reconfigurations applied since the last round."""
        self._events: deque[tuple[str, dict[str, Any]]] = deque(maxlen=EVENTS_KEPT)
        """What happened to jobs, until taken (``take_events``)."""
        self.parked: dict[str, float] = {}
        """Nodes out of service: parked (``inf``) or waking (the time they are usable)."""
        self._views: tuple[tuple[tuple[str, float], ...], Any] | None = None
        self._idle_watts = {
            n.node_id: device(n.gpu_model).tdp_watts * IDLE_POWER_FRACTION for n in self.nodes
        }
        """Each GPU node's draw per idle GPU."""
        self._idle_all_watts = sum(self._idle_watts[n.node_id] * n.gpu_count for n in self.nodes)

    # -- the job stream ---------------------------------------------------------------

    def _start_stream(self) -> None:
        from autotune.envs.workloads import job_stream

        stream: Iterator[Any]
        if self._arrivals is not None:
            stream = iter(sorted(self._arrivals, key=lambda a: a.spec.submitted_at))
        else:
            stream = job_stream(
                self.rng,
                mean_interarrival_s=self.config.mean_interarrival_s,
                initial_jobs=0 if self._restored else self.config.initial_jobs,
                max_jobs=self.config.max_jobs,
                taken=lambda job_id: job_id in self._taken or job_id in self.jobs,
                coeffs=self.config.coeffs,
                task_coeffs=dict(self.config.task_coeffs),
            )
        self._stream = stream
        self._next = next(stream, None)
        self._admit(self.now)

    def _admit(self, until_s: float) -> None:
        while self._next is not None and self._next.spec.submitted_at <= until_s:
            self._add(self._next)
            assert self._stream is not None
            self._next = next(self._stream, None)

    def _add(self, arrival: Arrival, *, progress: float = 0.0) -> SimJob:
        spec = arrival.spec
        job = SimJob(
            arrival=arrival,
            status=JobStatus(spec=spec, state="pending", task=arrival.task, steps=arrival.steps),
            work=arrival.work,
            straggler_cv=sample_cv(self.rng) if self.config.noise else median_cv(),
        )
        assert spec.model is not None
        spread = self.config.sensitivity
        if spread is not None and arrival.physics is None and not spec.model.compression_efficiency:
            assert self._sensitivity is not None
            drawn = spread.draw(self._sensitivity)
            job.truth = replace(spec.model, compression_sensitivity=drawn)
        reference = JobConfig(layout=Layout(world_size=arrival.reference_gpus))
        shape = Shape(gpu_model=self.reference_gpu, ranks_per_node=(arrival.reference_gpus,))
        ref = self._estimate(job, reference, shape, cv=median_cv())
        # The unit of speed, not a config to run: memory is ignored here.
        job.reference_goodput = ref.step.samples_per_s * ref.efficiency
        if arrival.physics is not None:
            job.work = arrival.physics.work
            job.reference_goodput = arrival.physics.reference_rate(
                arrival.reference_gpus,
                self._gpus_per_node,
                spec.global_batch,
                gpu_model=self.reference_gpu,
            )
        if job.work <= 0:
            assert arrival.duration_s is not None
            job.work = arrival.duration_s * job.reference_goodput
        job.done = progress * job.work
        # Every job says how long it trains, in steps of its batch (a trace job's work
        # comes from its measured duration): the job row keeps it for replay and restart.
        steps = arrival.steps or max(1, math.ceil(job.work / spec.global_batch))
        job.status = replace(job.status, progress=progress, steps=steps)
        self.jobs[spec.job_id] = job
        return job

    # -- queries ----------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """No job will arrive and none is active."""
        return self._observed and self._next is None and not self.active_jobs()

    def active_jobs(self) -> list[SimJob]:
        return [j for j in self.jobs.values() if j.status.state in ACTIVE_STATES]

    def finished_jobs(self) -> list[SimJob]:
        return [j for j in self.jobs.values() if j.status.state == "finished"]

    def failed_jobs(self) -> list[SimJob]:
        return [j for j in self.jobs.values() if j.status.state == "failed"]

    def coefficients(self, job_id: str) -> Coefficients:
        """The performance-model coefficients of a job (what an oracle may know)."""
        return self.jobs[job_id].arrival.coeffs

    def reference_goodput(self, job_id: str) -> float:
        return self.jobs[job_id].reference_goodput

    def replay_info(self, job_id: str) -> ReplayInfo:
        """What replaying this job in another simulation needs beyond its spec: its work
        in samples, the GPUs of its reference configuration, the application whose
        calibrated coefficients it runs with (``None``: the defaults)."""
        job = self.jobs[job_id]
        return ReplayInfo(
            work=job.work,
            reference_gpus=job.arrival.reference_gpus,
            coeffs_app=job.arrival.coeffs_app,
        )

    def snapshot(self) -> ClusterSnapshot:
        held = sum(
            slot.gpu_milli
            for job in self.jobs.values()
            if job.status.state == "running" and job.status.placement is not None
            for slot in job.status.placement.ranks
        )
        usable, parked, waking = self._node_views()
        return ClusterSnapshot(
            time_s=self.now,
            nodes=usable,
            jobs=[j.status for j in self.jobs.values()],
            telemetry=self.name,
            gpu_utilization=held / max(1, self.total_gpus * MILLI_PER_GPU),
            parked_nodes=parked,
            waking_nodes=waking,
            tenants={t.name: t for t in self.config.tenants},
            mixes_models=self.config.mix_models,
            packs_jobs=self.config.pack_jobs,
        )

    def _node_views(
        self,
    ) -> tuple[tuple[NodeInfo, ...], tuple[NodeInfo, ...], tuple[NodeInfo, ...]]:
        """The usable, parked and waking nodes; the same tuples round after round while
        no node is parked or woken, so the Planner reuses what it built from them."""
        key = tuple(self.parked.items())
        if self._views is None or self._views[0] != key:
            nodes = self.config.nodes
            views = (
                tuple(n for n in nodes if n.node_id not in self.parked),
                tuple(n for n in nodes if self.parked.get(n.node_id) == math.inf),
                tuple(
                    n
                    for n in nodes
                    if n.node_id in self.parked and self.parked[n.node_id] < math.inf
                ),
            )
            self._views = (key, views)
        return self._views[1]

    # -- provisioning -------------------------------------------------------------------

    def park(self, node_ids: Iterable[str]) -> None:
        """Power down idle nodes; ``ValueError`` if a job holds a GPU on one."""
        busy = self._busy_nodes()
        for node_id in node_ids:
            if node_id not in self._nodes:
                raise KeyError(f"no node {node_id!r}")
            if node_id in busy:
                raise ValueError(f"node {node_id} runs a job: only idle nodes are parked")
            self.parked[node_id] = math.inf

    def wake(self, node_ids: Iterable[str]) -> None:
        """Power parked nodes up: each is usable ``wake_s`` from now."""
        for node_id in node_ids:
            if self.parked.get(node_id) == math.inf:
                self.parked[node_id] = self.now + self.config.wake_s
        self._ready()

    def _ready(self) -> None:
        for node_id, at in list(self.parked.items()):
            if at <= self.now:
                del self.parked[node_id]

    def _busy_nodes(self) -> set[str]:
        return {
            slot.node_id
            for job in self.jobs.values()
            if job.status.state == "running" and job.status.placement is not None
            for slot in job.status.placement.ranks
        }

    # -- Backend ------------------------------------------------------------------------

    def _event(self, job_id: str, kind: str, **detail: Any) -> None:
        self._events.append(
            (job_id, {"kind": kind, "at": time.time(), "sim_s": self.now, **detail})
        )

    def take_events(self) -> list[tuple[str, dict[str, Any]]]:
        """What happened to jobs since the previous call (``JobEvents``): a divergence's
        move to a safer precision (``nonfinite``, one per module class, as the executor's
        fall-back reports it) and an out-of-memory crash (``out_of_memory``), each with
        the simulated time ``sim_s``; at most the newest ``EVENTS_KEPT`` when nobody
        takes them (a training environment)."""
        taken = list(self._events)
        self._events.clear()
        return taken

    def observe(self) -> ClusterSnapshot:
        """The cluster now (the first call starts it: the jobs present at the start
        arrive)."""
        self.start()
        return self.snapshot()

    def run_round(self) -> RoundOutcome | None:
        """One round of ``round_s`` simulated seconds and what the cluster did in it
        (``advance``); the first call only starts the cluster (``None``)."""
        if not self._observed:
            self.start()
            return None
        return self.advance()

    def start(self) -> None:
        """Admit the jobs present at the start (the first ``observe()`` or
        ``run_round()`` does this)."""
        if not self._observed:
            self._observed = True
            self._start_stream()

    def apply(self, decisions: Sequence[Decision]) -> None:
        changed: list[tuple[SimJob, JobConfig, object]] = []
        for decision in decisions:
            job = self.jobs.get(decision.job_id)
            if job is None:
                raise KeyError(f"no job {decision.job_id!r} in the simulated cluster")
            if decision.preempt and job.status.state == "running":
                # Stopped after a checkpoint: it keeps its progress and pays the start
                # downtime when it runs again.
                job.status = replace(
                    job.status, state="pending", config=None, placement=None, samples_per_s=0.0
                )
                job.downtime_s = 0.0
                job.preemptions += 1
                continue
            if decision.placement is None or job.status.state not in ACTIVE_STATES:
                continue
            changed.append((job, decision.config, decision.placement))
        for job, config, placement in changed:
            status = job.status
            if status.state == "running" and (
                status.placement != placement
                or (status.config != config and not _in_place(job, status.config, config))
            ):
                job.downtime_s = _restart_s(job, self.config.restart_s)
                job.restarts += 1
                self._restarts += 1
            elif status.state == "pending":
                job.downtime_s = _restart_s(job, self.config.start_s)
            job.status = replace(
                status,
                state="running",
                config=config,
                placement=placement,  # type: ignore[arg-type]
                started_s=status.started_s if status.started_s is not None else self.now,
            )
        # One check after all moves: a job may take GPUs another one of the round left.
        self._check_capacity()

    def close(self, timeout_s: float | None = None) -> None:
        self.jobs.clear()

    # -- JobControl ---------------------------------------------------------------------

    def submit(self, job: JobSubmission) -> None:
        job_id = job.spec.job_id
        if job_id in self.jobs:
            raise ValueError(f"job {job_id!r} already exists in the simulated cluster")
        if job.spec.model is None:
            raise ValueError(
                f"task {job.task!r}: the simulated cluster needs a model profile (a built-in "
                "task); module tasks run on a backend that trains them"
            )
        # Queue order among equal priorities is by arrival on the simulated clock.
        self._add(_arrival_of(job, submitted_at=self.now, coeffs=self._coeffs_of(job.task)))

    def _coeffs_of(self, task: str) -> Coefficients | None:
        """The coefficients a job of ``task`` runs on here."""
        return dict(self.config.task_coeffs).get(task, self.config.coeffs)

    def cancel(self, job_id: str) -> None:
        job = self.jobs.get(job_id)
        if job is None:
            raise KeyError(f"no job {job_id!r} in the simulated cluster")
        if job.status.state in ACTIVE_STATES:
            job.status = replace(
                job.status,
                state="cancelled",
                placement=None,
                samples_per_s=0.0,
                finished_s=self.now,
            )

    def restore(
        self, jobs: Sequence[tuple[JobSubmission, JobStatus]], *, taken_ids: Collection[str]
    ) -> None:
        if self._observed:
            raise RuntimeError("restore() must come before the first observe()")
        self._taken = set(taken_ids)
        for submission, status in jobs:
            self._restored = True
            job = self._add(
                _arrival_of(
                    submission,
                    submitted_at=submission.spec.submitted_at,
                    coeffs=self._coeffs_of(submission.task),
                ),
                progress=status.progress,
            )
            if status.state != "running" or status.config is None or status.placement is None:
                continue
            job.status = replace(
                job.status,
                state="running",
                config=status.config,
                placement=status.placement,
                started_s=self.now,
            )
            try:
                self._check_capacity()
            except ValueError:  # its GPUs no longer exist or are taken: it waits again
                job.status = replace(job.status, state="pending", placement=None)

    # -- physics ------------------------------------------------------------------------

    def _estimate(
        self, job: SimJob, config: JobConfig, shape: Shape, *, cv: float | None = None
    ) -> Estimate:
        spec = job.status.spec
        model = job.truth or spec.model
        assert model is not None
        straggler = job.straggler_cv if cv is None else cv
        batch = config.batch(spec)
        key = (model, id(job.arrival.coeffs), config, batch, shape, straggler)
        hit = self._cache.get(key)
        if hit is None:
            hit = estimate(
                model,
                config,
                shape,
                batch,
                coeffs=job.arrival.coeffs,
                straggler_cv=straggler,
            )
            if len(self._cache) > 200_000:
                self._cache.clear()
            self._cache[key] = hit
        return hit

    def estimate_for(
        self, job_id: str, config: JobConfig, shape: Shape, *, noise_free: bool = True
    ) -> Estimate:
        """The model's estimate for a job under a config and shape (for oracles)."""
        job = self.jobs[job_id]
        return self._estimate(job, config, shape, cv=median_cv() if noise_free else None)

    def advance(self, dt_s: float | None = None) -> RoundOutcome:
        """Run ``dt_s`` (default ``round_s``) of training, then admit the arrivals."""
        self.start()
        dt = self.config.round_s if dt_s is None else dt_s
        end = self.now + dt
        norm = energy_j = lost_s = 0.0
        ooms = nans = finished = 0
        restarts, self._restarts = self._restarts, 0
        busy = 0.0
        per_job: dict[str, JobRound] = {}
        idle_watts = self._idle_watts
        held_milli: dict[str, int] = {}
        for job in list(self.jobs.values()):
            status = job.status
            if status.state != "running" or status.placement is None or status.config is None:
                continue
            for slot in status.placement.ranks:
                held_milli[slot.node_id] = held_milli.get(slot.node_id, 0) + slot.gpu_milli
            gpus = status.placement.world_size * status.placement.ranks[0].gpu_milli / 1000
            busy += gpus
            shape = shape_of(status.placement, self._nodes, balanced=self.config.mix_models)
            est = self._estimate(job, status.config, shape)
            run_s = max(0.0, dt - job.downtime_s)
            lost_s += dt - run_s
            job.downtime_s = max(0.0, job.downtime_s - dt)
            job.attained_gpu_s += gpus * dt
            energy_j += est.power_watts * dt
            mine = JobRound(restart_s=dt - run_s, energy_kwh=est.power_watts * dt / 3.6e6)
            physics = job.arrival.physics
            if est.oom and physics is None:  # a measured job ran at this size
                per_job[job.job_id] = replace(mine, ooms=1)
                ooms += 1
                self._event(job.job_id, "out_of_memory", world_size=status.config.world_size)
                job.goodput = 0.0
                job.status = replace(
                    status,
                    state="failed",
                    placement=None,
                    samples_per_s=0.0,
                    finished_s=self.now,
                    metrics=JobMetrics(oom=True),
                )
                continue
            rate = est.divergence_per_hour * run_s / 3600
            events = int(self._divergence.poisson(rate)) if self.config.noise and rate > 0 else 0
            config = status.config
            if events:
                nans += events
                job.nan_events += events
                run_s *= 0.5
                node = self._nodes[status.placement.ranks[0].node_id]
                safer = replace(config, precision=self._safer(node.node_id))
                # As the executor does: more micro-batches where the wider map needs them.
                assert status.spec.model is not None
                config = fit_memory(
                    status.spec.model,
                    safer,
                    safer.batch(status.spec),
                    node.gpu_memory_bytes * status.placement.ranks[0].gpu_milli / MILLI_PER_GPU,
                )[0]
                for cls in MODULE_CLASSES:  # as the executor's fall-back reports it
                    was, now = getattr(status.config.precision, cls), getattr(safer.precision, cls)
                    if was != now:
                        self._event(
                            job.job_id,
                            "nonfinite",
                            module_class=cls,
                            **{"from": was, "to": now},
                            divergences=events,
                        )
            need = job.work - job.done
            reached = job.done
            if physics is not None:
                ran = physics.advance(
                    job.job_id,
                    job.done,
                    status.config,
                    shape.ranks_per_node,
                    status.config.batch(status.spec),
                    run_s,
                    gpu_model=shape.gpu_model,
                    gpu_models=shape.gpu_models if shape.balanced else (),
                )
                goodput, step_s, samples_per_s = ran.goodput, ran.step_s, ran.samples_per_s
                reached, used_s = ran.reached, ran.finished_after_s
                gained = need if used_s is not None else reached - job.done
            else:
                goodput, step_s, samples_per_s = (
                    est.goodput,
                    est.step.step_s,
                    est.step.samples_per_s,
                )
                gained = est.goodput * run_s
                used_s = need / goodput if gained >= need and goodput > 0 else None
            job.goodput = goodput
            if self.config.noise:  # what a backend measures: the step, give or take
                step_s *= float(np.exp(self._measure.normal(0.0, MEASUREMENT_NOISE)))
            metrics = JobMetrics(
                goodput=goodput,
                power_watts=est.power_watts,
                step_time_s=step_s,
                nan_events=job.nan_events,
            )
            if gained >= need:
                used = used_s + (dt - run_s) if used_s is not None else dt
                share = need / job.reference_goodput / dt
                job.done = job.work
                finished += 1
                job.status = replace(
                    status,
                    state="finished",
                    config=config,
                    placement=None,
                    progress=1.0,
                    samples_per_s=0.0,
                    finished_s=self.now + min(dt, used),
                    metrics=metrics,
                )
            else:
                job.done = reached if physics is not None else job.done + gained
                share = goodput / job.reference_goodput * run_s / dt
                job.status = replace(
                    status,
                    config=config,
                    progress=job.done / job.work,
                    samples_per_s=samples_per_s if run_s > 0 else 0.0,
                    metrics=metrics,
                )
            norm += share
            per_job[job.job_id] = replace(mine, normalized_goodput=share, nan_events=events)
        # Every GPU idle, less the held ones, parked nodes at their own draw (a waking
        # node idles): per held or parked node, not per node of the cluster.
        idle_w = self._idle_all_watts
        for node_id, milli in held_milli.items():
            if (watts := idle_watts.get(node_id)) is not None:
                idle_w -= watts * min(self._nodes[node_id].gpu_count, milli / 1000)
        parked_share = self.config.parked_power_fraction / IDLE_POWER_FRACTION
        for node_id, until in self.parked.items():
            if until == math.inf and (watts := idle_watts.get(node_id)) is not None:
                idle_gpus = self._nodes[node_id].gpu_count - held_milli.get(node_id, 0) / 1000
                idle_w += watts * max(0.0, idle_gpus) * (parked_share - 1.0)
        idle_j = idle_w * dt
        energy_j += idle_j
        self.now = end
        self._ready()
        self._admit(self.now)
        return RoundOutcome(
            normalized_goodput=norm,
            ooms=ooms,
            nan_events=nans,
            restarts=restarts,
            restart_s=lost_s,
            energy_kwh=energy_j / 3.6e6,
            idle_energy_kwh=idle_j / 3.6e6,
            finished=finished,
            busy_gpus=busy,
            jobs=per_job,
        )

    def skip_idle(self) -> None:
        """Jump to the round of the next arrival when nothing is active (nothing to
        decide); the environment does this, the daemon's clock does not jump."""
        self.start()
        if not self.active_jobs() and self._next is not None:
            gap = self._next.spec.submitted_at - self.now
            if gap > 0:
                self.now += math.ceil(gap / self.config.round_s) * self.config.round_s
            self._admit(self.now)

    def _safer(self, node_id: str) -> PrecisionMap:
        peaks = self._nodes[node_id].peak_tflops
        return PrecisionMap.uniform("bf16" if "bf16" in fast_precisions(peaks) else "fp32")

    def _check_capacity(self) -> None:
        used: dict[tuple[str, int], int] = {}
        for job in self.jobs.values():
            placement = job.status.placement
            if job.status.state != "running" or placement is None:
                continue
            for slot in placement.ranks:
                node = self._nodes.get(slot.node_id)
                if node is None or slot.gpu_index >= node.gpu_count:
                    raise ValueError(f"{job.job_id}: no GPU {slot}")
                if slot.node_id in self.parked:
                    raise ValueError(f"{job.job_id}: node {slot.node_id} is parked")
                key = (slot.node_id, slot.gpu_index)
                used[key] = used.get(key, 0) + slot.gpu_milli
                if used[key] > MILLI_PER_GPU:
                    raise ValueError(f"GPU {key} over-committed by {job.job_id}")


def _restart_s(job: SimJob, cluster_s: float) -> float:
    """A start's or restart's downtime: the job's physics' own where it has one."""
    physics = job.arrival.physics
    own = physics.restart_s if physics is not None else None
    return cluster_s if own is None else own


def _in_place(job: SimJob, old: JobConfig | None, new: JobConfig) -> bool:
    """Whether a running job changes from ``old`` to ``new`` without a restart: only where
    its own physics say so. Jobs on the performance model restart for any change: the
    executor restarts them from a checkpoint."""
    physics = job.arrival.physics
    return physics is not None and physics.in_place(old, new)


def _arrival_of(
    job: JobSubmission, *, submitted_at: float, coeffs: Coefficients | None = None
) -> Arrival:
    spec = replace(job.spec, submitted_at=submitted_at)
    return Arrival(
        spec=spec,
        task=job.task,
        steps=job.steps,
        work=float(job.steps * spec.global_batch),
        reference_gpus=spec.min_gpus,
        coeffs=coeffs or DEFAULT_COEFFICIENTS,
    )
