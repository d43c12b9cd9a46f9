"""The packing fallback (step 6): a job that no equal blocks could place takes the free
GPUs as they are, on one GPU model; and, where the plan allows it, a data-parallel job
that no single model has room for takes free GPUs of several models, when the
performance model says that beats the free GPUs of its best model alone."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from autotune.core import MILLI_PER_GPU, Placement, RankSlot
from autotune.perf.model import Shape, estimate, rank_batches, rank_speed, shape_of
from autotune.planner.arrays import IntArray
from autotune.planner.capacity import FreeCapacity
from autotune.planner.jobs import PreparedJob, mixable, spans_nodes


def _room(job: PreparedJob, state: FreeCapacity) -> tuple[IntArray, int, int]:
    """Per node: how many of the job's whole-GPU ranks it has room for (GPUs, and each
    rank's share of the job's CPU and memory); and that share (cores, MiB)."""
    spec, world = job.spec, job.world
    cpu = math.ceil(spec.cpu_milli / world)
    mem = math.ceil(spec.memory_mib / world)
    room: IntArray = (state.free_milli >= MILLI_PER_GPU).sum(axis=1)
    if cpu:
        room = np.minimum(room, state.free_cpu // cpu)
    if mem:
        room = np.minimum(room, state.free_mem // mem)
    return room, cpu, mem


def _fill(order: list[int], room: IntArray, world: int) -> list[tuple[int, int]]:
    """``(node, ranks)`` taking as many ranks on each node of ``order`` as it has room
    for, until ``world``."""
    takes: list[tuple[int, int]] = []
    left = world
    for node in order:
        take = min(int(room[node]), left)
        if take == 0:
            break
        takes.append((node, take))
        left -= take
    return takes


def _take(
    job: PreparedJob, state: FreeCapacity, takes: list[tuple[int, int]], cpu: int, mem: int
) -> Placement:
    """Commit ``takes`` (from ``_fill``) on ``state``: the ranks in node order."""
    slots: list[RankSlot] = []
    for node, take in takes:
        gpus = [int(g) for g in np.flatnonzero(state.free_milli[node] >= MILLI_PER_GPU)[:take]]
        state.take(node, gpus, MILLI_PER_GPU, cpu * take, mem * take)
        first = len(slots)
        slots.extend(
            RankSlot(
                rank=first + i,
                node_id=state.nodes[node].node_id,
                gpu_index=gpu,
                gpu_milli=MILLI_PER_GPU,
            )
            for i, gpu in enumerate(gpus)
        )
    return Placement(job_id=job.spec.job_id, ranks=tuple(slots))


def _most_room_first(job: PreparedJob, nodes: IntArray, room: IntArray) -> list[int]:
    order = sorted(nodes.tolist(), key=lambda n: (-int(room[n]), n))
    return order if job.spec.max_nodes is None else order[: job.spec.max_nodes]


def pack_greedy(job: PreparedJob, state: FreeCapacity) -> Placement | None:
    """Whole-GPU ranks without tensor parallelism on nodes of one allowed model (a job of
    several ranks: one that may span nodes), the nodes with the most free GPUs first
    (ties: the first node), as many ranks on each as it has room for (GPUs, and each
    rank's share of the job's CPU and memory), within ``max_nodes``. ``None`` when no
    model has room for every rank."""
    spec, world = job.spec, job.world
    if spec.gpu_milli < MILLI_PER_GPU or job.config.layout.tp > 1:
        return None
    if world > 1 and not spans_nodes(job):
        return None
    room, cpu, mem = _room(job, state)
    for model in np.flatnonzero(job.allowed):
        nodes = np.flatnonzero(state.gpu_nodes & (state.model_safe == model) & (room > 0))
        order = _most_room_first(job, nodes, room)
        if sum(int(room[n]) for n in order) < world:
            continue
        return _take(job, state, _fill(order, room, world), cpu, mem)
    return None


def split_of(placement: Placement, state: FreeCapacity) -> dict[str, int]:
    """A placement's ranks per GPU model (``?`` for a node not in ``state``)."""
    return placement.ranks_by_model(
        {
            node_id: state.nodes[i].gpu_model
            if (i := state.index.get(node_id)) is not None
            else "?"
            for node_id in placement.nodes
        }
    )


def pack_split(job: PreparedJob, state: FreeCapacity, split: Mapping[str, int]) -> Placement | str:
    """The job's whole-GPU data-parallel ranks split across GPU models as ``split``
    says (model -> ranks): on each model's nodes those with the most free GPUs first,
    within ``max_nodes`` in all; committed on ``state``. Why not, where it cannot be
    (the split is not the job's size, a model it may not use, too few free GPUs)."""
    spec, world = job.spec, job.world
    parts = " + ".join(f"{n}x{m}" for m, n in split.items())
    layout = job.config.layout
    if spec.gpu_milli < MILLI_PER_GPU or layout.tp > 1 or layout.pp > 1:
        return f"no split across GPU models ({parts}) for a job of GPU shares or tp/pp"
    if sum(split.values()) != world:
        return f"split across GPU models {parts} is not the job's {world} ranks"
    room, cpu, mem = _room(job, state)
    takes: list[tuple[int, int]] = []
    for name, count in split.items():
        if name not in state.models or not job.allowed[state.models.index(name)]:
            return f"split across GPU models {parts}: it may not run on {name}"
        model = state.models.index(name)
        nodes = np.flatnonzero(state.gpu_nodes & (state.model_safe == model) & (room > 0))
        order = _most_room_first(job, nodes, room)
        have = sum(int(room[n]) for n in order)
        if have < count:
            return f"split across GPU models {parts}: {have} {name} free for it"
        takes.extend(_fill(order, room, count))
    if spec.max_nodes is not None and len(takes) > spec.max_nodes:
        return f"split across GPU models {parts}: more than its {spec.max_nodes} node(s)"
    return _take(job, state, takes, cpu, mem)


