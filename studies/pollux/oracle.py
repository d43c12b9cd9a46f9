"""The oracle in the Pollux-compatible world: the default world's objective (the slot
jobs' summed normalized goodput, here each job's speed-up over its best on one GPU)
from the measured physics the jobs run on, on Pollux's knobs."""

from __future__ import annotations

from autotune.core import JobConfig
from autotune.interfaces import ClusterSnapshot, PolicyChoice, PolicyRound
from autotune.policies.baselines import OraclePolicy, oracle_choices, share_gpus
from autotune.rl.observation import slot_jobs
from autotune.studies.pollux.goodput import GoodputPolicy

__all__ = ["MeasuredOraclePolicy"]


class MeasuredOraclePolicy(OraclePolicy):
    """``oracle`` in the Pollux-compatible world: per job and GPU count the best batch
    (``GoodputPolicy.goodput_tables``), GPUs shared by the oracle's dynamic programming.
    Only counts faster than every smaller one are considered."""

    _tables: GoodputPolicy | None = None

    def decide(self, snapshot: ClusterSnapshot) -> PolicyRound:
        return PolicyRound(choices=self._measured(snapshot))

    def _measured(self, snapshot: ClusterSnapshot) -> dict[str, PolicyChoice]:
        """The Pollux-compatible mode: the same objective (the slot jobs' summed
        normalized goodput, here each job's speed-up over its best on one GPU) from the
        measured physics the jobs run on, on Pollux's knobs: per job and GPU count the
        best batch (``GoodputPolicy.goodput_tables``), GPUs shared by the same dynamic
        programming. Only counts faster than every smaller one are considered."""
        if self._tables is None:
            self._tables = GoodputPolicy(self.env)
        tables = self._tables.goodput_tables(snapshot)
        jobs = slot_jobs(snapshot, self.slots)
        lost = self.env.sim_config.restart_s / self.env.round_s
        options: list[dict[int, tuple[float, JobConfig | None]]] = []
        for job in jobs:
            table = tables.get(job.spec.job_id, [])
            one = table[1][0] if len(table) > 1 else 0.0
            best: dict[int, tuple[float, JobConfig | None]] = {}
            fastest = 0.0
            for n in range(1, len(table)):
                rate, batch = table[n]
                if one > 0 and rate > fastest:
                    fastest = rate
                    layout = JobConfig.data_parallel(n).layout
                    best[n] = (rate / one, JobConfig(layout=layout, global_batch=batch))
            if job.state == "running" and job.config is not None and one > 0:
                best = {g: (v * (1 - lost), c) for g, (v, c) in best.items()}
                held = job.config.world_size
                current = table[held][0] / one if held < len(table) else 0.0
                if best.get(held, (0.0, None))[0] <= current * (1 + self.gain_margin):
                    best[held] = (current, None)
            options.append(best)
        capacity = sum(n.gpu_count for n in snapshot.nodes if n.gpu_count > 0) - sum(
            j.placement.world_size
            for j in snapshot.by_state("running")
            if j.placement is not None and j not in jobs
        )
        running = [j.state == "running" and bool(o) for j, o in zip(jobs, options, strict=True)]
        chosen = share_gpus(options, capacity, running)
        return oracle_choices(
            snapshot,
            jobs,
            options,
            chosen,
            lambda v: f"oracle: speed-up {v:.2f} (measured physics)",
        )
