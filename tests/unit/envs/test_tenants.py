"""Tenants in the simulated cluster and in `autotune eval`: the simulator's snapshots
carry them and the decision step holds them to their quotas there as in the daemon,
`--tenants` parses into quotas or fails in one line, and the fairness figures are
what a hand count gives."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers import cli

from autotune.catalog.profiles import MODEL_CATALOG
from autotune.catalog.tasks import resolve_task
from autotune.core import JobSpec, TenantSpec
from autotune.envs.cluster_env import ClusterEnv
from autotune.envs.presets import small_nodes
from autotune.envs.simulator import Arrival, SimConfig, SimulatedCluster
from autotune.envs.tenants import (
    TENANT_FIGURES,
    TenantMeter,
    draw_tenants,
    parse_tenant_shares,
    quota_tenants,
)
from autotune.errors import InputError
from autotune.interfaces import ClusterSnapshot, JobStatus, JobSubmission
from autotune.policies.evaluate import evaluate_policies, run_episode
from autotune.policies.rules import RulesPolicy


def _job(
    job_id: str, tenant: str, submit_s: float = 0.0, gpus: int = 2, elastic: int = 4
) -> Arrival:
    model = MODEL_CATALOG["gpt-125m"]
    return Arrival(
        spec=JobSpec(
            job_id=job_id,
            model=model,
            global_batch=model.reference_batch,
            min_gpus=1,
            max_gpus=elastic * gpus,
            requested_gpus=gpus,
            submitted_at=submit_s,
            tenant=tenant,
        ),
        duration_s=1800.0,
        reference_gpus=gpus,
    )


# -- the simulated cluster --------------------------------------------------------------


def _held_per_round(tenants: tuple[TenantSpec, ...], jobs: list[Arrival]) -> list[dict[str, float]]:
    """The GPUs each tenant's jobs held in every round of an episode under ``rules``."""
    env = ClusterEnv(nodes=small_nodes(), jobs=jobs, tenants=tenants, slots=8, noise=False)
    rounds: list[dict[str, float]] = []
    before: dict[str, float] = defaultdict(float)

    def hook(_decided_on: ClusterSnapshot, sim: SimulatedCluster) -> None:
        assert {j.job_id: j.status.spec.tenant for j in sim.jobs.values()} == {
            a.spec.job_id: a.spec.tenant for a in jobs if a.spec.job_id in sim.jobs
        }
        now: dict[str, float] = defaultdict(float)
        for job in sim.jobs.values():
            now[job.status.spec.tenant] += job.attained_gpu_s
        rounds.append({t: (now[t] - before[t]) / sim.config.round_s for t in now})
        before.update(now)

    result = run_episode(RulesPolicy(), env, seed=0, on_round=hook)
    assert result["n_jobs_done"] == len(jobs)
    return rounds


def test_the_simulator_carries_tenants_into_its_snapshots_and_keeps_each_jobs() -> None:
    tenants = (TenantSpec(name="vision", gpus=8), TenantSpec(name="nlp", gpus=4, lend=False))
    sim = SimulatedCluster(
        SimConfig(nodes=tuple(small_nodes()), tenants=tenants),
        arrivals=[_job("a", "vision"), _job("b", "nlp")],
    )
    snapshot = sim.observe()
    assert snapshot.tenants == {"vision": tenants[0], "nlp": tenants[1]}
    assert {j.spec.job_id: j.spec.tenant for j in snapshot.jobs} == {"a": "vision", "b": "nlp"}
    # submitted and restored jobs keep their tenant too
    model = resolve_task("gpt-char", ()).model
    sim.submit(
        JobSubmission(
            spec=JobSpec(job_id="c", model=model, tenant="nlp"), task="gpt-char", steps=10
        )
    )
    restored = SimulatedCluster(SimConfig(nodes=tuple(small_nodes()), tenants=tenants), arrivals=[])
    spec = JobSpec(job_id="d", model=model, tenant="vision")
    restored.restore(
        [
            (
                JobSubmission(spec=spec, task="gpt-char", steps=10),
                JobStatus(spec=spec, state="pending"),
            )
        ],
        taken_ids=set(),
    )
    assert sim.observe().by_state("pending")[-1].spec.tenant == "nlp"
    assert restored.observe().jobs[0].spec.tenant == "vision"
    with pytest.raises(ValueError, match="a name twice"):
        SimConfig(tenants=(TenantSpec(name="x"), TenantSpec(name="x", gpus=2)))


