"""Provisioning in the decision loop: on the simulated cluster the plan parks idle nodes
before the tick decides; on a backend that cannot park, the plan is only recorded."""

from __future__ import annotations

from typing import Any

from autotune.daemon.tick import Daemon, DaemonParts
from autotune.db import Database
from autotune.db import repository as repo
from autotune.demand import NoForecast
from autotune.envs.presets import small_nodes
from autotune.envs.simulator import SimConfig, SimulatedCluster
from autotune.interfaces import ClusterSnapshot
from autotune.policies.rules import RulesPolicy
from autotune.provisioning import Provisioner


def _metric(daemon: Daemon, name: str) -> list[float]:
    with daemon.db.session() as session:
        return [s.value for s in repo.list_metrics(session=session, names=[name], limit=100)]


def test_the_simulated_cluster_parks_what_demand_does_not_need(database: Database) -> None:
    sim = SimulatedCluster(SimConfig(nodes=tuple(small_nodes()), initial_jobs=1, max_jobs=1))
    daemon = Daemon(
        DaemonParts(
            db=database, backend=sim, policy=RulesPolicy(), provisioner=Provisioner(NoForecast())
        )
    )
    daemon.start()
    for _ in range(3):
        daemon.tick()
    snapshot = sim.snapshot()
    # One small job: its demand fits on the first node(s); the idle rest is parked.
    assert snapshot.parked_nodes
    held = {s.node_id for j in snapshot.by_state("running") for s in j.placement.ranks}  # type: ignore[union-attr]
    assert not held & {n.node_id for n in snapshot.parked_nodes}
    assert _metric(daemon, "nodes_parked")[-1] == len(snapshot.parked_nodes)
    assert _metric(daemon, "gpu_capacity")[-1] == 16
    assert _metric(daemon, "provisioning_target_gpus")


class Unparkable:
    """A backend without park/wake (as Ray): the plan can only be recommended."""

    name = "fixed"

    def __init__(self) -> None:
        self.sim = SimulatedCluster(
            SimConfig(nodes=tuple(small_nodes()), initial_jobs=0, max_jobs=0)
        )

    def observe(self) -> ClusterSnapshot:
        return self.sim.observe()

    def apply(self, decisions: Any) -> None:
        self.sim.apply(decisions)

    def close(self, timeout_s: float | None = None) -> None:
        self.sim.close()


def test_elsewhere_the_plan_is_a_recommendation(database: Database) -> None:
    backend = Unparkable()
    daemon = Daemon(
        DaemonParts(
            db=database,
            backend=backend,  # type: ignore[arg-type]
            policy=RulesPolicy(),
            provisioner=Provisioner(NoForecast()),
        )
    )
    daemon.start()
    daemon.tick()
    assert not backend.sim.parked
    assert _metric(daemon, "provisioning_recommended_park")[-1] == 4
    assert _metric(daemon, "nodes_parked")[-1] == 0
