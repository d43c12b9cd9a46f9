"""The one observation encoder and the one action decoder.

Both work on the daemon's own types (``ClusterSnapshot`` in, ``PolicyChoice`` out), so
the Gymnasium environment (``autotune.envs.cluster_env``), the daemon's learned policy
(``autotune.policies.serving``) and replay see and act on the same numbers.

**Slots.** A policy acts on ``slots`` job slots: the first ``slots`` active jobs in
queue order (higher priority first, then earlier submission, then id: the Planner's
order). Jobs behind them are never dropped: a waiting one gets a ``wait`` choice naming
its queue position, a running one keeps its configuration, and each moves into the
window as jobs ahead of it finish.

**Observation.** ``GLOBAL`` features, then ``GPU_MODEL`` features for each of up to
``MAX_GPU_MODELS`` GPU models (fastest first), then ``SLOT`` features per slot. Every
feature has declared bounds; ``FEATURES`` lists them (index, name, range, meaning) and the
environment's docstring prints the same table.

**Action in the Pollux-compatible mode** (``knobs="pollux"``): one number per slot,
log2 of the job's weight in the goodput allocation (``POLLUX_WEIGHT_RANGE``;
``pollux_action_space``, ``decode_weights``), which turns weights into each job's GPU
count and batch size (``autotune.policies.goodput``).

**Action.** Per slot, ``ACTION_FIELDS`` in order: reconfigure a running job now (1) or
keep its configuration (0; a waiting job is always configured), compression, precision
map, GPU count, layout mode, batch scale, activation checkpointing. An entry out of its
range is rejected (``InvalidActionError``), never wrapped. The decoded configuration then
passes the decision step's memory rule (gradient accumulation, then checkpointing, until
a rank fits: ``autotune.perf.memory.fit_memory``) and the Planner.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

import numpy as np
from gymnasium import spaces

from autotune.catalog.devices import device
from autotune.core import (
    MILLI_PER_GPU,
    CompressionSpec,
    JobConfig,
    JobSpec,
    Layout,
    ModelProfile,
    NodeInfo,
    PrecisionMap,
)
from autotune.demand import DemandForecast, DemandForecaster, DemandHistory, NoForecast
from autotune.errors import InputError
from autotune.interfaces import ClusterSnapshot, JobStatus, PolicyChoice
from autotune.perf.memory import rank_memory
from autotune.perf.model import compute_bound_samples_per_s, statistical_efficiency

__all__ = [
    "ACTION_DIMS",
    "ACTION_FIELDS",
    "BATCH_SCALES",
    "COMPRESSIONS",
    "FEATURES",
    "GPU_OPTIONS",
    "LAYOUT_MODES",
    "MAX_GPU_MODELS",
    "POLLUX_WEIGHT_RANGE",
    "PRECISION_MAPS",
    "Feature",
    "InvalidActionError",
    "ObservationEncoder",
    "action_space",
    "decode_action",
    "decode_slot",
    "decode_weights",
    "encode_config",
    "encode_weights",
    "gpu_models",
    "pollux_action_space",
    "queue_order",
    "slot_config",
    "slot_jobs",
    "wait_choices",
]

COMPRESSIONS: Final = (
    CompressionSpec(),
    CompressionSpec(kind="topk", ratio=0.1),
    CompressionSpec(kind="topk", ratio=0.01),
    CompressionSpec(kind="int8"),
    CompressionSpec(kind="fp8"),
    CompressionSpec(kind="powersgd", rank=4),
)
PRECISION_MAPS: Final = (
    PrecisionMap.uniform("fp32"),
    PrecisionMap.uniform("bf16"),
    PrecisionMap.uniform("fp16"),
    # Feed-forward matmuls (57% of a GPT's weights) in fp8, everything else bf16.
    PrecisionMap(
        embedding="bf16",
        attention_qkv="bf16",
        attention_out="bf16",
        ffn="fp8",
        head="bf16",
    ),
    PrecisionMap.uniform("fp8"),
)
GPU_OPTIONS: Final = (1, 2, 4, 8, 16, 32, 64)
LAYOUT_MODES: Final = ("dp", "dp x tp2", "dp x pp2")
BATCH_SCALES: Final = (0.5, 1.0, 2.0, 4.0)
PIPELINE_MICRO_BATCHES: Final = 4
"""Micro-batches of a two-stage pipeline before the memory rule (bubble 1/5)."""
ACTION_FIELDS: Final = (
    ("change", 2),
    ("compression", len(COMPRESSIONS)),
    ("precision", len(PRECISION_MAPS)),
    ("gpus", len(GPU_OPTIONS)),
    ("mode", len(LAYOUT_MODES)),
    ("batch", len(BATCH_SCALES)),
    ("checkpointing", 2),
)
ACTION_DIMS: Final = tuple(n for _, n in ACTION_FIELDS)
MAX_GPU_MODELS: Final = 4
POLLUX_WEIGHT_RANGE: Final = (-6.0, 6.0)
"""Bounds of the Pollux-compatible mode's action entry: log2 of a job's weight in the
goodput allocation (a weight of 1/64 to 64; beyond is clipped)."""
_UNIT_BATCH: Final = BATCH_SCALES.index(1.0)
_LARGEST_GPU_BYTES: Final = 192 * (1 << 30)


class InvalidActionError(InputError):
    """An action entry outside its range, or an action of the wrong length."""


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
)
GPU_MODEL: Final = (
    Feature("present", 0, 1, "1 if the cluster has this GPU model"),
    Feature("total", 0, 1, "its GPUs / the cluster's GPUs"),
    Feature("free", 0, 1, "its free GPUs / the cluster's GPUs"),
    Feature("memory", 0, 1, "memory of one GPU / 192 GiB"),
    Feature("bf16", 0, 1, "1 if it has bf16 units"),
    Feature("fp8", 0, 1, "1 if it has fp8 units"),
    Feature("speed", 0, 1, "its 16-bit (else fp32) peak / the fastest model's"),
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


def observation_space(slots: int) -> spaces.Box:
    features = [f for _, _, f in FEATURES[:HEADER]] + list(SLOT) * slots
    low = np.array([f.low for f in features], np.float32)
    high = np.array([f.high for f in features], np.float32)
    return spaces.Box(low, high, dtype=np.float32)


def action_space(slots: int) -> spaces.MultiDiscrete:
    return spaces.MultiDiscrete(np.array(ACTION_DIMS * slots, dtype=np.int64))


# -- the cluster as the policy sees it -------------------------------------------------


def _speed(gpu_model: str) -> float:
    peaks = device(gpu_model).peak_tflops
    return float(peaks.get("bf16", peaks.get("fp16", peaks["fp32"])))


def gpu_models(nodes: Sequence[NodeInfo]) -> list[str]:
    """The cluster's GPU models, fastest first (16-bit peak, else fp32); name breaks ties."""
    return sorted({n.gpu_model for n in nodes if n.gpu_count > 0}, key=lambda m: (-_speed(m), m))


