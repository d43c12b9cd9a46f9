"""Two daemons on PostgreSQL on the testbed, with Ray jobs training
(``bench/testbed_failover.py``): the leader cut off from the database while its jobs train
(the new leader's ranks start only after the old term's have stopped, checked from the
ranks' own step logs), the leader SIGKILLed under API load, and Ray's head killed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import no_postgres

from autotune.benchmarks import REPO, postgres_bin

pytestmark = [pytest.mark.testbed, pytest.mark.usefixtures("testbed_host")]

STEPS = 100
"""Steps of each job: enough that none finishes before its fault. The faults come 15
steps in, after a takeover's 5-10 s (the cut) or 5 s of API load (the kill), at about 5
steps/s; at 60 steps a job sometimes finished first, and its new term had nothing to do."""


def test_no_job_trains_on_two_placements_and_a_new_leader_resumes_each_once(
    tmp_path: Path,
) -> None:
    if postgres_bin() is None or shutil.which("runuser") is None:
        no_postgres("the fail-over bench needs PostgreSQL's binaries (initdb, pg_ctl) and runuser")
    out = tmp_path / "failover.json"
    argv = [
        sys.executable, str(REPO / "bench" / "testbed_failover.py"),
        "--steps", str(STEPS), "--partition-s", "15", "--rate", "50", "--load-s", "15",
        "--head-watch-s", "15", "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert out.exists(), done.stderr[-4000:]
    result = json.loads(out.read_text())
    cut, kill, head = result["partition"], result["leader_killed"], result["head_killed"]
    # Cut off from the database: the follower leads within a lease and a bit, the old
    # term's ranks stop before the new term's first step, the jobs finish.
    assert cut["new_term"] > cut["old_term"]
    assert cut["takeover_s"] <= 10
    assert cut["old_leader_demoted"] == "another daemon took the leader lease"
    assert cut["decisions_lost"] == 0
    for job in cut["jobs"].values():
        assert job["state"] == "finished"
        assert job["terms"] == [cut["old_term"], cut["new_term"]]
        assert job["concurrent_step_pairs"] == 0
        assert min(job["handover_gaps_s"]) > 0
        assert job["old_term_steps_after_mend"] == 0
        assert job["steps_logged_max"] == STEPS
        # The takeover stops the old ranks at once, not when the cut heals.
        assert job["old_term_last_step_after_cut_s"] < cut["takeover_s"] + 3
    # SIGKILLed under load: the survivor leads within 10 s, answers no 5xx but 503, and
    # starts each job once, from its newest checkpoint.
    assert kill["takeover_s"] <= 10
    assert kill["server_errors_not_503"] == 0
    for job in kill["jobs"].values():
        assert job["state"] == "finished"
        assert job["starts_after_kill"] == 1
        assert job["concurrent_step_pairs"] == 0
        assert job["resumed_from_step"] == job["newest_checkpoint_before"]
    # Ray's head gone: no decision lost, and after Ray and a daemon start again the job
    # resumes from its checkpoint.
    assert head["decisions_lost"] == 0
    assert head["steps_after_the_kill"] == 0  # none but the one the driver had sent
    assert head["steps_in_flight_at_the_kill"] <= 1
    assert head["restart"]["decisions_lost"] == 0
    assert head["restart"]["resumed_from_step"] == head["newest_checkpoint_before"]
