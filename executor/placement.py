"""What each rank of a job asks Ray for, and which GPU its process uses: pure functions of
the Planner's ``Placement``, so that they are tested without Ray or a GPU.

The Planner places each rank on a node, a GPU of it (``RankSlot.gpu_index``) and a share
of that GPU in thousandths (``RankSlot.gpu_milli``). On GPUs each rank's placement-group
bundle is ``{"CPU": 1, "GPU": gpu_milli / 1000}`` (a fractional GPU below 1,000: Ray
then lets ranks of other jobs share the GPU up to its capacity), pinned to the node by
the runner; the actor asks for the same GPU share.

Ray does not let a request name the GPU within a node: it picks one itself and narrows
the process's ``CUDA_VISIBLE_DEVICES`` to it. A rank the Planner placed is therefore
started with ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1`` (Ray 2.x,
``ray/_private/accelerators/nvidia_gpu.py``: Ray leaves ``CUDA_VISIBLE_DEVICES`` as the
node's raylet has it) and selects the Planner's GPU itself (``torch.cuda.set_device
(gpu_index)``). ``gpu_index`` counts the GPUs Ray sees on the node (``NodeInfo``'s
``gpu_count`` is Ray's ``GPU`` resource), which are the devices the unnarrowed process
sees, in the same order. Ray still accounts the GPU shares per node, so it never reserves
more of a node's GPUs than it has; which GPU it counts a share against may differ from
the Planner's choice, which only the Planner's packing decides.

Without a placement (Ray packs the ranks) each rank asks for a whole GPU and uses the one
Ray makes visible (CUDA device 0), as before. On CPU each rank asks for one CPU: the
Planner's ``CPU`` devices are logical CPUs, and a rank's gloo process uses one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from autotune.core import MILLI_PER_GPU, Placement

__all__ = [
    "NOSET_CUDA_VISIBLE_DEVICES",
    "RankResources",
    "bundle_totals",
    "describe_bundles",
    "nvml_index",
    "rank_resources",
]

NOSET_CUDA_VISIBLE_DEVICES = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
"""Set in a Ray worker's environment, Ray does not narrow its ``CUDA_VISIBLE_DEVICES``
to the GPUs it assigned (``NvidiaGPUAcceleratorManager``)."""

_RESOURCE_DIGITS = 4
"""Ray keeps resource quantities to 1/10,000 of a unit: sums of GPU shares are rounded
there (three ranks of 0.1 GPU need 0.3, not 0.30000000000000004)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RankResources:
    """What one rank's actor asks Ray for, and the device its process uses."""

    bundle: Mapping[str, float]
    """The rank's placement-group bundle: ``{"CPU": 1}``, plus its GPU share on GPUs."""
    num_gpus: float
    """The actor's GPU request, in GPUs: its bundle's share (0 on CPU)."""
    cuda_index: int | None
    """The CUDA device the rank's process selects (``torch.cuda.set_device``), among the
    devices it sees: the Planner's ``gpu_index`` where it placed the rank, 0 where Ray
    chose the GPU (the only one visible); ``None`` on CPU."""
    env_vars: Mapping[str, str] = field(default_factory=dict)
    """Environment variables the rank's actor starts with (its ``runtime_env``)."""


def rank_resources(world: int, placement: Placement | None, *, gpu: bool) -> list[RankResources]:
    """Each rank's resources, by rank, for a job of ``world`` ranks on ``placement``
    (``None``: Ray packs the ranks) with GPUs or on CPUs (see the module docstring)."""
    if placement is not None and placement.world_size != world:
        raise ValueError(f"placement has {placement.world_size} ranks, the job {world}")
    if not gpu:
        return [RankResources(bundle={"CPU": 1.0}, num_gpus=0.0, cuda_index=None)] * world
    if placement is None:
        whole = RankResources(bundle={"CPU": 1.0, "GPU": 1.0}, num_gpus=1.0, cuda_index=0)
        return [whole] * world
    out = []
    for slot in placement.ranks:
        share = slot.gpu_milli / MILLI_PER_GPU
        out.append(
            RankResources(
                bundle={"CPU": 1.0, "GPU": share},
                num_gpus=share,
                cuda_index=slot.gpu_index,
                env_vars={NOSET_CUDA_VISIBLE_DEVICES: "1"},
            )
        )
    return out


def bundle_totals(bundles: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Each resource the bundles ask for, summed over them (to Ray's precision)."""
    totals: dict[str, float] = {}
    for bundle in bundles:
        for resource, amount in bundle.items():
            totals[resource] = totals.get(resource, 0.0) + amount
    return {resource: round(amount, _RESOURCE_DIGITS) for resource, amount in totals.items()}


def describe_bundles(bundles: Sequence[Mapping[str, float]]) -> str:
    """The bundles for a message: ``{'CPU': 1.0} each`` where they are alike, else each
    one in rank order."""
    first = dict(bundles[0]) if bundles else {}
    if all(dict(b) == first for b in bundles):
        return f"{first} each"
    return ", ".join(str(dict(b)) for b in bundles)


def nvml_index(cuda_index: int, visible_devices: str | None) -> int:
    """The NVML index (what ``nvidia-smi`` numbers) of CUDA device ``cuda_index`` in a
    process whose ``CUDA_VISIBLE_DEVICES`` is ``visible_devices`` (``None``: unset, every
    device visible). NVML ignores ``CUDA_VISIBLE_DEVICES``: device 0 of a process Ray
    narrowed to GPU 3 is NVML's 3. A device named by UUID keeps ``cuda_index``. Assumes
    CUDA numbers the devices as NVML does (PCI bus order: ``CUDA_DEVICE_ORDER=PCI_BUS_ID``,
    or a node of identical GPUs)."""
    if visible_devices is None:
        return cuda_index
    entries = [e.strip() for e in visible_devices.split(",") if e.strip()]
    if cuda_index < len(entries) and entries[cuda_index].isdigit():
        return int(entries[cuda_index])
    return cuda_index
