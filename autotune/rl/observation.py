"""The observation a policy sees: the one encoder of a ``ClusterSnapshot``.

Part of the reinforcement-learning contract (``autotune.rl``): the Gymnasium environment
(``autotune.envs.cluster_env``), the daemon's learned policy (``autotune.policies.serving``)
and replay all encode with ``ObservationEncoder``, so they see the same numbers.

``GLOBAL`` features, then ``GPU_MODEL`` features for each of up to ``MAX_GPU_MODELS`` GPU
models (fastest first), then ``SLOT`` features per slot. Every feature has declared
bounds; ``FEATURES`` lists them (index, name, range, meaning) and the environment's
docstring prints the same table.

**Slots.** A policy acts on ``slots`` job slots: the first ``slots`` active jobs in
queue order (higher priority first, then earlier submission, then id: the Planner's
order). Jobs behind them are never dropped: a waiting one gets a ``wait`` choice naming
its queue position (``autotune.rl.action.wait_choices``), a running one keeps its
configuration, and each moves into the window as jobs ahead of it finish.
``encode(snapshot, slots=n)`` encodes with ``n`` slots instead: a policy shared across
slots serves every active job with a slot each.

**Tenants.** A slot's ``tenant_quota`` and ``tenant_headroom`` read the job's tenant
(``ClusterSnapshot.tenants``): its quota, and how far the GPUs its running jobs hold are
below it (over 0.5: it may start within its quota, and the decision step will reclaim
borrowed GPUs for it) or above it (under 0.5: it borrows, and its jobs are the first
preempted when a quota's owner has work). On a cluster without quotas both are neutral:
0 and 0.5.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

import numpy as np

from autotune.catalog.devices import device
from autotune.core import (
    DEFAULT_RESTART_S,
    JobConfig,
    Layout,
    ModelProfile,
    NodeInfo,
    fast_precisions,
    node_table,
)
from autotune.demand import DemandForecast, DemandForecaster, DemandHistory, NoForecast
from autotune.interfaces import ClusterSnapshot, JobStatus
from autotune.perf.memory import rank_memory
from autotune.perf.model import compute_bound_samples_per_s, statistical_efficiency
from autotune.rl.action import (
    BATCH_SCALES,
    COMPRESSIONS,
    LAYOUT_MODES,
    PRECISION_MAPS,
    config_indices,
)

__all__ = [
    "FEATURES",
    "GLOBAL",
    "GPU_MODEL",
    "HEADER",
    "MAX_GPU_MODELS",
    "SLOT",
    "Feature",
    "ObservationEncoder",
    "from_log",
    "gpu_models",
    "observation_bounds",
    "observation_size",
    "round_slots",
    "slot_jobs",
]

MAX_GPU_MODELS: Final = 4
_UNIT_BATCH: Final = BATCH_SCALES.index(1.0)
_LARGEST_GPU_BYTES: Final = 192 * (1 << 30)


@dataclass(frozen=True, slots=True)
class Feature:
    name: str
    low: float
    high: float
    meaning: str


GLOBAL: Final = (
    Feature("pending", 0, 1, "waiting jobs, log(1+n)/log(1001), capped at 1"),
    Feature("running", 0, 1, "running jobs, log(1+n)/log(1001), capped at 1"),
    Feature("beyond_window", 0, 1, "share of active jobs outside the slots"),
    Feature("busy", 0, 1, "share of the cluster's GPUs held now"),
    Feature("busy_last", 0, 1, "share held at the previous decision"),
    Feature("arrival_15", 0, 1, "probability that new GPU demand arrives within 15 minutes"),
    Feature("arrival_60", 0, 1, "probability that new GPU demand arrives within 60 minutes"),
    Feature(
        "headroom",
        0,
        1,
        "free GPU share if demand reaches its next-hour peak (95% quantile)",
    ),
    Feature("round", 0, 1, "the decision round period, log10(1 + s)/5, capped at 1"),
    Feature(
        "restart",
        0,
        1,
        "restart cost / round period r as (log10(r) + 2)/4, capped: r = 0.1 is .25",
    ),
)
GPU_MODEL: Final = (
    Feature("present", 0, 1, "1 if the cluster has this GPU model"),
    Feature("total", 0, 1, "its GPUs / the cluster's GPUs"),
    Feature("free", 0, 1, "its free GPUs / the cluster's GPUs"),
    Feature("memory", 0, 1, "memory of one GPU / 192 GiB"),
    Feature("bf16", 0, 1, "1 if it has bf16 units faster than fp32"),
    Feature("fp8", 0, 1, "1 if it has fp8 units faster than its 16-bit ones"),
    Feature("speed", 0, 1, "its fastest 16-bit (else fp32) peak / the fastest model's"),
)
SLOT: Final = (
    Feature("occupied", 0, 1, "1 if a job is in the slot"),
    Feature("running", 0, 1, "1 if it runs"),
    Feature("waiting", 0, 1, "hours waiting since submission, log(1+h)/log(101), capped"),
    Feature("parameters", 0, 1, "log10(parameters)/12"),
    Feature("flops", 0, 1, "log10(FLOPs per sample)/16"),
    Feature("transformer", 0, 1, "1 for a transformer (tensor parallelism possible)"),
    Feature("min_gpus", 0, 1, "log2(min GPUs)/6"),
    Feature("max_gpus", 0, 1, "log2(max GPUs)/6"),
    Feature("memory_need", 0, 1, "one rank's bytes (1 GPU, bf16, job's batch) / 4x192 GiB"),
    Feature("gpus", 0, 1, "log2(1 + GPUs held)/log2(65)"),
    Feature("compression", 0, 1, "current compression option / 5"),
    Feature("precision", 0, 1, "current precision option / 4"),
    Feature("mode", 0, 1, "current layout mode / 2"),
    Feature("batch", 0, 1, "current batch-scale option / 3"),
    Feature("checkpointing", 0, 1, "1 if activation checkpointing is on"),
    Feature("accumulation", 0, 1, "log2(micro-batches)/6"),
    Feature("hardware_efficiency", 0, 1, "samples/s over the compute-bound rate"),
    Feature("statistical_efficiency", 0, 1, "of the current batch, compression, precision"),
    Feature("progress", 0, 1, "share of the job's work done"),
    Feature("gpu_model", 0, 1, "(index of the GPU model it runs on + 1) / 4; 0 if none"),
    Feature("tenant_quota", 0, 1, "its tenant's GPU quota / the cluster's GPUs; 0 if none"),
    Feature("tenant_headroom", 0, 1, "0.5 + (its tenant's quota - GPUs held) / 2 / GPUs"),
)


def _features() -> tuple[tuple[int, str, Feature], ...]:
    rows: list[tuple[int, str, Feature]] = []
    index = 0
    for f in GLOBAL:
        rows.append((index, f.name, f))
        index += 1
    for m in range(MAX_GPU_MODELS):
        for f in GPU_MODEL:
            rows.append((index, f"gpu{m}.{f.name}", f))
            index += 1
    for f in SLOT:
        rows.append((index, f"slot[k].{f.name}", f))
        index += 1
    return tuple(rows)


FEATURES: Final = _features()
"""(index, name, feature) of the global and GPU-model features and of slot 0; slot k's
features start at ``HEADER + k * len(SLOT)``."""
HEADER: Final = len(GLOBAL) + MAX_GPU_MODELS * len(GPU_MODEL)


def observation_size(slots: int) -> int:
    return HEADER + slots * len(SLOT)


_LOGGED_LAYOUTS: Final = (
    (len(GLOBAL), len(SLOT)),
    (len(GLOBAL), len(SLOT) - 2),
    (len(GLOBAL) - 2, len(SLOT) - 2),
)
"""(global features, features per slot) of the layouts an observation may have been
logged in, newest first: today's; before the ``tenant_quota`` and ``tenant_headroom``
slot features (they come last in a slot); before the ``round`` and ``restart`` global
features as well (they come last among the global features)."""


def from_log(stored: np.ndarray, jobs: int) -> np.ndarray:
    """A logged observation of ``jobs`` slots (its stored head) in today's layout, padded
    to at least one slot. One logged before a feature existed gets it as not known: the
    ``round`` and ``restart`` global features as 0, a slot's tenant features as on a
    cluster without quotas (0 and 0.5). The layout is told by the length."""
    stored = np.asarray(stored, dtype=np.float32)
    models = MAX_GPU_MODELS * len(GPU_MODEL)
    layout = next(
        ((g, w) for g, w in _LOGGED_LAYOUTS if len(stored) == g + models + jobs * w), None
    )
    if layout is not None and layout != _LOGGED_LAYOUTS[0]:
        g, w = layout
        head = (stored[:g], np.zeros(len(GLOBAL) - g, np.float32), stored[g : g + models])
        missing = np.tile(np.array([0.0, 0.5], np.float32)[: len(SLOT) - w], (jobs, 1))
        slots = np.hstack([stored[g + models :].reshape(jobs, w), missing])
        stored = np.concatenate([*head, slots.ravel()])
    out = np.zeros(observation_size(max(jobs, 1)), dtype=np.float32)
    out[: len(stored)] = stored[: len(out)]
    return out


def observation_bounds(slots: int) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bound of every entry of an observation for ``slots`` slots (the
    environment's ``Box``)."""
    features = [f for _, _, f in FEATURES[:HEADER]] + list(SLOT) * slots
    low = np.array([f.low for f in features], np.float32)
    high = np.array([f.high for f in features], np.float32)
    return low, high