def test_a_tenant_that_does_not_borrow_never_exceeds_its_quota_in_simulation() -> None:
    """Eight jobs of up to 2 GPUs of ``capped`` (quota 4, does not borrow) and two of
    ``others`` on 16 GPUs: without tenants ``capped`` holds more than 4 GPUs; with them,
    never more than 4, and all 4 while it has the work; every job finishes."""
    jobs = [_job(f"capped-{i}", "capped", submit_s=10.0 * i, elastic=1) for i in range(8)]
    jobs += [_job(f"others-{i}", "others", submit_s=5.0 + 10.0 * i) for i in range(2)]
    free = _held_per_round((), jobs)
    assert max(r.get("capped", 0.0) for r in free) > 4
    tenants = (TenantSpec(name="capped", gpus=4, borrow=False), TenantSpec(name="others"))
    held = _held_per_round(tenants, jobs)
    assert max(r.get("capped", 0.0) for r in held) == pytest.approx(4.0)


# -- `--tenants` -----------------------------------------------------------------------


def test_tenant_shares_parse_into_quotas_that_sum_to_at_most_the_cluster() -> None:
    shares = parse_tenant_shares("vision=50, nlp=30,speech=20")
    assert shares == {"vision": 50.0, "nlp": 30.0, "speech": 20.0}
    assert quota_tenants(shares, 64) == (
        TenantSpec(name="vision", gpus=32),
        TenantSpec(name="nlp", gpus=19),
        TenantSpec(name="speech", gpus=13),
    )
    # 31.5 each of 63 GPUs: rounding both up would promise 64
    assert [t.gpus for t in quota_tenants({"a": 50, "b": 50}, 63)] == [32, 31]
    assert [t.gpus for t in quota_tenants({"a": 25, "b": 12.5}, 10)] == [3, 1]
    assert [t.gpus for t in quota_tenants({"a": 1}, 16)] == [0]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("vision:50", "NAME=PERCENT"),
        ("vision=50,", "NAME=PERCENT"),
        ("vision=half", "'half' is not a percent"),
        ("vision=50,nlp=60", "add up to 110%, over the cluster's 100%"),
        ("vision=0", "over 0 percent"),
        ("vision=50,vision=10", "given twice"),
        ("vi/sion=50", "TenantSpec.name"),
    ],
)
def test_bad_tenant_shares_fail_in_one_line(text: str, says: str) -> None:
    with pytest.raises(InputError, match=says) as caught:
        parse_tenant_shares(text)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "command",
    [
        ["eval", "--pollux-workload"],
        ["pollux", "eval", "--workload"],
        ["train-policy", "--out", "runs/x", "--pollux-workload"],
    ],
)
def test_eval_commands_reject_bad_tenants_with_exit_code_2(command: list[str]) -> None:
    result = cli(*command, "x.csv", "--tenants", "vision=60,nlp=50")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: --tenants 'vision=60,nlp=50': the shares add up to 110%, over the cluster's 100%"
    ]


def test_jobs_are_drawn_to_tenants_by_a_seeded_draw_with_the_shares_as_odds() -> None:
    jobs = [_job(f"j{i}", "default", submit_s=float(i)) for i in range(2000)]
    shares = {"vision": 50.0, "nlp": 30.0, "speech": 20.0}
    drawn = draw_tenants(jobs, shares, seed=3)
    assert draw_tenants(jobs, shares, seed=3) == drawn
    assert draw_tenants(jobs, shares, seed=4) != drawn
    counts = {t: sum(a.spec.tenant == t for a in drawn) / len(jobs) for t in shares}
    assert counts == pytest.approx({"vision": 0.5, "nlp": 0.3, "speech": 0.2}, abs=0.03)
    # only the tenant changes; shares under 100 are odds over their sum
    assert all(
        d == replace(j, spec=replace(j.spec, tenant=d.spec.tenant))
        for d, j in zip(drawn, jobs, strict=True)
    )
    halves = draw_tenants(jobs, {"a": 10.0, "b": 10.0}, seed=0)
    assert sum(a.spec.tenant == "a" for a in halves) / len(jobs) == pytest.approx(0.5, abs=0.03)


# -- the fairness figures ----------------------------------------------------------------


def _status(
    job_id: str, tenant: str, finished_s: float | None, submitted: float = 0.0
) -> JobStatus:
    spec = JobSpec(job_id=job_id, tenant=tenant, submitted_at=submitted)
    state = "finished" if finished_s is not None else "pending"
    return JobStatus(spec=spec, state=state, finished_s=finished_s)


