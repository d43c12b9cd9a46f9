"""The action a policy takes: what each job slot's entries mean, and back.

Part of the reinforcement-learning contract (``autotune.rl``): the environment decodes an
action with ``decode_action``, the daemon's learned policy with ``decode_slot``, replay
encodes a logged configuration with ``encode_config``; all of them work on the daemon's
own types (``ClusterSnapshot`` in, ``PolicyChoice`` out).

Per slot, ``ACTION_FIELDS`` in order: reconfigure a running job now (1) or keep its
configuration (0; a waiting job is always configured), compression, precision map, GPU
count, layout mode, batch scale, activation checkpointing. An entry out of its range is
rejected (``InvalidActionError``), never wrapped. The decoded configuration then passes
the decision step's memory rule (gradient accumulation, then checkpointing, until a rank
fits: ``autotune.perf.memory.fit_memory``) and the Planner.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

import numpy as np

from autotune.core import (
    MILLI_PER_GPU,
    CompressionSpec,
    JobConfig,
    JobSpec,
    Layout,
    PrecisionMap,
)
from autotune.errors import InputError
from autotune.interfaces import ClusterSnapshot, JobStatus, PolicyChoice

__all__ = [
    "ACTION_DIMS",
    "ACTION_FIELDS",
    "BATCH_SCALES",
    "COMPRESSIONS",
    "GPU_OPTIONS",
    "LAYOUT_MODES",
    "PIPELINE_MICRO_BATCHES",
    "PRECISION_MAPS",
    "InvalidActionError",
    "check_action",
    "config_indices",
    "decode_action",
    "decode_slot",
    "encode_config",
    "slot_config",
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


class InvalidActionError(InputError):
    """An action entry outside its range, or an action of the wrong length."""


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


def check_action(action: np.ndarray, slots: int) -> np.ndarray:
    """``action`` as integers, checked: ``slots`` times ``ACTION_DIMS`` entries, each in
    its range (``InvalidActionError`` naming the first that is not)."""
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
    flat = check_action(action, slots)
    width = len(ACTION_DIMS)
    active = snapshot.queue_order()
    choices: dict[str, PolicyChoice] = {}
    for slot, job in enumerate(active[:slots]):
        choice = decode_slot(flat[slot * width : (slot + 1) * width], job, slot, source=source)
        if choice is not None:
            choices[job.spec.job_id] = choice
    choices.update(wait_choices(active, slots))
    return choices
