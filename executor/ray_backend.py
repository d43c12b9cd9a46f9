"""The daemon's ``ray`` backend: jobs submitted through the API are trained for real.

Each job runs in a ``JobRunner`` on its own thread; the daemon's decisions start it on
the Planner's placement and reconfigure it live (``JobRunner.apply``) when its config or
placement changes. ``observe()`` reports the Ray cluster's nodes and, per job, the
measured figures of its last step (throughput, loss, bytes sent, NaN events, power).
Checkpoints live in ``<checkpoint root>/<job id>``, so a job the daemon resumes after a
restart continues from its last checkpoint.

When a node that runs ranks of a job is lost (Ray declares it dead), the job goes back to
``pending`` with ``interrupted = "node X lost"``: the daemon's next decision places it on
the nodes that are left (the Planner never sees a lost node) and it starts again from its
newest checkpoint. ``observe()`` reports lost nodes beside the alive ones; a node that
comes back is offered again. ``job_events(job_id)`` lists what happened to a job here
(``node_lost``, ``resumed``, ``fenced``, ``fenced_older``) with wall-clock times.

Under a leader daemon (``lead(term)``) every job is fenced by the term that starts it
(``autotune.executor.fencing``): taking the jobs over (``restore``) and starting one
first stop its ranks of any older term, and a job that a newer term claims stops here
(``fenced``). Each rank logs its steps
(job, term, rank, node, step, wall times) in ``<checkpoint root>/<job id>/steps``.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from autotune.catalog.clusters import ClusterDescription
from autotune.core import Decision, JobConfig, NodeInfo, Placement
from autotune.executor.cluster import ray_cluster
from autotune.executor.fencing import Fence, Fenced
from autotune.executor.runner import JobRunner, NodeLost, RunnerConfig, balances
from autotune.interfaces import (
    EVENTS_KEPT,
    ClusterSnapshot,
    ConfigChange,
    JobMetrics,
    JobState,
    JobStatus,
    JobSubmission,
)
from autotune.perf.model import shape_of
from autotune.ray_session import ensure_ray

__all__ = ["RayBackend"]

log = logging.getLogger(__name__)

_RATE_STEPS: Final = 5
"""Steps whose throughput tells a configuration's: a change is measured after this many
steps under it, beside the two it skips (the step in progress when it was applied, and
the first after the restart, which builds kernels and caches)."""
_RESTARTS_KEPT: Final = 20
"""Recent restarts whose median is the backend's restart cost."""


@dataclass
class _Job:
    submission: JobSubmission
    state: JobState = "pending"
    config: JobConfig | None = None
    placement: Placement | None = None
    runner: JobRunner | None = None
    thread: threading.Thread | None = None
    step: int = 0
    metrics: JobMetrics = field(default_factory=JobMetrics)
    """What its last step measured, with the steps redone over all its runs."""
    error: str | None = None
    interrupted: str | None = None
    """Why the job waits to be placed again (a lost node, a preemption), until it starts."""
    events: list[dict[str, Any]] = field(default_factory=list)
    forwarded: int = 0
    """Events of its current run (``JobRunner.events_after``) already in ``events``."""
    rates: list[float] = field(default_factory=list)
    """Throughput of its steps since it started or was last reconfigured."""
    change: ConfigChange | None = None
    """Its last reconfiguration while running, with what it measured."""
    steps_redone: int = 0
    preempted: bool = False
    """Stopped by a preemption: it waits without a configuration once stopped."""


