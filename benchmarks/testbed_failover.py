"""Leader fail-over with Ray jobs training, on the testbed's machines.

    python bench/testbed_failover.py [--partition-s 30] [--rate 100] [--steps 300]
                                     [--json bench/out/testbed_failover.json]

The testbed (``autotune.benchmarks.testbed``): three Ray machines (a head with one CPU
rank slot, two workers with two; links of ``--mbit`` Mbit/s) and a ``control`` machine
that runs PostgreSQL. Two daemons (``autotune daemon --backend ray``) share the database,
the Ray cluster and a data directory (their jobs' checkpoints and the ranks' step logs):
daemon A on the head, daemon B on worker1. Every job is ``gpt-char`` with 2 ranks; every
rank logs each step with the leader term that started it (``autotune.executor.
fencing``), and the figures below come from those logs.

1. **The leader cut off from the database** for ``--partition-s`` seconds while 2 jobs
   train (blackhole routes between the head and the database's machine: the head still
   reaches Ray). The follower takes the lease and starts the jobs in its term, which
   first stops the old term's ranks. Measured: steps trained by two terms at once (from
   the step logs' wall-clock intervals), the new term's first step of each job after the
   cut, the old leader's demotion once its link is mended, and whether the jobs finish
   with every decision a client saw still in the database.
2. **The leader SIGKILLed** while 2 more jobs train, under ``--rate`` API requests per
   second to both daemons: takeover time (the kill to the survivor leading), API
   answers by status, and how often each job was started again (once, from its newest
   checkpoint).
3. **The head machine killed** (Ray's head: its GCS; daemon A with it) with a daemon on
   a worker and a job running: what the daemon does, and whether the database kept every
   decision.

Everything is printed and written as JSON to ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from autotune.benchmarks import REPO, postgres_bin
from autotune.benchmarks.api_load import decision_ids
from autotune.benchmarks.testbed import Testbed

TOKEN = "failover-bench"
PG_PORT = 5432
CHECKPOINT_EVERY = 5
LEASE_S = 5.0
IN_FLIGHT_S = 1.0
"""After the head dies, a step may still begin this long after: one the driver sent just
before (Ray's dispatch takes milliseconds); later ones would be training uncontrolled."""
READS = {
    "decisions": 0.3,
    "decisions_job": 0.1,
    "jobs": 0.2,
    "job": 0.1,
    "cluster": 0.15,
    "healthz": 0.05,
    "decision": 0.1,
}
"""The API load: reads (a write would submit real training jobs to the 2-core host)."""


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Partition and kill the leader daemon while Ray jobs train; kill the "
        "Ray head. On the testbed of network namespaces.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--partition-s", type=float, default=30.0, help="the leader's cut")
    parser.add_argument("--rate", type=float, default=100.0, help="API requests per second")
    parser.add_argument("--load-s", type=float, default=40.0, help="seconds of API load")
    parser.add_argument("--steps", type=int, default=300, help="steps of each job")
    parser.add_argument("--mbit", type=float, default=1000.0, help="the links' Mbit/s")
    parser.add_argument("--head-watch-s", type=float, default=90.0, help="after the head dies")
    parser.add_argument(
        "--json",
        type=Path,
        default=REPO / "bench" / "out" / "testbed_failover.json",
        help="output",
    )
    parser.add_argument("--timeout-s", type=float, default=1500.0, help="give up after this")
    args = parser.parse_args(argv)
    if min(args.partition_s, args.rate, args.load_s, args.mbit, args.head_watch_s) <= 0:
        parser.error("durations, --rate and --mbit must be > 0")
    if args.steps < 4 * CHECKPOINT_EVERY:
        parser.error(f"--steps must be >= {4 * CHECKPOINT_EVERY}")
    return args


# ----------------------------------------------------------------- the database


