"""A machine lost under a running job, end to end on the testbed (``bench/recovery.py``):
the daemon on the head machine, its API and the ``ray`` backend; a worker machine that
hosts ranks of the job is killed (every process on it) or cut off the network, the
daemon places the job again on the machines that are left, the lost node is marked in
the API, the job resumes from its checkpoint and finishes, and the machine, back, is used."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autotune.benchmarks import REPO

pytestmark = [pytest.mark.testbed, pytest.mark.usefixtures("testbed_host")]

EVERY = 5
STEPS = 40


def _recovery(tmp_path: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "recovery.json"
    argv = [
        sys.executable, str(REPO / "bench" / "recovery.py"),
        "--steps", str(STEPS), "--fault-at", "15", "--checkpoint-every", str(EVERY),
        "--json", str(out), *extra,
    ]  # fmt: skip
    # A process of its own: Ray reads the testbed's token settings when it is imported.
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def _recovered(result: dict[str, Any]) -> None:
    assert result["job_state"] == "finished"
    lost = result["failed_node"]
    assert result["failed_machine"] != "head"
    assert result["lost_node_state"] == "lost"
    assert result["lost_node_lost_at"]
    assert result["decision_reason"].startswith(f"node {lost} lost: ")
    assert lost not in result["placement_after"]
    # 3 rank slots are left for a job of 2 to 4 ranks: a smaller layout.
    assert result["layout_after"]["world_size"] < result["layout_before"]["world_size"]
    assert 0 <= result["steps_redone"] <= EVERY
    assert result["resumed_from_step"] % EVERY == 0
    # Restored exactly: the steps after the checkpoint repeat the uninterrupted run's
    # (up to the reduction order of fewer ranks), before chaos takes over.
    resumed = result["resumed_from_step"]
    reference, interrupted = result["loss_curve_reference"], result["loss_curve_interrupted"]
    assert len(reference) == len(interrupted) == STEPS
    for step in range(resumed, resumed + 3):
        assert interrupted[step] == pytest.approx(reference[step], rel=1e-3)
    # 40 steps end mid-descent, where rounding differences show (bench/RESULTS.md has
    # the 2 % goal measured on longer runs): the run still ends where the reference does.
    assert result["final_loss_rel_diff"] <= 0.1
    assert result["mttr_s"] > result["detect_s"] > 0
    assert result["mttr_s"] <= 30
    assert result["checkpoints"]["files"] > 0
    assert result["checkpoints"]["unreadable"] == []
    assert result["checkpoints"]["partial"] == []
    comeback = result["comeback"]
    assert comeback["job_state"] == "finished"
    assert comeback["uses_machine"]
    assert comeback["uses_joined"]


def test_a_job_whose_machine_is_killed_is_placed_again_and_finishes(tmp_path: Path) -> None:
    result = _recovery(tmp_path, "--fault", "kill")
    assert result["fault"] == "kill"
    _recovered(result)


def test_a_job_whose_machine_is_partitioned_moves_and_the_machine_comes_back(
    tmp_path: Path,
) -> None:
    result = _recovery(tmp_path, "--fault", "partition", "--partition-s", "20")
    assert result["fault"] == "partition"
    assert result["partition_s"] >= 20
    _recovered(result)
    # Ray does not let a node it declared dead back in: the machine's Ray was started again.
    assert result["rejoined_by_itself"] is False
