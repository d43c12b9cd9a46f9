"""Training survives a lost node and a hung rank.

The node-loss test runs ``bench/recovery.py`` end to end on a real 3-node Ray cluster
(``ray.cluster_utils.Cluster``): the daemon, its API and the ``ray`` backend; a worker's
raylet is SIGKILLed under a running job, which the daemon places again on the nodes that
are left; the lost node is marked in the API; a node that joins later is used."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.core import JobConfig, Layout
from autotune.executor.runner import JobRunner, RunnerConfig

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]


def test_a_job_whose_node_dies_is_placed_again_and_finishes(tmp_path: Path) -> None:
    import ray

    if ray.is_initialized():  # the driver joins the benchmark's cluster, not the local Ray
        ray.shutdown()
    out = tmp_path / "recovery.json"
    every = 5
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "recovery.py"),
            "--steps",
            "40",
            "--kill-at",
            "15",
            "--checkpoint-every",
            str(every),
            "--json",
            str(out),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["job_state"] == "finished"
    lost = result["killed_node"]
    assert result["lost_node_state"] == "lost"
    assert result["lost_node_lost_at"]
    assert result["decision_reason"].startswith(f"node {lost} lost: ")
    assert lost not in result["placement_after"]
    # 3 rank slots are left for a job of 2 to 4 ranks: a smaller layout.
    assert result["layout_after"]["world_size"] < result["layout_before"]["world_size"]
    assert 0 <= result["steps_redone"] <= every
    assert result["resumed_from_step"] % every == 0
    # Restored exactly: the steps after the checkpoint repeat the uninterrupted run's
    # (up to the reduction order of 2 ranks instead of 4), before chaos takes over.
    resumed = result["resumed_from_step"]
    reference, interrupted = result["loss_curve_reference"], result["loss_curve_interrupted"]
    assert len(reference) == len(interrupted) == 40
    for step in range(resumed, resumed + 3):
        assert interrupted[step] == pytest.approx(reference[step], rel=1e-3)
    # 40 steps end mid-descent, where rounding differences show (bench/RESULTS.md has
    # the 2 % goal measured on longer runs): the run still ends where the reference does.
    assert result["final_loss_rel_diff"] <= 0.1
    assert result["mttr_s"] > result["detect_s"] > 0
    assert result["comeback"]["uses_joined"]
    assert result["comeback"]["job_state"] == "finished"


def test_a_hung_rank_is_taken_for_dead_and_the_job_finishes(local_ray: str) -> None:
    sys.path.insert(0, str(REPO / "tests" / "data"))
    try:
        from hang_task import HANG_AT, HANG_MARKER
    finally:
        sys.path.pop(0)
    HANG_MARKER.touch()
    try:
        runner = JobRunner(
            RunnerConfig(
                task=f"{REPO / 'tests' / 'data' / 'hang_task.py'}:HangOnce",
                steps=8,
                checkpoint_every=2,
                step_timeout_s=10.0,
            ),
            JobConfig(layout=Layout(world_size=2)),
        )
        result = runner.run()
    finally:
        HANG_MARKER.unlink(missing_ok=True)
    assert result.steps == 8
    hung = [e for e in result.events if e["kind"] == "rank_hung"]
    assert len(hung) == 1
    assert hung[0]["step"] == HANG_AT
    assert "gave no answer within 10 s" in hung[0]["detail"]
    assert hung[0]["resumed_from"] == 2
    assert result.steps_redone == HANG_AT - 2