def queue_order(snapshot: ClusterSnapshot) -> list[JobStatus]:
    """Active jobs as the Planner takes them: priority, submission, id
    (``ClusterSnapshot.queue_order``)."""
    return snapshot.queue_order()


def slot_jobs(snapshot: ClusterSnapshot, slots: int) -> list[JobStatus]:
    """The jobs in the policy's slots."""
    return queue_order(snapshot)[:slots]


def _log_share(n: int) -> float:
    return min(1.0, math.log1p(n) / math.log(1001))


def _log2_over(value: float, top: float) -> float:
    return min(1.0, max(0.0, math.log2(max(value, 1.0)) / top))


def config_indices(config: JobConfig, spec: JobSpec) -> tuple[int, int, int, int, int, int]:
    """A configuration as the nearest action entries: compression, precision, GPUs,
    mode, batch scale, checkpointing."""
    comp = COMPRESSIONS.index(config.compression) if config.compression in COMPRESSIONS else 0
    if config.precision in PRECISION_MAPS:
        prec = PRECISION_MAPS.index(config.precision)
    else:
        lowest = config.precision.lowest()
        prec = {"fp32": 0, "bf16": 1, "fp16": 2, "fp8": 4}[lowest]
    layout = config.layout
    gpus = max(i for i, n in enumerate(GPU_OPTIONS) if n <= max(1, layout.world_size))
    mode = 1 if layout.tp > 1 else 2 if layout.pp > 1 else 0
    scale = config.batch(spec) / spec.global_batch
    batch = min(range(len(BATCH_SCALES)), key=lambda i: abs(math.log(BATCH_SCALES[i] / scale)))
    return comp, prec, gpus, mode, batch, int(layout.activation_checkpointing)


def encode_config(config: JobConfig, spec: JobSpec, *, change: bool = True) -> list[int]:
    """The action entries of one slot that decode to (about) ``config``: what a teacher
    policy's choice means in the learned policy's action space."""
    return [int(change), *config_indices(config, spec)]


