"""Provisioning: parked nodes in the simulator (no jobs there, no power drawn, a wake-up
latency), the Provisioner's plan, and its effect on an evaluation."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from helpers import cli

from autotune.catalog.devices import device
from autotune.demand import HORIZONS, QUANTILES, NoForecast
from autotune.envs.cluster_env import ClusterEnv
from autotune.envs.presets import small_nodes
from autotune.envs.simulator import SimConfig, SimulatedCluster
from autotune.envs.workloads import synthetic_jobs
from autotune.perf.model import IDLE_POWER_FRACTION
from autotune.policies.evaluate import evaluate_policies
from autotune.provisioning import Provisioner


@dataclass
class FixedPeak:
    """A forecaster whose 95% quantile of the next hour's peak is ``peak`` GPUs."""

    peak: float
    name: str = "fixed"
    history: int = 1

    def predict(self, demand, capacity, ends, week_minute, origin=0):  # type: ignore[no-untyped-def]
        prob = np.zeros((len(ends), len(HORIZONS)))
        peak = np.full((len(ends), len(HORIZONS), len(QUANTILES)), self.peak)
        return prob, peak


def _idle_cluster(**config: float) -> SimulatedCluster:
    sim = SimulatedCluster(SimConfig(nodes=tuple(small_nodes()), **config), arrivals=[])  # type: ignore[arg-type]
    sim.start()
    return sim


def test_parked_nodes_draw_nothing_and_wake_after_the_latency() -> None:
    sim = _idle_cluster(round_s=60.0, wake_s=90.0)
    t4_watts = device("T4").tdp_watts * IDLE_POWER_FRACTION
    a100_watts = device("A100").tdp_watts * IDLE_POWER_FRACTION
    everything = 4 * 60 * (2 * t4_watts + 2 * a100_watts) / 3.6e6
    assert sim.advance().idle_energy_kwh == pytest.approx(everything)
    sim.park(["t4-0", "t4-1"])
    snapshot = sim.snapshot()
    assert [n.node_id for n in snapshot.parked_nodes] == ["t4-0", "t4-1"]
    assert "t4-0" not in {n.node_id for n in snapshot.nodes}
    assert snapshot.capacity_gpus() == 16
    outcome = sim.advance()
    assert outcome.idle_energy_kwh == pytest.approx(4 * 60 * 2 * a100_watts / 3.6e6)
    assert outcome.energy_kwh == pytest.approx(outcome.idle_energy_kwh)
    sim.wake(["t4-0"])
    # Waking: idle power, not usable yet; usable after 90 s (two 60 s rounds).
    assert [n.node_id for n in sim.snapshot().waking_nodes] == ["t4-0"]
    sim.advance()
    assert "t4-0" not in {n.node_id for n in sim.snapshot().nodes}
    sim.advance()
    assert "t4-0" in {n.node_id for n in sim.snapshot().nodes}
    assert [n.node_id for n in sim.snapshot().parked_nodes] == ["t4-1"]


def test_a_busy_node_is_never_parked() -> None:
    env = ClusterEnv(nodes=small_nodes(), jobs=synthetic_jobs(np.random.default_rng(0), n_jobs=4))
    env.reset(seed=0)
    env.step_choices({})
    sim = env.sim
    assert sim is not None
    busy = {s.node_id for j in sim.snapshot().by_state("running") for s in j.placement.ranks}  # type: ignore[union-attr]
    assert busy
    with pytest.raises(ValueError, match="runs a job"):
        sim.park(busy)


def test_the_plan_keeps_what_the_quantile_needs() -> None:
    sim = _idle_cluster()
    snapshot = sim.snapshot()
    # Needs 6 GPUs: two 4-GPU nodes stay on, the last two are parked.
    plan = Provisioner(FixedPeak(6.0)).plan(snapshot)
    assert plan.park == ("t4-1", "t4-0")
    assert plan.powered_gpus == 8
    sim.park(plan.park)
    # The forecast rises to 13: wakes parked nodes until 16 GPUs are on or waking.
    plan = Provisioner(FixedPeak(13.0)).plan(sim.snapshot())
    assert plan.wake == ("t4-0", "t4-1")
    assert plan.park == ()
    # Demand now is a floor whatever the forecast says; no forecaster: every node on.
    plan = Provisioner(None).plan(sim.snapshot())
    assert plan.wake == ("t4-0", "t4-1")
    plan = Provisioner(NoForecast()).plan(sim.snapshot())
    assert len(plan.park) == 2  # nothing runs: only the nodes still on are parked


def test_provisioning_saves_idle_energy_in_an_evaluation() -> None:
    """Jobs arrive hours apart: keeping every node on burns idle energy between them,
    provisioning for demand now saves it, at the cost of waking nodes for each job."""
    jobs = synthetic_jobs(
        np.random.default_rng(3), n_jobs=6, mean_interarrival_s=4 * 3600, median_duration_s=1800
    )
    report = evaluate_policies(
        nodes=small_nodes(),
        jobs=jobs,
        policies=["static"],
        seeds=1,
        max_steps=2000,
        forecasts=["none"],
        provisioning=["none", "forecast"],
        wake_s=120.0,
    )
    on = report["policies"]["static provisioning=none"]
    parked = report["policies"]["static provisioning=forecast"]
    assert on["n_jobs_done"] == parked["n_jobs_done"] == 6
    assert parked["idle_energy_kwh"] < 0.5 * on["idle_energy_kwh"]
    assert parked["energy_kwh"] < on["energy_kwh"]
    assert parked["avg_jct_s"] >= on["avg_jct_s"]
    assert math.isfinite(parked["avg_jct_s"])


def test_eval_cli_rejects_unknown_modes() -> None:
    result = cli(
        "eval", "--pollux-workload", "x.csv", "--provisioning", "sometimes", "--policies", "rules"
    )
    assert result.exit_code == 2
    assert "--provisioning" in result.stderr
    result = cli("eval", "--pollux-workload", "x.csv", "--forecast", "crystal-ball")
    assert result.exit_code == 2
    assert "--forecast" in result.stderr