@dataclass(frozen=True, slots=True)
class Mixed:
    """What ``pack_mixed`` found: a placement across GPU models (``None`` where it did
    not pay or did not fit) and the sentence that says why."""

    placement: Placement | None
    why: str


def _shape(job: PreparedJob, state: FreeCapacity, takes: list[tuple[int, int]]) -> Shape:
    """The ``Shape`` of ``takes`` (from ``_fill``) before they are committed, ranks on
    several models taking batch shares by speed."""
    rank_nodes = [state.nodes[n].node_id for n, take in takes for _ in range(take)]
    draft = Placement(
        job_id=job.spec.job_id,
        ranks=tuple(RankSlot(rank=r, node_id=n, gpu_index=r) for r, n in enumerate(rank_nodes)),
    )
    return shape_of(
        draft, {state.nodes[n].node_id: state.nodes[n] for n, _ in takes}, balanced=True
    )


def _samples_per_s(job: PreparedJob, shape: Shape) -> float | None:
    """The performance model's samples/s of ``job`` on ``shape`` at its global batch
    (data parallelism over the shape's ranks); ``None`` where a rank runs out of memory."""
    assert job.spec.model is not None
    config = job.config
    if shape.world_size != config.world_size:
        layout = replace(config.layout, world_size=shape.world_size, dp=shape.world_size)
        config = replace(config, layout=layout)
    found = estimate(job.spec.model, config, shape, config.batch(job.spec))
    return None if found.oom else found.step.samples_per_s


def pack_mixed(job: PreparedJob, state: FreeCapacity) -> Mixed | None:
    """A ``mixable`` job's ranks on free GPUs of several allowed models: the fastest
    model's nodes first (then the most room), within ``max_nodes``; committed where no
    rank runs out of memory and the performance model (balanced batch shares, sync
    across the slowest link) says it runs faster than the job would on the free GPUs of
    any one allowed model alone, at a size it may have (``min_gpus`` or more; where none
    can, mixing beats waiting). ``None`` where the job is not mixable, the free GPUs of
    its models are too few, or a model is not in the catalog; else a ``Mixed`` with the
    placement or why not."""
    if not mixable(job):
        return None
    try:
        return _pack_mixed(job, state)
    except KeyError:  # a GPU model the catalog does not know: nothing prices the mix
        return None


def _pack_mixed(job: PreparedJob, state: FreeCapacity) -> Mixed | None:
    assert job.spec.model is not None
    profile, precision = job.spec.model, job.config.precision
    room, cpu, mem = _room(job, state)
    speeds = {
        int(m): rank_speed(state.models[m], profile, precision) for m in np.flatnonzero(job.allowed)
    }
    eligible = np.flatnonzero(state.gpu_nodes & job.allowed[state.model_safe] & (room > 0))
    order = sorted(
        eligible.tolist(), key=lambda n: (-speeds[int(state.model_safe[n])], -int(room[n]), n)
    )
    if job.spec.max_nodes is not None:
        order = order[: job.spec.max_nodes]
    if sum(int(room[n]) for n in order) < job.world:
        return None
    takes = _fill(order, room, job.world)
    shape = _shape(job, state, takes)
    if not shape.mixed:
        return None  # one model after all: the one-model steps' business
    mixed = _samples_per_s(job, shape)
    parts = " + ".join(f"{n}x{m}" for m, n in shape.gpu_models)
    if mixed is None:
        return Mixed(None, f"on {parts} a fast rank's larger batch share runs out of memory")
    best, best_name = 0.0, ""
    for model in speeds:
        nodes = np.flatnonzero(state.gpu_nodes & (state.model_safe == model) & (room > 0))
        alone = _fill(_most_room_first(job, nodes, room), room, job.world)
        if sum(t for _, t in alone) < job.spec.min_gpus:
            continue  # a size the job cannot be given
        alone_shape = _shape(job, state, alone)
        rate = _samples_per_s(job, alone_shape)
        if rate is not None and rate > best:
            best = rate
            best_name = f"{alone_shape.world_size} free {state.models[model]} alone"
    shares = ":".join(
        str(b // job.world or 1)
        for _, _, b in rank_batches(shape, profile, job.config, job.config.batch(job.spec))
    )
    against = f"{best:.1f} on the {best_name}" if best_name else "no size it may have on one model"
    if mixed <= best:
        return Mixed(
            None, f"on {parts} it would run {mixed:.1f} samples/s, no faster than {against}"
        )
    return Mixed(
        _take(job, state, takes, cpu, mem),
        f"on several GPU models ({parts}), samples per rank by speed {shares}: "
        f"{mixed:.1f} samples/s estimated, against {against}",
    )