class ObservationEncoder:
    """Snapshot -> observation vector. It remembers the cluster's earlier rounds (the
    busy share for ``busy_last``; the GPU demand per real minute for the forecast), so
    one encoder follows one cluster.

    ``forecaster`` (an ``autotune.demand.DemandForecaster``: the LSTM of
    ``autotune.policies.forecast``, its persistence fallback) fills the arrival
    probabilities and the headroom from the demand of every round so far, put on real
    minutes whatever the round period. ``None``: no forecast (``NoForecast``: no arrival
    expected, headroom from demand now).
    """

    def __init__(
        self,
        slots: int,
        *,
        round_s: float,
        forecaster: DemandForecaster | None = None,
    ) -> None:
        if slots < 1:
            raise ValueError(f"slots={slots!r}: must be >= 1")
        self.slots = slots
        self.round_s = round_s
        self.forecaster = forecaster
        self.space = observation_space(slots)
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

    def encode(self, snapshot: ClusterSnapshot) -> np.ndarray:
        obs = np.zeros(observation_size(self.slots), dtype=np.float32)
        nodes = [n for n in snapshot.nodes if n.gpu_count > 0]
        total = float(sum(n.gpu_count for n in nodes)) or 1.0
        held = snapshot.held_gpus()
        models = gpu_models(nodes)
        node_model = {n.node_id: n.gpu_model for n in nodes}
        busy = min(1.0, sum(held.values()) / total)
        last = self._busy[-1] if self._busy else 0.0
        self._busy.append(busy)
        self.demand.record(snapshot.time_s, snapshot.demand_gpus())
        self.forecast = self.demand.forecast(
            self.forecaster or NoForecast(), snapshot.capacity_gpus() or total
        )
        active = queue_order(snapshot)
        pending = sum(1 for j in active if j.state == "pending")
        obs[: len(GLOBAL)] = (
            _log_share(pending),
            _log_share(len(active) - pending),
            max(0, len(active) - self.slots) / max(1, len(active)),
            busy,
            last,
            min(1.0, max(0.0, self.forecast.p_arrival[15])),
            min(1.0, max(0.0, self.forecast.p_arrival[60])),
            self.forecast.headroom(60, 0.95),
        )
        fastest = _speed(models[0]) if models else 1.0
        for i, model in enumerate(models[:MAX_GPU_MODELS]):
            spec = device(model)
            count = sum(n.gpu_count for n in nodes if n.gpu_model == model)
            used = sum(v for k, v in held.items() if node_model.get(k) == model)
            base = len(GLOBAL) + i * len(GPU_MODEL)
            obs[base : base + len(GPU_MODEL)] = (
                1.0,
                count / total,
                max(0.0, count - used) / total,
                min(1.0, spec.memory_bytes / _LARGEST_GPU_BYTES),
                float("bf16" in spec.peak_tflops),
                float("fp8" in spec.peak_tflops),
                _speed(model) / fastest,
            )
        by_id = {n.node_id: n for n in nodes}
        for slot, job in enumerate(active[: self.slots]):
            base = HEADER + slot * len(SLOT)
            obs[base : base + len(SLOT)] = self._slot(snapshot, job, by_id, models)
        return obs

    @staticmethod
    def _slot(
        snapshot: ClusterSnapshot,
        job: JobStatus,
        nodes: dict[str, NodeInfo],
        models: list[str],
    ) -> tuple[float, ...]:
        spec, model = job.spec, job.spec.model
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


# -- actions ----------------------------------------------------------------------------


def _check(action: np.ndarray, slots: int) -> np.ndarray:
    flat = np.asarray(action)
    if flat.shape != (slots * len(ACTION_DIMS),):
        raise InvalidActionError(
            f"action of shape {flat.shape}: expected ({slots * len(ACTION_DIMS)},), "
            f"{len(ACTION_DIMS)} entries per slot for {slots} slots"
        )
    if not np.issubdtype(flat.dtype, np.integer) and not np.all(np.equal(np.mod(flat, 1), 0)):
        raise InvalidActionError("action entries must be integers")
    flat = flat.astype(np.int64)
    nvec = np.array(ACTION_DIMS * slots)
    bad = np.nonzero((flat < 0) | (flat >= nvec))[0]
    if len(bad):
        i = int(bad[0])
        name, size = ACTION_FIELDS[i % len(ACTION_DIMS)]
        raise InvalidActionError(
            f"slot {i // len(ACTION_DIMS)}: {name}={int(flat[i])} is outside 0..{size - 1}"
        )
    return flat


def slot_config(spec: JobSpec, entries: Sequence[int]) -> JobConfig:
    """The configuration one slot's entries (after ``change``) mean for ``spec``: the GPU
    count clipped to the job's bounds, a tensor or pipeline degree of 2 only where the
    GPU count is even and the model allows it, the batch scaled (at least one sample per
    data-parallel rank)."""
    comp, prec, gpus_i, mode, batch_i, ckpt = (int(e) for e in entries)
    gpus = min(max(GPU_OPTIONS[gpus_i], spec.min_gpus), spec.max_gpus)
    if spec.gpu_milli < MILLI_PER_GPU:
        gpus = 1
    model = spec.model
    tp = pp = 1
    if mode == 1 and gpus % 2 == 0 and model is not None and model.hidden_size > 0:
        tp = 2
    elif mode == 2 and gpus % 2 == 0 and model is not None and model.num_layers >= 2:
        pp = 2
    dp = gpus // (tp * pp)
    scale = BATCH_SCALES[batch_i]
    global_batch = None
    if scale != 1.0:
        global_batch = max(dp, round(spec.global_batch * scale))
    elif spec.global_batch < dp:
        global_batch = dp
    layout = Layout(
        world_size=gpus,
        dp=dp,
        tp=tp,
        pp=pp,
        micro_batches=PIPELINE_MICRO_BATCHES if pp > 1 else 1,
        activation_checkpointing=bool(ckpt),
    )
    return JobConfig(
        layout=layout,
        precision=PRECISION_MAPS[prec],
        compression=COMPRESSIONS[comp],
        global_batch=global_batch,
    )


