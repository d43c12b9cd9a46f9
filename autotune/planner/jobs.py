"""A job being placed, and its placement units (step 2 of the map in
``autotune.planner``): its per-model terms, its ranks per unit and the unit sizes to
try."""

from __future__ import annotations

import math

from autotune.core import MILLI_PER_GPU, JobConfig, JobSpec, Placement
from autotune.perf.model import balanced
from autotune.planner.arrays import BoolArray, FloatArray


class PreparedJob:
    """A job being placed: its per-model terms and its current unit size."""

    __slots__ = (
        "allowed",
        "block",
        "compute",
        "config",
        "current",
        "headroom",
        "index",
        "shape",
        "spec",
        "terms_id",
        "unit_cpu",
        "unit_mem",
        "units",
        "world",
    )

    def __init__(
        self,
        *,
        spec: JobSpec,
        config: JobConfig,
        allowed: BoolArray,
        compute: FloatArray,
        headroom: FloatArray,
        block: int,
        terms_id: int = -1,
    ) -> None:
        self.spec = spec
        self.config = config
        self.allowed = allowed
        """Per GPU model: type allowed and a rank fits its memory."""
        self.compute = compute
        """Per GPU model: compute-fit cost of one GPU."""
        self.headroom = headroom
        """Per GPU model: memory-headroom cost of one GPU."""
        self.terms_id = terms_id
        """An id equal for jobs with equal ``allowed``, ``compute`` and ``headroom``: with
        equal shapes, their units have equal costs everywhere (-1: shared with none)."""
        self.world: int = config.world_size
        self.current: Placement | None = None
        self.index = -1
        """Position among the pending jobs."""
        self.block = self.units = self.unit_cpu = self.unit_mem = 0
        self.shape: tuple[int, int, int, int] = (0, 0, 0, 0)
        self.set_block(block)

    def set_block(self, block: int) -> None:
        """Ranks per unit, and what follows from it."""
        spec, world = self.spec, self.world
        self.block = block
        self.units = world // block
        self.unit_cpu = math.ceil(spec.cpu_milli * block / world)
        self.unit_mem = math.ceil(spec.memory_mib * block / world)
        self.shape = (block, spec.gpu_milli, self.unit_cpu, self.unit_mem)


def block_sizes(job: PreparedJob, max_gpus_per_node: int) -> list[int]:
    """Unit sizes to try, largest first: multiples of tp dividing the world size."""
    world, tp = job.world, job.config.layout.tp
    if job.spec.max_nodes == 1:
        return [world]
    sizes = [
        b for b in range(min(world, max_gpus_per_node), 0, -1) if world % b == 0 and b % tp == 0
    ]
    if job.spec.max_nodes is not None:
        sizes = [b for b in sizes if world // b <= job.spec.max_nodes]
    return sizes


def spans_nodes(job: PreparedJob) -> bool:
    """Whether the job's ranks may go to more than one node. Synchronous training runs
    at the pace of its slowest GPU, so such a job's ranks all go to one GPU model."""
    return job.spec.max_nodes != 1 and job.world > 1


def mixable(job: PreparedJob) -> bool:
    """Whether the job may run on several GPU models (``packing.pack_mixed``): its model
    is known (the performance model prices the mix), it is data-parallel only (batch
    shares by speed balance it), on whole GPUs, over several nodes, and more than one
    GPU model is allowed for it."""
    return (
        job.spec.model is not None
        and balanced(job.config)
        and job.spec.gpu_milli >= MILLI_PER_GPU
        and spans_nodes(job)
        and int(job.allowed.sum()) > 1
    )
