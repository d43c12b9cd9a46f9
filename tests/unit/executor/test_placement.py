"""What each rank asks Ray for and which GPU it uses, from the Planner's placement: a
fractional GPU bundle below 1,000 milli-GPUs, the Planner's GPU index as the rank's CUDA
device (Ray told not to narrow the visible devices), and as before where there is no
placement or no GPU. Pure functions: no Ray, no GPU."""

from __future__ import annotations

import pytest

from autotune.core import Placement, RankSlot
from autotune.executor.placement import (
    NOSET_CUDA_VISIBLE_DEVICES,
    RankResources,
    bundle_totals,
    describe_bundles,
    nvml_index,
    rank_resources,
)


def placement(*slots: tuple[str, int, int]) -> Placement:
    return Placement(
        job_id="job",
        ranks=tuple(
            RankSlot(rank=rank, node_id=node, gpu_index=gpu, gpu_milli=milli)
            for rank, (node, gpu, milli) in enumerate(slots)
        ),
    )


def test_a_placed_rank_asks_for_its_gpu_share_and_uses_the_chosen_gpu() -> None:
    ranks = rank_resources(
        3, placement(("gpu-a", 2, 1000), ("gpu-a", 0, 500), ("gpu-b", 3, 250)), gpu=True
    )
    assert [r.bundle for r in ranks] == [
        {"CPU": 1.0, "GPU": 1.0},
        {"CPU": 1.0, "GPU": 0.5},
        {"CPU": 1.0, "GPU": 0.25},
    ]
    assert [r.num_gpus for r in ranks] == [1.0, 0.5, 0.25]  # the actor's request fits its bundle
    assert [r.cuda_index for r in ranks] == [2, 0, 3]
    assert all(r.env_vars == {NOSET_CUDA_VISIBLE_DEVICES: "1"} for r in ranks)


def test_without_a_placement_ray_picks_a_whole_gpu_per_rank() -> None:
    ranks = rank_resources(2, None, gpu=True)
    assert (
        ranks
        == [RankResources(bundle={"CPU": 1.0, "GPU": 1.0}, num_gpus=1.0, cuda_index=0, env_vars={})]
        * 2
    )


@pytest.mark.parametrize("placed", [True, False])
def test_a_cpu_rank_asks_for_one_cpu_whatever_the_placement(placed: bool) -> None:
    where = placement(("cpu-a", 0, 500), ("cpu-a", 1, 1000)) if placed else None
    ranks = rank_resources(2, where, gpu=False)
    assert [(r.bundle, r.num_gpus, r.cuda_index, dict(r.env_vars)) for r in ranks] == [
        ({"CPU": 1.0}, 0.0, None, {})
    ] * 2


def test_a_placement_of_another_size_is_refused() -> None:
    with pytest.raises(ValueError, match="placement has 1 ranks, the job 2"):
        rank_resources(2, placement(("gpu-a", 0, 1000)), gpu=True)


def test_bundle_totals_are_summed_to_rays_precision() -> None:
    bundles = [{"CPU": 1.0, "GPU": 0.1}] * 3 + [{"CPU": 1.0, "GPU": 0.7}]
    assert bundle_totals(bundles) == {"CPU": 4.0, "GPU": 1.0}
    assert bundle_totals([]) == {}


def test_bundles_are_described_once_when_alike_else_each() -> None:
    assert describe_bundles([{"CPU": 1.0}] * 3) == "{'CPU': 1.0} each"
    assert (
        describe_bundles([{"CPU": 1.0, "GPU": 1.0}, {"CPU": 1.0, "GPU": 0.5}])
        == "{'CPU': 1.0, 'GPU': 1.0}, {'CPU': 1.0, 'GPU': 0.5}"
    )


@pytest.mark.parametrize(
    ("cuda_index", "visible", "expected"),
    [
        (3, None, 3),  # every device visible: CUDA's index is NVML's
        (0, "3", 3),  # Ray narrowed the process to GPU 3
        (1, "2,5", 5),  # a raylet started on GPUs 2 and 5
        (0, "GPU-8f0c2a1e", 0),  # named by UUID: the index stands
        (2, "1", 2),  # outside the list: the index stands
    ],
)
def test_the_power_reading_follows_the_gpu_the_rank_uses(
    cuda_index: int, visible: str | None, expected: int
) -> None:
    assert nvml_index(cuda_index, visible) == expected
