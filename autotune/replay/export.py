"""``autotune replay export``: the daemon's logged rounds as RLlib offline data.

One row per job the learned policy acted on in a round (the policy is shared across job
slots, so a job's decision is the unit it learns from: the cluster-wide features and that
job's slot features in, its 7 action entries out). Columns carry RLlib's offline names
(``obs``, ``actions``, ``rewards``, ``new_obs``, ``terminateds``, ``truncateds``,
``eps_id``, ``t``) plus ``action_logp`` (joint, under the acting policy), per-entry
log-probabilities, the action mask, the reward's parts and where the row came from. An
episode (``eps_id``) is one job's consecutive decisions within one logged episode; a job
whose decision an override or a fallback took starts a new one after it.

Rows are streamed from the database in id order and written in row groups of about
``ROW_GROUP_BYTES`` into at most ``MAX_FILES`` Parquet files, so memory stays bounded
whatever the history's length. ``manifest.json`` describes the export, ``workload.json``
the jobs that arrived (``autotune.replay.workload``).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import inspect, select
from sqlalchemy.engine import make_url

from autotune.core import JobSpec, NodeInfo
from autotune.db import Database
from autotune.db import repository as repo
from autotune.db.tables import JobRow, NodeRow, TransitionRow
from autotune.errors import InputError
from autotune.replay.workload import WORKLOAD_FILE, workload_job, write_workload
from autotune.rl.action import ACTION_DIMS
from autotune.rl.observation import HEADER, SLOT, from_log
from autotune.serde import from_json

__all__ = ["FORMAT", "MAX_FILES", "ExportReport", "export"]

FORMAT = "autotune-replay/1"
MAX_FILES = 4
ROW_GROUP_BYTES = 32 << 20
FILE_BYTES = 256 << 20
"""A file is closed once it holds this much (uncompressed), while fewer than
``MAX_FILES`` exist; the last file takes the rest."""
OBS_SIZE = HEADER + len(SLOT)
WIDTH = len(ACTION_DIMS)
PARTS = ("goodput", "oom", "nan", "restart", "energy")

SCHEMA = pa.schema(
    [
        ("obs", pa.list_(pa.float32(), OBS_SIZE)),
        ("new_obs", pa.list_(pa.float32(), OBS_SIZE)),
        ("actions", pa.list_(pa.int64(), WIDTH)),
        ("action_mask", pa.list_(pa.bool_(), WIDTH)),
        ("action_logp", pa.float64()),
        ("action_logp_dims", pa.list_(pa.float64(), WIDTH)),
        ("rewards", pa.float64()),
        *[(f"reward_{p}", pa.float64()) for p in PARTS],
        ("terminateds", pa.bool_()),
        ("truncateds", pa.bool_()),
        ("eps_id", pa.string()),
        ("t", pa.int64()),
        ("job_id", pa.string()),
        ("policy_version", pa.string()),
        ("epsilon", pa.float64()),
        ("tick", pa.int64()),
        ("slot", pa.int32()),
        ("decided_at", pa.timestamp("us", tz="UTC")),
    ]
)
_ROW_BYTES = 4 * OBS_SIZE * 2 + 8 * WIDTH * 2 + WIDTH + 8 * 9 + 64
ROWS_PER_GROUP = max(1024, ROW_GROUP_BYTES // _ROW_BYTES)


@dataclass(slots=True)
class ExportReport:
    out: Path
    rows: int = 0
    rounds: int = 0
    episodes: int = 0
    files: list[str] = field(default_factory=list)
    skipped_unmeasured: int = 0
    """Rounds without a measured reward (the backend reports none, or the daemon stopped
    before measuring them)."""
    skipped_not_applied: int = 0
    """Job decisions an override or a fallback took instead of the policy."""
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "out": str(self.out),
            "rows": self.rows,
            "rounds": self.rounds,
            "episodes": self.episodes,
            "files": self.files,
            "skipped_unmeasured": self.skipped_unmeasured,
            "skipped_not_applied": self.skipped_not_applied,
            "seconds": round(self.seconds, 2),
        }


@dataclass(slots=True)
class _Round:
    id: int
    episode: str
    step: int
    policy_version: str
    epsilon: float
    obs: np.ndarray
    slots: dict[str, Any]
    reward_parts: dict[str, Any] | None
    truncated: bool
    at: datetime
    time_s: float | None
    """The backend's clock at the decision."""

    def job_obs(self, k: int) -> np.ndarray:
        """The header and slot ``k``'s features."""
        out = np.empty(OBS_SIZE, dtype=np.float32)
        out[:HEADER] = self.obs[:HEADER]
        start = HEADER + k * len(SLOT)
        out[HEADER:] = self.obs[start : start + len(SLOT)]
        return out

    def header_only(self) -> np.ndarray:
        out = np.zeros(OBS_SIZE, dtype=np.float32)
        out[:HEADER] = self.obs[:HEADER]
        return out


