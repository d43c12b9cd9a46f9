"""The Pollux-compatible mode: Pollux's jobs on its measured physics, its clock, rounds
and restart cost, run through our decision step; and Tiresias as its artifact runs it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import cli

from autotune.core import JobConfig, PrecisionMap, TenantSpec
from autotune.decision.step import decide_for
from autotune.envs.cluster_env import ClusterEnv
from autotune.envs.presets import pollux_nodes
from autotune.envs.simulator import Arrival
from autotune.envs.traces import pollux_workload
from autotune.envs.workloads import jobs_from_trace
from autotune.errors import InputError
from autotune.interfaces import ClusterSnapshot, PolicyChoice, PolicyRound
from autotune.policies.evaluate import evaluate_policies, run_episode
from autotune.policies.tiresias import TIRESIAS_THRESHOLD_GPU_S, TiresiasPolicy
from autotune.studies.pollux.env import compat_arrivals, measured_physics
from autotune.studies.pollux.trace import load_trace_apps

# Average JCT (s) of Tiresias in Pollux's artifact simulator (branch osdi21-artifact of
# petuum/adaptdl, ``results-jobload/tiresias-1.0/summary.json``), workloads 1-8.
POLLUX_TIRESIAS = {1: 2474, 2: 5145, 3: 3876, 4: 3280, 5: 3501, 6: 3470, 7: 5480, 8: 5080}


def _compat_env(
    jobs: list[Arrival], gpus: int = 64, tenants: tuple[TenantSpec, ...] = ()
) -> ClusterEnv:
    return ClusterEnv(
        nodes=pollux_nodes(gpus),
        jobs=jobs,
        slots=32,
        round_s=60.0,
        restart_s=30.0,
        start_s=30.0,
        noise=False,
        max_steps=100_000,
        tenants=tenants,
    )


def _workload(pollux_dir: Path, n: int) -> list[Arrival]:
    return compat_arrivals(pollux_dir / "workloads" / f"workload-{n}.csv", pollux_dir / "traces")


def _tiresias_jct(pollux_dir: Path, n: int) -> float:
    env = _compat_env(_workload(pollux_dir, n))
    return run_episode(TiresiasPolicy(), env, seed=0)["avg_jct_s"]


def test_compat_arrivals_keep_pollux_clock_and_measured_physics(pollux_dir: Path) -> None:
    jobs = _workload(pollux_dir, 6)
    assert len(jobs) == 160
    first = jobs[0]
    assert first.spec.job_id == "cifar10-0"
    assert first.spec.submitted_at == 53.0
    assert first.spec.requested_gpus == 6
    assert first.spec.global_batch == 2048
    assert first.physics is not None
    assert first.physics.name == "cifar10"  # type: ignore[attr-defined]
    # 48-GPU jobs keep their request even where the elastic maximum is capped at 64.
    assert max(j.spec.requested_gpus or 0 for j in jobs) == 48


def test_a_job_alone_finishes_as_in_pollux_simulator(pollux_dir: Path) -> None:
    """cifar10 on 16 GPUs (4 full nodes, as Pollux packs it): its measured standalone
    time plus the 30 s start, from the first round boundary after its arrival."""
    job = next(j for j in _workload(pollux_dir, 6) if j.spec.requested_gpus == 16)
    job = replace(job, spec=replace(job.spec, submitted_at=10.0))
    env = _compat_env([job])
    run_episode(TiresiasPolicy(), env, seed=0)
    assert env.sim is not None
    status = env.sim.jobs[job.spec.job_id].status
    app = load_trace_apps(pollux_dir / "traces")["cifar10"]
    standalone = app.standalone_s(16, job.spec.global_batch)
    assert status.state == "finished"
    assert status.finished_s == pytest.approx(60.0 + 30.0 + standalone)


@pytest.mark.parametrize("workload", [6])
def test_tiresias_matches_pollux_simulator_within_10_percent(
    pollux_dir: Path, workload: int
) -> None:
    jct = _tiresias_jct(pollux_dir, workload)
    assert jct == pytest.approx(POLLUX_TIRESIAS[workload], rel=0.10)


@pytest.mark.slow
@pytest.mark.parametrize("workload", [1, 2, 3, 4, 5, 7, 8])
def test_tiresias_matches_pollux_simulator_on_every_workload(
    pollux_dir: Path, workload: int
) -> None:
    jct = _tiresias_jct(pollux_dir, workload)
    assert jct == pytest.approx(POLLUX_TIRESIAS[workload], rel=0.10)


def test_measured_jobs_run_only_fp32_data_parallel(pollux_dir: Path) -> None:
    class Fp16:
        name, version = "fp16", "fp16-test"

        def decide(self, snapshot: ClusterSnapshot) -> PolicyRound:
            return PolicyRound(
                choices={
                    j.spec.job_id: PolicyChoice(
                        config=replace(
                            JobConfig.data_parallel(1), precision=PrecisionMap.uniform("fp16")
                        ),
                        reason="half",
                    )
                    for j in snapshot.by_state("pending")
                }
            )

    env = _compat_env(_workload(pollux_dir, 6)[:1])
    with pytest.raises(ValueError, match="fp32 without compression"):
        run_episode(Fp16(), env, seed=0)


def test_measured_physics_refuses_jobs_pollux_did_not_measure(pollux_dir: Path) -> None:
    from autotune.catalog.profiles import MODEL_CATALOG
    from autotune.core import JobSpec

    other = Arrival(
        spec=JobSpec(job_id="gpt", model=MODEL_CATALOG["gpt-125m"], max_gpus=2),
        duration_s=60.0,
    )
    with pytest.raises(InputError, match="not a Pollux application"):
        measured_physics([other], pollux_dir / "traces")


# --- Tiresias -------------------------------------------------------------------------


def _arrivals(pollux_dir: Path, requests: list[tuple[str, int, float]]) -> list[Arrival]:
    base = jobs_from_trace(pollux_workload(pollux_dir / "workloads" / "workload-6.csv"))
    # imagenet: long enough (hours) that nobody finishes within the test's rounds.
    imagenet_job = next(a for a in base if a.spec.model and a.spec.model.name == "imagenet")
    out = []
    for name, gpus, at in requests:
        spec = replace(
            imagenet_job.spec,
            job_id=name,
            submitted_at=at,
            requested_gpus=gpus,
            max_gpus=max(gpus, imagenet_job.spec.max_gpus),
        )
        out.append(replace(imagenet_job, spec=spec))
    return measured_physics(out, pollux_dir / "traces")


def test_tiresias_demotes_after_its_threshold_and_preempts_for_a_newcomer(
    pollux_dir: Path,
) -> None:
    """A 48-GPU job runs alone, passes 57,600 GPU-s after 20 rounds and drops to queue 1;
    a 32-GPU newcomer (queue 0) then takes the GPUs it needs: the big job is preempted."""
    jobs = _arrivals(pollux_dir, [("big", 48, 0.0), ("late", 32, 1500.0)])
    env = _compat_env(jobs)
    env.reset(seed=0)
    policy = TiresiasPolicy()
    preempted_at = None
    assert env.sim is not None
    assert env.snapshot is not None
    while env.sim.now < 2400:
        env.step_choices(policy.decide(env.snapshot).choices)
        if env.sim.jobs["big"].preemptions and preempted_at is None:
            preempted_at = env.sim.now
    assert policy.queue_of("big") == 1
    assert policy.queue_of("late") == 0
    assert policy.attained_gpu_s("big") >= TIRESIAS_THRESHOLD_GPU_S
    assert preempted_at is not None
    assert preempted_at >= 1500
    assert env.sim.jobs["big"].status.state == "pending"
    assert env.sim.jobs["late"].status.state in ("running", "finished")


def test_tiresias_backfills_a_smaller_later_job(pollux_dir: Path) -> None:
    jobs = _arrivals(pollux_dir, [("a", 48, 0.0), ("b", 32, 0.0), ("c", 16, 0.0)])
    env = _compat_env(jobs)
    env.reset(seed=0)
    assert env.snapshot is not None
    choices = TiresiasPolicy().decide(env.snapshot).choices
    assert choices["a"].config is not None
    assert choices["a"].config.layout.dp == 48
    assert choices["b"].config is None
    assert not choices["b"].preempt
    assert choices["c"].config is not None  # 48 + 16 fits: it goes ahead of "b"


def test_tiresias_rejects_a_bad_threshold() -> None:
    with pytest.raises(ValueError, match="threshold"):
        TiresiasPolicy(threshold_gpu_s=0)


# --- the command ----------------------------------------------------------------------


def test_eval_pollux_compat_command(pollux_dir: Path) -> None:
    run = cli(
        "pollux", "eval", "--workload", str(pollux_dir / "workloads" / "workload-6.csv"),
        "--policies", "tiresias,static", "--seeds", "1", "--limit-jobs", "20", "--json",
    )  # fmt: skip
    assert run.exit_code == 0, run.stderr[-2000:]
    report = json.loads(run.stdout)
    assert report["trace"]["kind"] == "pollux-compat"
    assert report["trace"]["round_s"] == 60.0
    assert report["trace"]["start_s"] == 30.0
    assert set(report["policies"]) == {"tiresias", "static"}
    assert report["policies"]["tiresias"]["n_jobs_done"] == 20


def test_eval_pollux_compat_command_with_tenants(pollux_dir: Path) -> None:
    run = cli(
        "pollux", "eval", "--workload", str(pollux_dir / "workloads" / "workload-6.csv"),
        "--policies", "tiresias", "--limit-jobs", "20", "--json",
        "--tenants", "vision=50,nlp=30,speech=20", "--trace-seed", "2",
    )  # fmt: skip
    assert run.exit_code == 0, run.stderr[-2000:]
    report = json.loads(run.stdout)
    assert report["trace"]["tenants"] == {"vision": 32, "nlp": 19, "speech": 13}
    assert report["trace"]["tenant_seed"] == 2
    tenants = report["policies"]["tiresias"]["tenants"]
    assert list(tenants) == ["vision", "nlp", "speech"]
    assert sum(t["n_jobs_done"] for t in tenants.values()) == 20
    assert all(0 < t["quota_attainment"] <= 1 for t in tenants.values())


def test_eval_pollux_compat_refuses_policies_that_judge_by_the_model(pollux_dir: Path) -> None:
    run = cli(
        "pollux", "eval", "--workload", str(pollux_dir / "workloads" / "workload-6.csv"),
        "--policies", "tune",
    )  # fmt: skip
    assert run.exit_code == 2
    assert "tune" in run.stderr
    assert "goodput" in run.stderr


def test_pollux_compat_needs_a_pollux_workload(tmp_path: Path) -> None:
    run = cli("pollux", "eval", "--policies", "tiresias")
    assert run.exit_code == 2
    assert "--workload" in run.stderr


def test_evaluate_reports_the_mode(pollux_dir: Path) -> None:
    jobs = _workload(pollux_dir, 6)[:5]
    report = evaluate_policies(
        nodes=pollux_nodes(64),
        jobs=jobs,
        policies=["tiresias"],
        seeds=1,
        round_s=60.0,
        start_s=30.0,
        noise=False,
    )
    assert report["trace"]["start_s"] == 30.0
    assert report["trace"]["noise"] is False
    assert report["policies"]["tiresias"]["n_jobs_done"] == 5


# --- the Pollux-style goodput optimiser -------------------------------------------------


def test_goodput_gives_everyone_a_gpu_before_anyone_a_second(pollux_dir: Path) -> None:
    from autotune.studies.pollux.goodput import GoodputPolicy

    jobs = _arrivals(pollux_dir, [(f"j{i}", 8, 0.0) for i in range(20)])
    env = _compat_env(jobs, gpus=16)
    env.reset(seed=0)
    assert env.snapshot is not None
    choices = GoodputPolicy(env).decide(env.snapshot).choices
    gpus = {k: c.config.world_size for k, c in choices.items() if c.config is not None}
    assert sum(gpus.values()) == 16
    assert set(gpus.values()) == {1}  # 20 jobs, 16 GPUs: one each, in arrival order
    assert sorted(gpus) == sorted(f"j{i}" for i in range(16))


def test_goodput_scales_a_lone_job_while_its_goodput_grows(pollux_dir: Path) -> None:
    from autotune.studies.pollux.goodput import GoodputPolicy

    jobs = _arrivals(pollux_dir, [("alone", 8, 0.0)])
    env = _compat_env(jobs)
    env.reset(seed=0)
    assert env.snapshot is not None
    choice = GoodputPolicy(env).decide(env.snapshot).choices["alone"]
    assert choice.config is not None
    n, batch = choice.config.world_size, choice.config.global_batch
    assert n > 1
    assert batch is not None
    trace = load_trace_apps(pollux_dir / "traces")["imagenet"]
    assert trace.init_batch <= batch <= trace.max_batch
    assert choice.features["goodput"] == pytest.approx(
        trace.rate((4,) * (n // 4) + ((n % 4,) if n % 4 else ()), batch, 0)
    )


def test_goodput_gives_a_tenant_its_quota_before_others_borrow(pollux_dir: Path) -> None:
    """Two tenants with 8 of 16 GPUs each: without quotas the fair objective spreads the
    GPUs over seven jobs (tenant a's one job gets 3); with quotas, a's job
    grows to its quota of 8 (it asks for 8) and b's six share the rest. With no job of
    a's, nothing is kept for it: b's jobs take all 16."""
    from autotune.studies.pollux.goodput import GoodputPolicy

    jobs = _arrivals(pollux_dir, [("a0", 8, 0.0)] + [(f"b{i}", 8, 0.0) for i in range(6)])
    jobs = [replace(j, spec=replace(j.spec, tenant=j.spec.job_id[0])) for j in jobs]
    tenants = (TenantSpec(name="a", gpus=8), TenantSpec(name="b", gpus=8))

    def gpus(env: ClusterEnv) -> dict[str, int]:
        env.reset(seed=0)
        assert env.snapshot is not None
        choices = GoodputPolicy(env).decide(env.snapshot).choices
        return {k: c.config.world_size for k, c in choices.items() if c.config is not None}

    free = gpus(_compat_env(jobs, gpus=16))
    assert sum(free.values()) == 16
    assert free["a0"] < 8
    shared = gpus(_compat_env(jobs, gpus=16, tenants=tenants))
    assert shared["a0"] == 8
    assert sum(n for k, n in shared.items() if k != "a0") == 8
    alone = gpus(_compat_env(jobs[1:], gpus=16, tenants=tenants))
    assert sum(alone.values()) == 16


def test_goodput_looks_past_the_two_node_dip(pollux_dir: Path) -> None:
    """bert runs slower on 5 GPUs (4 + 1, two nodes) than on 4: adding GPUs one by one
    would stop at 4; alone on 64 GPUs it goes to many more."""
    from autotune.studies.pollux.goodput import GoodputPolicy

    bert = next(
        replace(j, spec=replace(j.spec, submitted_at=0.0))
        for j in _workload(pollux_dir, 6)
        if j.spec.job_id.startswith("bert")
    )
    trace = load_trace_apps(pollux_dir / "traces")["bert"]
    assert trace.rate((4, 1), 280, 0) < trace.rate((4,), 384, 0)
    env = _compat_env([bert])
    env.reset(seed=0)
    assert env.snapshot is not None
    choice = GoodputPolicy(env).decide(env.snapshot).choices[bert.spec.job_id]
    assert choice.config is not None
    assert choice.config.world_size >= 12


def test_goodput_keeps_ncf_at_pollux_one_size(pollux_dir: Path) -> None:
    """Pollux's artifact trains ncf on one GPU at batch 32,768 under its elastic
    schedulers; so does the compat mode, alone on 64 GPUs."""
    from autotune.studies.pollux.goodput import GoodputPolicy

    ncf = next(
        replace(j, spec=replace(j.spec, submitted_at=0.0))
        for j in _workload(pollux_dir, 6)
        if j.spec.job_id.startswith("ncf")
    )
    assert ncf.physics is not None
    assert ncf.physics.fixed == (1, 32768)  # type: ignore[attr-defined]
    assert ncf.spec.max_gpus == 1
    env = _compat_env([ncf])
    env.reset(seed=0)
    assert env.snapshot is not None
    choice = GoodputPolicy(env).decide(env.snapshot).choices[ncf.spec.job_id]
    assert choice.config is not None
    assert choice.config.world_size == 1
    assert choice.config.global_batch == 32768


def test_goodput_beats_tiresias_on_workload_6(pollux_dir: Path) -> None:
    """Measured: 2,433 s against Tiresias's 3,478 s (Pollux's published 2,446 s)."""
    from autotune.studies.pollux.goodput import GoodputPolicy

    env = _compat_env(_workload(pollux_dir, 6))
    jct = run_episode(GoodputPolicy(env), env, seed=0)["avg_jct_s"]
    assert jct < 0.85 * _tiresias_jct(pollux_dir, 6)


def test_goodput_needs_a_fair_objective() -> None:
    from autotune.studies.pollux.goodput import GoodputPolicy

    with pytest.raises(ValueError, match="p < 0"):
        GoodputPolicy(_compat_env([]), p=1.0)


def test_pollux_knobs_keep_gpus_and_batch_only() -> None:
    from autotune.core import CompressionSpec, Layout
    from autotune.studies.pollux.env import to_pollux_knobs

    wide = JobConfig(
        layout=Layout(world_size=8, tp=2, pp=2, micro_batches=4, activation_checkpointing=True),
        precision=PrecisionMap.uniform("bf16"),
        compression=CompressionSpec(kind="int8"),
        global_batch=4,
    )
    out = to_pollux_knobs(
        {
            "a": PolicyChoice(config=wide, reason="mine"),
            "b": PolicyChoice(config=None, reason="wait"),
            "c": PolicyChoice(config=JobConfig.data_parallel(2), reason="plain"),
        }
    )
    a = out["a"].config
    assert a is not None
    assert a.layout == Layout(world_size=8)  # data parallel over the same GPUs
    assert a.precision == PrecisionMap()
    assert a.compression == CompressionSpec()
    assert a.global_batch == 8  # a sample per data-parallel rank at least
    assert out["a"].reason == "mine (Pollux's knobs)"
    assert out["b"].config is None
    assert out["c"] == PolicyChoice(config=JobConfig.data_parallel(2), reason="plain")


def test_a_batch_the_traces_did_not_measure_trains_at_the_nearest_measured(
    pollux_dir: Path,
) -> None:
    from autotune.studies.pollux.trace import measured_batch

    bert = load_trace_apps(pollux_dir / "traces")["bert"]
    eight_nodes = (4,) * 8
    assert measured_batch(bert, eight_nodes, 384) == 384
    assert measured_batch(bert, eight_nodes, 96) == 128  # local 3 -> 4, the smallest
    assert measured_batch(bert, eight_nodes, 1536) == 384  # the largest validated


def _running_alone(pollux_dir: Path, app: str, config: JobConfig) -> ClusterEnv:
    """A compat environment whose one job of ``app`` runs ``config`` after its first round."""
    job = next(
        replace(j, spec=replace(j.spec, submitted_at=0.0))
        for j in _workload(pollux_dir, 6)
        if j.spec.job_id.startswith(app)
    )
    env = _compat_env([job])
    env.reset(seed=0)
    assert env.snapshot is not None
    env.step_choices({job.spec.job_id: PolicyChoice(config=config, reason="start")})
    return env


def test_a_measured_job_changes_its_batch_in_place_as_pollux_does(pollux_dir: Path) -> None:
    """Pollux's agent re-chooses a job's batch without a restart (the artifact charges its
    30 s only for a new allocation): the job keeps its GPUs and loses no time, and the
    round still decides (the new batch is applied)."""
    from autotune.core import Layout

    four = JobConfig(layout=Layout(world_size=4), global_batch=256)
    env = _running_alone(pollux_dir, "cifar10", four)
    assert env.sim is not None
    job = next(iter(env.sim.jobs.values()))
    before = job.status.placement
    assert job.status.state == "running"
    assert before is not None
    restarts = job.restarts
    bigger = JobConfig(layout=Layout(world_size=4), global_batch=1024)
    assert bigger.rebatches(four)
    env.step_choices({job.job_id: PolicyChoice(config=bigger, reason="larger batch")})
    assert job.status.config is not None
    assert job.status.config.global_batch == 1024
    assert job.status.placement == before
    assert job.restarts == restarts
    # A new GPU count is a new allocation: it restarts.
    eight = JobConfig(layout=Layout(world_size=8), global_batch=1024)
    assert not eight.rebatches(bigger)
    env.step_choices({job.job_id: PolicyChoice(config=eight, reason="more GPUs")})
    assert job.restarts == restarts + 1


def test_a_job_on_our_model_restarts_for_a_new_batch() -> None:
    """In the default world the executor restarts a job from its checkpoint for any new
    configuration, its batch included."""
    from autotune.core import Layout
    from autotune.envs.simulator import SimConfig, SimulatedCluster

    sim = SimulatedCluster(SimConfig(seed=0, initial_jobs=1, max_jobs=1))
    snapshot = sim.observe()
    (job,) = snapshot.jobs
    config = JobConfig(layout=Layout(world_size=job.spec.min_gpus))
    first = decide_for(snapshot, _Fixed({job.spec.job_id: config}), {}, honoured={})
    sim.apply(first.decisions)
    snapshot = sim.observe()
    state = sim.jobs[job.spec.job_id]
    assert state.status.state == "running"
    rebatched = replace(config, global_batch=2 * job.spec.global_batch)
    again = decide_for(snapshot, _Fixed({job.spec.job_id: rebatched}), {}, honoured={})
    (decision,) = again.decisions
    assert decision.placement == state.status.placement  # the same GPUs ...
    sim.apply(again.decisions)
    assert state.restarts == 1  # ... and a restart all the same


class _Fixed:
    name, version = "fixed", "fixed-test"

    def __init__(self, configs: dict[str, JobConfig]) -> None:
        self.configs = configs

    def decide(self, snapshot: ClusterSnapshot) -> PolicyRound:
        return PolicyRound(
            choices={k: PolicyChoice(config=c, reason="fixed") for k, c in self.configs.items()}
        )


# --- Optimus ------------------------------------------------------------------------------


def test_optimus_matches_pollux_simulator_on_workload_6(pollux_dir: Path) -> None:
    """The artifact's Optimus + Oracle + TunedJobs: 5,302 s (measured here: 5,236 s)."""
    from autotune.studies.pollux.optimus import OptimusPolicy

    env = _compat_env(_workload(pollux_dir, 6))
    jct = run_episode(OptimusPolicy(env), env, seed=0)["avg_jct_s"]
    assert jct == pytest.approx(5302, rel=0.15)