# -- the cluster as the policy sees it -------------------------------------------------


def _speed(gpu_model: str) -> float:
    peaks = device(gpu_model).peak_tflops
    return max(peaks[p] for p in fast_precisions(peaks) if p != "fp8")


def gpu_models(nodes: Sequence[NodeInfo]) -> list[str]:
    """The cluster's GPU models, fastest first (16-bit peak, else fp32); name breaks ties."""
    return sorted(node_table(nodes).gpus_by_model, key=lambda m: (-_speed(m), m))


def slot_jobs(snapshot: ClusterSnapshot, slots: int) -> list[JobStatus]:
    """The jobs in the policy's slots."""
    return snapshot.queue_order()[:slots]


def round_slots(snapshot: ClusterSnapshot, slots: int, *, every_job: bool) -> int:
    """The slots a round is encoded with: ``slots``, or one for each active job where
    there are more and ``every_job`` (a policy shared across slots decides them all)."""
    return max(slots, len(snapshot.queue_order())) if every_job else slots


def _restart_feature(restart_s: float, round_s: float) -> float:
    if restart_s <= 0:
        return 0.0
    return min(1.0, max(0.0, (math.log10(restart_s / round_s) + 2) / 4))


def _log_share(n: int) -> float:
    return min(1.0, math.log1p(n) / math.log(1001))