def test_fairness_figures_of_a_hand_counted_episode() -> None:
    """4 GPUs, tenants a and b with a quota of 2 each, four 60 s rounds:

    | round | a asks | a holds | b asks | b holds |
    |---|---|---|---|---|
    | 1 | 4 | 4 | 0 | 0 |
    | 2 | 4 | 3 | 2 | 1 |  b waits for its quota: a holds 3 of its 2
    | 3 | 4 | 2 | 2 | 2 |
    | 4 | 0 | 0 | 1 | 1 |

    a: entitled 2 + 2 + 2, held of it 2 + 2 + 2 -> 100%; b: entitled 2 + 2 + 1, held of
    it 1 + 2 + 1 -> 80%, 60 s waiting."""
    meter = TenantMeter([TenantSpec(name="a", gpus=2), TenantSpec(name="b", gpus=2)])
    for asked, held in [
        ({"a": 4.0}, {"a": 4.0}),
        ({"a": 4.0, "b": 2.0}, {"a": 3.0, "b": 1.0}),
        ({"a": 4.0, "b": 2.0}, {"a": 2.0, "b": 2.0}),
        ({"b": 1.0}, {"b": 1.0}),
    ]:
        meter.record(asked=asked, held=held, seconds=60.0)
    jobs = [
        _status("a1", "a", 100.0),
        _status("a2", "a", 230.0, submitted=30.0),
        _status("b1", "b", 240.0),
        _status("b2", "b", None),
        _status("c1", "c", 50.0),  # a tenant without a quota: owed nothing
    ]
    figures = meter.figures(jobs, total_gpus=4, makespan_s=240.0)
    assert list(figures) == ["a", "b", "c"]
    assert all(list(f) == list(TENANT_FIGURES) for f in figures.values())
    a, b, c = figures["a"], figures["b"], figures["c"]
    assert a == pytest.approx(
        {
            "quota_gpus": 2,
            "quota_share": 0.5,
            "jobs": 2,
            "n_jobs_done": 2,
            "avg_jct_s": 150.0,
            "gpu_share": (4 + 3 + 2) * 60 / (4 * 240),
            "active_s": 180.0,
            "quota_attainment": 1.0,
            "quota_wait_s": 0.0,
        }
    )
    assert b == pytest.approx(
        {
            "quota_gpus": 2,
            "quota_share": 0.5,
            "jobs": 2,
            "n_jobs_done": 1,
            "avg_jct_s": 240.0,
            "gpu_share": (1 + 2 + 1) * 60 / (4 * 240),
            "active_s": 180.0,
            "quota_attainment": 0.8,
            "quota_wait_s": 60.0,
        }
    )
    assert c["jobs"] == 1
    assert c["quota_gpus"] == 0
    assert math.isnan(c["quota_attainment"])


def test_eval_reports_each_tenants_figures_from_its_rounds() -> None:
    """`evaluate_policies` with tenants: every run has each tenant's figures, their GPU
    shares add up to the cluster's utilisation, their jobs to the trace's."""
    jobs = draw_tenants(
        [_job(f"j{i}", "default", submit_s=120.0 * i) for i in range(8)], {"a": 75, "b": 25}, seed=0
    )
    tenants = quota_tenants({"a": 75, "b": 25}, 16)
    report = evaluate_policies(
        nodes=small_nodes(), jobs=jobs, policies=["rules"], seeds=1, slots=8, tenants=tenants
    )
    assert report["trace"]["tenants"] == {"a": 12, "b": 4}
    row = report["policies"]["rules"]
    run = row["per_seed"][0]
    assert row["tenants"] == run["tenants"]
    assert list(run["tenants"]) == ["a", "b"]
    assert sum(f["jobs"] for f in run["tenants"].values()) == 8
    assert sum(f["gpu_share"] for f in run["tenants"].values()) == pytest.approx(run["gpu_util"])
    for figures in run["tenants"].values():
        assert 0 < figures["quota_attainment"] <= 1
        assert figures["active_s"] > 0
    bare = evaluate_policies(nodes=small_nodes(), jobs=jobs, policies=["rules"], seeds=1, slots=8)
    assert "tenants" not in bare["policies"]["rules"]
    assert "tenants" not in bare["trace"]


