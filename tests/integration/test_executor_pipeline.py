"""Pipeline stages that hold their own parameters, and compression state in checkpoints,
through ``JobRunner`` on a local Ray: a job moved between pp 1, 2 and 4 keeps its
trajectory; a top-k job whose rank is killed resumes bit for bit; a change of the
data-parallel degree re-shards the residuals and says so in the job's events."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray
from helpers import REPO, train

from autotune.core import CompressionSpec, JobConfig, Layout
from autotune.executor.runner import JobRunner
from autotune.interfaces import JobMetrics

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("local_ray")]

GPT8 = f"{REPO / 'tests' / 'data' / 'pipeline_tasks.py'}:GPT8"
TOPK = CompressionSpec(kind="topk", ratio=0.05)


def config(dp: int = 1, pp: int = 1, **kwargs: object) -> JobConfig:
    return JobConfig(
        layout=Layout(world_size=dp * pp, dp=dp, pp=pp, micro_batches=2 if pp > 1 else 1),
        **kwargs,  # type: ignore[arg-type]
    )


def test_moving_a_job_between_pp_1_2_and_4_keeps_its_trajectory() -> None:
    """pp=1 -> pp=2 -> pp=4 -> pp=1 mid-run: each move goes through the merged,
    layout-independent checkpoint of stages that hold their own weights only."""
    switches = {2: config(pp=2), 4: config(pp=4), 6: config()}

    def move(runner: JobRunner, step: int, metrics: JobMetrics) -> None:
        if step in switches:
            runner.apply(switches[step])

    moved = train(GPT8, config(), 8, on_step=move)
    still = train(GPT8, config(), 8)
    assert moved.losses == pytest.approx(still.losses, rel=1e-4)
    assert [e["kind"] for e in moved.events].count("reconfigured") == 3


def test_a_killed_topk_rank_resumes_bit_for_bit(tmp_path: Path) -> None:
    """The residuals are in the checkpoint: the steps redone after a rank dies are the
    uninterrupted run's exactly (they used to start from empty residuals)."""
    killed: list[int] = []

    def kill(runner: JobRunner, step: int, metrics: JobMetrics) -> None:
        if step == 5 and not killed:
            killed.append(step)
            ray.kill(runner.workers[1])

    result = train(
        "mlp-synthetic",
        config(dp=2, compression=TOPK),
        8,
        checkpoint_dir=tmp_path,
        checkpoint_every=3,
        on_step=kill,
    )
    assert killed == [5]
    assert result.steps_redone == 2
    uninterrupted = train("mlp-synthetic", config(dp=2, compression=TOPK), 8)
    assert result.losses == uninterrupted.losses


def test_a_new_data_parallel_degree_reshards_the_residuals_and_says_so() -> None:
    def grow(runner: JobRunner, step: int, metrics: JobMetrics) -> None:
        if step == 3:
            runner.apply(config(dp=4, compression=TOPK))

    result = train("mlp-synthetic", config(dp=2, compression=TOPK), 5, on_step=grow)
    [event] = [e for e in result.events if e["kind"] == "compression_state_resharded"]
    assert event["step"] == 3
    assert "data-parallel degree 2 -> 4" in event["detail"]
    assert len(result.losses) == 5
