"""Runs one job on Ray: one actor per rank, in a placement group whose bundles are pinned
to the nodes the Planner chose and ask for the GPU share it chose, each rank on the GPU it
chose (``placement``); checkpoints, restarts after a rank dies, and reconfigures a running
job (``apply``) without losing its step or optimizer state.

A rank that dies is restarted from the newest checkpoint on the same nodes; when one of
those nodes is gone (Ray declares it dead: a killed raylet, a lost machine), ``run`` raises
``NodeLost`` instead, naming it, so that the caller places the job again on the nodes
that are left and starts it from the checkpoint. A rank that hangs (no answer within
``step_timeout_s``) is handled as one that died.

Checkpoints are layout-independent: full (unsharded) weights and Adam moments, the step,
the current precision map and the loss scale, written atomically as
``<dir>/step-XXXXXXXX.pt``; the newest two are kept. Restoring loads the newest that
loads, reporting any that does not. Compression state is checkpointed as well: the
error-feedback residuals of top-k and PowerSGD of every data-parallel rank (by parameter
name) and PowerSGD's warm-start factors, step counter and generator, so a job restarted
at the same layout trains on as if uninterrupted. After a change of the data-parallel
degree each rank starts from the mean residual (a ``compression_state_resharded``
event); a change of compression, or to one data-parallel rank, drops the state (a
``compression_state_reset`` event). See ``worker``.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import suppress
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from autotune.core import JobConfig, Placement
from autotune.executor.balance import BatchBalancer
from autotune.executor.cluster import node_name, ray_node_id
from autotune.executor.errors import ExecutorError, ParallelError
from autotune.executor.fencing import NAMESPACE, Fence, Fenced
from autotune.executor.placement import bundle_totals, describe_bundles, rank_resources
from autotune.executor.quality import NoiseScale
from autotune.executor.reports import RankStep, distinct_events, job_loss
from autotune.executor.tasks import (
    TaskError,
    count_samples,
    declared_samples,
    load_task,
    shares_refusal,
    splits_unevenly,
)
from autotune.executor.worker import RankWorker, WorkerSpec
from autotune.interfaces import JobMetrics
from autotune.perf.model import balanced

__all__ = [
    "ExecutorError",
    "JobResult",
    "JobRunner",
    "NodeLost",
    "RunnerConfig",
    "balances",
    "check_config",
]

log = logging.getLogger(__name__)

NODE_ID_LABEL = "ray.io/node-id"


class NodeLost(ExecutorError):  # noqa: N818 - named for what happened, like Ray's errors
    """A node the job's placement uses is gone: the job must be placed again elsewhere.

    ``nodes`` are the lost nodes' names; ``step`` the last step the job completed (its
    newest checkpoint is at or before it)."""

    def __init__(self, nodes: list[str], step: int) -> None:
        self.nodes, self.step = nodes, step
        super().__init__(f"node {', '.join(nodes)} lost at step {step}")


def check_config(config: JobConfig) -> None:
    """Refuse, before any actor starts, what the executor cannot run."""
    refusal = config.executor_refusal()
    if refusal is not None:
        raise ParallelError(refusal)


@dataclass
class JobResult:
    steps: int
    losses: list[float]
    step_times_s: list[float]
    bytes_sent: int
    bytes_dense: int
    samples: list[int]
    """Samples each step trained (the task's ``batch_size``, or counted from its batches)."""
    wall_times_s: list[float]
    """Each step's wall time as the job sees it: the slowest rank's step plus the round trip
    to the ranks. Throughput is samples over this; ``step_times_s`` is the ranks' own."""
    tokens_per_sample: int | None
    """The task's ``seq_len``, where it says one."""
    placement: list[dict[str, Any]]
    events: list[dict[str, Any]]
    steps_redone: int = 0
    peak_memory_bytes: int = 0
    power_watts: list[float] = field(default_factory=list)
    start_s: float | None = None
    """Seconds the job's ranks took to start the first time (placement group, actors,
    process groups, restore), up to their first step."""
    reconfigure_s: list[float] = field(default_factory=list)
    """Seconds each reconfiguration took: state gathered from the ranks, ranks stopped,
    the new layout's started and restored (what a change costs on this backend, besides
    the slower first step that builds kernels and caches)."""
    sync_times_s: list[float] = field(default_factory=list)
    """Each step's gradient synchronisation that no rank hid (``JobMetrics.sync_time_s``),
    where the job is data-parallel."""
    quality: list[dict[str, Any]] = field(default_factory=list)
    """Each trained step's gradient figures (``autotune.executor.quality.Quality``) with
    its ``step`` and the job's ``noise_scale`` after it; skipped steps have none."""

    def summary(self) -> dict[str, Any]:
        median = statistics.median(self.step_times_s) if self.step_times_s else 0.0
        sync = statistics.median(self.sync_times_s) if self.sync_times_s else None
        # Throughput over every step but the first (which builds the model's kernels and
        # caches): samples trained over the wall time they took, as a user would time it.
        skip = 1 if len(self.samples) > 1 else 0
        wall = sum(self.wall_times_s[skip:])
        samples_per_s = sum(self.samples[skip:]) / wall if wall > 0 else 0.0
        return {
            "steps": self.steps,
            "loss_first": self.losses[0] if self.losses else None,
            "loss_last": self.losses[-1] if self.losses else None,
            "bytes_sent": self.bytes_sent,
            "bytes_dense": self.bytes_dense,
            "step_time_s_median": median,
            "sync_time_s_median": sync,
            "communication_share": sync / median if sync is not None and median > 0 else None,
            "samples_per_step": statistics.median(self.samples) if self.samples else None,
            "samples_per_s": samples_per_s,
            "tokens_per_s": (
                samples_per_s * self.tokens_per_sample if self.tokens_per_sample else None
            ),
            "steps_redone": self.steps_redone,
            "peak_memory_bytes": self.peak_memory_bytes,
            "power_watts_mean": statistics.fmean(self.power_watts) if self.power_watts else None,
            "noise_scale": next(
                (q["noise_scale"] for q in reversed(self.quality) if q["noise_scale"] is not None),
                None,
            ),
            "compression_cosine": _median_of(self.quality, "cosine"),
            "compression_error": _median_of(self.quality, "relative_error"),
            "reference_steps": sum(1 for q in self.quality if q["reference_s"] is not None),
            "placement": self.placement,
            "events": self.events,
        }


class _WorkerDied(Exception):  # noqa: N818 - control flow within the runner
    def __init__(self, detail: str, *, hung: bool = False) -> None:
        super().__init__(detail)
        self.hung = hung


# How often a start that waits for its nodes reads Ray's node table.
_NODE_POLL_S = 0.5


@dataclass(kw_only=True, slots=True, frozen=True)
class RunnerConfig:
    """How to run one job: what to train, for how long, where to checkpoint, and how
    patiently to wait for ranks. The layout, compression and precision (``JobConfig``)
    and the nodes (``Placement``) are what the Planner decides, and go to ``JobRunner``
    separately, since ``apply`` changes them while the job runs."""

    task: str
    """The task to train: a built-in name (``gpt-char``, ``mlp-synthetic``) or
    ``path/to/file.py:ClassName``."""

    steps: int
    """Training steps to reach (a resumed job counts the steps already checkpointed);
    >= 1."""

    batch_size: int | None = None
    """Global batch in samples per step, split across the data-parallel ranks; ``None``:
    the task's default."""

    seed: int = 0
    """Seed for the weights and the data (the same on every rank)."""

    checkpoint_dir: Path | None = None
    """Directory of the ``step-XXXXXXXX.pt`` checkpoints, created if missing, kept after
    the run; ``None``: a temporary directory, removed when ``run`` returns."""

    checkpoint_every: int = 50
    """Steps between checkpoints (the last step is always checkpointed); >= 1."""

    device: str = "cpu"
    """``cpu`` or ``cuda`` (one GPU per rank)."""

    learning_rate: float | None = None
    """Adam's learning rate; ``None``: the task's default."""

    lr_reference_batch: int | None = None
    """The global batch the learning rate is tuned for: trained at a larger
    ``batch_size``, each step's rate is scaled by the batch's gain
    (``WorkerSpec.lr_reference_batch``). ``None``: the rate as set."""

    noise_prior: float | None = None
    """The noise scale the gain rests on until the job has measured one
    (``WorkerSpec.noise_prior``)."""

    max_restarts: int = 3
    """Times the job's ranks are restarted from the last checkpoint after a rank dies
    before the run gives up."""

    placement_timeout_s: float = 120.0
    """Seconds to wait for Ray to reserve the ranks' slots (on the placement's nodes)
    before giving up."""

    step_timeout_s: float = 600.0
    """Seconds a step may take before the ranks that have not answered are taken for
    hung: the job restarts from its checkpoint as if they had died."""

    fence: Fence | None = None
    """The job's fence (``autotune.executor.fencing``): the runner claims it and stops
    the job's ranks of older leader terms before it starts, and stops with ``Fenced``
    once a newer term claims the job. ``None``: not fenced (one daemon, or a user's
    ``autotune job run``)."""

    step_log_dir: Path | None = None
    """Where each rank appends a JSON line per step (job, term, rank, node, step, start
    and end wall times): ``<dir>/t<term>-r<rank>-<attempt>.jsonl``. ``None``: no log."""

    adaptive_topk: bool = False
    """A top-k job's kept share moves with its measured communication share and fidelity
    (``WorkerSpec.adaptive_topk``), starting from the config's ratio."""

    batch_shares: tuple[float, ...] | None = None
    """The global batch split across the data-parallel ranks in these proportions (one
    weight per rank, e.g. ``(2, 1)``: rank 0 takes two thirds) instead of evenly;
    gradients are averaged by samples. Needs a data-parallel-only layout; dropped (with a
    ``batch_shares_reset`` event) when the job is reconfigured to another data-parallel
    degree."""

    stage_weights: tuple[float, ...] | None = None
    """The pipeline stages cut in these proportions of the model's blocks (one weight per
    stage, e.g. ``(2, 1)`` where stage 0's machine is twice as fast: it holds two thirds
    of the blocks) instead of evenly (``WorkerSpec.stage_weights``); stage ``i`` runs on
    the ranks ``i`` of each pipeline. Dropped (with a ``stage_weights_reset`` event) when
    the job is reconfigured to another pipeline degree."""

    balance_batch: bool = False
    """Move the batch shares to the ranks' measured speeds while the job trains
    (``autotune.executor.balance``): a ``batch_shares`` event at each move. Needs a
    data-parallel-only layout; ignored with one rank."""

    def __post_init__(self) -> None:
        if self.batch_shares is not None and (
            len(self.batch_shares) < 1
            or any(not w > 0 or w == float("inf") for w in self.batch_shares)
        ):
            raise ExecutorError(
                f"batch shares must be positive numbers, one per rank, not {self.batch_shares}"
            )
        if self.stage_weights is not None and (
            len(self.stage_weights) < 2
            or any(not w > 0 or w == float("inf") for w in self.stage_weights)
        ):
            raise ExecutorError(
                "stage weights must be positive numbers, one per pipeline stage (two or "
                f"more), not {self.stage_weights}"
            )
        if self.steps < 1:
            raise ExecutorError(f"steps must be >= 1, not {self.steps}")
        if self.checkpoint_every < 1:
            raise ExecutorError(f"checkpoint interval must be >= 1, not {self.checkpoint_every}")
        if self.step_timeout_s <= 0:
            raise ExecutorError(f"step timeout must be > 0 s, not {self.step_timeout_s}")


class JobRunner:
    """Trains ``run_config.task`` under ``config`` on ``placement`` (Ray node ids per
    rank; ``None`` lets Ray pack the ranks) for ``run_config.steps`` steps.

    ``on_step(runner, step, metrics)`` is called after every step (from the training
    thread) with what the step measured (``JobMetrics``); ``apply`` may be called from it
    or from any thread and takes effect before the next step.
    """

    def __init__(
        self,
        run_config: RunnerConfig,
        config: JobConfig,
        *,
        placement: Placement | None = None,
        on_step: Callable[[JobRunner, int, JobMetrics], None] | None = None,
    ) -> None:
        probe = load_task(run_config.task, batch_size=run_config.batch_size)  # fail fast
        # Global samples per step the task declares; None: counted from its batches.
        self.samples_per_step = declared_samples(probe)
        if self.samples_per_step is None:
            _check_countable(probe, run_config, config.layout.dp)
        seq_len = getattr(probe, "seq_len", None)
        self.tokens_per_sample = (
            seq_len if isinstance(seq_len, int) and not isinstance(seq_len, bool) else None
        )
        check_config(config)
        self._check_placement(config, placement)
        self.run_config = run_config
        self.config, self.placement = config, placement
        self._own_dir = run_config.checkpoint_dir is None
        self.checkpoint_dir = Path(
            run_config.checkpoint_dir or tempfile.mkdtemp(prefix="autotune-ckpt-")
        )
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        self.on_step = on_step
        self.step = 0
        self.resumed_from = 0
        """The step the job started from (its newest checkpoint's; 0 for a fresh job)."""
        self.workers: list[Any] = []
        self._group: Any = None
        self._pending: tuple[JobConfig, Placement | None, int | None] | None = None
        self._stopping = threading.Event()
        self._checkpoint_on_stop = False
        self._lock = threading.Lock()
        self._result = JobResult(
            steps=0,
            losses=[],
            step_times_s=[],
            bytes_sent=0,
            bytes_dense=0,
            samples=[],
            wall_times_s=[],
            tokens_per_sample=self.tokens_per_sample,
            placement=[],
            events=[],
        )
        self._balancer: BatchBalancer | None = None
        self._shares: tuple[float, ...] | None = None
        """The batch shares the ranks train on now (``None``: even)."""
        self._check_shares(config)
        self._noise = NoiseScale()
        self._fidelity: dict[str, float] = {}
        """The latest reference step's figures, reported until the next one."""

    @property
    def steps(self) -> int:
        """The steps the job runs to (``run_config.steps``)."""
        return self.run_config.steps

    def _check_shares(self, config: JobConfig) -> None:
        """Refuse uneven batch shares (given or balanced) where they cannot apply: a
        layout with tensor or pipeline parallelism, or a task whose batches split evenly
        only or that declares no global batch; and stage weights for a task that cuts
        its own stages (``split_points()``)."""
        run, layout = self.run_config, config.layout
        if run.stage_weights is not None and callable(
            getattr(load_task(run.task, batch_size=run.batch_size), "split_points", None)
        ):
            raise ParallelError(
                f"task {run.task!r} gives its own split_points(): stage weights apply to "
                "stages cut from its block stack only"
            )
        if run.batch_shares is None and not run.balance_batch:
            return
        why = shares_refusal(layout.dp, layout.tp, layout.pp)
        if why is not None:
            raise ParallelError(why)
        if not splits_unevenly(load_task(run.task, batch_size=run.batch_size)):
            raise TaskError(
                f"task {run.task!r} cannot split its batch unevenly: its batches() takes no "
                "'shares' keyword or it declares no batch_size (see "
                "autotune.executor.tasks.split_batch)"
            )

    @staticmethod
    def _check_placement(config: JobConfig, placement: Placement | None) -> None:
        if placement is not None and placement.world_size != config.world_size:
            raise ExecutorError(
                f"placement has {placement.world_size} ranks but the layout needs "
                f"{config.world_size}"
            )

    # ----------------------------------------------------------------- public

    def apply(
        self,
        config: JobConfig,
        placement: Placement | None = None,
        *,
        batch_size: int | None = None,
    ) -> None:
        """Reconfigure the running job: checkpoint, tear down, start the new layout on
        the new placement, restore, continue (before the next step). ``batch_size``: the
        job's new global batch (``None``: unchanged)."""
        check_config(config)
        self._check_placement(config, placement)
        if batch_size is not None and batch_size < config.layout.dp:
            raise ValueError(
                f"batch_size {batch_size}: fewer samples than data-parallel ranks "
                f"({config.layout.dp})"
            )
        with self._lock:
            self._pending = (config, placement, batch_size)

    def stop(self, *, checkpoint: bool = False) -> None:
        """End the job after the step in progress (from any thread); ``run`` returns the
        steps done so far, after saving a checkpoint first if ``checkpoint``."""
        self._checkpoint_on_stop = checkpoint
        self._stopping.set()

    @property
    def steps_redone(self) -> int:
        """Steps trained again after ranks were restarted from a checkpoint."""
        return self._result.steps_redone

    @property
    def stopped(self) -> bool:
        return self._stopping.is_set()

    def events_after(self, n: int) -> list[dict[str, Any]]:
        """The run's events (``JobResult.events``) after its first ``n``, so far: from
        ``on_step``, or once ``run`` returned."""
        return [dict(e) for e in self._result.events[n:]]

    def run(self) -> JobResult:
        restarts = 0
        fence = self.run_config.fence
        try:
            if fence is not None:
                fence.claim()
                stopped = fence.stop_older(self.run_config.placement_timeout_s)
                if stopped:
                    self._result.events.append(
                        {"step": 0, "kind": "fenced_older", "term": fence.term, "ranks": stopped}
                    )
            began = time.perf_counter()
            self._start(self._load_checkpoint())
            self._result.start_s = time.perf_counter() - began
            self.resumed_from = self.step
            while self.step < self.steps and not self._stopping.is_set():
                with self._lock:
                    pending, self._pending = self._pending, None
                started = time.perf_counter()
                try:
                    if pending is not None:
                        self._reconfigure(*pending)
                        started = time.perf_counter()
                    if fence is not None:
                        fence.check()
                    metrics = self._step_all()
                    self.step += 1
                    self._record(metrics, wall_s=time.perf_counter() - started)
                    self._balance(metrics)
                    if self.step % self.run_config.checkpoint_every == 0 or self.step == self.steps:
                        self._save_checkpoint()
                except _WorkerDied as died:
                    restarts += 1
                    if restarts > self.run_config.max_restarts:
                        raise ExecutorError(
                            f"a rank died {restarts} times; giving up at step {self.step}: {died}"
                        ) from None
                    if pending is not None:  # the ranks died while handing over their state
                        self.config, self.placement = pending[:2]
                        self._take_batch(pending[2])
                    self._recover(died)
                    continue
                if self.on_step is not None:
                    self.on_step(self, self.step, self._last)
            if self._stopping.is_set() and self._checkpoint_on_stop and self.step:
                try:
                    self._save_checkpoint()
                except (_WorkerDied, Fenced) as why:  # the newest periodic checkpoint stands
                    log.warning("no checkpoint at stop (step %d): %s", self.step, why)
        finally:
            self._stop()
            if self._own_dir:
                shutil.rmtree(self.checkpoint_dir, ignore_errors=True)
        self._result.steps = self.step
        return self._result

    # ----------------------------------------------------------------- actors

    def _start(self, state: dict[str, Any] | None) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        config, placement = self.config, self.placement
        world = config.world_size
        run = self.run_config
        gpu = run.device == "cuda"
        ranks = rank_resources(world, placement, gpu=gpu)
        bundles = [dict(r.bundle) for r in ranks]
        selectors = None
        if placement is not None:
            selectors = [{NODE_ID_LABEL: ray_node_id(slot.node_id)} for slot in placement.ranks]
        lost = self._lost_nodes()
        if lost:
            raise NodeLost(lost, self.step)
        total = ray.cluster_resources()  # type: ignore[no-untyped-call]
        for resource, need in bundle_totals(bundles).items():
            if total.get(resource, 0) < need:
                raise ExecutorError(
                    f"the job needs {world} ranks with {describe_bundles(bundles)}, but the "
                    f"Ray cluster has {total.get(resource, 0):g} {resource} in all"
                )
        fence = run.fence
        attempt = uuid.uuid4().hex[:8]
        if fence is not None:
            fence.check()  # before any rank exists: see ``autotune.executor.fencing``
        self._group = placement_group(
            bundles,
            strategy="PACK",
            bundle_label_selector=selectors,
            name="" if fence is None else fence.group_name(attempt),
        )
        self._await_group(world, bundles)
        self._start_shares(config)
        spec = WorkerSpec(
            task=run.task,
            batch_shares=self._shares,
            stage_weights=self._stage_weights(config),
            config=config,
            seed=run.seed,
            batch_size=run.batch_size,
            device=run.device,
            kernel_backend="auto" if gpu else "reference",
            learning_rate=run.learning_rate,
            lr_reference_batch=run.lr_reference_batch,
            # After a restart the ranks start from what the job measured so far.
            noise_prior=self._noise.reported or run.noise_prior,
            step_log=None if run.step_log_dir is None else str(run.step_log_dir),
            job=None if run.fence is None else run.fence.job_id,
            term=None if run.fence is None else run.fence.term,
            adaptive_topk=run.adaptive_topk,
        )
        passed = {k: v for k, v in os.environ.items() if k in ("TRITON_INTERPRET",)}
        actor = ray.remote(RankWorker)
        named: dict[str, Any] = {}
        self.workers = []
        for rank, resources in enumerate(ranks):
            env = {**passed, **resources.env_vars}
            if fence is not None:
                named = {"name": fence.actor_name(rank, attempt), "namespace": NAMESPACE}
            self.workers.append(
                actor.options(
                    **named,
                    num_cpus=1,
                    num_gpus=resources.num_gpus,
                    max_restarts=0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=self._group, placement_group_bundle_index=rank
                    ),
                    runtime_env={"env_vars": env} if env else None,
                ).remote(rank, spec, cuda_index=resources.cuda_index or 0, attempt=attempt)
            )
        try:
            where = ray.get([w.where.remote() for w in self.workers])
            address, port = ray.get(self.workers[0].rendezvous.remote())
            self._wait_all([w.setup.remote(address, port, state) for w in self.workers])
        except _WorkerDied as died:
            self._stop()
            raise ExecutorError(f"starting the job's ranks failed: {died}") from None
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
            self._stop()
            raise ExecutorError(f"starting the job's ranks failed: {_cause(exc)}") from None
        self._result.placement = [{"rank": w["rank"], "node": node_name(w["node"])} for w in where]
        self.step = int(state["step"]) if state is not None else 0

    def _await_group(self, world: int, bundles: list[dict[str, float]]) -> None:
        """Wait for Ray to reserve the placement group. A group pinned to a node that is
        gone never becomes ready: Ray's node table is read meanwhile, and ``NodeLost``
        raised as soon as it says one of the placement's nodes is dead (a killed raylet
        is declared dead after Ray's health checks fail: about 15 s by default)."""
        import ray

        run, placement = self.run_config, self.placement
        deadline = time.monotonic() + run.placement_timeout_s
        while True:
            try:
                ray.get(self._group.ready(), timeout=_NODE_POLL_S)
                return
            except ray.exceptions.GetTimeoutError:
                pass
            lost = self._lost_nodes()
            if lost:
                self._remove_group()
                raise NodeLost(lost, self.step)
            if time.monotonic() >= deadline:
                wanted = "the nodes asked for" if placement is not None else "the cluster"
                self._remove_group()
                raise ExecutorError(
                    f"could not reserve {world} rank slots ({describe_bundles(bundles)}) on "
                    f"{wanted} within {run.placement_timeout_s:.0f} s"
                )

    def _lost_nodes(self) -> list[str]:
        """Names of the placement's nodes that Ray reports dead (or no longer knows)."""
        import ray

        if self.placement is None:
            return []
        alive = {e["NodeID"] for e in ray.nodes() if e.get("Alive")}  # type: ignore[no-untyped-call]
        names = sorted({slot.node_id for slot in self.placement.ranks})
        return [name for name in names if ray_node_id(name) not in alive]

    def _wait_all(self, refs: list[Any], *, timeout_s: float | None = None) -> list[Any]:
        """Results of ``refs`` in order; the first failure kills the job's actors (the
        survivors may be blocked in a collective with the dead rank). Ranks that have
        not answered within ``timeout_s`` count as dead (hung)."""
        import ray

        pending = list(refs)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not ready:
                silent = sorted(refs.index(ref) for ref in pending)
                raise _WorkerDied(
                    f"rank {', '.join(map(str, silent))} gave no answer within {timeout_s:g} s",
                    hung=True,
                )
            try:
                ray.get(ready[0])
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
                cause = exc.cause if isinstance(exc, ray.exceptions.RayTaskError) else None
                if isinstance(cause, TaskError | ParallelError):
                    self._stop()
                    raise cause from None
                raise _WorkerDied(_cause(exc)) from None
        return list(ray.get(refs))

    def _step_all(self) -> list[RankStep]:
        shares = self._shares
        return self._wait_all(
            [w.step.remote(shares) for w in self.workers],
            timeout_s=self.run_config.step_timeout_s,
        )

    def _stage_weights(self, config: JobConfig) -> tuple[float, ...] | None:
        """The configured stage weights where they fit the pipeline degree; else none,
        with a ``stage_weights_reset`` event."""
        weights, pp = self.run_config.stage_weights, config.layout.pp
        if weights is None or len(weights) == pp:
            return weights
        self._result.events.append(
            {"step": self.step, "kind": "stage_weights_reset", "weights": list(weights), "pp": pp}
        )
        return None

    def _start_shares(self, config: JobConfig) -> None:
        """The batch shares the ranks start on: the configured ones where they fit the
        data-parallel degree (else even, with a ``batch_shares_reset`` event), and a
        fresh balancer where the job balances."""
        run, layout = self.run_config, config.layout
        dp = layout.dp
        dp_only = shares_refusal(dp, layout.tp, layout.pp) is None
        shares = run.batch_shares
        why = None if shares is None else shares_refusal(dp, layout.tp, layout.pp, len(shares))
        if shares is not None and why is not None:
            self._result.events.append(
                {
                    "step": self.step,
                    "kind": "batch_shares_reset",
                    "shares": list(shares),
                    "dp": dp,
                    "detail": why,
                }
            )
            shares = None
        self._balancer = None
        if run.balance_batch and dp > 1 and dp_only:
            assert self.samples_per_step is not None  # _check_shares
            self._balancer = BatchBalancer(
                self.samples_per_step, dp, least=config.layout.micro_batches, shares=shares
            )
            shares = tuple(float(n) for n in self._balancer.counts)
        self._shares = shares

    @property
    def _uneven(self) -> bool:
        return self._shares is not None and len(set(self._shares)) > 1

    def _balance(self, reports: list[RankStep]) -> None:
        """Feed the step's compute times to the balancer; move the shares when it says."""
        balancer = self._balancer
        if balancer is None:
            return
        times = [r.compute_time_s for r in sorted(reports, key=lambda r: r.rank)]
        if any(t is None for t in times):
            return
        before = balancer.counts
        moved = balancer.observe([t for t in times if t is not None])
        if moved is None:
            return
        self._shares = tuple(float(n) for n in moved)
        self._result.events.append(
            {
                "step": self.step,
                "kind": "batch_shares",
                "from": list(before),
                "to": list(moved),
                **balancer.last,
            }
        )

    def _stop(self) -> None:
        import ray

        for worker in self.workers:
            with suppress(Exception):  # already dead
                ray.kill(worker, no_restart=True)
        self.workers = []
        self._remove_group()

    def _remove_group(self) -> None:
        from ray.util.placement_group import remove_placement_group

        if self._group is not None:
            with suppress(Exception):
                remove_placement_group(self._group)
            self._group = None

    # ----------------------------------------------------------------- recovery

    def _recover(self, died: _WorkerDied) -> None:
        """Restart the ranks from the newest checkpoint, on the same nodes; ``NodeLost``
        if one of them is gone."""
        lost_at = self.step
        self._stop()
        state = self._load_checkpoint()
        resumed = int(state["step"]) if state is not None else 0
        self._result.steps_redone += lost_at - resumed
        kind = "rank_hung" if died.hung else "rank_died"
        self._result.events.append(
            {"step": lost_at, "kind": kind, "detail": str(died), "resumed_from": resumed}
        )
        log.warning("%s at step %d (%s); resuming from step %d", kind, lost_at, died, resumed)
        # Metrics of steps about to be redone are replaced by the redone ones.
        del self._result.losses[resumed:]
        del self._result.step_times_s[resumed:]
        self._start(state)

    def _reconfigure(
        self, config: JobConfig, placement: Placement | None, batch_size: int | None
    ) -> None:
        began = time.perf_counter()
        state = self._gather_state()
        old, old_batch = self.config, self.run_config.batch_size
        self._stop()
        self.config, self.placement = config, placement
        self._take_batch(batch_size)
        self._start(state)
        seconds = time.perf_counter() - began
        self._result.reconfigure_s.append(seconds)
        event = {
            "step": self.step,
            "kind": "reconfigured",
            "from": _describe(old),
            "to": _describe(config),
            "seconds": round(seconds, 3),
        }
        if self.run_config.batch_size != old_batch:
            event["batch"] = {"from": old_batch, "to": self.run_config.batch_size}
        self._result.events.append(event)

    def _take_batch(self, batch_size: int | None) -> None:
        """Train at global batch ``batch_size`` from the next start of the ranks on
        (``None`` or the same: unchanged)."""
        if batch_size is None or batch_size == self.run_config.batch_size:
            return
        self.run_config = replace(self.run_config, batch_size=batch_size)
        self.samples_per_step = declared_samples(
            load_task(self.run_config.task, batch_size=batch_size)
        )

    @property
    def start_s(self) -> float | None:
        """Seconds the ranks took to start the first time (``JobResult.start_s``)."""
        return self._result.start_s

    @property
    def reconfigure_s(self) -> list[float]:
        """Seconds each reconfiguration took (``JobResult.reconfigure_s``)."""
        return list(self._result.reconfigure_s)

    # ----------------------------------------------------------------- checkpoints

    def _gather_state(self) -> dict[str, Any]:
        """The job's checkpoint: every rank's part (each pipeline stage's own weights, every
        data-parallel rank's compression state) joined by ``merge_rank_states``."""
        from autotune.executor.checkpoint import merge_rank_states

        return merge_rank_states(self._wait_all([w.state.remote() for w in self.workers]))

    def _save_checkpoint(self) -> None:
        fence = self.run_config.fence
        if fence is not None:
            fence.check()
        state = self._gather_state()
        path = self.checkpoint_dir / f"step-{self.step:08d}.pt"
        tmp = path.with_suffix(f".{uuid.uuid4().hex[:8]}.tmp")
        torch.save(state, tmp)
        if fence is not None:
            try:
                fence.check()  # a newer term may have started from the checkpoint before
            except Fenced:
                tmp.unlink(missing_ok=True)
                raise
        os.replace(tmp, path)
        for old in sorted(self.checkpoint_dir.glob("step-*.pt"))[:-2]:
            old.unlink(missing_ok=True)

    def _load_checkpoint(self) -> dict[str, Any] | None:
        for path in sorted(self.checkpoint_dir.glob("step-*.pt"), reverse=True):
            try:
                state: dict[str, Any] = torch.load(path, weights_only=False)
                return state
            except Exception as exc:
                self._result.events.append(
                    {
                        "step": self.step,
                        "kind": "checkpoint_unreadable",
                        "path": str(path),
                        "detail": _first_line(exc),
                    }
                )
                log.warning("checkpoint %s does not load (%s); trying an older one", path, exc)
        return None

    # ----------------------------------------------------------------- metrics

    def _record(self, reports: list[RankStep], *, wall_s: float) -> None:
        """Account one step: ``reports`` from every rank, ``wall_s`` the step's wall time
        as the job sees it (from asking the ranks to step to the last one's answer)."""
        loss = job_loss(reports)
        step_time = max(r.step_time_s for r in reports)
        result = self._result
        if loss is not None:
            result.losses.append(loss)
        result.step_times_s.append(step_time)
        samples = self.samples_per_step or sum(r.samples or 0 for r in reports)
        if samples < 1:
            raise ExecutorError(
                f"step {self.step}: the task's batches held no samples "
                "(the first tensor of a batch has a leading dimension of 0)"
            )
        result.samples.append(samples)
        result.wall_times_s.append(wall_s)
        rate = samples / wall_s
        sent = sum(r.bytes_sent for r in reports)
        dense = sum(r.bytes_dense for r in reports)
        result.bytes_sent += sent
        result.bytes_dense += dense
        result.peak_memory_bytes = max(
            result.peak_memory_bytes, *(r.peak_memory_bytes for r in reports)
        )
        # The least any rank waited: the rest of a rank's wait is for a slower peer.
        syncs = [r.sync_time_s for r in reports if r.sync_time_s is not None]
        sync = min(syncs) if syncs else None
        if sync is not None:
            result.sync_times_s.append(sync)
        power = [r.power_watts for r in reports if r.power_watts is not None]
        if power:
            result.power_watts.append(sum(power))
        result.events.extend(distinct_events(reports))  # every rank reports the agreed ones
        self._measure_quality(reports, samples)
        scales = [r.loss_scale for r in reports if r.loss_scale is not None]
        self._last = JobMetrics(
            loss=loss,
            step_time_s=step_time,
            samples_per_s=rate,
            tokens_per_s=rate * self.tokens_per_sample if self.tokens_per_sample else None,
            bytes_sent=sent,
            bytes_dense=dense,
            nan_events=sum(1 for r in reports[:1] for e in r.events if e["kind"] == "nonfinite"),
            peak_memory_bytes=result.peak_memory_bytes,
            power_watts=sum(power) if power else None,
            sync_time_s=sync,
            noise_scale=self._noise.reported,
            grad_norm=self._fidelity.get("grad_norm"),
            compression_cosine=self._fidelity.get("cosine"),
            compression_error=self._fidelity.get("relative_error"),
            residual_norm=self._fidelity.get("residual_norm"),
            loss_scale=min(scales) if scales else None,
        )

    def _measure_quality(self, reports: list[RankStep], samples: int) -> None:
        """The job's gradient noise scale and compression fidelity after a step (every
        rank reports the same figures: the first's are taken)."""
        quality = next((r.quality for r in reports if r.quality is not None), None)
        if quality is None:
            return
        dp = self.config.layout.dp
        # The estimator takes every replica's batch to be samples / dp: with uneven
        # shares the noise scale keeps the figure of the even steps.
        if not self._uneven:
            self._noise.record(quality, samples, dp, self.step)
        self._fidelity["grad_norm"] = quality.update_sq**0.5
        for key in ("cosine", "relative_error", "residual_norm"):
            value = getattr(quality, key)
            if value is not None:
                self._fidelity[key] = value
        self._result.quality.append(
            {
                "step": self.step,
                **asdict(quality),
                "noise_scale": self._noise.value if self._noise.measurements else None,
            }
        )