def test_eval_command_prints_and_reports_the_tenants(tmp_path: Path) -> None:
    trace = tmp_path / "philly.csv"
    trace.write_text("timestamp,duration,num_gpus\n0,1800,1\n60,3600,2\n120,900,4\n600,2400,8\n")
    args = ["eval", "--philly-jobs", str(trace), "--gpus", "16", "--policies", "rules"]
    args += ["--seeds", "1", "--tenants", "vision=50,nlp=30", "--trace-seed", "1"]
    printed = cli(*args)
    assert printed.exit_code == 0, printed.stderr
    assert "attained" in printed.stdout
    assert "waited s" in printed.stdout
    report = json.loads(cli(*args, "--json").stdout)
    assert report["trace"]["tenants"] == {"vision": 8, "nlp": 5}
    assert report["trace"]["tenant_seed"] == 1
    tenants = report["policies"]["rules"]["tenants"]
    assert sum(f["jobs"] for f in tenants.values()) == 4
    assert np.isclose(tenants["vision"]["quota_share"], 0.5)


# -- training with tenants, and what the policy sees --------------------------------------


def _tenant_features(obs: np.ndarray, snapshot: ClusterSnapshot, slots: int) -> list[tuple]:
    """(tenant, quota feature, headroom feature) of each occupied slot."""
    from autotune.rl.observation import HEADER, SLOT, slot_jobs

    names = [f.name for f in SLOT]
    quota, headroom = names.index("tenant_quota"), names.index("tenant_headroom")
    rows = []
    for k, job in enumerate(slot_jobs(snapshot, slots)):
        base = HEADER + k * len(SLOT)
        rows.append((job.spec.tenant, float(obs[base + quota]), float(obs[base + headroom])))
    return rows


def test_training_draws_tenants_each_episode_and_the_policy_sees_their_headroom(
    pollux_dir: Path,
) -> None:
    """``train-policy --tenants``: half the Pollux episodes share the cluster, each one's
    jobs drawn afresh to the tenants (quotas of 32, 19 and 13 of 64 GPUs), and every slot
    shows its job's tenant's quota and headroom (0.5 + (quota - GPUs the tenant holds) /
    2 / 64); the other half have no quotas and the same features are neutral (0 and
    0.5), as on the daemon's default cluster."""
    from dataclasses import asdict

    from autotune.policies.ppo import make_train_env
    from autotune.policies.ppo_settings import PPOSettings, TraceSource

    source = TraceSource(
        kind="pollux", jobs=str(pollux_dir / "workloads" / "workload-1.csv"), window=20
    )
    shared = replace(source, tenants="vision=50,nlp=30,speech=20")
    env = make_train_env(asdict(PPOSettings(forecast=False, sources=(shared,))))
    env.action_space.seed(0)  # the random actions the same each run (some jobs must run)
    quotas = {"vision": 32, "nlp": 19, "speech": 13}
    draws, without = [], 0
    for seed in range(10):
        obs, _ = env.reset(seed=seed)
        for _ in range(4):
            obs, *_ = env.step(env.action_space.sample())
        snapshot = env.current.snapshot
        rows = _tenant_features(obs, snapshot, env.current.config.slots)
        assert rows
        if not snapshot.tenants:
            without += 1
            assert {(q, h) for _, q, h in rows} == {(0.0, 0.5)}
            continue
        assert {n: t.nominal_gpus for n, t in snapshot.tenants.items()} == quotas
        held = snapshot.tenant_gpus()
        assert held  # some jobs run, so some headroom is not the quota's
        for tenant, quota, headroom in rows:
            assert quota == pytest.approx(quotas[tenant] / 64)
            want = 0.5 + (quotas[tenant] - held.get(tenant, 0.0)) / 128
            assert headroom == pytest.approx(min(1.0, max(0.0, want)))
        draws.append([j.spec.tenant for j in sorted(snapshot.jobs, key=lambda j: j.spec.job_id)])
    assert 3 <= len(draws) <= 7  # about half the episodes each
    assert without == 10 - len(draws)
    assert draws[0] != draws[1]  # drawn afresh
    plain = make_train_env(asdict(PPOSettings(forecast=False, sources=(source,))))
    plain.action_space.seed(0)
    obs, _ = plain.reset(seed=1)
    obs, *_ = plain.step(plain.action_space.sample())
    rows = _tenant_features(obs, plain.current.snapshot, plain.current.config.slots)
    assert rows
    assert {(q, h) for _, q, h in rows} == {(0.0, 0.5)}