class Postgres:
    """A throwaway PostgreSQL server on a testbed machine, on its address."""

    def __init__(self, bed: Testbed, machine: str = "control") -> None:
        found = postgres_bin()
        if found is None:
            raise SystemExit("no PostgreSQL binaries (initdb, pg_ctl): install postgresql")
        self.bed, self.machine = bed, bed.machine(machine)
        self.root = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
        user = pwd.getpwnam("postgres")  # initdb refuses root
        os.chown(self.root, user.pw_uid, user.pw_gid)
        self.prefix = ["runuser", "-u", "postgres", "--"]
        data = self.root / "data"
        initdb = [str(found / "initdb"), "-D", str(data), "-A", "trust", "-U", "autotune"]
        subprocess.run([*self.prefix, *initdb], check=True, capture_output=True)
        with (data / "pg_hba.conf").open("a") as hba:
            hba.write("host all all 198.18.0.0/24 trust\n")
        options = (
            f"-p {PG_PORT} -k {self.root} -c listen_addresses={self.machine.address} "
            "-c fsync=off -c max_connections=200"
        )
        ctl = [str(found / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(self.root / "log")]
        started = bed.run(
            self.machine, [*self.prefix, *ctl, "-w", "start"], stdout=subprocess.DEVNULL
        )
        if started.wait(timeout=120) != 0:
            raise RuntimeError(f"PostgreSQL did not start: {(self.root / 'log').read_text()}")
        self.url = f"postgresql+psycopg://autotune@{self.machine.address}:{PG_PORT}/postgres"

    def close(self) -> None:
        # Its processes go with the testbed's machine; the data directory is ours.
        self.bed.kill(self.machine)
        shutil.rmtree(self.root, ignore_errors=True)


# ----------------------------------------------------------------- the daemons


class Daemon:
    """``autotune daemon --backend ray`` on a testbed machine, its API on its address."""

    def __init__(
        self, bed: Testbed, machine: str, port: int, url: str, data: Path, logs: Path
    ) -> None:
        self.bed, self.machine, self.port = bed, bed.machine(machine), port
        self.name = f"daemon-{self.machine.name}"
        self.log = logs / f"{self.name}-{int(time.time())}.err"
        autotune = str(Path(sys.executable).with_name("autotune"))
        env = {
            "AUTOTUNE_DB_URL": url,
            "AUTOTUNE_DATA_DIR": str(data),
            "AUTOTUNE_TOKEN": TOKEN,
            "AUTOTUNE_LEADER_LEASE_S": str(LEASE_S),
            "AUTOTUNE_CHECKPOINT_EVERY": str(CHECKPOINT_EVERY),
            "AUTOTUNE_EXPLORATION_EPSILON": "0",
        }
        argv = [
            autotune, "daemon", "--backend", "ray", "--ray-address", bed.ray_address,
            "--host", self.machine.address, "--port", str(port), "--tick-s", "0.5",
            "--policy", "rules", "--forecast", "persistence",
        ]  # fmt: skip
        with self.log.open("w") as err:
            self.process = bed.run(
                self.machine, argv, env=env, stdout=subprocess.DEVNULL, stderr=err
            )

    @property
    def base(self) -> str:
        return f"http://{self.machine.address}:{self.port}"

    def readiness(self) -> dict[str, Any] | None:
        """``/readyz``'s body (any status), ``None`` when it does not answer."""
        import httpx

        try:
            body: dict[str, Any] = httpx.get(f"{self.base}/api/v1/readyz", timeout=3).json()
        except (httpx.HTTPError, ValueError):
            return None
        return body

    def leading(self) -> int | None:
        """The term this daemon leads in, if it does."""
        ready = self.readiness()
        leader = (ready or {}).get("leader") or {}
        return int(leader["term"]) if leader.get("leading") and leader.get("term") else None

    def events(self) -> list[dict[str, Any]]:
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    found.append(json.loads(line))
                except ValueError:
                    continue
        return found

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


def _wait(what: str, check: Any, timeout_s: float, every_s: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(every_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _submit(daemon: Daemon, job_id: str, steps: int) -> None:
    import httpx

    response = httpx.post(
        f"{daemon.base}/api/v1/jobs",
        json={
            "job_id": job_id,
            "task": "gpt-char",
            "steps": steps,
            "global_batch": 16,
            "min_gpus": 2,
            "max_gpus": 2,
        },
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )
    if response.status_code != 201:
        raise RuntimeError(f"submitting {job_id}: {response.status_code} {response.text}")


def _job(daemon: Daemon, job_id: str) -> dict[str, Any]:
    import httpx

    body: dict[str, Any] = httpx.get(f"{daemon.base}/api/v1/jobs/{job_id}", timeout=10).json()
    return body


# ----------------------------------------------------------------- the step logs


def step_log(data: Path, job_id: str) -> list[dict[str, Any]]:
    """Every step the job's ranks logged, each with its ``attempt`` (the file's)."""
    entries = []
    for path in sorted((data / "checkpoints" / job_id / "steps").glob("*.jsonl")):
        attempt = path.stem.split("-", 2)[2]
        for line in path.read_text().splitlines():
            if line.strip():
                entries.append({**json.loads(line), "attempt": attempt})
    return entries


def overlaps(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Steps of one job trained by two terms at once: pairs of step intervals (of any
    ranks) of different terms that intersect in wall-clock time, and the gap between each
    term's last step and the next term's first (negative: they overlapped)."""
    by_term: dict[int, list[tuple[float, float]]] = {}
    for e in entries:
        by_term.setdefault(int(e["term"]), []).append((e["start"], e["end"]))
    terms = sorted(by_term)
    pairs = 0
    for i, a in enumerate(terms):
        for b in terms[i + 1 :]:
            pairs += sum(1 for s1, e1 in by_term[a] for s2, e2 in by_term[b] if s1 < e2 and s2 < e1)
    gaps = [
        round(min(s for s, _ in by_term[b]) - max(e for _, e in by_term[a]), 3)
        for a, b in itertools.pairwise(terms)
    ]
    return {"terms": terms, "concurrent_step_pairs": pairs, "handover_gaps_s": gaps}


def _first_step_of(entries: list[dict[str, Any]], term: int) -> dict[str, Any] | None:
    mine = [e for e in entries if e["term"] == term and e["rank"] == 0]
    return min(mine, key=lambda e: e["start"]) if mine else None


def _newest_checkpoint(data: Path, job_id: str) -> int | None:
    """The step of the job's newest checkpoint file (``step-XXXXXXXX.pt``)."""
    steps = [int(p.stem[5:]) for p in (data / "checkpoints" / job_id).glob("step-*.pt")]
    return max(steps) if steps else None


def _steps_done(data: Path, job_id: str) -> int:
    return max((e["step"] for e in step_log(data, job_id)), default=0)


# ----------------------------------------------------------------- the scenarios


def _start_jobs(daemon: Daemon, jobs: list[str], data: Path, steps: int) -> list[str]:
    """Submit ``jobs`` through ``daemon`` and wait until each has trained 15 steps."""
    for job in jobs:
        _submit(daemon, job, steps)
    _wait(
        f"{', '.join(jobs)} to train 15 steps",
        lambda: all(_steps_done(data, j) >= 15 for j in jobs),
        300,
    )
    return jobs


def partition_phase(
    bed: Testbed, a: Daemon, b: Daemon, url: str, data: Path, args: argparse.Namespace
) -> dict[str, Any]:
    jobs = _start_jobs(a, ["cut-1", "cut-2"], data, args.steps)
    old_term = a.leading()
    seen_before = decision_ids(url)
    cut_at = time.time()
    bed.cut(a.machine, "control")
    new_term = _wait("the follower to lead", b.leading, args.partition_s + 60)
    took_over_s = time.time() - cut_at
    _wait(
        "both jobs' first step in the new term",
        lambda: all(_first_step_of(step_log(data, j), new_term) for j in jobs),
        # Starting the new term's ranks (Ray actors, torch) takes over 2 minutes on a
        # loaded 2-core host: a deadline, not a figure (the start times are measured).
        max(5.0, args.partition_s - (time.time() - cut_at)) + 240,
    )
    left = args.partition_s - (time.time() - cut_at)
    if left > 0:
        time.sleep(left)
    bed.mend(a.machine, "control")
    mended_at = time.time()
    _wait(
        "the old leader to step down",
        lambda: any(e.get("event") == "leader.demoted" for e in a.events()),
        120,
    )
    demoted = next(e for e in a.events() if e.get("event") == "leader.demoted")
    finished = _wait(
        "both jobs to finish",
        lambda: (
            all(_job(b, j)["state"] in ("finished", "failed") for j in jobs)
            and [_job(b, j) for j in jobs]
        ),
        args.timeout_s,
        every_s=1.0,
    )
    seen_after = decision_ids(url)
    result: dict[str, Any] = {
        "partition_s": round(mended_at - cut_at, 1),
        "old_term": old_term,
        "new_term": new_term,
        "takeover_s": round(took_over_s, 2),
        "old_leader_demoted": demoted.get("reason"),
        "decisions_lost": len(seen_before - seen_after),
        "jobs": {},
    }
    for job, status in zip(jobs, finished, strict=True):
        entries = step_log(data, job)
        first_new = _first_step_of(entries, new_term)
        assert first_new is not None
        old = [e for e in entries if e["term"] == old_term and e["rank"] == 0]
        result["jobs"][job] = {
            "state": status["state"],
            "steps_logged_max": max(e["step"] for e in entries),
            **overlaps(entries),
            "old_term_last_step_after_cut_s": round(max(e["end"] for e in old) - cut_at, 2),
            "new_term_first_step_after_cut_s": round(first_new["end"] - cut_at, 2),
            "new_term_resumed_from_step": first_new["step"] - 1,
            "old_term_last_step": max(e["step"] for e in old),
            "old_term_steps_after_mend": sum(1 for e in old if e["end"] > mended_at),
        }
    return result


def kill_phase(
    bed: Testbed, a: Daemon, b: Daemon, url: str, data: Path, args: argparse.Namespace
) -> dict[str, Any]:
    from autotune.benchmarks.api_load import Load, Targets

    jobs = _start_jobs(b, ["kill-1", "kill-2"], data, args.steps)
    old_term = b.leading()
    load = Load(
        [a.port, b.port],
        Targets(url, seed=0),
        seed=0,
        hosts={a.port: a.machine.address, b.port: b.machine.address},
        mix=READS,
    )
    killed: dict[str, Any] = {}
    took: dict[str, Any] = {}

    def on_time(elapsed: float) -> None:
        if not killed and elapsed >= 5.0:
            killed["at"] = time.time()
            b.kill()
            load.killed = b.port
            killed["checkpoints"] = {j: _newest_checkpoint(data, j) for j in jobs}

    def watch() -> None:
        with bed.inside("control"):
            while "at" not in killed:
                time.sleep(0.05)
            term = _wait("the survivor to lead", a.leading, 120, every_s=0.1)
            took.update(term=term, at=time.time())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    achieved = asyncio.run(load.run(args.rate, args.load_s, on_time))
    watcher.join(timeout=150)
    if "at" not in took:
        raise RuntimeError("the surviving daemon never led")
    new_term = took["term"]
    finished = _wait(
        "both jobs to finish",
        lambda: (
            all(_job(a, j)["state"] in ("finished", "failed") for j in jobs)
            and [_job(a, j) for j in jobs]
        ),
        args.timeout_s,
        every_s=1.0,
    )
    statuses: Counter[str] = Counter()
    for per_kind in load.status.values():
        statuses.update(per_kind)
    statuses.update(load.after_signal)
    result: dict[str, Any] = {
        "rate_achieved": round(achieved, 1),
        "old_term": old_term,
        "new_term": new_term,
        "takeover_s": round(took["at"] - killed["at"], 2),
        "answers_from_the_survivor": dict(statuses),
        "answers_from_the_killed": dict(load.killed_port),
        "server_errors_not_503": sum(
            n for s, n in statuses.items() if s.isdigit() and int(s) >= 500 and s != "503"
        ),
        "jobs": {},
    }
    for job, status in zip(jobs, finished, strict=True):
        entries = step_log(data, job)
        old = [e for e in entries if e["term"] == old_term and e["rank"] == 0]
        new = [e for e in entries if e["term"] > old_term and e["rank"] == 0]
        last_old = max(e["step"] for e in old)
        result["jobs"][job] = {
            "state": status["state"],
            **overlaps(entries),
            "old_term_last_step": last_old,
            "newest_checkpoint_before": killed["checkpoints"][job],
            "resumed_from_step": min(e["step"] for e in new) - 1 if new else None,
            "starts_after_kill": len({(e["term"], e["attempt"]) for e in new}),
            "first_step_after_kill_s": round(min(e["end"] for e in new) - killed["at"], 2)
            if new
            else None,
        }
    return result


def head_phase(
    bed: Testbed,
    a: Daemon,
    b: Daemon,
    url: str,
    data: Path,
    logs: Path,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """The head machine dies under daemon A (the leader) and a job; daemon B, on a
    worker, is watched; then the cluster is started again as an operator would (Ray on
    every machine, a daemon on the head) and the job resumes from its checkpoint."""
    job = "head-1"
    _submit(a, job, 100_000)
    _wait("the job to train 10 steps", lambda: _steps_done(data, job) >= 10, 300)
    before = decision_ids(url)
    killed_at = time.time()
    bed.kill("head")  # the Ray head (GCS, raylet) and daemon A with it
    checkpoint = _newest_checkpoint(data, job)
    seen: list[dict[str, Any]] = []
    while time.time() - killed_at < args.head_watch_s:
        ready = b.readiness()
        seen.append(
            {
                "t": round(time.time() - killed_at, 1),
                "process_alive": b.process.poll() is None,
                "answers": ready is not None,
                "leading": bool(((ready or {}).get("leader") or {}).get("leading")),
                "tick": (ready or {}).get("tick"),
            }
        )
        time.sleep(1.0)
    after = decision_ids(url)
    # The driver (daemon A, on the head) sends each step when the last one returns, and
    # the bench kills the head when step 10 is logged, so the step sent just before the
    # kill may begin on a worker's ranks a few milliseconds after it: that one is in
    # flight. A step begun later than IN_FLIGHT_S after the kill would be training that
    # nothing controls.
    ranked = [e for e in step_log(data, job) if e["rank"] == 0]
    steps_after = [e for e in ranked if e["start"] > killed_at + IN_FLIGHT_S]
    in_flight = [e for e in ranked if killed_at < e["start"] <= killed_at + IN_FLIGHT_S]
    answering = [s for s in seen if s["answers"]]
    last = answering[-1] if answering else {}
    job_seen = _job(b, job) if b.readiness() is not None else None
    result: dict[str, Any] = {
        "watched_s": args.head_watch_s,
        "daemon_b_exit_code": b.process.poll(),
        "daemon_b_led_at_s": next((s["t"] for s in seen if s["leading"]), None),
        "daemon_b_answered_until_s": last.get("t"),
        "daemon_b_tick_at_end": last.get("tick"),
        "daemon_b_job_state": None if job_seen is None else job_seen["state"],
        "daemon_b_events": sorted(
            {str(e["event"])[:120] for e in b.events() if e.get("level") in ("warning", "error")}
        )[:20],
        "decisions_before": len(before),
        "decisions_lost": len(before - after),
        "steps_after_the_kill": len(steps_after),
        "steps_in_flight_at_the_kill": len(in_flight),
        "last_step_before": max(e["step"] for e in step_log(data, job)),
        "newest_checkpoint_before": checkpoint,
    }
    # Start again: Ray on every machine (the workers' raylets exit once the head is gone
    # for good), daemon B stopped, a daemon on the head.
    b.kill()
    restarted_at = time.time()
    for machine in bed.machines:
        if machine.name != "control":
            bed.kill(machine)
    bed.restart("head")
    for worker in bed.workers:
        bed.restart(worker)
    fresh = Daemon(bed, "head", 8003, url, data, logs)
    try:
        term = _wait("the new daemon to lead", fresh.leading, 180)
        first = _wait(
            "the job's first step after the restart",
            lambda: _first_step_of(step_log(data, job), term),
            300,
        )
    finally:
        fresh.kill()
    result["restart"] = {
        "term": term,
        "first_step_after_restart_s": round(first["end"] - restarted_at, 1),
        "resumed_from_step": first["step"] - 1,
        "decisions_lost": len(before - decision_ids(url)),
    }
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    result: dict[str, Any] = {}
    with Testbed(3, mbit=args.mbit, cpus=[1, 2, 2], control=True) as bed:
        result["testbed_built_s"] = round(bed.built_s, 2)
        data = bed.root / "shared"
        data.mkdir()
        logs = Path(tempfile.mkdtemp(prefix="autotune-failover-logs-"))  # kept: to read after
        result["daemon_logs"] = str(logs)
        database = Postgres(bed)
        daemons: list[Daemon] = []
        try:
            with bed.inside("control"):  # the database and both APIs are reached from here
                a = Daemon(bed, "head", 8001, database.url, data, logs)
                daemons.append(a)
                _wait("daemon A to lead", a.leading, 180)
                b = Daemon(bed, "worker1", 8002, database.url, data, logs)
                daemons.append(b)
                _wait("daemon B to serve", b.readiness, 180)
                result["partition"] = partition_phase(bed, a, b, database.url, data, args)
                result["leader_killed"] = kill_phase(bed, a, b, database.url, data, args)
                b = Daemon(bed, "worker1", 8002, database.url, data, logs)
                daemons.append(b)
                result["head_killed"] = head_phase(bed, a, b, database.url, data, logs, args)
        except BaseException:
            for d in daemons:
                sys.stderr.write(f"--- {d.name} ({d.log}):\n")
                sys.stderr.write("".join(d.log.read_text(errors="replace").splitlines(True)[-40:]))
            raise
        finally:
            for d in daemons:
                d.kill()
            database.close()
    result["wall_s"] = round(time.perf_counter() - started, 1)
    return result


def goals(result: dict[str, Any]) -> dict[str, bool]:
    cut, kill, head = result["partition"], result["leader_killed"], result["head_killed"]
    return {
        "cut_no_step_trained_twice_at_once": all(
            j["concurrent_step_pairs"] == 0 for j in cut["jobs"].values()
        ),
        "cut_new_leader_first_step_within_20s": all(
            j["new_term_first_step_after_cut_s"] <= 20 for j in cut["jobs"].values()
        ),
        "cut_nothing_lost": cut["decisions_lost"] == 0
        and all(
            j["state"] == "finished" and j["old_term_steps_after_mend"] == 0
            for j in cut["jobs"].values()
        ),
        "kill_takeover_within_10s": kill["takeover_s"] <= 10,
        "kill_no_5xx_but_503": kill["server_errors_not_503"] == 0,
        "kill_each_job_resumed_once": all(
            j["starts_after_kill"] == 1
            and j["concurrent_step_pairs"] == 0
            and j["resumed_from_step"] == j["newest_checkpoint_before"]
            for j in kill["jobs"].values()
        ),
        "head_no_decision_lost": head["decisions_lost"] == 0
        and head["restart"]["decisions_lost"] == 0,
        "head_job_resumes_after_restart": head["restart"]["resumed_from_step"]
        == head["newest_checkpoint_before"],
    }


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    result = run(args)
    met = goals(result)
    out = {
        "benchmark": "testbed_failover",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "command": " ".join(["python", "bench/testbed_failover.py", *(argv or sys.argv[1:])]),
        "lease_s": LEASE_S,
        "checkpoint_every": CHECKPOINT_EVERY,
        **result,
        "goals": met,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0 if all(met.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