def _log2_over(value: float, top: float) -> float:
    return min(1.0, max(0.0, math.log2(max(value, 1.0)) / top))


class ObservationEncoder:
    """Snapshot -> observation vector. It remembers the cluster's earlier rounds (the
    busy share for ``busy_last``; the GPU demand per real minute for the forecast), so
    one encoder follows one cluster.

    ``forecaster`` (an ``autotune.demand.DemandForecaster``: the LSTM of
    ``autotune.policies.forecast``, its persistence fallback) fills the arrival
    probabilities and the headroom from the demand of every round so far, put on real
    minutes whatever the round period. ``None``: no forecast (``NoForecast``: no arrival
    expected, headroom from demand now).

    ``restart_s`` is what a reconfiguration costs where the snapshot does not say
    (``ClusterSnapshot.restart_s``, which a backend that measures its restarts fills): the
    simulated cluster's charge, which it knows without measuring.
    """

    def __init__(
        self,
        slots: int,
        *,
        round_s: float,
        restart_s: float = DEFAULT_RESTART_S,
        forecaster: DemandForecaster | None = None,
    ) -> None:
        if slots < 1:
            raise ValueError(f"slots={slots!r}: must be >= 1")
        if not round_s > 0:
            raise ValueError(f"round_s={round_s!r}: must be > 0")
        self.slots = slots
        self.round_s = round_s
        self.restart_s = restart_s
        self.forecaster = forecaster
        self._busy: list[float] = []
        self.demand = DemandHistory()
        self.forecast: DemandForecast | None = None

    def reset(self) -> None:
        self._busy = []
        self.demand.clear()
        self.forecast = None

    def continue_from(self, other: ObservationEncoder) -> None:
        """Take over ``other``'s memory of the cluster (the busy share of every round,
        the demand per minute, its newest forecast), as if this encoder had followed the
        cluster all along: a policy swapped in mid-run keeps its forecast features."""
        self._busy = list(other._busy)
        self.demand.copy_from(other.demand)
        self.forecast = other.forecast

    def encode(self, snapshot: ClusterSnapshot, *, slots: int | None = None) -> np.ndarray:
        """The observation of ``snapshot`` with ``slots`` slots (default: the encoder's;
        more serve every active job to a policy shared across slots)."""
        slots = self.slots if slots is None else slots
        if slots < 1:
            raise ValueError(f"slots={slots!r}: must be >= 1")
        obs = np.zeros(observation_size(slots), dtype=np.float32)
        table = node_table(snapshot.nodes)
        total = float(table.total_gpus) or 1.0
        held = snapshot.held_gpus()
        models = gpu_models(table.gpu_nodes)
        busy = min(1.0, sum(held.values()) / total)
        last = self._busy[-1] if self._busy else 0.0
        self._busy.append(busy)
        self.demand.record(snapshot.time_s, snapshot.demand_gpus())
        self.forecast = self.demand.forecast(
            self.forecaster or NoForecast(), snapshot.capacity_gpus() or total
        )
        active = snapshot.queue_order()
        pending = sum(1 for j in active if j.state == "pending")
        obs[: len(GLOBAL)] = (
            _log_share(pending),
            _log_share(len(active) - pending),
            max(0, len(active) - slots) / max(1, len(active)),
            busy,
            last,
            min(1.0, max(0.0, self.forecast.p_arrival[15])),
            min(1.0, max(0.0, self.forecast.p_arrival[60])),
            self.forecast.headroom(60, 0.95),
            min(1.0, math.log10(1 + self.round_s) / 5),
            _restart_feature(
                self.restart_s if snapshot.restart_s is None else snapshot.restart_s,
                self.round_s,
            ),
        )
        fastest = _speed(models[0]) if models else 1.0
        for i, model in enumerate(models[:MAX_GPU_MODELS]):
            spec = device(model)
            fast = fast_precisions(spec.peak_tflops)
            count = table.gpus_by_model[model]
            used = sum(
                v for k, v in held.items() if (n := table.by_id.get(k)) and n.gpu_model == model
            )
            base = len(GLOBAL) + i * len(GPU_MODEL)
            obs[base : base + len(GPU_MODEL)] = (
                1.0,
                count / total,
                max(0.0, count - used) / total,
                min(1.0, spec.memory_bytes / _LARGEST_GPU_BYTES),
                float("bf16" in fast),
                float("fp8" in fast),
                _speed(model) / fastest,
            )
        quotas = {name: t.nominal_gpus for name, t in snapshot.tenants.items()}
        tenant_held = snapshot.tenant_gpus() if any(quotas.values()) else None
        for slot, job in enumerate(active[:slots]):
            base = HEADER + slot * len(SLOT)
            quota = quotas.get(job.spec.tenant, 0)
            headroom = 0.5
            if tenant_held is not None:
                room = (quota - tenant_held.get(job.spec.tenant, 0.0)) / total
                headroom = min(1.0, max(0.0, 0.5 + room / 2))
            obs[base : base + len(SLOT)] = (
                *self._slot(snapshot, job, table.by_id, models),
                min(1.0, quota / total),
                headroom,
            )
        return obs

    @staticmethod
    def _slot(
        snapshot: ClusterSnapshot,
        job: JobStatus,
        nodes: Mapping[str, NodeInfo],
        models: list[str],
    ) -> tuple[float, ...]:
        spec, model = job.spec, job.profile
        running = job.state == "running" and job.placement is not None
        waiting_h = max(0.0, snapshot.time_s - spec.submitted_at) / 3600 if not running else 0.0
        config = job.config
        comp = prec = mode = batch = ckpt = 0
        batch = _UNIT_BATCH
        accumulation = 0.0
        hardware = statistical = 0.0
        gpu_model = 0.0
        if config is not None:
            comp, prec, _gpus_i, mode, batch, ckpt = config_indices(config, spec)
            accumulation = _log2_over(config.layout.micro_batches, 6)
            statistical = statistical_efficiency(model, config, config.batch(spec))
        held = 0
        if running and config is not None and job.placement is not None:
            held = job.placement.world_size
            if model is not None and all(s.node_id in nodes for s in job.placement.ranks):
                bound = compute_bound_samples_per_s(model, config, job.placement, nodes)
                hardware = min(1.0, job.samples_per_s / bound) if bound > 0 else 0.0
            first = nodes.get(job.placement.ranks[0].node_id)
            if first is not None and first.gpu_model in models[:MAX_GPU_MODELS]:
                gpu_model = (models.index(first.gpu_model) + 1) / MAX_GPU_MODELS
        need = _memory_need(model, spec.global_batch) if model is not None else 0.0
        return (
            1.0,
            float(running),
            min(1.0, math.log1p(waiting_h) / math.log(101)),
            min(1.0, math.log10(model.parameters) / 12) if model else 0.0,
            min(1.0, math.log10(model.flops_per_sample) / 16) if model else 0.0,
            float(model is not None and model.hidden_size > 0),
            _log2_over(spec.min_gpus, 6),
            _log2_over(spec.max_gpus, 6),
            need,
            math.log2(1 + held) / math.log2(65) if held <= 64 else 1.0,
            comp / (len(COMPRESSIONS) - 1),
            prec / (len(PRECISION_MAPS) - 1),
            mode / (len(LAYOUT_MODES) - 1),
            batch / (len(BATCH_SCALES) - 1),
            float(ckpt),
            accumulation,
            hardware,
            min(1.0, statistical),
            min(1.0, max(0.0, job.progress)),
            gpu_model,
        )


@lru_cache(maxsize=4096)
def _memory_need(model: ModelProfile, batch: int) -> float:
    """One rank's bytes on one GPU in bf16 at the job's batch, over 4x the largest GPU."""
    one = JobConfig(layout=Layout(world_size=1), precision=PRECISION_MAPS[1])
    return min(1.0, rank_memory(model, one, batch).total_bytes / (4 * _LARGEST_GPU_BYTES))
