"""``parallelize`` applies tensor parallelism, then activation checkpointing, then data
parallelism: checkpointing the blocks a rank runs after they are sharded (its own stage's
blocks under pipeline parallelism, the whole block stack without) changes no loss."""

from __future__ import annotations

import pytest
from helpers import REPO

from autotune.core import JobConfig, Layout
from autotune.executor.local import run_local
from autotune.executor.worker import WorkerSpec

TASK = f"{REPO / 'tests' / 'data' / 'pipeline_tasks.py'}:BufferTask"


def spec(*, tp: int, pp: int, checkpointing: bool) -> WorkerSpec:
    layout = Layout(
        world_size=tp * pp,
        dp=1,
        tp=tp,
        pp=pp,
        micro_batches=2 if pp > 1 else 1,
        activation_checkpointing=checkpointing,
    )
    return WorkerSpec(task=TASK, config=JobConfig(layout=layout), seed=3)


@pytest.mark.slow
@pytest.mark.parametrize("pp", [1, 2])
def test_checkpointing_sharded_blocks_keeps_the_losses(pp: int) -> None:
    plain = run_local(spec(tp=2, pp=pp, checkpointing=False), 2, save=False)
    checkpointed = run_local(spec(tp=2, pp=pp, checkpointing=True), 2, save=False)
    assert checkpointed.losses() == pytest.approx(plain.losses(), rel=1e-5)
    assert [s["tp_plan"] for s in checkpointed.setup] == [s["tp_plan"] for s in plain.setup]
    assert all(s["tp_plan"] for s in checkpointed.setup)