@functools.cache
def _splits_unevenly(task: str, batch_size: int | None) -> bool:
    try:
        return splits_unevenly(load_task(task, batch_size=batch_size))
    except Exception:  # a task that does not load fails where the job starts, with why
        return False


def balances(task: str, batch_size: int | None, config: JobConfig) -> bool:
    """Whether a job of ``task`` under ``config`` can balance its batch shares
    (``RunnerConfig.balance_batch``): data parallelism only, over two ranks or more, and a
    task that ``splits_unevenly``."""
    if not balanced(config):
        return False
    return _splits_unevenly(task, batch_size)


def _median_of(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [row[key] for row in rows if row.get(key) is not None]
    return statistics.median(values) if values else None


def _check_countable(task: Any, run: RunnerConfig, dp: int) -> None:
    """Refuse, before any rank starts, a task whose samples per step cannot be told: it
    declares no ``batch_size`` and its first batch (data-parallel rank 0's) holds no
    tensor with a batch dimension. Throughput is never reported as 0 for lack of it."""
    try:
        first = next(iter(task.batches(0, dp, run.seed)))
    except Exception as exc:  # the user's task failed while making a batch
        raise TaskError(f"task {run.task!r}: making its first batch failed: {exc!r}") from exc
    if count_samples(first) is None:
        raise TaskError(
            f"task {run.task!r}: cannot count the samples a step trains: its batches hold "
            f"no tensor with a batch dimension ({type(first).__name__}) and it declares no "
            "batch_size; yield tensors (or tuples, lists or dicts of them) whose first "
            "dimension is the batch, or give the task a batch_size attribute (global "
            "samples per step)"
        )


def _describe(config: JobConfig) -> dict[str, Any]:
    layout = config.layout
    return {
        "dp": layout.dp,
        "tp": layout.tp,
        "pp": layout.pp,
        "compression": config.compression.kind,
        "precision": config.precision.as_dict(),
    }


def _cause(exc: BaseException) -> str:
    """What went wrong in a rank, in one line: for an exception raised in the rank, the
    rank's method and node and the exception itself (Ray's first line names only the
    method)."""
    import ray

    if isinstance(exc, ray.exceptions.RayTaskError) and exc.cause is not None:
        cause = exc.cause
        # ``ray.get`` raises a copy that is also an instance of the cause's class
        # (``as_instanceof_cause``): it keeps only the cause and Ray's text, whose first
        # line is ``ray::Class.method() (pid=…, ip=…, …)``.
        fields = vars(exc)
        head = _RAY_HEAD.match(str(exc).lstrip())
        method = fields.get("function_name") or (head and head["method"]) or "a rank"
        ip = fields.get("ip") or (head and head["ip"])
        where = f" on {ip}" if ip else ""
        text = _first_line(cause)
        name = type(cause).__name__
        return f"{method}{where}: {text if text.startswith(name) else f'{name}: {text}'}"
    return _first_line(exc)


_RAY_HEAD = re.compile(r"ray::(?P<method>[\w.]+)\(\)[^\n]*?\bip=(?P<ip>[^,\s)]+)")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