def decode_slot(
    entries: Sequence[int] | np.ndarray, job: JobStatus, slot: int, *, source: str = "ppo"
) -> PolicyChoice | None:
    """One slot's choice for ``job``: ``None`` when a running job keeps its
    configuration (``change`` is 0). A waiting job in a slot is always configured: the
    Planner, not the policy, decides whether it fits now (a policy that could hold jobs
    back starves them whenever it errs)."""
    change = bool(entries[0])
    if not change and job.state == "running" and job.config is not None:
        return None
    config = slot_config(job.spec, [int(e) for e in entries[1:]])
    verb = "reconfigured" if job.state == "running" else "chosen"
    return PolicyChoice(
        config=config,
        reason=f"{source} (slot {slot}): {verb} {config.describe()}",
        features={"slot": float(slot)},
    )


def wait_choices(active: Sequence[JobStatus], slots: int) -> dict[str, PolicyChoice]:
    """``wait`` choices for the pending jobs behind the policy's slots, with their queue
    position (``active`` in queue order)."""
    return {
        job.spec.job_id: PolicyChoice(
            config=None,
            reason=(
                f"waiting: position {position} in the queue; the policy decides the "
                f"first {slots} active jobs each round"
            ),
        )
        for position, job in enumerate(active[slots:], start=slots + 1)
        if job.state == "pending"
    }


def decode_action(
    action: np.ndarray, snapshot: ClusterSnapshot, slots: int, *, source: str = "ppo"
) -> dict[str, PolicyChoice]:
    """The choices an action means: for every waiting job in a slot, and every running
    one whose ``change`` entry is 1, its configuration; for waiting jobs beyond the slots,
    a ``wait`` choice with their queue position. Raises
    ``InvalidActionError`` for an entry out of range."""
    flat = _check(action, slots)
    width = len(ACTION_DIMS)
    active = queue_order(snapshot)
    choices: dict[str, PolicyChoice] = {}
    for slot, job in enumerate(active[:slots]):
        choice = decode_slot(flat[slot * width : (slot + 1) * width], job, slot, source=source)
        if choice is not None:
            choices[job.spec.job_id] = choice
    choices.update(wait_choices(active, slots))
    return choices


# -- the Pollux-compatible mode's action ---------------------------------------------


def pollux_action_space(slots: int) -> spaces.Box:
    """One entry per slot: log2 of the job's weight in the goodput allocation."""
    low, high = POLLUX_WEIGHT_RANGE
    return spaces.Box(low, high, (slots,), dtype=np.float32)


def decode_weights(action: np.ndarray, snapshot: ClusterSnapshot, slots: int) -> dict[str, float]:
    """The slot jobs' weights an action of ``pollux_action_space`` means (entries beyond
    ``POLLUX_WEIGHT_RANGE`` clipped, as for any bounded continuous action). Raises
    ``InvalidActionError`` for a wrong length or a value that is not a number; jobs
    beyond the slots keep weight 1."""
    flat = np.asarray(action, dtype=np.float64).reshape(-1)
    if flat.shape != (slots,):
        raise InvalidActionError(f"action has {flat.size} entries; expected {slots}")
    if not np.isfinite(flat).all():
        raise InvalidActionError("action has an entry that is not a finite number")
    low, high = POLLUX_WEIGHT_RANGE
    return {
        job.spec.job_id: float(2.0 ** np.clip(flat[slot], low, high))
        for slot, job in enumerate(slot_jobs(snapshot, slots))
    }


def encode_weights(weights: dict[str, float], snapshot: ClusterSnapshot, slots: int) -> np.ndarray:
    """The action that decodes to (about) ``weights`` (a slot whose job has none: 1)."""
    low, high = POLLUX_WEIGHT_RANGE
    out = np.zeros(slots, dtype=np.float32)
    for slot, job in enumerate(slot_jobs(snapshot, slots)):
        weight = weights.get(job.spec.job_id, 1.0)
        out[slot] = float(np.clip(math.log2(weight), low, high))
    return out
