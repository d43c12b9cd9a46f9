"""A rank's coordinates in the ("pp", "dp", "tp") mesh are the inverse of ``Layout``'s
numbering (tensor parallelism innermost)."""

from __future__ import annotations

import pytest

from autotune.core import Layout
from autotune.executor.mesh import RankCoordinates, process_group_backend


@pytest.mark.parametrize(
    ("dp", "tp", "pp"), [(1, 1, 1), (2, 1, 1), (2, 2, 2), (1, 4, 2), (3, 1, 2)]
)
def test_rank_coordinates_invert_the_layouts_numbering(dp: int, tp: int, pp: int) -> None:
    layout = Layout(world_size=dp * tp * pp, dp=dp, tp=tp, pp=pp)
    seen = set()
    for rank in range(layout.world_size):
        c = RankCoordinates.of(rank, layout)
        assert (c.pp_index * dp + c.dp_index) * tp + c.tp_index == rank
        seen.add((c.pp_index, c.dp_index, c.tp_index))
    assert len(seen) == layout.world_size
    with pytest.raises(ValueError, match="outside a world"):
        RankCoordinates.of(layout.world_size, layout)


def test_gpus_reduce_cpu_tensors_through_gloo_and_cuda_ones_through_nccl() -> None:
    assert process_group_backend("cpu") == "gloo"
    assert process_group_backend("cuda") == "cpu:gloo,cuda:nccl"