def test_optimus_grows_jobs_by_marginal_gain_and_keeps_ncf_on_one_gpu(pollux_dir: Path) -> None:
    from autotune.studies.pollux.optimus import OptimusPolicy

    jobs = _workload(pollux_dir, 6)
    cifar = next(j for j in jobs if j.spec.job_id.startswith("cifar10"))
    ncf = next(j for j in jobs if j.spec.job_id.startswith("ncf"))
    both = [replace(j, spec=replace(j.spec, submitted_at=0.0)) for j in (cifar, ncf)]
    env = _compat_env(both)
    env.reset(seed=0)
    assert env.snapshot is not None
    policy = OptimusPolicy(env)
    choices = policy.decide(env.snapshot).choices
    grown = choices[cifar.spec.job_id].config
    assert grown is not None
    assert grown.world_size > 1
    assert grown.global_batch is None  # its workload batch, kept
    assert choices[ncf.spec.job_id].config == JobConfig.data_parallel(1)
    trace = load_trace_apps(pollux_dir / "traces")["cifar10"]
    # One more GPU would no longer pay, or the cap is reached.
    n = grown.world_size
    assert n <= cifar.spec.global_batch // trace.min_local
    assert policy.step_time(trace, cifar.spec.global_batch, n, 4) <= policy.step_time(
        trace, cifar.spec.global_batch, 1, 4
    )


def test_iterations_interpolate_between_validated_batches(pollux_dir: Path) -> None:
    cifar = load_trace_apps(pollux_dir / "traces")["cifar10"]
    assert cifar.iterations(128, 0) == 390.0  # validation-128.csv, first epoch
    low, high = cifar.iterations(2048, 99), cifar.iterations(4096, 99)
    assert cifar.iterations(3072, 99) == pytest.approx((low + high) / 2)
    with pytest.raises(ValueError, match="epoch"):
        cifar.iterations(128, 100)