class RayBackend:
    """Trains submitted jobs on a Ray cluster (``address``) or a local Ray."""

    name = "ray"

    def __init__(
        self,
        *,
        checkpoint_root: Path,
        address: str | None = None,
        checkpoint_every: int = 25,
        device: str = "auto",
        step_timeout_s: float = 600.0,
        on_step: Callable[[str, int, JobMetrics], None] | None = None,
        cluster: ClusterDescription | None = None,
        adaptive_topk: bool = False,
        balance_batch: bool = False,
        mix_models: bool = False,
    ) -> None:
        """``step_timeout_s``: a step that takes longer is taken for a hung rank (the job
        restarts from its checkpoint); ``on_step(job_id, step, metrics)`` is called after
        every step of every job, from the job's thread; ``cluster``: the cluster's
        description (``autotune cluster describe``), whose nodes' measured inter-node
        bandwidth replaces the catalog's default for the same Ray nodes;
        ``adaptive_topk``: top-k jobs move their kept share with what they measure
        (``RunnerConfig.adaptive_topk``); ``balance_batch``: data-parallel jobs whose task
        can split its batch unevenly move their ranks' batch shares to the ranks'
        measured speeds (``RunnerConfig.balance_batch``; other jobs train as they
        would); ``mix_models``: the Planner may place a data-parallel job on nodes of
        several GPU models (``ClusterSnapshot.mixes_models``), and such a job's ranks
        take batch shares by their measured speeds, as with ``balance_batch``."""
        import torch

        self._started_ray = ensure_ray(address)
        self._root = checkpoint_root
        self._every = checkpoint_every
        self._step_timeout_s = step_timeout_s
        self._adaptive_topk = adaptive_topk
        self._balance_batch = balance_batch
        self._mix_models = mix_models
        self._nodes: dict[str, NodeInfo] = {}
        """The nodes last observed, by id."""
        self._on_step = on_step
        self._device = (
            device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        )
        self._jobs: dict[str, _Job] = {}
        self._taken: set[str] = set()
        self._lock = threading.Lock()
        self._outbox: deque[tuple[str, dict[str, Any]]] = deque(maxlen=EVENTS_KEPT)
        """Events not yet taken (``take_events``); the newest ``EVENTS_KEPT`` when
        nobody takes them."""
        self._clock = time.monotonic()
        self._term: int | None = None
        self._links: dict[str, float] = {}
        self._devices: dict[str, NodeInfo] = {}
        """Nodes the cluster file calibrated: their device is the calibrated one."""
        if cluster is not None:
            calibrated = cluster.profile()
            for node in cluster.with_measured_links().nodes:
                key = node.backend_node_id or node.node_id
                self._links[key] = node.inter_node_bandwidth_gbps
                if calibrated is not None and node.gpu_model == calibrated[0].name:
                    self._devices[key] = node
        self._starts: deque[float] = deque(maxlen=_RESTARTS_KEPT)
        self._starting: dict[str, float] = {}
        """Jobs whose ranks are starting, with when (monotonic), until their first step."""
        self._reconfigures: deque[float] = deque(maxlen=_RESTARTS_KEPT)

    def lead(self, term: int | None) -> None:
        """Fence the jobs started from now on by leader term ``term``."""
        self._term = term

    # ----------------------------------------------------------------- JobControl

    def submit(self, job: JobSubmission) -> None:
        job_id = job.spec.job_id
        with self._lock:
            if job_id in self._jobs or job_id in self._taken:
                raise ValueError(f"job {job_id!r} exists already")
            self._jobs[job_id] = _Job(submission=job)

    def cancel(self, job_id: str) -> None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise KeyError(job_id)
            if job.state in ("finished", "failed", "cancelled"):
                return
            job.state = "cancelled"
            runner = job.runner
        if runner is not None:
            runner.stop()

    def restore(
        self, jobs: Sequence[tuple[JobSubmission, JobStatus]], *, taken_ids: Collection[str]
    ) -> None:
        """Jobs that were pending or running wait for the daemon's next decision, which
        starts them again from their checkpoint; ended jobs are remembered as they were.
        Under a leader term (``lead``), each active job is claimed for the term first and
        its ranks of older terms stopped, their slots freed (``Fence.stop_older``): the
        ranks of a leader that lost the lease, still training, stop before this daemon
        decides where the job goes."""
        active = []
        with self._lock:
            self._taken.update(taken_ids)
            for submission, status in jobs:
                job = _Job(submission=submission, config=status.config, placement=status.placement)
                if status.state in ("finished", "failed", "cancelled"):
                    job.state = status.state
                else:  # it holds no slots here: placed again, like a job whose node was lost
                    job.placement = None
                    job.interrupted = (
                        "resumed after the daemon restarted"
                        if self._term is None
                        else f"taken over by leader term {self._term}"
                    )
                    active.append(job)
                self._jobs[submission.spec.job_id] = job
        if self._term is None:
            return
        for job in active:
            fence = Fence(job.submission.spec.job_id, self._term)
            fence.claim()
            stopped = fence.stop_older(self._step_timeout_s)
            if stopped:
                log.warning("job %s: stopped %s of an older term", fence.job_id, stopped)
                with self._lock:
                    event = {"kind": "fenced_older", "term": self._term, "stopped": stopped}
                    self._record(job, {**event, "at": time.time()})

    def _record(self, job: _Job, event: dict[str, Any]) -> None:
        """Keep ``event`` with the job and for ``take_events`` (under ``_lock``)."""
        job.events.append(event)
        self._outbox.append((job.submission.spec.job_id, dict(event)))

    def _forward(self, job: _Job, runner: JobRunner | None) -> None:
        """The events ``runner`` reported since the last call (the gradient-norm guard's,
        batch shares moved, reconfigurations, ...), stamped with the time they are taken
        (under ``_lock``)."""
        if runner is None:
            return
        new = runner.events_after(job.forwarded)
        job.forwarded += len(new)
        now = time.time()
        for event in new:
            self._record(job, {**event, "at": now})

    # ----------------------------------------------------------------- Backend

    def job_events(self, job_id: str) -> list[dict[str, Any]]:
        """What happened to the job on this backend: ``node_lost`` (``nodes``, ``step``),
        ``resumed`` (``step``, ``steps_redone``), ``fenced``, and what its runs reported
        (``JobResult.events``: ``grad_norm_growth``, ``batch_shares``, ``reconfigured``,
        ...), each with ``at`` (Unix time)."""
        with self._lock:
            return [dict(e) for e in self._jobs[job_id].events]

    def take_events(self) -> list[tuple[str, dict[str, Any]]]:
        """The jobs' events since the previous call (``JobEvents``)."""
        with self._lock:
            taken = list(self._outbox)
            self._outbox.clear()
        return taken

    def observe(self) -> ClusterSnapshot:
        cluster = ray_cluster()
        nodes: list[NodeInfo] = [self._described(n) for n in cluster.alive]
        self._nodes = {n.node_id: n for n in nodes}
        with self._lock:
            statuses = [self._status(job) for job in self._jobs.values()]
            used = sum(
                job.config.world_size
                for job in self._jobs.values()
                if job.state == "running" and job.config is not None
            )
        capacity = sum(n.gpu_count for n in nodes) or 1
        return ClusterSnapshot(
            time_s=time.monotonic() - self._clock,
            nodes=nodes,
            jobs=statuses,
            telemetry="ray",
            gpu_utilization=min(1.0, used / capacity),
            lost_nodes=cluster.lost,
            restart_s=self.restart_s(),
            mixes_models=self._mix_models,
        )

    def _spans_models(self, placement: Placement) -> bool:
        """Whether ``placement`` runs on nodes of several GPU models (as last observed)."""
        if any(slot.node_id not in self._nodes for slot in placement.ranks):
            return False  # a node gone since: the job restarts where the next round says
        return shape_of(placement, self._nodes).mixed

    def _described(self, node: NodeInfo) -> NodeInfo:
        """``node`` with the link bandwidth the cluster file measured for it, and the
        device its calibration fitted, if any."""
        gbps = self._links.get(node.backend_node_id) or self._links.get(node.node_id)
        if gbps is not None:
            node = replace(node, inter_node_bandwidth_gbps=gbps)
        filed = self._devices.get(node.backend_node_id) or self._devices.get(node.node_id)
        if filed is not None:
            node = replace(node, gpu_model=filed.gpu_model, peak_tflops=dict(filed.peak_tflops))
        return node

    def restart_s(self) -> float | None:
        """What a reconfiguration costs here: the median of the recent ones, or of the
        jobs' first starts until one is measured, or, while the first jobs are still
        starting, how long they have been at it (a lower bound); ``None`` before any job
        started."""
        with self._lock:
            measured = self._reconfigures or self._starts
            if measured:
                return statistics.median(measured)
            if self._starting:
                return time.monotonic() - min(self._starting.values())
            return None

    def _status(self, job: _Job) -> JobStatus:
        steps = job.submission.steps
        return JobStatus(
            spec=job.submission.spec,
            state=job.state,
            config=job.config,
            placement=job.placement,
            progress=min(1.0, job.step / steps),
            samples_per_s=job.metrics.samples_per_s or 0.0,
            task=job.submission.task,
            steps=steps,
            metrics=job.metrics,
            interrupted=job.interrupted if job.state == "pending" else None,
            last_change=job.change if job.state == "running" else None,
        )

    def apply(self, decisions: Sequence[Decision]) -> None:
        """Preemptions first: each job stops after its step in progress and a checkpoint,
        and is waited for (up to the step timeout) before anything starts on its GPUs. A
        decision whose GPUs a job still holds after that is not applied (the daemon
        decides again at its next tick)."""
        stopping: list[_Job] = []
        for decision in decisions:
            if not decision.preempt:
                continue
            with self._lock:
                job = self._jobs.get(decision.job_id)
                runner = job.runner if job is not None and job.state == "running" else None
                if job is not None and runner is not None:
                    job.preempted = True
                    stopping.append(job)
            if runner is not None:
                runner.stop(checkpoint=True)
        busy: set[tuple[str, int]] = set()
        for job in stopping:
            if job.thread is not None:
                job.thread.join(timeout=self._step_timeout_s)
            with self._lock:
                if job.state == "running" and job.placement is not None:
                    busy.update((s.node_id, s.gpu_index) for s in job.placement.ranks)
                    log.warning(
                        "job %s: still stopping after %.0f s; its GPUs stay taken",
                        job.submission.spec.job_id,
                        self._step_timeout_s,
                    )
        for decision in decisions:
            if decision.preempt or decision.placement is None:
                continue
            if busy and any((s.node_id, s.gpu_index) in busy for s in decision.placement.ranks):
                log.warning(
                    "job %s: not started: its GPUs are held by a job still stopping",
                    decision.job_id,
                )
                continue
            with self._lock:
                job = self._jobs.get(decision.job_id)
                if job is None or job.state in ("finished", "failed", "cancelled"):
                    continue
                if job.state == "pending":
                    self._start(job, decision.config, decision.placement)
                elif (decision.config, decision.placement) != (job.config, job.placement):
                    assert job.runner is not None
                    if decision.config != job.config and job.config is not None:
                        job.change = ConfigChange(
                            previous=job.config,
                            at_s=time.monotonic() - self._clock,
                            samples_per_s_before=(
                                statistics.median(job.rates[-_RATE_STEPS:]) if job.rates else None
                            ),
                        )
                        job.rates = []
                    job.runner.apply(
                        decision.config,
                        decision.placement,
                        batch_size=decision.config.batch(job.submission.spec),
                    )
                    job.config, job.placement = decision.config, decision.placement

    @staticmethod
    def _noise_prior(job: _Job) -> float | None:
        """The noise scale a job's learning rate at a larger batch starts from: what its
        earlier runs measured, else its model's (``RunnerConfig.noise_prior``)."""
        if job.metrics.noise_scale:
            return job.metrics.noise_scale
        model = job.submission.spec.model
        return model.noise_scale if model is not None and model.noise_scale > 0 else None

    def _start(self, job: _Job, config: JobConfig, placement: Placement) -> None:
        job_id = job.submission.spec.job_id

        first = True
        seen: list[float] = []
        job.change, job.rates = None, []  # a start, not a change of a running job
        self._starting[job_id] = time.monotonic()

        def on_step(runner: JobRunner, step: int, metrics: JobMetrics) -> None:
            nonlocal first
            with self._lock:
                if first and job.interrupted is not None:
                    redone = max(0, job.step - runner.resumed_from)
                    job.steps_redone += redone
                    self._record(
                        job,
                        {
                            "kind": "resumed",
                            "step": step,
                            "resumed_from": runner.resumed_from,
                            "steps_redone": redone,
                            "at": time.time(),
                            "nodes": sorted({s.node_id for s in placement.ranks}),
                        },
                    )
                    job.interrupted = None
                if first and runner.start_s is not None:
                    self._starts.append(runner.start_s)
                self._starting.pop(job_id, None)
                self._reconfigures.extend(runner.reconfigure_s[len(seen) :])
                seen[:] = runner.reconfigure_s
                first = False
                job.step = step
                if metrics.samples_per_s:
                    job.rates.append(metrics.samples_per_s)
                    steady = job.rates[2:]
                    change = job.change
                    if (
                        change is not None
                        and change.samples_per_s_after is None
                        and len(steady) >= _RATE_STEPS
                    ):
                        job.change = replace(change, samples_per_s_after=statistics.median(steady))
                job.metrics = replace(metrics, steps_redone=job.steps_redone + runner.steps_redone)
                self._forward(job, runner)
            if self._on_step is not None:
                self._on_step(job_id, step, metrics)

        run = RunnerConfig(
            task=job.submission.task,
            steps=job.submission.steps,
            batch_size=config.batch(job.submission.spec),
            lr_reference_batch=job.submission.spec.global_batch,
            noise_prior=self._noise_prior(job),
            checkpoint_dir=self._root / job_id,
            checkpoint_every=self._every,
            device=self._device,
            step_timeout_s=self._step_timeout_s,
            fence=None if self._term is None else Fence(job_id, self._term),
            step_log_dir=self._root / job_id / "steps",
            adaptive_topk=self._adaptive_topk,
            balance_batch=(
                self._balance_batch or (self._mix_models and self._spans_models(placement))
            )
            and balances(job.submission.task, config.batch(job.submission.spec), config),
        )
        runner = JobRunner(run, config, placement=placement, on_step=on_step)
        job.runner, job.config, job.placement, job.state = runner, config, placement, "running"
        job.forwarded = 0
        job.thread = threading.Thread(
            target=self._run, args=(job,), name=f"job-{job_id}", daemon=True
        )
        job.thread.start()

    def _run(self, job: _Job) -> None:
        try:
            self._train(job)
        finally:  # a job that never stepped is no longer starting
            with self._lock:
                self._starting.pop(job.submission.spec.job_id, None)

    def _train(self, job: _Job) -> None:
        assert job.runner is not None
        try:
            result = job.runner.run()
        except NodeLost as lost:  # placed again by the daemon's next decision
            why = f"node {', '.join(lost.nodes)} lost"
            log.warning("job %s: %s at step %d", job.submission.spec.job_id, why, lost.step)
            with self._lock:
                self._forward(job, job.runner)
                self._record(
                    job,
                    {
                        "kind": "node_lost",
                        "nodes": lost.nodes,
                        "step": lost.step,
                        "at": time.time(),
                    },
                )
                if job.state == "running":
                    job.state, job.placement, job.runner = "pending", None, None
                    job.interrupted = why
                    job.step = lost.step
            return
        except Fenced as fenced:  # a newer leader runs it now
            log.warning("job %s: %s", job.submission.spec.job_id, fenced)
            with self._lock:
                self._forward(job, job.runner)
                self._record(
                    job,
                    {"kind": "fenced", "term": fenced.term, "by": fenced.holder, "at": time.time()},
                )
                if job.state == "running":
                    job.state, job.placement, job.runner = "pending", None, None
                    job.interrupted = f"fenced by leader term {fenced.holder}"
            return
        except Exception as exc:  # the job fails; the daemon keeps going
            log.warning("job %s failed: %s", job.submission.spec.job_id, exc)
            with self._lock:
                self._forward(job, job.runner)
                job.state, job.error = "failed", str(exc).splitlines()[0] if str(exc) else repr(exc)
            return
        with self._lock:
            self._forward(job, job.runner)
            if job.state == "running":
                job.state = "finished" if result.steps >= job.submission.steps else "pending"
                if job.state == "pending":  # stopped: it waits for a decision
                    job.placement, job.runner = None, None
                    if job.preempted:
                        job.config, job.preempted = None, False
                        job.interrupted = "preempted"
            job.step = result.steps

    def close(self, timeout_s: float | None = None) -> None:
        """Stop the running jobs, each after a checkpoint, waiting ``timeout_s`` in all
        (120 s per job when ``None``)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            running = [
                j for j in self._jobs.values() if j.runner is not None and j.state == "running"
            ]
        for job in running:
            assert job.runner is not None
            job.runner.stop(checkpoint=True)
        for job in running:
            if job.thread is not None:
                wait = 120.0 if deadline is None else max(0.0, deadline - time.monotonic())
                job.thread.join(timeout=wait)
                if job.thread.is_alive():
                    log.warning(
                        "job %s: no checkpoint within the stop timeout",
                        job.submission.spec.job_id,
                    )
        if self._started_ray:
            import ray

            ray.shutdown()