def _rounds(
    db: Database, since: datetime | None, until: datetime | None, batch: int = 2000
) -> Iterator[_Round]:
    """Logged rounds in id order, streamed."""
    query = select(
        TransitionRow.id,
        TransitionRow.episode,
        TransitionRow.step,
        TransitionRow.policy_version,
        TransitionRow.epsilon,
        TransitionRow.observation,
        TransitionRow.slots,
        TransitionRow.reward_parts,
        TransitionRow.packed,
        TransitionRow.truncated,
        TransitionRow.created_at,
        TransitionRow.sim_time_s,
    ).order_by(TransitionRow.id)
    if since is not None:
        query = query.where(TransitionRow.created_at >= since)
    if until is not None:
        query = query.where(TransitionRow.created_at < until)
    last_id = 0
    while True:
        with db.session() as session:
            rows = session.execute(query.where(TransitionRow.id > last_id).limit(batch)).all()
        if not rows:
            return
        for r in rows:
            slots, parts = repo.transition_payload(r.slots, r.reward_parts, r.packed)
            n = len(slots.get("jobs", ()))
            yield _Round(
                id=r.id,
                episode=r.episode,
                step=r.step,
                policy_version=r.policy_version,
                epsilon=r.epsilon,
                obs=from_log(repo.unpack_observation(r.observation), n),
                slots=slots,
                reward_parts=parts,
                truncated=r.truncated,
                at=r.created_at,
                time_s=r.sim_time_s,
            )
        last_id = rows[-1].id


