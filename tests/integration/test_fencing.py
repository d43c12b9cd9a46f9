"""A job fenced by the leader term that started it: a newer term's runner of the same
job stops the older term's ranks before its own start, the older runner stops, and the
ranks' own step logs show no step trained by two terms at once."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from autotune.core import JobConfig, Layout
from autotune.executor.fencing import Fence, Fenced
from autotune.executor.runner import JobRunner, RunnerConfig

pytestmark = pytest.mark.ray


def test_the_fence_is_the_highest_term_claimed(local_ray: str) -> None:
    job = f"fence-{time.monotonic_ns()}"
    assert Fence(job, 1).holder() is None
    Fence(job, 1).check()  # never claimed: nothing fences it
    for term in (3, 5, 4):  # a late claim of an older term does not lower the fence
        Fence(job, term).claim()
    assert Fence(job, 1).holder() == 5
    Fence(job, 5).check()
    with pytest.raises(Fenced, match="term 5 holds it, this runner's is 4"):
        Fence(job, 4).check()
    assert Fence(f"{job}-other", 1).holder() is None


def _steps(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.open()]


def test_a_newer_term_stops_the_older_ranks_before_its_own_start(
    local_ray: str, tmp_path: Path
) -> None:
    job = f"fenced-{time.monotonic_ns()}"
    logs = tmp_path / "steps"

    def runner(term: int, steps: int) -> JobRunner:
        run = RunnerConfig(
            task="mlp-synthetic",
            steps=steps,
            checkpoint_dir=tmp_path / "checkpoints",
            checkpoint_every=5,
            fence=Fence(job, term),
            step_log_dir=logs,
        )
        return JobRunner(run, JobConfig(layout=Layout(world_size=1)))

    old = runner(1, 100_000)
    failure: list[BaseException] = []

    def train_old() -> None:
        try:
            old.run()
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=train_old, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while old.step < 12 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert old.step >= 12, "the first term's runner did not train"
    new = runner(2, 30)
    result = new.run()  # claims term 2, kills term 1's rank, resumes from its checkpoint
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert len(failure) == 1
    assert isinstance(failure[0], Fenced), failure
    assert result.steps == 30
    fenced = [e for e in result.events if e["kind"] == "fenced_older"]
    assert len(fenced) == 1
    stopped = sorted(fenced[0]["ranks"])
    # Term 1's rank, and its slots (freed for term 2's ranks) unless term 1's runner,
    # fenced at its next step, removed its placement group itself first: both orders
    # happen, and either way nothing of term 1 is left.
    assert [name for name in stopped if name.startswith(f"{job}@t1/r0/")], stopped
    assert all(name.startswith((f"{job}@t1/pg/", f"{job}@t1/r0/")) for name in stopped)
    assert Fence(job, 2).stop_older() == [], "a rank or placement group of term 1 is left"
    steps = _steps(logs)
    by_term = {t: [s for s in steps if s["term"] == t] for t in (1, 2)}
    assert by_term[1]
    assert by_term[2]
    assert {s["job"] for s in steps} == {job}
    # No step of term 1 ended after term 2's first step began.
    assert max(s["end"] for s in by_term[1]) < min(s["start"] for s in by_term[2])
    # Term 2 resumed from a checkpoint of term 1, at most one interval back.
    first_new = min(s["step"] for s in by_term[2])
    last_old = max(s["step"] for s in by_term[1])
    assert first_new % 5 == 1
    assert last_old - 5 < first_new <= last_old + 1