class _Writer:
    """Buffers rows, writes a row group per ``ROWS_PER_GROUP``, rolls files."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.files: list[str] = []
        self._writer: pq.ParquetWriter | None = None
        self._file_bytes = 0
        self.columns: dict[str, list[Any]] = {name: [] for name in SCHEMA.names}
        self.rows = 0

    def add(self, **row: Any) -> None:
        for name, value in row.items():
            self.columns[name].append(value)
        self.rows += 1
        if len(self.columns["t"]) >= ROWS_PER_GROUP:
            self.flush()

    def flush(self) -> None:
        n = len(self.columns["t"])
        if n == 0:
            return
        arrays = []
        for f in SCHEMA:
            values = self.columns[f.name]
            if pa.types.is_fixed_size_list(f.type):
                flat = np.concatenate(values).astype(f.type.value_type.to_pandas_dtype())
                arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(flat), f.type.list_size))
            else:
                arrays.append(pa.array(values, type=f.type))
        table = pa.Table.from_arrays(arrays, schema=SCHEMA)
        if self._writer is None or (self._file_bytes >= FILE_BYTES and len(self.files) < MAX_FILES):
            self._close_file()
            name = f"transitions-{len(self.files):05d}.parquet"
            self.files.append(name)
            self._writer = pq.ParquetWriter(self.out / name, SCHEMA, compression="zstd")
            self._file_bytes = 0
        self._writer.write_table(table, row_group_size=n)
        self._file_bytes += table.nbytes
        self.columns = {name: [] for name in SCHEMA.names}

    def _close_file(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def close(self) -> None:
        self.flush()
        self._close_file()


def export(
    db_url: str,
    out: str | Path,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    progress: Callable[[int], None] | None = None,
) -> ExportReport:
    """Export the transitions logged in ``[since, until)`` (see the module docstring);
    ``progress(rounds_read)`` is called as rounds are read."""
    started = time.perf_counter()
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise InputError("the output folder exists and is not empty", path=str(out))
    url = make_url(db_url)
    if url.get_backend_name() == "sqlite" and url.database and not Path(url.database).is_file():
        raise InputError("no database here", path=url.database)
    db = Database(db_url)
    try:
        if not inspect(db.engine).has_table(TransitionRow.__tablename__):
            raise InputError(
                "not a daemon database, or one older than the transition log (run "
                "`autotune db upgrade`)"
            )
        with db.session() as session:
            if session.scalar(select(TransitionRow.id).limit(1)) is None:
                raise InputError(
                    "no logged transitions in this database (is the daemon "
                    "running the learned policy with log_transitions on?)"
                )
        out.mkdir(parents=True, exist_ok=True)
        report = ExportReport(out=out)
        writer = _Writer(out)
        counters: dict[str, int] = {}
        segments: dict[tuple[str, str], int] = {}
        versions: dict[str, int] = {}
        epsilons: set[float] = set()
        seen_jobs: set[str] = set()
        first: datetime | None = None
        last: datetime | None = None
        first_id: int | None = None  # the first and the last transition read
        last_id: int | None = None
        previous: _Round | None = None
        weights: dict[str, float] = {}
        speeds: dict[str, list[float]] = {}
        gap_s = _round_s(db)  # the backend's clock between two rounds
        for current in _rounds(db, since, until):
            if not weights and current.reward_parts:
                weights = dict(current.reward_parts.get("weights", {}))
            report.rounds += 1
            if progress is not None and report.rounds % 500 == 0:
                progress(report.rounds)
            if previous is not None:
                _emit(previous, current, writer, counters, segments, versions, report, gap_s)
            previous = current
            seen_jobs.update(current.slots.get("jobs", ()))
            for job_id, mine in (current.reward_parts or {}).get("jobs", {}).items():
                if "speed" in mine:
                    total = speeds.setdefault(job_id, [0.0, 0.0])
                    total[0] += mine["speed"][0]
                    total[1] += mine["speed"][1]
            epsilons.add(current.epsilon)
            first = first or current.at
            last = current.at
            first_id = current.id if first_id is None else first_id
            last_id = current.id
        if previous is not None:
            _emit(previous, None, writer, counters, segments, versions, report, gap_s)
        writer.close()
        report.rows = writer.rows
        report.files = writer.files
        report.episodes = len(counters)
        factors = {job: m / p for job, (m, p) in speeds.items() if m > 0 and p > 0}
        # The round period the log was taken with, as its reward says (else its clock).
        round_s = float(weights.get("round_s") or gap_s)
        _write_workload(db, out, seen_jobs, first, last, factors, round_s)
        if first_id is not None and last_id is not None:  # retention may now delete them
            with db.session() as session:
                repo.record_transition_export(
                    session=session,
                    first_id=first_id,
                    last_id=last_id,
                    rounds=report.rounds,
                    path=str(out.resolve()),
                )
    finally:
        db.dispose()
    report.seconds = time.perf_counter() - started
    manifest = {
        "format": FORMAT,
        "rows": report.rows,
        "rounds": report.rounds,
        "episodes": report.episodes,
        "files": report.files,
        "columns": {f.name: str(f.type) for f in SCHEMA},
        "policy_versions": versions,
        "time_range": {
            "since": first.isoformat() if first else None,
            "until": last.isoformat() if last else None,
        },
        "epsilon": sorted(epsilons),
        "action_dims": list(ACTION_DIMS),
        "observation_size": OBS_SIZE,
        "round_s": round_s,
        "energy_weight": weights.get("energy_weight"),
        "skipped_unmeasured": report.skipped_unmeasured,
        "skipped_not_applied": report.skipped_not_applied,
        "db": url.render_as_string(hide_password=True),
        "workload": WORKLOAD_FILE,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return report


def _run(round_: _Round) -> str:
    """The daemon run a round belongs to (its episode without the episode's number)."""
    return round_.episode.rpartition("-")[0]


def _adjacent(now: _Round, after: _Round | None, gap_s: float) -> bool:
    """Whether ``after`` is the round right after ``now`` in the same daemon run (the
    backend's clock one round later; by step where there is no clock)."""
    if after is None or _run(after) != _run(now):
        return False
    if now.time_s is not None and after.time_s is not None and math.isfinite(gap_s):
        return 0 < after.time_s - now.time_s <= 1.5 * gap_s
    return after.episode == now.episode and after.step == now.step + 1


def _emit(
    now: _Round,
    after: _Round | None,
    writer: _Writer,
    counters: dict[str, int],
    segments: dict[tuple[str, str], int],
    versions: dict[str, int],
    report: ExportReport,
    gap_s: float,
) -> None:
    """The rows of round ``now``; ``after`` is the next logged round (any episode).

    A job's row continues its episode into ``after`` only if ``after`` is the next round
    of the same logged episode (``now`` not truncated), was measured, and the policy's
    choice for the job was applied there; otherwise the row is truncated. ``new_obs`` is
    the job's observation in the round right after (even across an episode boundary),
    else that round's cluster-wide features with an empty slot."""
    parts = now.reward_parts
    slots = now.slots
    jobs: list[str] = slots.get("jobs", [])
    if parts is None:
        report.skipped_unmeasured += 1
        for job_id in jobs:  # the job's next decision starts a new episode
            segments[(now.episode, job_id)] = segments.get((now.episode, job_id), 0) + 1
        return
    adjacent = _adjacent(now, after, gap_s)
    follows = (
        adjacent
        and after is not None
        and after.episode == now.episode
        and not now.truncated
        and after.reward_parts is not None
    )
    next_slot: dict[str, int] = {}
    next_applied: dict[str, bool] = {}
    if adjacent:
        assert after is not None
        for k, job_id in enumerate(after.slots.get("jobs", [])):
            next_slot[job_id] = k
            next_applied[job_id] = bool(after.slots["applied"][k])
    job_parts: dict[str, dict[str, Any]] = parts.get("jobs", {})
    for k, job_id in enumerate(jobs):
        key = (now.episode, job_id)
        if not slots["applied"][k]:
            report.skipped_not_applied += 1
            segments[key] = segments.get(key, 0) + 1
            continue
        mine = job_parts.get(job_id, {})
        ended = bool(mine.get("ended", False))
        if after is not None and adjacent and job_id in next_slot and not ended:
            new_obs = after.job_obs(next_slot[job_id])
        elif after is not None and adjacent:
            new_obs = after.header_only()
        else:
            new_obs = now.header_only()
        truncated = not ended and not (follows and next_applied.get(job_id, False))
        segment = segments.get(key, 0)
        eps_id = f"{now.episode}/{job_id}" + (f"#{segment}" if segment else "")
        t = counters.get(eps_id, 0)
        counters[eps_id] = t + 1
        if truncated or ended:
            segments[key] = segment + 1
        logp = np.asarray(slots["logp"][k], dtype=np.float64)
        mask = np.asarray(slots["mask"][k], dtype=bool)
        values = {p: float(mine.get(p, 0.0)) for p in PARTS}
        writer.add(
            obs=now.job_obs(k),
            new_obs=new_obs,
            actions=np.asarray(slots["entries"][k], dtype=np.int64),
            action_mask=mask,
            action_logp=float(logp[mask].sum()),
            action_logp_dims=logp,
            rewards=float(mine.get("reward", sum(values.values()))),
            **{f"reward_{p}": v for p, v in values.items()},
            terminateds=ended,
            truncateds=truncated,
            eps_id=eps_id,
            t=t,
            job_id=job_id,
            policy_version=now.policy_version,
            epsilon=now.epsilon,
            tick=now.step,
            slot=k,
            decided_at=now.at,
        )
        versions[now.policy_version] = versions.get(now.policy_version, 0) + 1


def _write_workload(
    db: Database,
    out: Path,
    seen: set[str],
    first: datetime | None,
    last: datetime | None,
    factors: dict[str, float],
    round_s: float,
) -> None:
    """The jobs the logged rounds saw, and those submitted while they were logged, each
    with its measured speed over the model's (``factors``; 1 where never measured)."""
    with db.session() as session:
        query = select(JobRow)
        if first is not None and last is not None:
            query = query.where(
                JobRow.job_id.in_(seen)
                | ((JobRow.submitted_at >= first) & (JobRow.submitted_at <= last))
            )
        else:
            query = query.where(JobRow.job_id.in_(seen))
        jobs = []
        for row in session.scalars(query):
            spec = from_json(JobSpec, row.spec)
            if spec.model is None or row.sim_submitted_s is None:
                continue  # not replayable in the simulator: no model profile or clock
            try:
                jobs.append(
                    workload_job(
                        spec=spec,
                        task=row.task,
                        submitted_s=row.sim_submitted_s,
                        speed_factor=factors.get(spec.job_id, 1.0),
                    )
                )
            except ValueError:
                continue
        nodes = [from_json(NodeInfo, r.info) for r in session.scalars(select(NodeRow))]
    write_workload(out / WORKLOAD_FILE, nodes=nodes, jobs=jobs, round_s=round_s)


def _round_s(db: Database) -> float:
    """The round period of the logged run: the gap between consecutive rounds on the
    backend's clock (most common value)."""
    with db.session() as session:
        times = session.scalars(
            select(TransitionRow.sim_time_s).order_by(TransitionRow.id.desc()).limit(200)
        ).all()
    gaps = np.diff([t for t in reversed(times) if t is not None])
    gaps = gaps[gaps > 0]
    if len(gaps) == 0:
        return float("nan")
    values, counts = np.unique(np.round(gaps, 3), return_counts=True)
    return float(values[int(np.argmax(counts))])
